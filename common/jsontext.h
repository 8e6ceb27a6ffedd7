/*
 * jsontext.h - what a JSON text says that json-c would not tell: read from
 * the text json-c parsed, so that a value is taken only as written.
 *
 * json-c (0.16, even with JSON_TOKENER_STRICT) takes 'single quotes', NaN,
 * Infinity and raw control bytes in strings, and even with
 * JSON_TOKENER_VALIDATE_UTF8 overlong forms, encoded surrogates and code
 * points beyond U+10FFFF; it cuts member names at a \u0000 escape, turns a
 * lone surrogate escape into U+FFFD, keeps the last of a member named
 * twice, and clamps integers beyond 64 bits. The text itself has the
 * answers: jsontext_scan() refuses the first kinds and counts and reads
 * what the others would hide, for the caller to hold json-c's tree
 * against (jcs.c, jwt.c).
 */
#ifndef IDEMPROXY_JSONTEXT_H
#define IDEMPROXY_JSONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

/* What the text says, in the order it says it. */
struct jsontext {
	uint32_t *members;	/* of each object, in the order they open */
	size_t nobj, capobj;
	double *numbers;	/* each number as strtod() reads its text */
	size_t nnum, capnum;
};

/*
 * Scan s[0..len), a text json-c accepted, into t (zeroed first; free it
 * with jsontext_free() whatever the result). -1 for what RFC 8259 or a
 * single reading of the text forbids: outside strings a character JSON
 * has not (quotes other than '"', NaN, Infinity), a raw control byte in a
 * string, a string that is not UTF-8 (RFC 3629: no overlong form, no
 * encoded surrogate, nothing beyond U+10FFFF), a \u0000 escape, a lone
 * surrogate escape, nesting deeper than max_depth, a number beyond a
 * double's range or longer than 511 characters; and when out of memory.
 */
int jsontext_scan(const char *s, size_t len, int max_depth,
		  struct jsontext *t) MUSTCHECK;
void jsontext_free(struct jsontext *t);

#endif
