/*
 * idemkey.c - see idemkey.h.
 */
#include "idemkey.h"

#include <stdbool.h>
#include <string.h>

static bool visible(unsigned char c)
{
	return c >= 0x21 && c <= 0x7e;
}

static bool digit(unsigned char c)
{
	return c >= '0' && c <= '9';
}

static bool lcalpha(unsigned char c)
{
	return c >= 'a' && c <= 'z';
}

static bool alpha(unsigned char c)
{
	return lcalpha(c) || (c >= 'A' && c <= 'Z');
}

/* RFC 9110 tchar */
static bool tchar(unsigned char c)
{
	return alpha(c) || digit(c) || (c != 0 && strchr("!#$%&'*+-.^_`|~", c));
}

static int fail(const char **why, const char *reason)
{
	if (why != NULL)
		*why = reason;
	return -1;
}

/* The sf-string at v[*i] (its opening quote), unescaped into out (NULL:
 * only checked); *i past its closing quote. Returns its length or -1. */
static int sf_string(const char *v, size_t len, size_t *i, char *out,
		     size_t max, const char **why)
{
	size_t n = 0;

	for ((*i)++; *i < len; (*i)++) {
		unsigned char c = (unsigned char)v[*i];

		if (c == '"') {
			(*i)++;
			return (int)n;
		}
		if (c == '\\') {
			if (++*i >= len)
				return fail(why, "the quoted key ends inside an escape");
			c = (unsigned char)v[*i];
			if (c != '"' && c != '\\')
				return fail(why, "a quoted key escapes only \\\" and \\\\");
		} else if (c < 0x20 || c > 0x7e) {
			return fail(why, "a quoted key holds printable ASCII "
				    "only (0x20-0x7E)");
		}
		if (n == max)
			return fail(why, "the key is longer than 255 characters");
		if (out != NULL)
			out[n] = (char)c;
		n++;
	}
	return fail(why, "the quoted key has no closing quote");
}

/* A bare item (RFC 8941 §3.3) at v[*i], only checked; *i past it. */
static int bare_item(const char *v, size_t len, size_t *i, const char **why)
{
	unsigned char c = (unsigned char)v[*i];
	if (c == '"')
		return sf_string(v, len, i, NULL, (size_t)-1, why) < 0 ? -1 : 0;
	if (c == '?') {		/* boolean */
		if (*i + 1 < len && (v[*i + 1] == '0' || v[*i + 1] == '1')) {
			*i += 2;
			return 0;
		}
		return fail(why, "a parameter's boolean is ?0 or ?1");
	}
	if (c == ':') {		/* byte sequence */
		for ((*i)++; *i < len && v[*i] != ':'; (*i)++)
			if (!alpha((unsigned char)v[*i]) && !digit((unsigned char)v[*i]) &&
			    v[*i] != '+' && v[*i] != '/' && v[*i] != '=')
				return fail(why, "a parameter's byte sequence is base64 "
					    "between colons");
		if (*i >= len)
			return fail(why, "a parameter's byte sequence has no "
				    "closing colon");
		(*i)++;
		return 0;
	}
	if (c == '-' || digit(c)) {	/* integer or decimal */
		size_t ints = 0, fracs = 0;

		if (c == '-')
			(*i)++;
		for (; *i < len && digit((unsigned char)v[*i]); (*i)++)
			ints++;
		if (*i < len && v[*i] == '.') {
			for ((*i)++; *i < len && digit((unsigned char)v[*i]); (*i)++)
				fracs++;
			if (ints < 1 || ints > 12 || fracs < 1 || fracs > 3)
				return fail(why, "a parameter's decimal has 1-12 digits, "
					    "a dot and 1-3 digits");
			return 0;
		}
		if (ints < 1 || ints > 15)
			return fail(why, "a parameter's integer has 1-15 digits");
		return 0;
	}
	if (alpha(c) || c == '*') {	/* token */
		for ((*i)++; *i < len && (tchar((unsigned char)v[*i]) ||
					  v[*i] == ':' || v[*i] == '/'); (*i)++)
			;
		return 0;
	}
	return fail(why, "a parameter's value is not an RFC 8941 bare item");
}

/* Parameters (RFC 8941 §3.1.2) from v[i] to the end; checked only. */
static int parameters(const char *v, size_t len, size_t i, const char **why)
{
	while (i < len) {
		if (v[i] != ';')
			return fail(why, "only parameters (;name=value) may follow "
				    "the quoted key");
		for (i++; i < len && v[i] == ' '; i++)
			;
		if (i >= len || !(lcalpha((unsigned char)v[i]) || v[i] == '*'))
			return fail(why, "a parameter's name starts with a-z or *");
		for (i++; i < len && (lcalpha((unsigned char)v[i]) ||
				      digit((unsigned char)v[i]) || v[i] == '_' ||
				      v[i] == '-' || v[i] == '.' || v[i] == '*'); i++)
			;
		if (i < len && v[i] == '=') {
			i++;
			if (i >= len)
				return fail(why, "a parameter has '=' and no value");
			if (bare_item(v, len, &i, why) < 0)
				return -1;
		}
	}
	return 0;
}

int idemkey_parse(const char *value, size_t len, char out[IDEMKEY_MAX + 1],
		  const char **why)
{
	size_t i = 0;
	int n;

	while (len > 0 && (value[0] == ' ' || value[0] == '\t')) {
		value++;
		len--;
	}
	while (len > 0 && (value[len - 1] == ' ' || value[len - 1] == '\t'))
		len--;
	if (len == 0)
		return fail(why, "the key is empty");
	if (value[0] != '"') {
		/* a bare value, as before sf-strings: taken as it is */
		if (len > IDEMKEY_MAX)
			return fail(why, "the key is longer than 255 characters");
		for (i = 0; i < len; i++) {
			if (!visible((unsigned char)value[i]))
				return fail(why, "a key that is not quoted holds visible "
					    "ASCII only (0x21-0x7E); quote it for spaces");
			out[i] = value[i];
		}
		out[len] = '\0';
		return (int)len;
	}
	n = sf_string(value, len, &i, out, IDEMKEY_MAX, why);
	if (n < 0)
		return -1;
	if (n == 0)
		return fail(why, "the quoted key is empty");
	if (parameters(value, len, i, why) < 0)
		return -1;
	out[n] = '\0';
	return n;
}
