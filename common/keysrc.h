/*
 * keysrc.h - where a route's idempotency key comes from besides a header:
 * the query string, an urlencoded form field, a JSON value (DESIGN.md §4).
 *
 * Each function writes the key (NUL-terminated, at most IDEMKEY_MAX bytes
 * after the prefix) into out and returns its length, or KEYSRC_MISSING when
 * the source has no such value (a body that does not parse has none), or
 * KEYSRC_INVALID when the value is there but is not a valid key (empty,
 * too long, not visible ASCII, an object). Every key is subject to the
 * syntax of idemkey.h.
 */
#ifndef IDEMPROXY_KEYSRC_H
#define IDEMPROXY_KEYSRC_H

#include <stddef.h>

#include "idemkey.h"

#define KEYSRC_MISSING (-1)
#define KEYSRC_INVALID (-2)

/* name=value in the query string of a raw request-target. */
int keysrc_query(const char *target, const char *name, const char *prefix,
		 char out[IDEMKEY_MAX + 1]);

/* field=value in an application/x-www-form-urlencoded body. */
int keysrc_form(const char *body, size_t len, const char *field,
		const char *prefix, char out[IDEMKEY_MAX + 1]);

/* The string or integer at an RFC 6901 pointer in a JSON body. */
int keysrc_json(const char *body, size_t len, const char *pointer,
		const char *prefix, char out[IDEMKEY_MAX + 1]);

/* Percent-decode s[0..len) ('+' is a space) into buf, which may be s
 * itself. Returns the decoded length, or -1 for a malformed escape or when
 * more than cap bytes would come out (never with cap >= len). */
int keysrc_url_decode(const char *s, size_t len, char *buf, size_t cap);

/* prefix + value, checked as a key: 1-255 visible ASCII characters. For
 * auto keys too. */
int keysrc_finish(const char *prefix, const char *value, size_t len,
		  char out[IDEMKEY_MAX + 1]);

/* The same for a key that may hold spaces: a header's sf-string
 * (idemkey.h), and a key an operator names (GET /keys/{key}): 1-255
 * printable ASCII characters (0x20-0x7E). */
int keysrc_finish_quoted(const char *prefix, const char *value, size_t len,
			 char out[IDEMKEY_MAX + 1]);

#endif
