/*
 * store_memory.h - the embedded store: one per process, shared by every
 * worker thread, no durability. Same semantics as the PostgreSQL store.
 */
#ifndef IDEMPROXY_STORE_MEMORY_H
#define IDEMPROXY_STORE_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

/* Milliseconds on some monotonic clock; replaceable for tests. */
typedef uint64_t (*store_clock_fn)(void);

/*
 * max_bytes bounds what records and stored responses take together. At the
 * bound, after a bounded sweep of expired records (see below): a new claim
 * gets STORE_FULL, and a completion is stored without its body (duplicates
 * get 409 response-not-stored) - never is a record evicted, since that would
 * let a duplicate execute. clock may be NULL (CLOCK_MONOTONIC).
 */
struct store *store_memory_new(size_t max_bytes, store_clock_fn clock);

/*
 * The most one operation does on the table besides finding its own record,
 * whatever the table's size:
 *  - while the table is doubling, it moves the next STORE_MEMORY_MOVE_BUCKETS
 *    buckets of the old table to the new one (records are looked up in
 *    both until all are moved);
 *  - at the bound, it sweeps expired records from the next buckets after
 *    the sweep cursor: at most STORE_MEMORY_SWEEP_BUCKETS buckets, and it
 *    stops after the chain in which it reached STORE_MEMORY_SWEEP_RECORDS
 *    records. A record no sweep reached yet is still never served once
 *    expired: every lookup checks the expiry.
 * The sweep timer (store_sweep) sweeps and moves a larger batch per call.
 */
#define STORE_MEMORY_MOVE_BUCKETS 16
#define STORE_MEMORY_SWEEP_BUCKETS 1024	/* a whole table of the first size */
#define STORE_MEMORY_SWEEP_RECORDS 64

/* For tests and metrics: records held and bytes accounted. */
size_t store_memory_count(struct store *s);
size_t store_memory_bytes(struct store *s);

/* For tests: the table's shape, and the work operations did. */
struct store_memory_stats {
	size_t count;		/* records */
	size_t nbuckets;	/* the table's (while doubling: the new one's) */
	bool doubling;		/* records are being moved to a doubled table */
	/* the most buckets and records one claim, complete, release, extend
	 * or watch looked at besides its own record (sweeping and moving),
	 * since the previous call */
	size_t op_buckets_max;
	size_t op_records_max;
};

void store_memory_stats(struct store *s, struct store_memory_stats *st);

/* For tests: the longest hash chain in either table (walks them all). */
size_t store_memory_longest_chain(struct store *s);

#endif
