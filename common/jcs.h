/*
 * jcs.h - the JSON Canonicalization Scheme (RFC 8785): one byte string per
 * JSON value, whatever the member order, spacing, escapes and number
 * spelling of the text it came from. Routes with `fingerprint = json` are
 * fingerprinted over it (fpshape.h).
 *
 * Numbers are IEEE 754 doubles in JCS, as in JavaScript: integers beyond
 * 2^53 lose precision (9007199254740993 and 9007199254740992 are one
 * number). A body that relies on them should keep `fingerprint = body`.
 */
#ifndef IDEMPROXY_JCS_H
#define IDEMPROXY_JCS_H

#include <stddef.h>

#include "compiler.h"

struct evbuffer;
struct json_object;

/* "-1.7976931348623157e+308" (25 bytes) fits, with room that compilers
 * can see. */
#define JCS_NUMBER_MAX 64

/* Deepest nesting of arrays and objects taken. */
#define JCS_DEPTH_MAX 64

/*
 * JSON text body[0..len) as a json-c value (json_object_put() it), or NULL
 * when it is not a value JCS represents exactly: not RFC 8259 JSON, not
 * UTF-8 (RFC 3629: an overlong form, an encoded surrogate or a code point
 * beyond U+10FFFF is not), a lone surrogate escape, a \u0000 escape, one
 * member name twice in an object, nesting deeper than JCS_DEPTH_MAX, a
 * number beyond a double's range or written with more than 511
 * characters. Its numbers are all doubles, each the nearest to what the
 * text wrote.
 */
struct json_object *jcs_parse(const char *body, size_t len);

/* Append the canonical form of v, a value from jcs_parse() or a part of
 * one, to out. 0, or -1 when out of memory. */
int jcs_write(struct evbuffer *out, const struct json_object *v) MUSTCHECK;

/* d as ECMAScript's Number.prototype.toString() writes it (RFC 8785
 * §3.2.2.3): 0, -5e-324, 1e+21, 0.000001, 333333333.3333333. -1 for NaN
 * and the infinities, which JSON cannot carry. */
int jcs_number(double d, char buf[JCS_NUMBER_MAX]) MUSTCHECK;

#endif
