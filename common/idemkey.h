/*
 * idemkey.h - Idempotency-Key syntax (DESIGN.md §1 item 3, §7).
 *
 * Accepted: 1-255 visible ASCII characters (0x21-0x7E), either bare or as an
 * RFC 8941 sf-string ("...", with \" and \\ escapes). The limit counts the
 * unquoted key; "abc" and abc are the same key.
 */
#ifndef IDEMPROXY_IDEMKEY_H
#define IDEMPROXY_IDEMKEY_H

#include <stddef.h>

#include "compiler.h"

#define IDEMKEY_MAX 255

/*
 * Parse a header value (leading and trailing spaces or tabs are ignored)
 * into out (IDEMKEY_MAX + 1 bytes, NUL-terminated). Returns the key length,
 * or -1 when the value is not a valid key.
 */
int idemkey_parse(const char *value, size_t len, char out[IDEMKEY_MAX + 1]) MUSTCHECK;

#endif
