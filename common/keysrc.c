/*
 * keysrc.c - see keysrc.h.
 */
#include "keysrc.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <json-c/json.h>

#include "hex.h"

/* prefix + value into out; lowest: the least byte a key may hold. */
static int join(const char *prefix, const char *value, size_t len,
		unsigned char lowest, char out[IDEMKEY_MAX + 1])
{
	size_t plen = strlen(prefix);

	if (len == 0)
		return KEYSRC_INVALID;
	if (plen + len > IDEMKEY_MAX)
		return KEYSRC_INVALID;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)value[i] < lowest || (unsigned char)value[i] > 0x7e)
			return KEYSRC_INVALID;
	memcpy(out, prefix, plen);
	memcpy(out + plen, value, len);
	out[plen + len] = '\0';
	return (int)(plen + len);
}

int keysrc_finish(const char *prefix, const char *value, size_t len,
		  char out[IDEMKEY_MAX + 1])
{
	return join(prefix, value, len, 0x21, out);
}

int keysrc_finish_quoted(const char *prefix, const char *value, size_t len,
			 char out[IDEMKEY_MAX + 1])
{
	return join(prefix, value, len, 0x20, out);
}

int keysrc_url_decode(const char *s, size_t len, char *buf, size_t cap)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++) {
		char c = s[i];

		if (c == '%') {
			int hi, lo;

			if (i + 2 >= len)
				return -1;
			hi = hex_digit(s[i + 1]);
			lo = hex_digit(s[i + 2]);
			if (hi < 0 || lo < 0)
				return -1;
			c = (char)(hi << 4 | lo);
			i += 2;
		} else if (c == '+') {
			c = ' ';
		}
		if (n == cap)
			return -1;
		buf[n++] = c;
	}
	return (int)n;
}

/* Find name in "a=1&b=2" (names compared after decoding). */
static int pairs_lookup(const char *s, size_t len, const char *name,
			const char *prefix, char out[IDEMKEY_MAX + 1])
{
	size_t i = 0;

	while (i < len) {
		size_t start = i, eq, end;
		char dname[256], dval[IDEMKEY_MAX + 1];
		int nlen, vlen;

		while (i < len && s[i] != '&')
			i++;
		end = i++;
		for (eq = start; eq < end && s[eq] != '='; eq++)
			;
		nlen = keysrc_url_decode(s + start, eq - start, dname, sizeof(dname));
		if (nlen < 0 || (size_t)nlen != strlen(name) ||
		    memcmp(dname, name, (size_t)nlen) != 0)
			continue;
		if (eq == end)
			return KEYSRC_INVALID;	/* "key" with no '=' */
		vlen = keysrc_url_decode(s + eq + 1, end - eq - 1, dval, sizeof(dval));
		if (vlen < 0)
			return KEYSRC_INVALID;
		return keysrc_finish(prefix, dval, (size_t)vlen, out);
	}
	return KEYSRC_MISSING;
}

int keysrc_query(const char *target, const char *name, const char *prefix,
		 char out[IDEMKEY_MAX + 1])
{
	const char *q = strchr(target, '?');
	size_t len;

	if (q == NULL)
		return KEYSRC_MISSING;
	q++;
	len = strcspn(q, "#");
	return pairs_lookup(q, len, name, prefix, out);
}

int keysrc_form(const char *body, size_t len, const char *field,
		const char *prefix, char out[IDEMKEY_MAX + 1])
{
	return pairs_lookup(body, len, field, prefix, out);
}

int keysrc_json(const char *body, size_t len, const char *pointer,
		const char *prefix, char out[IDEMKEY_MAX + 1])
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *root, *v = NULL;
	char num[32];
	const char *s = NULL;
	size_t slen = 0;
	int rc = KEYSRC_INVALID;

	if (tok == NULL)
		return KEYSRC_INVALID;
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT);	/* RFC 8259 only */
	root = json_tokener_parse_ex(tok, body, (int)len);
	if (root == NULL || json_tokener_get_error(tok) != json_tokener_success ||
	    json_tokener_get_parse_end(tok) != len) {
		/* malformed, truncated, or trailing bytes: no key to be had */
		json_object_put(root);
		json_tokener_free(tok);
		return KEYSRC_MISSING;
	}
	json_tokener_free(tok);
	if (json_pointer_get(root, pointer, &v) != 0 || v == NULL) {
		rc = KEYSRC_MISSING;
		goto out;
	}
	switch (json_object_get_type(v)) {
	case json_type_string:
		s = json_object_get_string(v);
		slen = (size_t)json_object_get_string_len(v);
		if (memchr(s, '\0', slen) != NULL)
			goto out;
		break;
	case json_type_int:
		/* integers only: 1.0 and 1 must not be different keys */
		snprintf(num, sizeof(num), "%lld", (long long)json_object_get_int64(v));
		s = num;
		slen = strlen(num);
		break;
	default:
		goto out;
	}
	rc = keysrc_finish(prefix, s, slen, out);
out:
	json_object_put(root);
	return rc;
}
