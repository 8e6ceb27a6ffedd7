/*
 * store.h - the idempotency store interface.
 *
 * A store keeps one record per (scope, key): its fingerprint, its state
 * (in flight under a lease held by an owner token, completed with a
 * stored response, or of unknown outcome: the request may have executed
 * and nothing says what it did) and its expiry. Backends: the embedded memory store
 * (store_memory.c) and, beside it, PostgreSQL with an optional Redis fast
 * path. The engine (proxy/idem.c) sees only this interface.
 *
 * Each backend counts its own failures (idemproxy_store_errors_total, by
 * store); callers only act on the results.
 *
 * Every call is asynchronous: it returns a handle at once and reports
 * through its callback on the caller's event loop, never inside the call
 * itself. store_cancel() withdraws a handle; its callback will not run.
 * A handle is finished once its callback has run. Calls may be made from
 * any worker thread, each with its own event_base.
 */
#ifndef IDEMPROXY_STORE_H
#define IDEMPROXY_STORE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"
#include "fingerprint.h"
#include "idemkey.h"

#define STORE_OWNER_LEN 32	/* the fencing token: hex of 16 random bytes */
/* What a won claim hands its caller to complete, release or extend with:
 * the token, which a store may follow with '@' and what helps it find the
 * record again (PostgreSQL: where its partitions begin, store_pg.c).
 * Opaque to callers. */
#define STORE_HANDLE_MAX (STORE_OWNER_LEN + 24)
#define STORE_SCOPE_LEN 64	/* hex SHA-256, or "" */

struct event_base;
struct store;

/* The head of every backend's handle type. */
struct store_op {
	struct store *store;
};

/*
 * A response as stored and replayed. Immutable once built, shared by
 * reference count between the store and every replay in progress.
 */
struct stored_response {
	atomic_int refcount;
	int status;
	char *head;		/* end-to-end fields as "Name: value\r\n"... */
	size_t head_len;
	char *body;
	size_t body_len;
	bool body_stored;	/* false: too large; duplicates get 409 */
	/* the outcome is unknown: this is the problem document replayed in
	 * its place (502 outcome-unknown). Never cached in front of the
	 * store; its owner's completion replaces it. */
	bool unknown;
	char data[];		/* head and body point in here */
};

struct stored_response *stored_response_new(int status, const char *head,
					    size_t head_len, const char *body,
					    size_t body_len, bool body_stored);
struct stored_response *stored_response_ref(struct stored_response *r);
/* The problem document an unknown outcome is replayed as (unknown set):
 * 502 outcome-unknown with detail, or the one for an owner that stopped
 * extending its lease when detail is NULL; with the request id of the
 * request that executed (the one its client had), or none (NULL). NULL
 * when out of memory. */
struct stored_response *stored_response_unknown(const char *detail,
						const char *request_id);
void stored_response_unref(struct stored_response *r);

/* What a record is addressed by. */
struct store_key {
	char scope[STORE_SCOPE_LEN + 1];
	char key[IDEMKEY_MAX + 1];
};

enum store_status {
	STORE_WON,		/* claim: ours now (new, expired or taken over) */
	STORE_COMPLETED,	/* claim: completed, same fingerprint: replay */
	STORE_UNKNOWN,		/* claim: its outcome is unknown, same
				 * fingerprint: replay resp; owner is the
				 * handle that resolves it (complete, release) */
	STORE_IN_FLIGHT,	/* claim: another owner holds a live lease */
	STORE_MISMATCH,		/* claim: the record has another fingerprint */
	STORE_OK,		/* complete / release / extend done */
	STORE_FENCED,		/* complete / release / extend: no longer ours */
	STORE_SETTLED,		/* watch: no longer in flight (or lease ran out) */
	STORE_FULL,		/* claim: the store refuses new records */
	STORE_ABSENT,		/* inspect / purge: no live record */
	STORE_ERROR,		/* the store could not be reached */
};

const char *store_status_name(enum store_status s);

/* Where a copy of a record was found (inspect) or dropped (purge). */
#define STORE_IN_MEMORY 1u	/* the memory store, or this process's
				   response cache */
#define STORE_IN_POSTGRES 2u
#define STORE_IN_REDIS 4u

/*
 * A record as an operator sees it (store_inspect, store_purge). Times are
 * Unix milliseconds, 0 when not known (a copy that only a cache holds has
 * no creation time). The stored head and body themselves, when asked for,
 * are in the result's resp.
 */
struct store_record {
	unsigned found;		/* STORE_IN_* bits */
	unsigned unreached;	/* STORE_IN_* bits: could not be asked */
	bool completed;		/* settled (or unknown), else in flight */
	bool unknown;		/* the outcome is unknown */
	uint8_t fp[FP_LEN];
	char owner[STORE_OWNER_LEN + 1];	/* in flight */
	int64_t created_ms, expires_ms, lease_until_ms;
	int status;		/* completed */
	size_t head_len, body_len;
	bool body_stored;
};

struct store_result {
	enum store_status status;
	/* STORE_WON: the handle to complete, release or extend with;
	 * STORE_UNKNOWN: the original owner's, to resolve the outcome with */
	char owner[STORE_HANDLE_MAX + 1];
	/* STORE_UNKNOWN: this very claim found the owner's lease run out and
	 * recorded the outcome as unknown (else it was so already) */
	bool lapsed;
	/* STORE_COMPLETED, and an inspect that asked for the body: a
	 * reference handed to the callback, which must take its own with
	 * stored_response_ref() to keep it */
	struct stored_response *resp;
	/* inspect and purge: the record (purge: as it was) */
	struct store_record rec;
	/* STORE_COMPLETED: how long the record still lives (0: unknown), so
	 * that a cache in front can keep it no longer; purge: how long the
	 * purged record would still have lived */
	uint64_t ttl_left_ms;
};

typedef void (*store_cb)(void *arg, const struct store_result *res);

struct store_claim {
	struct store_key key;
	uint8_t fp[FP_LEN];
	uint64_t lease_ms;	/* in-flight lease */
	uint64_t ttl_ms;	/* record lifetime (in flight: from the claim) */
	bool wait;		/* an answer in flight is waited for (watch):
				 * the store makes its completion wake us */
	/* a record whose owner's lease ran out is taken over (won again, for
	 * at-least-once routes and issued-key markers); else its outcome
	 * becomes unknown (STORE_UNKNOWN, lapsed) and nothing is won */
	bool takeover;
};

/* The operations a backend implements; see the wrappers below. */
struct store_ops {
	const char *name;
	struct store_op *(*claim)(struct store *s, struct event_base *base,
				  const struct store_claim *c, store_cb cb, void *arg);
	struct store_op *(*complete)(struct store *s, struct event_base *base,
				     const struct store_key *k, const char *owner,
				     const uint8_t fp[FP_LEN],
				     struct stored_response *resp, uint64_t ttl_ms,
				     store_cb cb, void *arg);
	struct store_op *(*release)(struct store *s, struct event_base *base,
				    const struct store_key *k, const char *owner,
				    store_cb cb, void *arg);
	struct store_op *(*extend)(struct store *s, struct event_base *base,
				   const struct store_key *k, const char *owner,
				   uint64_t lease_ms, store_cb cb, void *arg);
	struct store_op *(*watch)(struct store *s, struct event_base *base,
				  const struct store_key *k, store_cb cb, void *arg);
	struct store_op *(*inspect)(struct store *s, struct event_base *base,
				    const struct store_key *k, bool body,
				    store_cb cb, void *arg);
	struct store_op *(*purge)(struct store *s, struct event_base *base,
				  const struct store_key *k, store_cb cb, void *arg);
	void (*cancel)(struct store_op *op);
	/* Is the store reachable (for /readyz)? Thread-safe. */
	bool (*ready)(struct store *s);
	/* What is down while the store is ready, for /readyz (a Citus
	 * worker): its length written to buf (NUL-terminated, cut to len),
	 * 0 when nothing is. Thread-safe. May be NULL (never degraded). */
	size_t (*degraded)(struct store *s, char *buf, size_t len);
	/* Delete expired records (a batch); called by the main thread's
	 * timer every --sweep-interval. May work asynchronously on base. */
	void (*sweep)(struct store *s, struct event_base *base);
	/* A thread starts or stops using the store with its loop (before the
	 * loop runs; before its base is freed). Per-thread connections are
	 * opened and closed here. Either may be NULL. thread_init returns -1
	 * (logged) when the loop cannot be served; thread_done is still
	 * called then.
	 *
	 * A base given to thread_init may be one without libevent's lock
	 * (EVENT_BASE_FLAG_NOLOCK, the workers'): no other thread touches
	 * its events. A store may rely on the lock of a base it was not
	 * given (the unit tests'). */
	int (*thread_init)(struct store *s, struct event_base *base);
	void (*thread_done)(struct store *s, struct event_base *base);
	void (*free)(struct store *s);
};

struct store {
	const struct store_ops *ops;
};

/*
 * Claim (scope, key) for a request with fingerprint fp. Results: WON,
 * COMPLETED, UNKNOWN, IN_FLIGHT, MISMATCH (checked before any state), FULL
 * or ERROR.
 */
static inline struct store_op *store_claim(struct store *s, struct event_base *b,
					   const struct store_claim *c,
					   store_cb cb, void *arg)
{
	return s->ops->claim(s, b, c, cb, arg);
}

/* Complete a record we own with resp (a reference is taken); it expires
 * ttl_ms from now. In flight, or of unknown outcome: resp replaces it
 * (resp->unknown: the outcome is recorded as unknown); completed already
 * (a re-sent completion): unchanged. fp is the claim's fingerprint (for
 * caches in front: the record they keep carries it). OK, FENCED or
 * ERROR. */
static inline struct store_op *store_complete(struct store *s, struct event_base *b,
					      const struct store_key *k,
					      const char *owner,
					      const uint8_t fp[FP_LEN],
					      struct stored_response *resp,
					      uint64_t ttl_ms, store_cb cb, void *arg)
{
	return s->ops->complete(s, b, k, owner, fp, resp, ttl_ms, cb, arg);
}

/* Delete a record we own, in flight or of unknown outcome, so that a
 * retry can execute. OK, FENCED or ERROR. */
static inline struct store_op *store_release(struct store *s, struct event_base *b,
					     const struct store_key *k,
					     const char *owner, store_cb cb, void *arg)
{
	return s->ops->release(s, b, k, owner, cb, arg);
}

/* Push our lease lease_ms into the future. OK, FENCED or ERROR. */
static inline struct store_op *store_extend(struct store *s, struct event_base *b,
					    const struct store_key *k,
					    const char *owner, uint64_t lease_ms,
					    store_cb cb, void *arg)
{
	return s->ops->extend(s, b, k, owner, lease_ms, cb, arg);
}

/* Tell me (SETTLED) when this key stops being in flight: completed,
 * unknown, released, expired, or its lease ran out (a claim decides). */
static inline struct store_op *store_watch(struct store *s, struct event_base *b,
					   const struct store_key *k, store_cb cb,
					   void *arg)
{
	return s->ops->watch(s, b, k, cb, arg);
}

/* What the store holds for k, for an operator: OK with res->rec (and, if
 * body, the stored response in res->resp), ABSENT or ERROR. A layer in
 * front adds where it holds a copy. */
static inline struct store_op *store_inspect(struct store *s, struct event_base *b,
					     const struct store_key *k, bool body,
					     store_cb cb, void *arg)
{
	return s->ops->inspect(s, b, k, body, cb, arg);
}

/* Delete k whatever its state, and every copy of it: OK with res->rec as
 * the record was, ABSENT when there was none, or ERROR (nothing is known
 * to be deleted). An in-flight record's owner is fenced: its completion,
 * release or extension finds FENCED; its waiters wake. A layer that could
 * not drop its copy says so in res->rec.unreached. */
static inline struct store_op *store_purge(struct store *s, struct event_base *b,
					   const struct store_key *k, store_cb cb,
					   void *arg)
{
	return s->ops->purge(s, b, k, cb, arg);
}

static inline void store_cancel(struct store_op *op)
{
	op->store->ops->cancel(op);
}

static inline void store_sweep(struct store *s, struct event_base *base)
{
	s->ops->sweep(s, base);
}

MUSTCHECK static inline int store_thread_init(struct store *s,
					    struct event_base *base)
{
	return s->ops->thread_init != NULL ? s->ops->thread_init(s, base) : 0;
}

static inline void store_thread_done(struct store *s, struct event_base *base)
{
	if (s->ops->thread_done != NULL)
		s->ops->thread_done(s, base);
}

static inline bool store_ready(struct store *s)
{
	return s->ops->ready(s);
}

static inline size_t store_degraded(struct store *s, char *buf, size_t len)
{
	return s->ops->degraded != NULL ? s->ops->degraded(s, buf, len) : 0;
}

static inline void store_free(struct store *s)
{
	if (s != NULL)
		s->ops->free(s);
}

/* A record's identity as one string, "<scope>\n<key>", and its hash for
 * in-process tables: SipHash-2-4 under a key drawn at random once per
 * process, so that clients cannot choose keys that share a bucket (with an
 * unkeyed hash they can, and one chain takes every lookup). A table may
 * rather hold a key of its own (common/siphash.h), as the memory store does. */
#define STORE_ID_MAX (STORE_SCOPE_LEN + 1 + IDEMKEY_MAX + 1)
size_t store_id(const char *scope, size_t slen, const char *key, size_t klen,
		char buf[STORE_ID_MAX]);
size_t store_key_id(const struct store_key *k, char buf[STORE_ID_MAX]);
uint64_t store_id_hash(const char *id, size_t len);

/* A moment `at` of a monotonic clock whose reading is now `now`, in Unix
 * milliseconds (for store_record). */
int64_t store_unix_ms(uint64_t at, uint64_t now);

/* A fresh owner token (hex): no other claim gets it and nobody can guess
 * it (store.c). Returns 0 or -1. */
int store_new_owner(char out[STORE_OWNER_LEN + 1]) MUSTCHECK;

#endif
