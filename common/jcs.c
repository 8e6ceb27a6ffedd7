/*
 * jcs.c - see jcs.h.
 *
 * json-c parses (strictly); what it would let through or hide is read
 * from the text itself (jsontext.h): UTF-8 as RFC 3629 has it (json-c
 * takes overlong forms and encoded surrogates), the number of members
 * of every object, which a member named twice makes larger than what
 * json-c keeps (the last value), and every number as strtod() reads its
 * text - json-c clamps integers beyond 64 bits, JCS wants the nearest
 * double. adopt() holds the tree against the text and puts those doubles
 * in it.
 */
#include "jcs.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <json-c/json.h>

#include "jsontext.h"

/*
 * Does the tree json-c made of v hold what the text says, each object as
 * many members as the text wrote (no name twice)? v with its numbers
 * replaced by the text's - or, when v is a number itself, the text's as a
 * new value for the caller to put where v was - or NULL when it does not
 * (v is not NULL: json-c's null, which holds nothing to check).
 * *obj and *num walk t in the order jsontext_scan() filled it.
 */
static struct json_object *adopt(struct json_object *v,
				 const struct jsontext *t, size_t *obj,
				 size_t *num)
{
	struct json_object *c;

	switch (json_object_get_type(v)) {
	case json_type_int:
	case json_type_double:
		return *num < t->nnum ?
		       json_object_new_double(t->numbers[(*num)++]) : NULL;
	case json_type_object:
		if (*obj >= t->nobj ||
		    (size_t)json_object_object_length(v) != t->members[(*obj)++])
			return NULL;
		json_object_object_foreach(v, name, member) {
			if (member == NULL)
				continue;	/* null: json-c's NULL */
			/* a replaced value goes in place, no relinking */
			if ((c = adopt(member, t, obj, num)) == NULL)
				return NULL;
			if (c != member && json_object_object_add(v, name, c) < 0) {
				json_object_put(c);
				return NULL;
			}
		}
		return v;
	case json_type_array:
		for (size_t i = 0; i < json_object_array_length(v); i++) {
			struct json_object *e = json_object_array_get_idx(v, i);

			if (e == NULL)
				continue;
			if ((c = adopt(e, t, obj, num)) == NULL)
				return NULL;
			if (c != e && json_object_array_put_idx(v, i, c) < 0) {
				json_object_put(c);
				return NULL;
			}
		}
		return v;
	default:
		return v;
	}
}

struct json_object *jcs_parse(const char *body, size_t len)
{
	struct json_tokener *tok;
	struct json_object *root, *adopted = NULL;
	struct jsontext t;
	size_t obj = 0, num = 0;
	bool ok;

	if (len > INT32_MAX || (tok = json_tokener_new_ex(JCS_DEPTH_MAX)) == NULL)
		return NULL;
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT |
				    JSON_TOKENER_VALIDATE_UTF8);
	root = json_tokener_parse_ex(tok, body, (int)len);
	if (root == NULL && json_tokener_get_error(tok) == json_tokener_continue &&
	    json_tokener_get_parse_end(tok) == len)
		root = json_tokener_parse_ex(tok, "", 1);  /* a bare number ends */
	else if (json_tokener_get_parse_end(tok) != len)
		goto fail;		/* trailing bytes */
	if (root == NULL || json_tokener_get_error(tok) != json_tokener_success)
		goto fail;
	json_tokener_free(tok);
	ok = jsontext_scan(body, len, JCS_DEPTH_MAX, &t) == 0 &&
	     (adopted = adopt(root, &t, &obj, &num)) != NULL;
	if (ok && adopted != root) {	/* a bare number */
		json_object_put(root);
		root = adopted;
	}
	ok = ok && obj == t.nobj && num == t.nnum;
	jsontext_free(&t);
	if (!ok) {
		json_object_put(root);
		return NULL;
	}
	return root;
fail:
	json_object_put(root);
	json_tokener_free(tok);
	return NULL;
}

/* ---- numbers -------------------------------------------------------------- */

/*
 * The fewest significant digits whose number is d, and of those the
 * nearest to d (ECMA-262 Number::toString): into digits, with d = 0.digits
 * x 10^*n. At each precision printf gives the correctly rounded digits; when
 * they do not read back as d, the neighbour on d's other side may.
 */
static void shortest(double d, char digits[24], int *n)
{
	char s[48];
	unsigned long long m = 0;
	int k, x;

	for (int p = 1; p <= 17; p++) {
		double r;

		snprintf(s, sizeof(s), "%.*e", p - 1, d);
		r = strtod(s, NULL);
		m = 0;
		for (const char *c = s; *c != 'e'; c++)
			if (*c != '.')
				m = m * 10 + (unsigned long long)(*c - '0');
		x = atoi(strchr(s, 'e') + 1) - (p - 1);	/* d ~ m x 10^x */
		if (r == d)
			break;
		m = r < d ? m + 1 : m - 1;
		snprintf(s, sizeof(s), "%llue%d", m, x);
		if (strtod(s, NULL) == d)
			break;
	}
	k = snprintf(digits, 24, "%llu", m);
	while (k > 1 && digits[k - 1] == '0') {
		digits[--k] = '\0';
		x++;
	}
	*n = k + x;
}

int jcs_number(double d, char buf[JCS_NUMBER_MAX])
{
	char digits[24];
	const char *sign = d < 0 ? "-" : "";
	int k, n;

	if (!isfinite(d))
		return -1;
	if (d == 0) {			/* -0 too */
		strcpy(buf, "0");
		return 0;
	}
	shortest(fabs(d), digits, &n);	/* k <= 17, -323 <= n <= 309 */
	k = (int)strlen(digits);
	if (k <= n && n <= 21)		/* 1234000 */
		snprintf(buf, JCS_NUMBER_MAX, "%s%s%.*s", sign, digits, n - k,
			 "000000000000000000000");
	else if (0 < n && n <= 21)	/* 12.34 */
		snprintf(buf, JCS_NUMBER_MAX, "%s%.*s.%s", sign, n, digits,
			 digits + n);
	else if (-6 < n && n <= 0)	/* 0.001234 */
		snprintf(buf, JCS_NUMBER_MAX, "%s0.%.*s%s", sign, -n, "00000",
			 digits);
	else				/* 1.234e+21, 1e-7 */
		snprintf(buf, JCS_NUMBER_MAX, "%s%c%s%se%c%d", sign, digits[0],
			 k > 1 ? "." : "", digits + 1, n > 0 ? '+' : '-',
			 abs(n - 1));
	return 0;
}

/* ---- strings and member order --------------------------------------------- */

static int write_string(struct evbuffer *out, const char *s, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t plain = 0;
	int rc = evbuffer_add(out, "\"", 1);

	for (size_t i = 0; i < len && rc == 0; i++) {
		unsigned char ch = (unsigned char)s[i];
		char esc[7] = "\\u00";
		size_t n = 2;

		if (ch >= 0x20 && ch != '"' && ch != '\\')
			continue;
		switch (ch) {
		case '"': esc[1] = '"'; break;
		case '\\': esc[1] = '\\'; break;
		case '\b': esc[1] = 'b'; break;
		case '\f': esc[1] = 'f'; break;
		case '\n': esc[1] = 'n'; break;
		case '\r': esc[1] = 'r'; break;
		case '\t': esc[1] = 't'; break;
		default:
			esc[4] = hex[ch >> 4];
			esc[5] = hex[ch & 15];
			n = 6;
			break;
		}
		rc = evbuffer_add(out, s + plain, i - plain);
		if (rc == 0)
			rc = evbuffer_add(out, esc, n);
		plain = i + 1;
	}
	if (rc == 0)
		rc = evbuffer_add(out, s + plain, len - plain);
	if (rc == 0)
		rc = evbuffer_add(out, "\"", 1);
	return rc;
}

/* The next UTF-16 code unit of valid UTF-8 text *s (NUL-terminated), 0 at
 * its end; *pending holds a low surrogate still to come. */
static unsigned utf16_next(const unsigned char **s, unsigned *pending)
{
	const unsigned char *p = *s;
	unsigned cp;

	if (*pending) {
		cp = *pending;
		*pending = 0;
		return cp;
	}
	if (p[0] < 0x80) {
		cp = p[0];
		*s = p + (p[0] != 0);
	} else if (p[0] < 0xe0) {
		cp = (p[0] & 0x1fu) << 6 | (p[1] & 0x3fu);
		*s = p + 2;
	} else if (p[0] < 0xf0) {
		cp = (p[0] & 0x0fu) << 12 | (p[1] & 0x3fu) << 6 | (p[2] & 0x3fu);
		*s = p + 3;
	} else {
		cp = (p[0] & 0x07u) << 18 | (p[1] & 0x3fu) << 12 |
		     (p[2] & 0x3fu) << 6 | (p[3] & 0x3fu);
		*s = p + 4;
		cp -= 0x10000;
		*pending = 0xdc00 + (cp & 0x3ff);
		cp = 0xd800 + (cp >> 10);
	}
	return cp;
}

/* Member names in the order of their UTF-16 code units (RFC 8785 §3.2.3). */
static int by_utf16(const void *a, const void *b)
{
	const unsigned char *x = *(const unsigned char *const *)a;
	const unsigned char *y = *(const unsigned char *const *)b;
	unsigned px = 0, py = 0;

	for (;;) {
		unsigned ux = utf16_next(&x, &px), uy = utf16_next(&y, &py);

		if (ux != uy)
			return ux < uy ? -1 : 1;
		if (ux == 0)
			return 0;
	}
}

static int write_value(struct evbuffer *out, const struct json_object *v);

static int write_object(struct evbuffer *out, struct json_object *v)
{
	size_t n = (size_t)json_object_object_length(v), i = 0;
	const char **names = n ? malloc(n * sizeof(*names)) : NULL;
	int rc = -1;

	if (n && names == NULL)
		return -1;
	json_object_object_foreach(v, name, member) {
		(void)member;
		names[i++] = name;
	}
	if (n > 1)
		qsort(names, n, sizeof(*names), by_utf16);
	if (evbuffer_add(out, "{", 1) < 0)
		goto out;
	for (i = 0; i < n; i++) {
		struct json_object *m = NULL;

		(void)json_object_object_get_ex(v, names[i], &m);
		if ((i > 0 && evbuffer_add(out, ",", 1) < 0) ||
		    write_string(out, names[i], strlen(names[i])) < 0 ||
		    evbuffer_add(out, ":", 1) < 0 || write_value(out, m) < 0)
			goto out;
	}
	rc = evbuffer_add(out, "}", 1);
out:
	free(names);
	return rc;
}

static int write_value(struct evbuffer *out, const struct json_object *cv)
{
	struct json_object *v = (struct json_object *)cv;  /* json-c's API */
	char num[JCS_NUMBER_MAX];
	double d;

	switch (json_object_get_type(v)) {
	case json_type_null:
		return evbuffer_add(out, "null", 4);
	case json_type_boolean:
		return json_object_get_boolean(v) ? evbuffer_add(out, "true", 4) :
						    evbuffer_add(out, "false", 5);
	case json_type_int:	/* not from jcs_parse(), which makes doubles */
	case json_type_double:
		d = json_object_get_double(v);
		if (jcs_number(d, num) < 0)
			return -1;
		return evbuffer_add(out, num, strlen(num));
	case json_type_string:
		return write_string(out, json_object_get_string(v),
				    (size_t)json_object_get_string_len(v));
	case json_type_array:
		if (evbuffer_add(out, "[", 1) < 0)
			return -1;
		for (size_t i = 0; i < json_object_array_length(v); i++)
			if ((i > 0 && evbuffer_add(out, ",", 1) < 0) ||
			    write_value(out, json_object_array_get_idx(v, i)) < 0)
				return -1;
		return evbuffer_add(out, "]", 1);
	case json_type_object:
		return write_object(out, v);
	}
	return -1;
}

int jcs_write(struct evbuffer *out, const struct json_object *v)
{
	return write_value(out, v);
}
