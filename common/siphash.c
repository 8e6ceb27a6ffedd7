/*
 * siphash.c - SipHash-2-4 (see siphash.h), written from the paper's
 * definition: four 64-bit words of state, two SipRounds per 8-byte word of
 * input, the length in the last word's top byte, four rounds to finish.
 * The reference test vectors are checked in tests/unit/test_siphash.c.
 */
#include "siphash.h"

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

#define SIPROUND(v0, v1, v2, v3) do { \
	v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32); \
	v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2; \
	v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0; \
	v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32); \
} while (0)

/* Eight bytes as a little-endian word, whatever the host's order (the
 * compiler makes this one load on x86-64). */
static inline uint64_t load_le64(const uint8_t *p)
{
	return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
	       (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 |
	       (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
	       (uint64_t)p[7] << 56;
}

uint64_t siphash24(const uint8_t key[SIPHASH_KEY_LEN], const void *in, size_t len)
{
	const uint8_t *p = in, *end = p + (len & ~(size_t)7);
	uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
	uint64_t v0 = 0x736f6d6570736575ull ^ k0;	/* "somepseudorandomlygeneratedbytes" */
	uint64_t v1 = 0x646f72616e646f6dull ^ k1;
	uint64_t v2 = 0x6c7967656e657261ull ^ k0;
	uint64_t v3 = 0x7465646279746573ull ^ k1;
	uint64_t m, b = (uint64_t)len << 56;

	for (; p != end; p += 8) {
		m = load_le64(p);
		v3 ^= m;
		SIPROUND(v0, v1, v2, v3);
		SIPROUND(v0, v1, v2, v3);
		v0 ^= m;
	}
	switch (len & 7) {	/* the last 0-7 bytes, below the length */
	case 7: b |= (uint64_t)p[6] << 48; /* fall through */
	case 6: b |= (uint64_t)p[5] << 40; /* fall through */
	case 5: b |= (uint64_t)p[4] << 32; /* fall through */
	case 4: b |= (uint64_t)p[3] << 24; /* fall through */
	case 3: b |= (uint64_t)p[2] << 16; /* fall through */
	case 2: b |= (uint64_t)p[1] << 8; /* fall through */
	case 1: b |= (uint64_t)p[0]; break;
	case 0: break;
	}
	v3 ^= b;
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	v0 ^= b;
	v2 ^= 0xff;
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}
