/*
 * store_cache.h - an in-process cache of completed responses in front of
 * another store (PostgreSQL, with or without Redis).
 *
 * A completed record is immutable until it expires or is purged, so every
 * worker of the process can replay it from memory:
 *
 *   claim     a cached record with the claim's fingerprint: STORE_COMPLETED
 *             (idemproxy_response_cache_hits_total); with another one:
 *             STORE_MISMATCH. Otherwise the inner store's claim, whose
 *             STORE_COMPLETED fills the cache (read-through).
 *   complete  the inner store's; STORE_OK fills the cache (write-through).
 *   the rest  the inner store's.
 *
 * Never past expiry: an entry expires at (when the call that learned it was
 * made) + (the record's life as the store reported it), which is never
 * later than the record's expires_at (the store's clock ran from a later
 * moment). Nothing else changes a completed record before it expires but
 * an explicit purge, which PostgreSQL announces to every instance with
 * NOTIFY idemproxy, 'purge:<scope>:<key>' (or 'purge:*' for everything):
 * the entry is dropped, a fill whose claim started before the purge
 * was heard is not kept, and a hit not yet delivered goes to the inner
 * store instead. A purge through the cache answers once the process heard
 * it (or after a second), so every instance hears it about then. While no listener of the process is up, purges
 * could go unheard: nothing is served or kept, and everything is dropped
 * when hearing stops or resumes.
 *
 * Bounded by bytes (keys, heads and bodies); the oldest entries go first.
 * One table for the process, behind one mutex.
 */
#ifndef IDEMPROXY_STORE_CACHE_H
#define IDEMPROXY_STORE_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "store.h"

/* Wraps inner (taken: freed with the cache). NULL when out of memory (inner
 * is freed then too). */
struct store *store_cache_new(struct store *inner, uint64_t max_bytes);

/* What the store behind heard (any thread): a notification payload, and
 * whether a listener went up or down. */
void store_cache_notified(struct store *s, const char *payload);
void store_cache_listening(struct store *s, bool up);
/* Purges may go unheard whatever the listeners say (a pooler shares their
 * sessions): nothing is served or kept from now on. */
void store_cache_deaf(struct store *s);

#endif
