/*
 * hex.h - one hex digit's value, for the parsers that need it, and bytes
 * written as lowercase hex.
 */
#ifndef IDEMPROXY_HEX_H
#define IDEMPROXY_HEX_H

#include <stddef.h>

/* 0-15, or -1 when c is not a hex digit (either case). */
static inline int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* n bytes as 2n lowercase hex digits and a NUL: out holds 2n + 1. */
static inline void hex_encode(const void *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	const unsigned char *p = in;

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[p[i] >> 4];
		out[2 * i + 1] = digits[p[i] & 15];
	}
	out[2 * n] = '\0';
}

#endif
