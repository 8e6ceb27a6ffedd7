/*
 * cidr.h - address ranges such as "10.0.0.0/8,192.168.1.7,::1/128": which
 * peers are trusted to name the client (--trusted-proxies, X-Forwarded-For)
 * and, later, to send a PROXY protocol header.
 */
#ifndef IDEMPROXY_CIDR_H
#define IDEMPROXY_CIDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

struct cidr {
	uint8_t addr[16];	/* IPv4 as ::ffff:a.b.c.d */
	unsigned bits;		/* prefix length over those 128 bits */
};

struct cidr_set {
	struct cidr *v;
	size_t n;
};

/*
 * Parse a comma-separated list of addresses with optional "/bits" (IPv4 or
 * IPv6, blanks around items allowed). A range with bits set past its prefix
 * ("10.0.0.1/8") is refused: it is almost always a typing mistake. 0, or -1
 * with err set (naming the item).
 */
int cidr_parse(const char *list, struct cidr_set *out, char *err,
	       size_t errlen) MUSTCHECK;
void cidr_clear(struct cidr_set *s);

/* Is the textual address (as inet_ntop wrote it; "::ffff:1.2.3.4" too) in
 * the set? An address that does not parse is in no set. */
bool cidr_contains(const struct cidr_set *s, const char *addr);

/* Is the 16-byte address (IPv4-mapped for IPv4) in the set? */
bool cidr_contains_bytes(const struct cidr_set *s, const uint8_t addr[16]);

/* Parse one address into its 16-byte form; -1 when it is not one. */
int cidr_addr(const char *s, size_t len, uint8_t out[16]) MUSTCHECK;

#endif
