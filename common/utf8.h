/*
 * utf8.h - the one check of a UTF-8 sequence that the JSON writers (log.c,
 * accesslog.c, otel.c) and the JSON reader's checks (jsontext.c) share.
 * Header-only: it runs per byte of every JSON string written.
 */
#ifndef IDEMPROXY_UTF8_H
#define IDEMPROXY_UTF8_H

#include <stddef.h>

/*
 * The length of the well-formed UTF-8 sequence at s (at most left bytes),
 * or 0 when the bytes there are not one RFC 3629 allows (Unicode's table
 * 3-7): an ASCII byte or a continuation byte first, a sequence cut short,
 * an overlong form (C0 80, E0 80 80), an encoded surrogate (ED A0 80), a
 * code point beyond U+10FFFF (F4 90 80 80, F5 and up).
 */
static inline size_t utf8_len(const unsigned char *s, size_t left)
{
	unsigned char lo = 0x80, hi = 0xbf;	/* what the second byte may be */
	size_t n;

	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 3;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4;
	else
		return 0;
	if (s[0] == 0xe0)
		lo = 0xa0;			/* below U+0800: overlong */
	else if (s[0] == 0xed)
		hi = 0x9f;			/* U+D800-DFFF */
	else if (s[0] == 0xf0)
		lo = 0x90;			/* below U+10000: overlong */
	else if (s[0] == 0xf4)
		hi = 0x8f;			/* beyond U+10FFFF */
	if (left < n || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < n; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return n;
}

#endif
