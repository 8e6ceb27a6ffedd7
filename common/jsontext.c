/*
 * jsontext.c - see jsontext.h.
 */
#include "jsontext.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "hex.h"
#include "utf8.h"

/* Deepest nesting jsontext_scan() can follow at all. */
#define DEPTH_LIMIT 256

void jsontext_free(struct jsontext *t)
{
	free(t->members);
	free(t->numbers);
	memset(t, 0, sizeof(*t));
}

/* Room for one more of an array of *n elements of size sz. */
static int grow(void **p, size_t *n, size_t *cap, size_t sz)
{
	void *q;

	if (*n < *cap)
		return 0;
	q = realloc(*p, (*cap ? 2 * *cap : 16) * sz);
	if (q == NULL)
		return -1;
	*p = q;
	*cap = *cap ? 2 * *cap : 16;
	return 0;
}

/* The code unit of the four hex digits at s, or -1. */
static long escape_unit(const char *s, size_t left)
{
	long u = 0;

	if (left < 4)
		return -1;
	for (int i = 0; i < 4; i++) {
		int d = hex_digit(s[i]);

		if (d < 0)
			return -1;
		u = u << 4 | d;
	}
	return u;
}

/* Past an escape of a string at s[*i] (after the backslash): -1 for one
 * that reads as something else, or as nothing. */
static int escape(const char *s, size_t len, size_t *i)
{
	long u, lo;

	if (s[*i] != 'u')
		return 0;
	u = escape_unit(s + *i + 1, len - *i - 1);
	if (u <= 0)
		return -1;			/* \u0000 */
	*i += 4;
	if (u >= 0xdc00 && u <= 0xdfff)
		return -1;			/* a lone low surrogate */
	if (u < 0xd800 || u > 0xdbff)
		return 0;
	if (*i + 2 >= len || s[*i + 1] != '\\' || s[*i + 2] != 'u')
		return -1;			/* a lone high one */
	lo = escape_unit(s + *i + 3, len - *i - 3);
	if (lo < 0xdc00 || lo > 0xdfff)
		return -1;
	*i += 6;
	return 0;
}

/* The number whose text starts at s[*i]: read into t, *i on its last
 * character. */
static int number(const char *s, size_t len, size_t *i, struct jsontext *t)
{
	char text[512];
	size_t n;

	for (n = 1; *i + n < len && s[*i + n] != '\0' &&
		    strchr("0123456789+-.eE", s[*i + n]) != NULL; n++)
		;
	if (n >= sizeof(text) ||
	    grow((void **)&t->numbers, &t->nnum, &t->capnum,
		 sizeof(*t->numbers)) < 0)
		return -1;
	memcpy(text, s + *i, n);
	text[n] = '\0';
	t->numbers[t->nnum] = strtod(text, NULL);
	if (!isfinite(t->numbers[t->nnum++]))
		return -1;			/* 1e400 */
	*i += n - 1;
	return 0;
}

int jsontext_scan(const char *s, size_t len, int max_depth, struct jsontext *t)
{
	/* the object each open bracket is, or SIZE_MAX for an array */
	size_t open[DEPTH_LIMIT];
	int depth = 0;
	bool in_string = false;

	memset(t, 0, sizeof(*t));
	if (max_depth > DEPTH_LIMIT)
		max_depth = DEPTH_LIMIT;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];

		if (in_string) {
			size_t n;

			if ((unsigned char)c >= 0x80) {
				n = utf8_len((const unsigned char *)s + i, len - i);
				if (n == 0)
					return -1;	/* not UTF-8 */
				i += n - 1;
				continue;
			}
			if ((unsigned char)c < 0x20)
				return -1;	/* a raw control byte */
			if (c == '"')
				in_string = false;
			else if (c == '\\' && ++i < len && escape(s, len, &i) < 0)
				return -1;
			continue;
		}
		switch (c) {
		case '"':
			in_string = true;
			break;
		case '{':
		case '[':
			if (depth == max_depth)
				return -1;
			if (c == '[') {
				open[depth++] = SIZE_MAX;
				break;
			}
			if (grow((void **)&t->members, &t->nobj, &t->capobj,
				 sizeof(*t->members)) < 0)
				return -1;
			t->members[t->nobj] = 0;
			open[depth++] = t->nobj++;
			break;
		case '}':
		case ']':
			if (depth > 0)
				depth--;
			break;
		case ':':
			if (depth > 0 && open[depth - 1] != SIZE_MAX)
				t->members[open[depth - 1]]++;
			break;
		case '-':
		case '0': case '1': case '2': case '3': case '4':
		case '5': case '6': case '7': case '8': case '9':
			if (number(s, len, &i, t) < 0)
				return -1;
			break;
		case 't': case 'r': case 'u': case 'e':	/* true */
		case 'f': case 'a': case 'l': case 's':	/* false */
		case 'n':					/* null */
		case ' ': case '\t': case '\r': case '\n': case ',':
			break;
		default:
			return -1;	/* 'quotes', NaN, Infinity, ... */
		}
	}
	return 0;
}
