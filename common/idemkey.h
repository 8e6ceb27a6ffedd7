/*
 * idemkey.h - Idempotency-Key syntax (DESIGN.md §1 item 3, §7;
 * draft-ietf-httpapi-idempotency-key-header: the field is an RFC 8941
 * sf-string).
 *
 * Accepted, either:
 *   - an RFC 8941 sf-string: "..." holding printable ASCII (0x20-0x7E,
 *     spaces included) with \" and \\ as its only escapes, optionally
 *     followed by parameters (;name or ;name=value, RFC 8941 §3.1.2), which
 *     are checked and are not part of the key: "k";v=1 is the key k;
 *   - or, as a compatibility with clients that send a bare value, 1-255
 *     visible ASCII characters (0x21-0x7E) taken as they are, a ';' and
 *     what follows it included (abc;v=1 is the key abc;v=1, as before).
 * The limit counts the unquoted key: "abc" and abc are the same key.
 */
#ifndef IDEMPROXY_IDEMKEY_H
#define IDEMPROXY_IDEMKEY_H

#include <stddef.h>

#include "compiler.h"

#define IDEMKEY_MAX 255

/*
 * Parse a header value (leading and trailing spaces or tabs are ignored)
 * into out (IDEMKEY_MAX + 1 bytes, NUL-terminated). Returns the key length,
 * or -1 when the value is not a valid key, with *why (when why is not NULL)
 * a static sentence saying what is wrong.
 */
int idemkey_parse(const char *value, size_t len, char out[IDEMKEY_MAX + 1],
		  const char **why) MUSTCHECK;

#endif
