/*
 * issue.h - issued keys (DESIGN.md §4, article §4.3 and §6), in one place:
 * minting one for GET /.well-known/idempotency-key, the marker record that
 * says "issued here", and the checks require_issued_key makes.
 *
 * A key is 128 random bits in URL-safe base64, then "." and the issue time
 * in seconds. Its marker lives in the store under ISSUE_SCOPE, which no
 * hashed scope (64 hex digits) nor the global one ("") can equal, for the
 * longest issued_key_ttl of the global settings and every route.
 */
#ifndef IDEMPROXY_ISSUE_H
#define IDEMPROXY_ISSUE_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "compiler.h"
#include "store.h"

#define ISSUE_PATH "/.well-known/idempotency-key"
#define ISSUE_SCOPE "!issued"

struct config;

/* Is target (query ignored) the issuing path? */
bool issue_is_path(const char *target);

/* A fresh key into key. 0, or -1 when no randomness is to be had. */
int issue_mint(char key[IDEMKEY_MAX + 1], time_t now) MUSTCHECK;

/* How long a marker lives (and holds its lease). */
uint64_t issue_marker_ttl(const struct config *cfg);

/* The claim that records (or, for a check, finds) key's marker. */
void issue_marker(const char *key, uint64_t ttl_ms, struct store_claim *m);

/* The issue time a key carries, or 0 when it is not one of ours. */
time_t issue_time(const char *key);

/* Was a key issued at `at` still usable at `now` (within ttl_ms, and not
 * from the future beyond a minute of clock skew)? */
bool issue_fresh(time_t at, time_t now, uint64_t ttl_ms);

#endif
