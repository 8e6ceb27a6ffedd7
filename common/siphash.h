/*
 * siphash.h - SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast
 * short-input PRF", 2012): a 64-bit hash under a 128-bit secret key.
 *
 * For in-process hash tables whose keys a client chooses (idempotency
 * keys): without the key, nobody can choose names that land in one bucket,
 * as they can for an unkeyed hash such as FNV-1a. Draw the key at random
 * (RAND_bytes) once per table or per process, and never show it.
 */
#ifndef IDEMPROXY_SIPHASH_H
#define IDEMPROXY_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

#define SIPHASH_KEY_LEN 16

/* SipHash-2-4 of in[0..len) under key. The 8 output bytes of the reference
 * implementation are this value's little-endian encoding. */
uint64_t siphash24(const uint8_t key[SIPHASH_KEY_LEN], const void *in, size_t len);

#endif
