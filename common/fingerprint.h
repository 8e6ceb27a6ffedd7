/*
 * fingerprint.h - the request fingerprint: SHA-256 over the method, the raw
 * request-target and the body, each prefixed by its length so that no two
 * different requests share an encoding. Byte-for-byte definition and a test
 * vector: docs/protocol.md.
 */
#ifndef IDEMPROXY_FINGERPRINT_H
#define IDEMPROXY_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <openssl/types.h>

#include "compiler.h"

#define FP_LEN 32

/* Body given as n pieces (an evbuffer's chunks, peeked). Returns 0 or -1. */
int fp_compute(const char *method, const char *target, const struct iovec *body,
	       int n, uint8_t out[FP_LEN]) MUSTCHECK;

/*
 * A shaped fingerprint (fpshape.h; docs/protocol.md): the shaping's
 * description, the method, the target as shaped (target_len bytes), a byte
 * naming what the body pieces hold ('r' the raw bytes, 'j' the canonical
 * JSON, 'p' the values of fingerprint_only's pointers, 'f' the decoded
 * form fields), and the body pieces. Returns 0 or -1.
 */
int fp_compute_shaped(const char *shaping, size_t shaping_len,
		      const char *method, const char *target, size_t target_len,
		      char kind, const struct iovec *body, int n,
		      uint8_t out[FP_LEN]) MUSTCHECK;

/* OpenSSL's SHA-256, fetched once for the process: for every digest on a
 * request's path (EVP_sha256() looks it up again on each init). */
const EVP_MD *fp_sha256(void);

/* Lower-case hex of a fingerprint into buf (at least 2 * FP_LEN + 1). */
void fp_hex(const uint8_t fp[FP_LEN], char *buf);

#endif
