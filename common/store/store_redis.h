/*
 * store_redis.h - Redis as a fast path in front of another store.
 *
 * store_redis_new() wraps an inner store (PostgreSQL, or memory in tests)
 * and returns a store that answers duplicates of completed requests from a
 * Redis cache, without touching the inner store:
 *
 *   claim     GET idemproxy:<scope>:<key>, bounded by a short timeout.
 *             A cached record with the claim's fingerprint: STORE_COMPLETED
 *             (counted in idemproxy_redis_hits_total); with another
 *             fingerprint: STORE_MISMATCH. A miss, an error, a timeout or
 *             Redis down: the inner store's claim, its result passed through
 *             unchanged. The inner store alone decides who wins.
 *   complete  the inner store's; when it says STORE_OK the record is written
 *             through by a script that expires the copy, on the server's
 *             clock, no later than the record, and writes nothing when a
 *             copy is there or a purge came after the record was learned;
 *             fire and forget: failures are only counted
 *             (idemproxy_store_errors_total{store="redis"}).
 *   inspect   the inner store's, then GET: a copy is added to found.
 *   purge     the inner store's, then one script: the old value (found)
 *             and, in its place, a tombstone that claims read as a miss
 *             and that lives as long as the purged record could have: a
 *             read- or write-through that learned the record before the
 *             purge, however late it arrives, cannot put it back.
 *   release, extend, watch, sweep, ready: the inner store's. Redis never
 *             affects readiness and is never an error: losing its data (down,
 *             slow, flushed, evicted) only sends claims to the inner store.
 *   free      closes the Redis connections, then frees the inner store.
 *
 * Connections: hiredis async contexts are not thread-safe, so there is one
 * connection per (store, event_base), made on the first operation on that
 * base, driven by that base (hiredis' libevent adapter) and reconnected with
 * back-off (100 ms doubling to 5 s). While it is down, claims go straight to
 * the inner store.
 *
 * Connection lifetime: a connection's events live on its event_base, so it
 * must be closed before that base is freed. That happens by itself when the
 * thread that used the base exits (a thread-specific destructor), which
 * covers worker threads (joined before worker_free() frees their bases).
 * A base freed by a thread that keeps running - or the main thread's base,
 * if it is freed before the store - needs store_redis_thread_done() first,
 * called on that thread. Whatever is left is closed by store_free(), which
 * must run after every thread that used the store has exited or called
 * store_redis_thread_done() for its bases, and while the bases of the
 * calling thread are still alive.
 *
 * The host name is resolved once, by store_redis_new(), so that no worker
 * ever blocks in DNS; if it cannot be resolved yet the fast path stays off
 * and the resolution is retried by store_sweep() (the main thread's timer).
 *
 * Cached value (all integers big-endian), STORE_REDIS_MAGIC "IPR2" first:
 *
 *   offset  size  field
 *   0       4     magic "IPR2" (format version 2)
 *   4       16    epoch: the first 16 characters of the master_replid of
 *                 the server it was written to (a promoted replica or a
 *                 restarted server has another: the copy is then a miss)
 *   20      32    fingerprint (SHA-256) of the request that completed it
 *   52      2     status
 *   54      1     flags: bit 0 = body_stored (0: too large, duplicates 409)
 *   55      4     head length H
 *   59      H     head ("Name: value\r\n"...)
 *   59+H    4     body length B
 *   63+H    B     body
 *
 * The value is exactly 63 + H + B bytes; anything else is a miss.
 */
#ifndef IDEMPROXY_STORE_REDIS_H
#define IDEMPROXY_STORE_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

#define STORE_REDIS_MAGIC "IPR2"
#define STORE_REDIS_EPOCH_LEN 16
#define STORE_REDIS_HDR_LEN 63		/* bytes besides head and body */
#define STORE_REDIS_TIMEOUT_MS 50	/* claim lookup bound, default */

struct event_base;

/*
 * A Redis fast path over inner, which the returned store owns from then on
 * (also on failure: inner is freed when NULL is returned). host is a name
 * or an address, port a decimal string, db the database index (SELECT).
 * Does not connect: connections are made by the first operation on each
 * event_base. Returns NULL with a message in err on bad arguments.
 */
struct store *store_redis_new(struct store *inner, const char *host,
			      const char *port, int db, char *err, size_t errlen);

/*
 * The same with Redis Sentinel: sentinels is "host:port,..." (hostport.h's
 * canonical list), master the name they monitor. Each connection asks
 * them for the master before it connects, checks ROLE, and asks again
 * after a failure or a READONLY answer (the master was demoted).
 */
struct store *store_redis_new_sentinel(struct store *inner,
				       const char *sentinels,
				       const char *master, int db, char *err,
				       size_t errlen);

/* The bound on a claim's Redis lookup (default STORE_REDIS_TIMEOUT_MS).
 * Takes effect for lookups started afterwards. */
void store_redis_set_timeout(struct store *s, unsigned ms);

/*
 * Close this thread's connection on base, if any, so that base can be freed.
 * Call on the thread that ran base, after its operations were finished or
 * cancelled. Safe to call when no connection was made.
 */
void store_redis_thread_done(struct store *s, struct event_base *base);

/* Is base's connection established (for tests)? */
bool store_redis_connected(struct store *s, struct event_base *base);

/*
 * The cached value for a completed record: a malloc'ed buffer of *len
 * bytes, NULL if out of memory or too large for the format.
 */
char *store_redis_encode(const uint8_t fp[FP_LEN], const char *epoch,
			 const struct stored_response *resp, size_t *len);

/* Parse a cached value: the response (one reference), its fingerprint into
 * fp and its epoch into epoch, or NULL when buf is not a well-formed value. */
struct stored_response *store_redis_decode(const char *buf, size_t len,
					   uint8_t fp[FP_LEN],
					   char epoch[STORE_REDIS_EPOCH_LEN + 1]);

#endif
