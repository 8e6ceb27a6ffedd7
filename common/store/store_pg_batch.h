/*
 * store_pg_batch.h - a PostgreSQL store thread's pool (store_pg_batch.c):
 * its queue, the operations' lives, the batches and their results, the
 * order in which operations settle. What a statement is and what its
 * result means is the store's (store_pg.c), reached through
 * pg_store.meaning.
 */
#ifndef IDEMPROXY_STORE_PG_BATCH_H
#define IDEMPROXY_STORE_PG_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "store_pg_priv.h"

#define PG_POLL_MS 500		/* a watcher claims again this often */
#define PG_BATCH_MAX 64		/* operations per pipeline */

/* What an operation means: its statement and its outcome (store_pg.c). */
struct pg_meaning {
	/* The prepared statement of kind, for the log. */
	const char *(*name)(enum pg_kind kind);
	/* Queue o's statement in c's pipeline. 0 or -1. */
	int (*send)(struct pg_conn *c, struct pg_op *o);
	/* Send the wake-up of the completions of c's committed batch that
	 * waiters marked (a transaction of its own, and its Sync): 1 sent,
	 * 0 nothing to wake, -1 failed. */
	int (*wake)(struct pg_conn *c);
	/* o's batch committed: its held result is its outcome. */
	void (*committed)(struct pg_op *o);
	/* o's deadline passed without an outcome. */
	void (*give_up)(struct pg_op *o);
};

struct pg_local *pg_local_for(struct pg_store *s, struct event_base *base);
/* A new pool on base (one statement connection opened at once; the
 * listener too when s wants every notification). NULL without memory. */
struct pg_local *pg_local_new(struct pg_store *s, struct event_base *base);
void pg_local_free(struct pg_local *l);
struct pg_op *pg_op_alloc(struct pg_local *l, enum pg_kind kind,
			  const struct store_key *k, store_cb cb, void *arg);
struct pg_op *pg_op_new(struct pg_store *s, struct event_base *base,
			enum pg_kind kind, const struct store_key *k,
			store_cb cb, void *arg);
void pg_op_free(struct pg_op *o);
/* Report st on the caller's loop, next turn (an internal op is freed). */
void pg_op_finish(struct pg_op *o, enum store_status st);
/* Queue o (at the head: a retry keeps its turn) under its deadline. */
void pg_enqueue(struct pg_op *o, bool head);
struct store_op *pg_op_submit(struct pg_op *o);
/* A watcher waits for a notification, or its poll. */
void pg_watch_add(struct pg_op *o);
/* The advisory lock a claim of k takes before it inserts or takes over
 * (idemproxy_claim6): SipHash-2-4 of "scope\0key" under a fixed key, the
 * same in every instance sharing the table. Batches send their claims in
 * its order, so that two batches never wait for each other's keys. */
int64_t pg_lock_id(const struct store_key *k);

#endif
