/*
 * citus_hash.c - PostgreSQL's hash of a text value (see citus_hash.h).
 *
 * PostgreSQL hashes text with Bob Jenkins' lookup3 "hashlittle" mixing
 * (src/common/hashfn.c hash_bytes), seeded with 0x9e3779b9 + length +
 * 3923095: the bytes are taken 12 at a time as three little-endian 32-bit
 * words and mixed; the 0-11 left over are added into the words (into c
 * from its second byte up: its low byte is where lookup3 once put the
 * length), then a final avalanche. The word-at-a-time and byte-at-a-time
 * forms agree on a little-endian machine; this is the byte form, which is
 * endian-neutral. Checked against hashtext() by the unit test (fixed
 * vectors) and by tests/integration/test_citus.py (a live worker_hash()).
 */
#include "citus_hash.h"

static inline uint32_t rotl(uint32_t x, int k)
{
	return (x << k) | (x >> (32 - k));
}

#define MIX(a, b, c) do { \
	a -= c; a ^= rotl(c, 4);  c += b; \
	b -= a; b ^= rotl(a, 6);  a += c; \
	c -= b; c ^= rotl(b, 8);  b += a; \
	a -= c; a ^= rotl(c, 16); c += b; \
	b -= a; b ^= rotl(a, 19); a += c; \
	c -= b; c ^= rotl(b, 4);  b += a; \
} while (0)

#define FINAL(a, b, c) do { \
	c ^= b; c -= rotl(b, 14); \
	a ^= c; a -= rotl(c, 11); \
	b ^= a; b -= rotl(a, 25); \
	c ^= b; c -= rotl(b, 16); \
	a ^= c; a -= rotl(c, 4);  \
	b ^= a; b -= rotl(a, 14); \
	c ^= b; c -= rotl(b, 24); \
} while (0)

static inline uint32_t word(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

int32_t citus_hash_text(const char *s, size_t len)
{
	const unsigned char *k = (const unsigned char *)s;
	uint32_t a, b, c;
	/* the tail: bytes 0-3 into a, 4-7 into b, 8-10 into c from its
	 * second byte up (the low byte of c is lookup3's length slot) */
	uint32_t *dst[3] = { &a, &b, &c };

	a = b = c = 0x9e3779b9u + (uint32_t)len + 3923095u;
	while (len >= 12) {
		a += word(k);
		b += word(k + 4);
		c += word(k + 8);
		MIX(a, b, c);
		k += 12;
		len -= 12;
	}
	for (size_t i = 0; i < len; i++) {
		if (i < 8)
			*dst[i / 4] += (uint32_t)k[i] << (8 * (i % 4));
		else
			c += (uint32_t)k[i] << (8 * (i - 8 + 1));
	}
	FINAL(a, b, c);
	return (int32_t)c;
}
