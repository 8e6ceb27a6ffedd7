/*
 * citus_hash.h - which shard of a Citus hash-distributed table a text key
 * lands in: the value PostgreSQL's hashtext() (Citus' worker_hash() on
 * text) gives it, for the Citus store (store_citus.c) to send each key's
 * statements to the worker that owns it.
 */
#ifndef IDEMPROXY_CITUS_HASH_H
#define IDEMPROXY_CITUS_HASH_H

#include <stddef.h>
#include <stdint.h>

/* hashtext(s) of PostgreSQL (deterministic collation), as a signed 32-bit
 * value: Bob Jenkins' lookup3 mix over the bytes, little-endian words. */
int32_t citus_hash_text(const char *s, size_t len);

#endif
