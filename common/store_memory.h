/*
 * store_memory.h - the embedded store: one per process, shared by every
 * worker thread, no durability. Same semantics as the PostgreSQL store.
 */
#ifndef IDEMPROXY_STORE_MEMORY_H
#define IDEMPROXY_STORE_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

/* Milliseconds on some monotonic clock; replaceable for tests. */
typedef uint64_t (*store_clock_fn)(void);

/*
 * max_bytes bounds what records and stored responses take together. At the
 * bound, after expired records are swept: a new claim gets STORE_FULL, and a
 * completion is stored without its body (duplicates get 409
 * response-not-stored) - never is a record evicted, since that would let
 * a duplicate execute. clock may be NULL (CLOCK_MONOTONIC).
 */
struct store *store_memory_new(size_t max_bytes, store_clock_fn clock);

/* For tests and metrics: records held and bytes accounted. */
size_t store_memory_count(struct store *s);
size_t store_memory_bytes(struct store *s);

#endif
