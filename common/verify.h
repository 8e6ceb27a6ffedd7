/*
 * verify.h - HMAC-SHA256 signatures of webhooks and payment callbacks
 * (DESIGN.md §4): GitHub style and Stripe style. Comparison is constant
 * time (CRYPTO_memcmp).
 */
#ifndef IDEMPROXY_VERIFY_H
#define IDEMPROXY_VERIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "route.h"

/*
 * Does header value sig prove that body was signed with secret?
 *   VERIFY_GITHUB: "sha256=<hex>" of HMAC(secret, body)
 *   VERIFY_STRIPE: "t=<unix>,v1=<hex>[,v1=<hex>...]" of HMAC(secret,
 *                  "<t>.<body>"); any v1 may match; t must be within
 *                  tolerance_ms of now.
 */
bool verify_signature(enum verify_format fmt, const char *secret,
		      size_t secret_len, const char *sig, size_t sig_len,
		      const void *body, size_t body_len, time_t now,
		      uint64_t tolerance_ms);

#endif
