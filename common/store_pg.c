/*
 * store_pg.c - PostgreSQL store (see store_pg.h).
 *
 *   thread_init ──▶ per-thread pool: up to N statement connections (grown
 *                   on demand) + 1 listener
 *
 *   connection: DOWN ──start──▶ CONNECTING ──ok──▶ SETUP ──ok──▶ IDLE ⇄ BUSY
 *                 ▲  back-off      │ (PQconnectPoll)  (migrate,      (one
 *                 └────────────────┴── any failure ──  PREPARE)      batch)
 *
 * Operations wait in the thread's queue for an idle connection. An idle
 * connection takes everything queued (up to PG_BATCH_MAX) and sends it as
 * one pipeline: a prepared statement per operation, then one Sync. The
 * statements up to a Sync are one implicit transaction, so a batch costs
 * one round trip and one commit (one WAL flush) however many keys it
 * carries. Nothing waits to fill a batch: an operation submitted while a
 * connection is idle goes out at once; batches only form from what queued
 * while every connection was busy.
 *
 * Outcomes only after commit. A statement's result is held until the
 * PGRES_PIPELINE_SYNC of its batch, i.e. until ReadyForQuery arrived after
 * the commit; only then does it become an outcome. A connection lost, a
 * statement timeout or an error before that point leaves the outcome
 * unknown, and every operation is written so that sending it again is
 * safe (same owner token: a claim finds its own row and is won again, a
 * completion finds its own completed row). Unknown operations are re-sent
 * until their deadline; an error in one statement rolls back its
 * neighbours, which are re-sent, while the failing one is retried alone.
 * docs/architecture.md "Outcomes only after commit" has the protocol.
 *
 * What is never lost: completions, releases and extensions, and claims
 * already sent once, stay queued while no connection is up (and hasten
 * the reconnection) until their deadline. A fresh claim with no connection
 * up fails at once (STORE_ERROR: the engine applies --store-down). A claim
 * whose caller gave up (cancelled, or the deadline passed) after it was
 * sent, or that won after its caller left, is released in the background
 * with its owner token until its lease would have ended anyway.
 *
 * Waiting: completion and release NOTIFY channel "idemproxy" with the
 * payload "<scope>:<key>"; each thread's listener connection wakes its
 * waiters. A waiter also wakes every PG_POLL_MS to claim again, so a lost
 * notification (listener reconnecting) costs at most that much latency.
 */
#include "store_pg.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/event.h>
#include <libpq-fe.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"

#define PG_POLL_MS 500
#define PG_OP_TIMEOUT_MS 5000	/* a batch on the wire; an operation's life */
#define PG_CONNECT_TIMEOUT_MS 5000
#define PG_BACKOFF_MIN_MS 100
#define PG_BACKOFF_MAX_MS 5000
#define PG_BACKOFF_PENDING_MS 250	/* reconnect this often while work waits */
#define PG_SWEEP_BATCH 1000
#define PG_CLAIM_RETRIES 5	/* the record changed under the statement */
#define PG_STMT_ERRORS 3	/* a statement failing on its own */
#define PG_BATCH_MAX 64		/* operations per pipeline */
#define PG_LOCK_MIGRATE "7165310201"	/* advisory lock keys */
#define PG_LOCK_SWEEP "7165310202"

/*
 * Idempotent, and cheap once done: a catalog check takes no table lock, so
 * every new connection can run it. Creators serialise on an advisory lock;
 * one that still finds the table created meanwhile (its catalog view can
 * lag the lock) swallows the duplicate error. Two instances starting
 * together never fail or deadlock.
 */
const char store_pg_schema_sql[] =
	"SET client_min_messages = warning;\n"
	"DO $migrate$ BEGIN\n"
	"IF to_regclass('idempotency_keys') IS NULL THEN\n"
	"  PERFORM pg_advisory_xact_lock(" PG_LOCK_MIGRATE ");\n"
	"  IF to_regclass('idempotency_keys') IS NULL THEN\n"
	"    CREATE TABLE idempotency_keys (\n"
	"      scope        text        NOT NULL,\n"
	"      key          text        NOT NULL,\n"
	"      fingerprint  bytea       NOT NULL,\n"
	"      state        text        NOT NULL,\n"
	"      owner        text,\n"
	"      lease_until  timestamptz,\n"
	"      status       int,\n"
	"      headers      bytea,\n"
	"      body         bytea,\n"
	"      created_at   timestamptz NOT NULL DEFAULT now(),\n"
	"      expires_at   timestamptz NOT NULL,\n"
	"      PRIMARY KEY (scope, key)\n"
	"    );\n"
	"    CREATE INDEX idempotency_keys_expires_at_idx\n"
	"      ON idempotency_keys (expires_at);\n"
	"  END IF;\n"
	"END IF;\n"
	"EXCEPTION WHEN duplicate_table OR duplicate_object OR unique_violation THEN\n"
	"  NULL;  -- created meanwhile by another instance\n"
	"END $migrate$;\n";

/*
 * $1 scope, $2 key, $3 fingerprint, $4 owner, $5 lease ms, $6 ttl ms.
 *
 * Read first, write only when needed: a replay, an in-flight duplicate
 * or a mismatch reads the row and nothing else (no lock, no transaction
 * id, no WAL, no flush at commit). A new key is inserted; an expired
 * record, or one whose lease ran out with the same fingerprint, is taken
 * over. A row this owner already holds (an earlier attempt of this very
 * claim committed, but its outcome was lost with the connection) is
 * reported won again: a claim can be re-sent until its outcome is known.
 *
 * One row: ('won'), or the existing record as the statement's snapshot saw
 * it. No row: the record changed under the statement (inserted or taken
 * over meanwhile); claim again.
 */
const char store_pg_claim_sql[] =
	"WITH cur AS (\n"
	"  SELECT k.state, k.fingerprint, k.status, k.headers, k.body, k.owner,\n"
	"         k.expires_at <= now() AS expired,\n"
	"         (k.state = 'in_flight' AND k.lease_until <= now()) AS lapsed,\n"
	"         greatest(0, extract(epoch FROM k.expires_at - now()) * 1000)::bigint AS ttl_left\n"
	"    FROM idempotency_keys k\n"
	"   WHERE k.scope = $1 AND k.key = $2),\n"
	"ins AS (\n"
	"  INSERT INTO idempotency_keys\n"
	"    (scope, key, fingerprint, state, owner, lease_until, expires_at)\n"
	"  SELECT $1, $2, $3, 'in_flight', $4,\n"
	"         now() + $5 * interval '1 millisecond',\n"
	"         now() + greatest($5, $6) * interval '1 millisecond'\n"
	"   WHERE NOT EXISTS (SELECT 1 FROM cur)\n"
	"  ON CONFLICT (scope, key) DO NOTHING\n"
	"  RETURNING 1),\n"
	"tko AS (\n"
	"  UPDATE idempotency_keys k\n"
	"     SET fingerprint = $3, state = 'in_flight', owner = $4,\n"
	"         lease_until = now() + $5 * interval '1 millisecond',\n"
	"         status = NULL, headers = NULL, body = NULL, created_at = now(),\n"
	"         expires_at = now() + greatest($5, $6) * interval '1 millisecond'\n"
	"   WHERE k.scope = $1 AND k.key = $2\n"
	"     AND EXISTS (SELECT 1 FROM cur WHERE cur.owner IS DISTINCT FROM $4\n"
	"                   AND (cur.expired OR (cur.lapsed AND cur.fingerprint = $3)))\n"
	"     AND k.owner IS DISTINCT FROM $4\n"
	"     AND (k.expires_at <= now()\n"
	"          OR (k.state = 'in_flight' AND k.lease_until <= now()\n"
	"              AND k.fingerprint = $3))\n"
	"  RETURNING 1)\n"
	"SELECT 'won'::text, NULL::bytea, NULL::int, NULL::bytea, NULL::bytea,\n"
	"       NULL::bigint\n"
	"  FROM ins\n"
	"UNION ALL\n"
	"SELECT 'won', NULL, NULL, NULL, NULL, NULL FROM tko\n"
	"UNION ALL\n"
	"SELECT CASE WHEN cur.owner = $4 AND cur.state = 'in_flight'\n"
	"            THEN 'won' ELSE cur.state END,\n"
	"       cur.fingerprint, cur.status, cur.headers, cur.body, cur.ttl_left\n"
	"  FROM cur\n"
	" WHERE NOT EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM tko)\n"
	"   AND (cur.owner = $4 OR NOT (cur.expired OR (cur.lapsed AND cur.fingerprint = $3)))";

/*
 * $1 scope, $2 key, $3 owner, $4 status, $5 headers, $6 body (NULL: not
 * stored), $7 ttl ms. 'completed' (and a NOTIFY), 'again' when this owner
 * had completed it already (a re-sent completion whose first attempt
 * committed), no row when fenced. A completed row keeps its owner, which
 * is what makes the re-send recognisable.
 */
const char store_pg_complete_sql[] =
	"WITH u AS (\n"
	"  UPDATE idempotency_keys\n"
	"     SET state = 'completed', status = $4, headers = $5, body = $6,\n"
	"         lease_until = NULL,\n"
	"         expires_at = now() + $7 * interval '1 millisecond'\n"
	"   WHERE scope = $1 AND key = $2 AND owner = $3 AND state = 'in_flight'\n"
	"  RETURNING 1)\n"
	"SELECT 'completed'::text FROM u, pg_notify('idemproxy', $1 || ':' || $2)\n"
	"UNION ALL\n"
	"SELECT 'again' FROM idempotency_keys\n"
	" WHERE scope = $1 AND key = $2 AND owner = $3 AND state = 'completed'\n"
	"   AND NOT EXISTS (SELECT 1 FROM u)";

static const char release_sql[] =
	"WITH d AS (\n"
	"  DELETE FROM idempotency_keys\n"
	"   WHERE scope = $1 AND key = $2 AND owner = $3 AND state = 'in_flight'\n"
	"  RETURNING 1)\n"
	"SELECT 'released'::text FROM d, pg_notify('idemproxy', $1 || ':' || $2)";

static const char extend_sql[] =
	"UPDATE idempotency_keys\n"
	"   SET lease_until = now() + $4 * interval '1 millisecond',\n"
	"       expires_at = greatest(expires_at,\n"
	"                             now() + $4 * interval '1 millisecond')\n"
	" WHERE scope = $1 AND key = $2 AND owner = $3 AND state = 'in_flight'";

/* One instance at a time (advisory lock), a batch, no long locks. */
static const char sweep_sql[] =
	"WITH lock AS (SELECT pg_try_advisory_xact_lock(" PG_LOCK_SWEEP ") AS ok),\n"
	"victims AS (\n"
	"  SELECT ctid FROM idempotency_keys\n"
	"   WHERE expires_at <= now() AND (SELECT ok FROM lock)\n"
	"   LIMIT $1 FOR UPDATE SKIP LOCKED),\n"
	"d AS (DELETE FROM idempotency_keys\n"
	"       WHERE ctid IN (SELECT ctid FROM victims) RETURNING expires_at)\n"
	"SELECT count(*)::text,\n"
	"       coalesce(extract(epoch FROM now() - min(expires_at)), 0)::bigint::text\n"
	"  FROM d";

enum pg_kind {
	PG_CLAIM,
	PG_COMPLETE,
	PG_RELEASE,
	PG_EXTEND,
	PG_SWEEP,
	PG_WATCH,
};

static const char *const stmt_names[] = {
	[PG_CLAIM] = "idem_claim", [PG_COMPLETE] = "idem_complete",
	[PG_RELEASE] = "idem_release", [PG_EXTEND] = "idem_extend",
	[PG_SWEEP] = "idem_sweep",
};

/* Where an operation is; exactly one place at a time. */
enum op_where {
	OP_NEW,			/* being set up */
	OP_QUEUED,		/* on local->queue; o->ev is its deadline */
	OP_RUNNING,		/* in a connection's batch on the wire */
	OP_WATCHING,		/* on local->watchers; o->ev is the poll */
	OP_DELIVERING,		/* o->ev is active: the callback runs next */
};

struct pg_local;
struct pg_op;
TAILQ_HEAD(pg_ops, pg_op);

struct pg_op {
	struct store_op op;		/* first: the generic handle */
	enum pg_kind kind;
	struct pg_local *local;
	store_cb cb;			/* NULL: internal, or cancelled */
	void *arg;
	struct event *ev;		/* see enum op_where */
	struct store_result res;
	TAILQ_ENTRY(pg_op) link;	/* queue, watchers or a batch */
	enum op_where where;
	bool sent;			/* on the wire once: outcome may exist */
	bool solo;			/* retry it alone (failed, or abandoned) */
	bool abandoned;			/* a claim nobody waits for: abandon() */
	int changed;			/* claims: record changed under us */
	int errors;			/* its own statement failed */
	uint64_t deadline_ms;		/* monotonic: give up after this */
	/* this attempt, until its batch's Sync */
	PGresult *result;
	bool stmt_failed;

	struct store_key key;
	uint8_t fp[FP_LEN];
	char owner[STORE_OWNER_LEN + 1];
	uint64_t lease_ms, ttl_ms;
	struct stored_response *resp;
};

enum pgc_state {
	PGC_DOWN,		/* waiting to reconnect (back-off timer) */
	PGC_CONNECTING,		/* PQconnectPoll steps */
	PGC_SETUP,		/* migration and PREPAREs (or LISTEN) */
	PGC_IDLE,		/* statement connections: in pipeline mode */
	PGC_BUSY,		/* one batch on the wire */
};

struct pg_conn {
	struct pg_local *local;
	PGconn *pg;
	struct event *io;
	struct event *timer;		/* back-off, or the batch deadline */
	enum pgc_state state;
	struct pg_ops batch;		/* BUSY: the batch's operations, in order */
	struct pg_op *reading;		/* whose result comes next; NULL: Sync */
	bool batch_failed;		/* an error: the transaction rolled back */
	int backoff_ms;
	uint64_t retry_at;		/* DOWN: monotonic ms of the next attempt */
	bool listener;
	bool used;			/* opened: pools grow on demand */
	bool was_up;
};

struct pg_local {
	struct pg_store *s;
	struct event_base *base;
	struct pg_conn *conns;
	int nconns;
	struct pg_conn listen;
	struct pg_ops queue;
	struct pg_ops watchers;
	int up;				/* connections IDLE or BUSY */
	bool sweeping;
	struct pg_local *next;		/* s->locals */
};

struct pg_store {
	struct store base;
	char *conninfo;
	char *setup_sql;		/* schema + PREPAREs */
	int conns_per_thread;
	atomic_int up;			/* connections up, all threads */
	atomic_bool down_logged;
	pthread_mutex_t mu;
	struct pg_local *locals;
	store_pg_notify_fn notify_fn;	/* every notification (a cache) */
	void *notify_arg;
};

static void conn_start(struct pg_conn *c);
static void dispatch(struct pg_local *l);
static void grow(struct pg_local *l);
static int conn_init(struct pg_local *l, struct pg_conn *c, bool listener);
static void enqueue(struct pg_op *o, bool head);

/* ---- finding the calling thread's pool ----------------------------- */

static _Thread_local struct {
	struct pg_store *s;
	struct event_base *base;
	struct pg_local *local;
} tl_cache;

static struct pg_local *local_for(struct pg_store *s, struct event_base *base)
{
	struct pg_local *l;

	if (tl_cache.s == s && tl_cache.base == base)
		return tl_cache.local;
	pthread_mutex_lock(&s->mu);
	for (l = s->locals; l != NULL; l = l->next)
		if (l->base == base)
			break;
	pthread_mutex_unlock(&s->mu);
	if (l != NULL) {
		tl_cache.s = s;
		tl_cache.base = base;
		tl_cache.local = l;
	}
	return l;
}

/* ---- operations ---------------------------------------------------- */

static void op_clear_attempt(struct pg_op *o)
{
	if (o->result != NULL) {
		PQclear(o->result);
		o->result = NULL;
	}
	o->stmt_failed = false;
}

static void op_free(struct pg_op *o)
{
	if (o->ev != NULL)
		event_free(o->ev);
	op_clear_attempt(o);
	stored_response_unref(o->resp);
	stored_response_unref(o->res.resp);
	free(o);
}

static void give_up(struct pg_op *o);

static void op_ev_cb(evutil_socket_t fd, short what, void *arg)
{
	struct pg_op *o = arg;

	switch (o->where) {
	case OP_QUEUED:
		/* its deadline passed before a connection could take it */
		TAILQ_REMOVE(&o->local->queue, o, link);
		o->where = OP_NEW;
		give_up(o);
		return;
	case OP_WATCHING:
		/* the poll timeout: claim again */
		TAILQ_REMOVE(&o->local->watchers, o, link);
		o->res.status = STORE_SETTLED;
		break;
	case OP_DELIVERING:
		break;
	case OP_NEW:
	case OP_RUNNING:
		log_error("postgres store: operation event in a wrong place");
		return;
	}
	o->where = OP_DELIVERING;
	if (o->cb != NULL)
		o->cb(o->arg, &o->res);
	op_free(o);
}

/* Report the result on the caller's loop (next turn). */
static void op_finish(struct pg_op *o, enum store_status st)
{
	o->res.status = st;
	if (o->cb == NULL) {
		op_free(o);	/* internal or cancelled: nobody to tell */
		return;
	}
	event_del(o->ev);
	o->where = OP_DELIVERING;
	event_active(o->ev, EV_TIMEOUT, 1);
}

static struct pg_op *op_alloc(struct pg_local *l, enum pg_kind kind,
			      const struct store_key *k, store_cb cb, void *arg)
{
	struct pg_op *o = calloc(1, sizeof(*o));

	if (o == NULL)
		return NULL;
	o->op.store = &l->s->base;
	o->kind = kind;
	o->local = l;
	o->cb = cb;
	o->arg = arg;
	if (k != NULL)
		o->key = *k;
	o->deadline_ms = clock_ms() + PG_OP_TIMEOUT_MS;
	o->ev = event_new(l->base, -1, 0, op_ev_cb, o);
	if (o->ev == NULL) {
		free(o);
		return NULL;
	}
	return o;
}

static struct pg_op *op_new(struct pg_store *s, struct event_base *base,
			    enum pg_kind kind, const struct store_key *k,
			    store_cb cb, void *arg)
{
	struct pg_local *l = local_for(s, base);

	if (l == NULL) {
		log_error("postgres store used on a loop it was not set up for");
		return NULL;
	}
	return op_alloc(l, kind, k, cb, arg);
}

/*
 * A claim this store holds (won) but nobody will execute: delete it with
 * its owner token in the background, for as long as its lease could hold
 * the key.
 */
static void release_owned(struct pg_local *l, const struct store_key *k,
			  const char *owner, uint64_t lease_ms)
{
	struct pg_op *o = op_alloc(l, PG_RELEASE, k, NULL, NULL);

	if (o == NULL) {
		log_error("key %s: out of memory; an abandoned claim stays until "
			  "its lease ends", k->key);
		return;
	}
	memcpy(o->owner, owner, sizeof(o->owner));
	o->deadline_ms = clock_ms() + lease_ms;
	enqueue(o, false);
}

/*
 * Make claim o abandoned: nobody will execute it, but it was sent and may
 * have committed (or may still: a statement that timed out on our side
 * can commit on the server later - a phantom claim). It goes on in the
 * background, alone in its batch, until its outcome is known: claimed
 * again with its own owner token - the INSERT waits on the key's index
 * entry for a transaction still in progress, which a DELETE would not see -
 * and released if won. Gone when its lease would have ended anyway.
 */
static void abandon(struct pg_op *o)
{
	o->cb = NULL;
	o->abandoned = true;
	o->solo = true;
	o->deadline_ms = clock_ms() + o->lease_ms;
}

/* A copy of claim o, abandoned and queued (o itself reports to its
 * caller). */
static void abandon_copy(const struct pg_op *o)
{
	struct pg_op *a = op_alloc(o->local, PG_CLAIM, &o->key, NULL, NULL);

	if (a == NULL) {
		log_error("key %s: out of memory; a claim whose outcome is "
			  "unknown stays until its lease ends", o->key.key);
		return;
	}
	memcpy(a->fp, o->fp, FP_LEN);
	memcpy(a->owner, o->owner, sizeof(a->owner));
	a->lease_ms = o->lease_ms;
	a->ttl_ms = o->ttl_ms;
	a->sent = true;
	abandon(a);
	enqueue(a, false);
}

/*
 * The operation's deadline passed with its outcome unknown or unsent:
 * report STORE_ERROR; a claim that was sent goes on abandoned. An
 * abandoned claim past its deadline is simply dropped: its lease is over.
 */
static void give_up(struct pg_op *o)
{
	if (o->kind == PG_SWEEP)
		o->local->sweeping = false;
	if (o->abandoned) {
		op_free(o);
		return;
	}
	if (o->kind == PG_CLAIM && o->sent)
		abandon_copy(o);
	metrics_store_error(STORE_KIND_POSTGRES);
	op_finish(o, STORE_ERROR);
}

/* Is any statement connection of l up, or on its way up? */
static bool may_serve(const struct pg_local *l)
{
	for (int i = 0; i < l->nconns; i++)
		if (l->conns[i].used && l->conns[i].state != PGC_DOWN)
			return true;
	return false;
}

/*
 * Work waits and no connection is up: reconnect soon rather than after
 * the full back-off, so that a pending outcome meets a PostgreSQL that
 * came back at once.
 */
static void hasten(struct pg_local *l)
{
	uint64_t now = clock_ms();

	for (int i = 0; i < l->nconns; i++) {
		struct pg_conn *c = &l->conns[i];
		struct timeval tv = clock_tv(PG_BACKOFF_PENDING_MS);

		if (!c->used || c->state != PGC_DOWN ||
		    c->retry_at <= now + PG_BACKOFF_PENDING_MS)
			continue;
		c->retry_at = now + PG_BACKOFF_PENDING_MS;
		evtimer_add(c->timer, &tv);
	}
}

/*
 * Put o on the queue (at the head for a retry, keeping its turn) with its
 * deadline armed, and hand the queue to idle connections.
 */
static void enqueue(struct pg_op *o, bool head)
{
	struct pg_local *l = o->local;
	uint64_t now = clock_ms();
	struct timeval tv = clock_tv(o->deadline_ms > now ? o->deadline_ms - now : 0);

	o->where = OP_QUEUED;
	if (head)
		TAILQ_INSERT_HEAD(&l->queue, o, link);
	else
		TAILQ_INSERT_TAIL(&l->queue, o, link);
	event_add(o->ev, &tv);
	if (!may_serve(l))
		hasten(l);
	dispatch(l);
}

/* Submit a new operation. A fresh claim with no connection up or coming
 * up fails at once: nothing was sent, so "not claimed" is exact. */
static struct store_op *op_submit(struct pg_op *o)
{
	if (o->kind == PG_CLAIM && !may_serve(o->local)) {
		op_finish(o, STORE_ERROR);
		return &o->op;
	}
	enqueue(o, false);
	return &o->op;
}

/* ---- connections ----------------------------------------------------- */

static void set_up(struct pg_conn *c, bool up)
{
	struct pg_store *s;

	if (c->was_up == up)
		return;		/* also: a slot never opened has no local */
	s = c->local->s;
	c->was_up = up;
	if (c->listener) {
		if (s->notify_fn != NULL)
			s->notify_fn(s->notify_arg, up ? STORE_PG_LISTEN_UP :
						STORE_PG_LISTEN_DOWN, NULL);
		return;
	}
	c->local->up += up ? 1 : -1;
	if (up) {
		if (atomic_fetch_add(&s->up, 1) == 0 &&
		    atomic_exchange(&s->down_logged, false))
			log_info("postgres store reachable again");
	} else {
		atomic_fetch_sub(&s->up, 1);
	}
}

/*
 * o's attempt is over without an outcome: rolled back (known: nothing
 * happened) or unknown (it may have committed). Send it again while its
 * deadline lasts. Cancelled operations are dropped, except releases and
 * abandoned claims (see abandon()).
 */
static void retry_op(struct pg_op *o)
{
	op_clear_attempt(o);
	o->where = OP_NEW;
	if (o->kind == PG_SWEEP) {
		o->local->sweeping = false;
		op_free(o);	/* the next interval sweeps again */
	} else if (o->cb == NULL && o->kind != PG_RELEASE && !o->abandoned) {
		op_free(o);	/* cancelled: nobody to tell */
	} else if (o->errors >= PG_STMT_ERRORS || clock_ms() >= o->deadline_ms) {
		give_up(o);
	} else {
		enqueue(o, true);
	}
}

/* Take the batch off c (so that c can take the next one at once). */
static void batch_take(struct pg_conn *c, struct pg_ops *out)
{
	TAILQ_INIT(out);
	TAILQ_CONCAT(out, &c->batch, link);
	c->reading = NULL;
}

/* The batch's outcome is unknown (connection lost, timed out): every
 * operation in it is sent again. */
static void batch_unknown(struct pg_conn *c)
{
	struct pg_ops ops;
	struct pg_op *o;

	batch_take(c, &ops);
	c->batch_failed = false;
	while ((o = TAILQ_FIRST(&ops)) != NULL) {
		TAILQ_REMOVE(&ops, o, link);
		retry_op(o);
	}
}

static void arm_io(struct pg_conn *c, short what);

/* Fail the connection: close, reconnect later; its batch's outcome is
 * unknown. */
static void conn_fail(struct pg_conn *c, const char *why)
{
	struct pg_local *l = c->local;
	struct pg_store *s = l->s;
	struct timeval tv;
	struct pg_op *o, *next;
	int delay;

	if (c->pg != NULL && !atomic_exchange(&s->down_logged, true))
		log_warn("postgres store: %s: %s", why,
			 c->pg ? PQerrorMessage(c->pg) : "");
	metrics_store_error(STORE_KIND_POSTGRES);
	if (c->io != NULL) {
		event_free(c->io);
		c->io = NULL;
	}
	evtimer_del(c->timer);
	if (c->pg != NULL) {
		PQfinish(c->pg);
		c->pg = NULL;
	}
	set_up(c, false);
	c->state = PGC_DOWN;
	delay = c->backoff_ms;
	c->backoff_ms = c->backoff_ms * 2 > PG_BACKOFF_MAX_MS ?
				PG_BACKOFF_MAX_MS : c->backoff_ms * 2;
	if (!c->listener && !TAILQ_EMPTY(&c->batch)) {
		batch_unknown(c);	/* may requeue: hasten sees the timer */
		if (delay > PG_BACKOFF_PENDING_MS)
			delay = PG_BACKOFF_PENDING_MS;
	}
	if (!c->listener && !may_serve(l)) {
		/* nothing can serve the queue now: a fresh claim is refused
		 * (never sent, so not claimed); everything else waits for a
		 * connection until its deadline */
		for (o = TAILQ_FIRST(&l->queue); o != NULL; o = next) {
			next = TAILQ_NEXT(o, link);
			if (o->kind != PG_CLAIM || o->sent)
				continue;
			TAILQ_REMOVE(&l->queue, o, link);
			o->where = OP_NEW;
			op_finish(o, STORE_ERROR);
		}
		if (!TAILQ_EMPTY(&l->queue) && delay > PG_BACKOFF_PENDING_MS)
			delay = PG_BACKOFF_PENDING_MS;
	}
	c->retry_at = clock_ms() + (uint64_t)delay;
	tv = clock_tv((uint64_t)delay);
	evtimer_add(c->timer, &tv);
}

static void io_cb(evutil_socket_t fd, short what, void *arg);

/* (Re)arm the socket event: the socket can change between connect steps. */
static void arm_io(struct pg_conn *c, short what)
{
	int fd = PQsocket(c->pg);

	if (c->io != NULL)
		event_free(c->io);
	c->io = event_new(c->local->base, fd, what | EV_PERSIST, io_cb, c);
	if (c->io == NULL || event_add(c->io, NULL) < 0)
		conn_fail(c, "cannot watch its socket");
}

/* Send what libpq has buffered; watch for writability until done. */
static void flush(struct pg_conn *c)
{
	int rc = PQflush(c->pg);

	if (rc < 0)
		conn_fail(c, "send failed");
	else
		arm_io(c, rc == 1 ? EV_READ | EV_WRITE : EV_READ);
}

/* A new connection migrates (idempotent, under the advisory lock) and
 * prepares its statements before it takes work; the listener LISTENs. */
static void run_setup(struct pg_conn *c)
{
	c->state = PGC_SETUP;
	if (!PQsendQuery(c->pg, c->listener ? "LISTEN idemproxy" :
						 c->local->s->setup_sql)) {
		conn_fail(c, "setup");
		return;
	}
	flush(c);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct pg_conn *c = arg;

	if (c->state == PGC_DOWN)
		conn_start(c);
	else if (c->state == PGC_BUSY)
		conn_fail(c, "statement timed out");
	else if (c->state == PGC_CONNECTING || c->state == PGC_SETUP)
		conn_fail(c, "connect timed out");
}

/* The server's notices (e.g. FATAL at shutdown) are not ours to print;
 * failures reach the log through conn_fail. */
static void quiet(void *arg, const char *message)
{
	log_debug("postgres: %s", message);
}

static void conn_start(struct pg_conn *c)
{
	c->pg = PQconnectStart(c->local->s->conninfo);
	if (c->pg != NULL)
		PQsetNoticeProcessor(c->pg, quiet, NULL);
	if (c->pg == NULL || PQstatus(c->pg) == CONNECTION_BAD ||
	    PQsetnonblocking(c->pg, 1) != 0) {
		conn_fail(c, "cannot start a connection");
		return;
	}
	c->state = PGC_CONNECTING;
	arm_io(c, EV_WRITE);
	if (c->pg != NULL) {
		struct timeval tv = clock_tv(PG_CONNECT_TIMEOUT_MS);

		evtimer_add(c->timer, &tv);	/* a black-holed server */
	}
}

/* Read a binary int8 column. */
static uint64_t get_int8(const PGresult *r, int row, int col)
{
	const unsigned char *p = (const unsigned char *)PQgetvalue(r, row, col);
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

/* Read a binary int4 column. */
static int get_int4(const PGresult *r, int row, int col)
{
	uint32_t v;

	memcpy(&v, PQgetvalue(r, row, col), 4);
	return (int)ntohl(v);
}

/* A committed claim's row: won, or the existing record. */
static void claim_result(struct pg_op *o, const PGresult *r)
{
	const char *state;
	int slen;

	if (PQntuples(r) == 0) {
		/* the record changed under the statement: claim again */
		if (++o->changed >= PG_CLAIM_RETRIES) {
			op_finish(o, STORE_ERROR);
			return;
		}
		enqueue(o, true);
		return;
	}
	state = PQgetvalue(r, 0, 0);
	slen = PQgetlength(r, 0, 0);
	if (slen == 3 && memcmp(state, "won", 3) == 0) {
		memcpy(o->res.owner, o->owner, sizeof(o->owner));
		if (o->cb == NULL) {
			/* abandoned: nobody will execute it; give the key back
			 * now rather than leave it stuck for a lease */
			release_owned(o->local, &o->key, o->owner, o->lease_ms);
			op_free(o);
			return;
		}
		op_finish(o, STORE_WON);
		return;
	}
	if (PQgetlength(r, 0, 1) != FP_LEN ||
	    memcmp(PQgetvalue(r, 0, 1), o->fp, FP_LEN) != 0) {
		op_finish(o, STORE_MISMATCH);
		return;
	}
	if (slen == 9 && memcmp(state, "completed", 9) == 0) {
		bool stored = !PQgetisnull(r, 0, 4);

		o->res.resp = stored_response_new(get_int4(r, 0, 2),
			PQgetvalue(r, 0, 3), (size_t)PQgetlength(r, 0, 3),
			stored ? PQgetvalue(r, 0, 4) : "",
			stored ? (size_t)PQgetlength(r, 0, 4) : 0, stored);
		if (!PQgetisnull(r, 0, 5) && PQgetlength(r, 0, 5) == 8)
			o->res.ttl_left_ms = get_int8(r, 0, 5);
		op_finish(o, o->res.resp != NULL ? STORE_COMPLETED : STORE_ERROR);
		return;
	}
	op_finish(o, STORE_IN_FLIGHT);
}

/* The batch of o committed: its statement's result is now its outcome. */
static void op_committed(struct pg_op *o)
{
	const PGresult *r = o->result;

	switch (o->kind) {
	case PG_CLAIM:
		claim_result(o, r);
		return;
	case PG_COMPLETE:
	case PG_RELEASE:
		op_finish(o, PQntuples(r) > 0 ? STORE_OK : STORE_FENCED);
		return;
	case PG_EXTEND:
		op_finish(o, strcmp(PQcmdTuples((PGresult *)r), "1") == 0 ?
				     STORE_OK : STORE_FENCED);
		return;
	case PG_SWEEP:
		o->local->sweeping = false;
		if (PQntuples(r) == 1) {
			/* rows deleted, and how late the oldest of them was */
			metrics_count_n(COUNTER_sweep_deleted_total,
					strtoul(PQgetvalue(r, 0, 0), NULL, 10));
			metrics_gauge_set(GAUGE_sweep_lag_seconds,
					  strtol(PQgetvalue(r, 0, 1), NULL, 10));
		}
		op_finish(o, STORE_OK);
		return;
	case PG_WATCH:
		break;
	}
	op_finish(o, STORE_ERROR);
}

/*
 * The batch's Sync arrived: the transaction is over. Committed: every
 * result is an outcome. Rolled back (a statement or the commit failed):
 * nothing happened. A statement that failed is retried alone, up to
 * PG_STMT_ERRORS times; its neighbours are sent again as they were. A
 * failed commit blames nobody in particular: every member of the batch is
 * retried alone (a batch of one counts it as its error).
 */
static void batch_done(struct pg_conn *c)
{
	struct pg_ops ops;
	struct pg_op *o;
	bool failed = c->batch_failed, blamed = false;
	int n = 0;

	batch_take(c, &ops);
	c->batch_failed = false;
	TAILQ_FOREACH(o, &ops, link) {
		blamed |= o->stmt_failed;
		n++;
	}
	while ((o = TAILQ_FIRST(&ops)) != NULL) {
		TAILQ_REMOVE(&ops, o, link);
		o->where = OP_NEW;
		if (!failed && o->result != NULL) {
			op_committed(o);
			continue;
		}
		if (o->stmt_failed || (!blamed && n == 1))
			o->errors++;
		if (o->stmt_failed || !blamed)
			o->solo = true;
		retry_op(o);
	}
}

/* Wake the waiters of "<scope>:<key>". */
static void notified(struct pg_local *l, const char *payload)
{
	struct pg_op *o, *next;
	const char *colon = strchr(payload, ':');
	size_t slen;

	if (colon == NULL)
		return;
	if (l->s->notify_fn != NULL)
		l->s->notify_fn(l->s->notify_arg, STORE_PG_NOTIFY, payload);
	slen = (size_t)(colon - payload);
	for (o = TAILQ_FIRST(&l->watchers); o != NULL; o = next) {
		next = TAILQ_NEXT(o, link);
		if (strlen(o->key.scope) == slen &&
		    memcmp(o->key.scope, payload, slen) == 0 &&
		    strcmp(o->key.key, colon + 1) == 0) {
			TAILQ_REMOVE(&l->watchers, o, link);
			op_finish(o, STORE_SETTLED);
		}
	}
}

/* The setup batch (or the listener's LISTEN) answered. */
static void setup_result(struct pg_conn *c, PGresult *r)
{
	if (r != NULL) {
		ExecStatusType st = PQresultStatus(r);

		PQclear(r);
		if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
			conn_fail(c, "setup failed");
		return;
	}
	/* the setup is over: statement connections work in pipelines */
	if (!c->listener && PQenterPipelineMode(c->pg) != 1) {
		conn_fail(c, "cannot enter pipeline mode");
		return;
	}
	c->backoff_ms = PG_BACKOFF_MIN_MS;
	evtimer_del(c->timer);	/* the connect deadline */
	set_up(c, true);
	c->state = PGC_IDLE;
}

/* One result of the batch on the wire (NULL: the end of one statement's
 * results). */
static void batch_result(struct pg_conn *c, PGresult *r)
{
	struct pg_op *o = c->reading;

	if (r == NULL) {
		if (o != NULL && (o->result != NULL || o->stmt_failed))
			c->reading = TAILQ_NEXT(o, link);
		return;
	}
	switch (PQresultStatus(r)) {
	case PGRES_PIPELINE_SYNC:
		PQclear(r);
		evtimer_del(c->timer);
		c->state = PGC_IDLE;
		batch_done(c);
		return;
	case PGRES_TUPLES_OK:
	case PGRES_COMMAND_OK:
		if (o != NULL && o->result == NULL && !o->stmt_failed) {
			o->result = r;	/* held until the Sync */
			return;
		}
		break;
	case PGRES_PIPELINE_ABORTED:
		/* skipped after an earlier error: sent again, not its fault */
		if (o != NULL && o->result == NULL && !o->stmt_failed) {
			PQclear(r);
			c->reading = TAILQ_NEXT(o, link);
			return;
		}
		break;
	default:
		/* an error: this statement's, or the commit's (after the last
		 * statement); either way the transaction rolled back */
		c->batch_failed = true;
		if (o != NULL && o->result == NULL && !o->stmt_failed) {
			o->stmt_failed = true;
			log_warn("postgres store: %s: %s", stmt_names[o->kind],
				 PQresultErrorMessage(r));
		} else {
			log_warn("postgres store: commit failed: %s",
				 PQresultErrorMessage(r));
		}
		metrics_store_error(STORE_KIND_POSTGRES);
		PQclear(r);
		return;
	}
	c->batch_failed = true;
	log_warn("postgres store: unexpected %s in a batch",
		 PQresStatus(PQresultStatus(r)));
	PQclear(r);
}

/* Everything libpq has for us: results, notifications. */
static void drain_results(struct pg_conn *c)
{
	PGnotify *n;
	int nulls = 0;

	while (c->pg != NULL && !PQisBusy(c->pg) &&
	       (c->state == PGC_SETUP || c->state == PGC_BUSY)) {
		PGresult *r = PQgetResult(c->pg);

		if (r == NULL && ++nulls > 1)
			break;		/* nothing more for now */
		if (r != NULL)
			nulls = 0;
		if (c->state == PGC_SETUP)
			setup_result(c, r);
		else
			batch_result(c, r);
	}
	while (c->pg != NULL && (n = PQnotifies(c->pg)) != NULL) {
		notified(c->local, n->extra);
		PQfreemem(n);
	}
	if (c->pg != NULL && c->state == PGC_IDLE && !c->listener)
		dispatch(c->local);
}

static void io_cb(evutil_socket_t fd, short what, void *arg)
{
	struct pg_conn *c = arg;

	if (c->state == PGC_CONNECTING) {
		switch (PQconnectPoll(c->pg)) {
		case PGRES_POLLING_READING:
			arm_io(c, EV_READ);
			return;
		case PGRES_POLLING_WRITING:
			arm_io(c, EV_WRITE);
			return;
		case PGRES_POLLING_OK:
			run_setup(c);
			return;
		default:
			conn_fail(c, "connect failed");
			return;
		}
	}
	if (what & EV_WRITE) {
		flush(c);
		if (c->pg == NULL)
			return;
	}
	if (what & EV_READ) {
		if (!PQconsumeInput(c->pg)) {
			conn_fail(c, "connection lost");
			return;
		}
		drain_results(c);
	}
}

/* Queue o's statement in the pipeline. Text parameters except the binary
 * ones (fingerprint, headers, body); results in binary. */
static int send_op(struct pg_conn *c, struct pg_op *o)
{
	char lease[24], ttl[24], status[16], batch[16];
	const char *v[7];
	int len[7] = { 0 }, fmt[7] = { 0 };
	int n = 0;

	switch (o->kind) {
	case PG_CLAIM:
		snprintf(lease, sizeof(lease), "%llu", (unsigned long long)o->lease_ms);
		snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)o->ttl_ms);
		v[0] = o->key.scope; v[1] = o->key.key;
		v[2] = (const char *)o->fp; len[2] = FP_LEN; fmt[2] = 1;
		v[3] = o->owner; v[4] = lease; v[5] = ttl;
		n = 6;
		break;
	case PG_COMPLETE:
		snprintf(status, sizeof(status), "%d", o->resp->status);
		snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)o->ttl_ms);
		v[0] = o->key.scope; v[1] = o->key.key; v[2] = o->owner;
		v[3] = status;
		v[4] = o->resp->head; len[4] = (int)o->resp->head_len; fmt[4] = 1;
		v[5] = o->resp->body_stored ? o->resp->body : NULL;
		len[5] = (int)o->resp->body_len; fmt[5] = 1;
		v[6] = ttl;
		n = 7;
		break;
	case PG_RELEASE:
		v[0] = o->key.scope; v[1] = o->key.key; v[2] = o->owner;
		n = 3;
		break;
	case PG_EXTEND:
		snprintf(lease, sizeof(lease), "%llu", (unsigned long long)o->lease_ms);
		v[0] = o->key.scope; v[1] = o->key.key; v[2] = o->owner;
		v[3] = lease;
		n = 4;
		break;
	case PG_SWEEP:
		snprintf(batch, sizeof(batch), "%d", PG_SWEEP_BATCH);
		v[0] = batch;
		n = 1;
		break;
	case PG_WATCH:
		return -1;
	}
	if (!PQsendQueryPrepared(c->pg, stmt_names[o->kind], n, v, len, fmt, 1))
		return -1;
	return 0;
}

/*
 * Send one batch on idle connection c: what is queued, up to
 * PG_BATCH_MAX operations; an operation to be retried alone (or a sweep)
 * goes in a batch of its own.
 */
static void send_batch(struct pg_conn *c)
{
	struct pg_local *l = c->local;
	struct timeval tv = clock_tv(PG_OP_TIMEOUT_MS);
	struct pg_op *o;
	int n = 0;

	while ((o = TAILQ_FIRST(&l->queue)) != NULL && n < PG_BATCH_MAX) {
		bool alone = o->solo || o->kind == PG_SWEEP;

		if (n > 0 && alone)
			break;
		TAILQ_REMOVE(&l->queue, o, link);
		event_del(o->ev);	/* the queue deadline */
		op_clear_attempt(o);	/* a claim sent again keeps its last */
		o->where = OP_RUNNING;
		o->sent = true;
		TAILQ_INSERT_TAIL(&c->batch, o, link);
		n++;
		if (send_op(c, o) < 0) {
			conn_fail(c, "send failed");
			return;
		}
		if (alone)
			break;
	}
	if (PQpipelineSync(c->pg) != 1) {
		conn_fail(c, "send failed");
		return;
	}
	c->state = PGC_BUSY;
	c->reading = TAILQ_FIRST(&c->batch);
	evtimer_add(c->timer, &tv);
	flush(c);
}

/* Give queued operations to idle connections. */
static void dispatch(struct pg_local *l)
{
	for (int i = 0; i < l->nconns && !TAILQ_EMPTY(&l->queue); i++) {
		struct pg_conn *c = &l->conns[i];

		if (c->state == PGC_IDLE)
			send_batch(c);
	}
	grow(l);
}

/*
 * Work is waiting and every open connection is busy: open one more, up to
 * conns_per_thread, one at a time. A quiet loop (the sweeper's) keeps one.
 */
static void grow(struct pg_local *l)
{
	int unused = -1;

	if (TAILQ_EMPTY(&l->queue))
		return;
	for (int i = 0; i < l->nconns; i++) {
		const struct pg_conn *c = &l->conns[i];

		if (!c->used) {
			if (unused < 0)
				unused = i;
		} else if (c->state == PGC_CONNECTING || c->state == PGC_SETUP ||
			   c->state == PGC_IDLE) {
			return;		/* one is coming or free already */
		}
	}
	if (unused >= 0 && conn_init(l, &l->conns[unused], false) < 0)
		log_error("postgres store: cannot set up a connection");
}

static int conn_init(struct pg_local *l, struct pg_conn *c, bool listener)
{
	c->local = l;
	c->listener = listener;
	c->used = true;
	c->backoff_ms = PG_BACKOFF_MIN_MS;
	TAILQ_INIT(&c->batch);
	c->timer = evtimer_new(l->base, timer_cb, c);
	if (c->timer == NULL)
		return -1;
	conn_start(c);
	return 0;
}

/* Thread shutdown: close; whatever is on the wire is dropped unanswered
 * (its callers are gone: the worker aborted its engines first). */
static void conn_close(struct pg_conn *c)
{
	struct pg_op *o;

	if (c->io != NULL)
		event_free(c->io);
	if (c->timer != NULL)
		event_free(c->timer);
	if (c->pg != NULL)
		PQfinish(c->pg);
	set_up(c, false);
	if (c->used) {
		while ((o = TAILQ_FIRST(&c->batch)) != NULL) {
			TAILQ_REMOVE(&c->batch, o, link);
			op_free(o);
		}
	}
	memset(c, 0, sizeof(*c));
}

/* ---- the store operations ------------------------------------------ */

static struct store_op *pg_claim(struct store *st, struct event_base *base,
				 const struct store_claim *c, store_cb cb, void *arg)
{
	struct pg_op *o = op_new((struct pg_store *)st, base, PG_CLAIM, &c->key,
				 cb, arg);

	if (o == NULL)
		return NULL;
	memcpy(o->fp, c->fp, FP_LEN);
	o->lease_ms = c->lease_ms;
	o->ttl_ms = c->ttl_ms;
	if (store_new_owner(o->owner) < 0) {
		op_finish(o, STORE_ERROR);
		return &o->op;
	}
	return op_submit(o);
}

static struct store_op *pg_complete(struct store *st, struct event_base *base,
				    const struct store_key *k, const char *owner,
				    const uint8_t fp[FP_LEN],
				    struct stored_response *resp, uint64_t ttl_ms,
				    store_cb cb, void *arg)
{
	struct pg_op *o = op_new((struct pg_store *)st, base, PG_COMPLETE, k,
				 cb, arg);

	if (o == NULL)
		return NULL;
	snprintf(o->owner, sizeof(o->owner), "%s", owner);
	memcpy(o->fp, fp, FP_LEN);
	o->resp = stored_response_ref(resp);
	o->ttl_ms = ttl_ms;
	return op_submit(o);
}

static struct store_op *pg_release(struct store *st, struct event_base *base,
				   const struct store_key *k, const char *owner,
				   store_cb cb, void *arg)
{
	struct pg_op *o = op_new((struct pg_store *)st, base, PG_RELEASE, k,
				 cb, arg);

	if (o == NULL)
		return NULL;
	snprintf(o->owner, sizeof(o->owner), "%s", owner);
	return op_submit(o);
}

static struct store_op *pg_extend(struct store *st, struct event_base *base,
				  const struct store_key *k, const char *owner,
				  uint64_t lease_ms, store_cb cb, void *arg)
{
	struct pg_op *o = op_new((struct pg_store *)st, base, PG_EXTEND, k,
				 cb, arg);

	if (o == NULL)
		return NULL;
	snprintf(o->owner, sizeof(o->owner), "%s", owner);
	o->lease_ms = lease_ms;
	return op_submit(o);
}

static struct store_op *pg_watch(struct store *st, struct event_base *base,
				 const struct store_key *k, store_cb cb, void *arg)
{
	struct pg_op *o = op_new((struct pg_store *)st, base, PG_WATCH, k, cb, arg);
	struct timeval tv = clock_tv(PG_POLL_MS);

	if (o == NULL)
		return NULL;
	if (!o->local->listen.used &&
	    conn_init(o->local, &o->local->listen, true) < 0)
		log_error("postgres store: cannot set up the listener");
	o->where = OP_WATCHING;
	TAILQ_INSERT_TAIL(&o->local->watchers, o, link);
	event_add(o->ev, &tv);	/* the bounded poll */
	return &o->op;
}

/*
 * The caller withdraws. A claim that may hold the key - sent and its
 * outcome not yet known, or won but not yet delivered - is given back
 * rather than left in flight until its lease ends.
 */
static void pg_cancel(struct store_op *op)
{
	struct pg_op *o = (struct pg_op *)op;

	switch (o->where) {
	case OP_QUEUED:
		TAILQ_REMOVE(&o->local->queue, o, link);
		if (o->kind == PG_CLAIM && o->sent) {
			abandon(o);
			enqueue(o, true);
			return;
		}
		op_free(o);
		return;
	case OP_WATCHING:
		TAILQ_REMOVE(&o->local->watchers, o, link);
		op_free(o);
		return;
	case OP_RUNNING:
		/* on the wire: forget the caller; its batch decides */
		if (o->kind == PG_CLAIM)
			abandon(o);
		o->cb = NULL;
		return;
	case OP_DELIVERING:
		if (o->kind == PG_CLAIM && o->res.status == STORE_WON)
			release_owned(o->local, &o->key, o->owner, o->lease_ms);
		op_free(o);	/* event_free drops the pending activation */
		return;
	case OP_NEW:
		op_free(o);
		return;
	}
}

static bool pg_ready(struct store *st)
{
	return atomic_load(&((struct pg_store *)st)->up) > 0;
}

static void pg_sweep(struct store *st, struct event_base *base)
{
	struct pg_store *s = (struct pg_store *)st;
	struct pg_local *l = local_for(s, base);
	struct pg_op *o;

	if (l == NULL || l->sweeping || l->up == 0)
		return;
	o = op_new(s, base, PG_SWEEP, NULL, NULL, NULL);
	if (o == NULL)
		return;
	l->sweeping = true;
	op_submit(o);
}

static void pg_thread_init(struct store *st, struct event_base *base)
{
	struct pg_store *s = (struct pg_store *)st;
	struct pg_local *l = calloc(1, sizeof(*l));

	if (l == NULL)
		return;
	l->s = s;
	l->base = base;
	TAILQ_INIT(&l->queue);
	TAILQ_INIT(&l->watchers);
	l->nconns = s->conns_per_thread;
	l->conns = calloc((size_t)l->nconns, sizeof(*l->conns));
	if (l->conns == NULL) {
		free(l);
		return;
	}
	pthread_mutex_lock(&s->mu);
	l->next = s->locals;
	s->locals = l;
	pthread_mutex_unlock(&s->mu);
	/* one connection now (so that /readyz tells); more under load; the
	 * listener when the first duplicate waits, or at once when every
	 * notification is wanted (a cache to keep coherent) */
	if (conn_init(l, &l->conns[0], false) < 0)
		log_error("postgres store: cannot set up a connection");
	if (s->notify_fn != NULL && conn_init(l, &l->listen, true) < 0)
		log_error("postgres store: cannot set up the listener");
}

static void local_free(struct pg_local *l)
{
	struct pg_op *o;

	while ((o = TAILQ_FIRST(&l->queue)) != NULL) {
		TAILQ_REMOVE(&l->queue, o, link);
		op_free(o);
	}
	while ((o = TAILQ_FIRST(&l->watchers)) != NULL) {
		TAILQ_REMOVE(&l->watchers, o, link);
		op_free(o);
	}
	for (int i = 0; i < l->nconns; i++)
		conn_close(&l->conns[i]);
	conn_close(&l->listen);
	free(l->conns);
	free(l);
}

static void pg_thread_done(struct store *st, struct event_base *base)
{
	struct pg_store *s = (struct pg_store *)st;
	struct pg_local **pp, *l = NULL;

	pthread_mutex_lock(&s->mu);
	for (pp = &s->locals; *pp != NULL; pp = &(*pp)->next) {
		if ((*pp)->base == base) {
			l = *pp;
			*pp = l->next;
			break;
		}
	}
	pthread_mutex_unlock(&s->mu);
	if (tl_cache.local == l)
		memset(&tl_cache, 0, sizeof(tl_cache));
	if (l != NULL)
		local_free(l);
}

static void pg_free(struct store *st)
{
	struct pg_store *s = (struct pg_store *)st;

	while (s->locals != NULL) {
		struct pg_local *l = s->locals;

		s->locals = l->next;
		local_free(l);
	}
	pthread_mutex_destroy(&s->mu);
	free(s->conninfo);
	free(s->setup_sql);
	free(s);
}

static const struct store_ops pg_ops_table = {
	.name = "postgres",
	.claim = pg_claim,
	.complete = pg_complete,
	.release = pg_release,
	.extend = pg_extend,
	.watch = pg_watch,
	.cancel = pg_cancel,
	.ready = pg_ready,
	.sweep = pg_sweep,
	.thread_init = pg_thread_init,
	.thread_done = pg_thread_done,
	.free = pg_free,
	.kind = STORE_KIND_POSTGRES,
};

void store_pg_on_notify(struct store *st, store_pg_notify_fn fn, void *arg)
{
	struct pg_store *s = (struct pg_store *)st;

	s->notify_fn = fn;
	s->notify_arg = arg;
}

struct store *store_pg_new(const char *conninfo, int conns_per_thread)
{
	struct pg_store *s = calloc(1, sizeof(*s));

	if (s == NULL)
		return NULL;
	s->base.ops = &pg_ops_table;
	s->conns_per_thread = conns_per_thread > 0 ? conns_per_thread : 2;
	s->conninfo = strdup(conninfo);
	if (asprintf(&s->setup_sql, "%s"
		     "PREPARE idem_claim (text, text, bytea, text, bigint, bigint) AS %s;\n"
		     "PREPARE idem_complete (text, text, text, int, bytea, bytea, bigint) AS %s;\n"
		     "PREPARE idem_release (text, text, text) AS %s;\n"
		     "PREPARE idem_extend (text, text, text, bigint) AS %s;\n"
		     "PREPARE idem_sweep (int) AS %s;\n",
		     store_pg_schema_sql, store_pg_claim_sql, store_pg_complete_sql,
		     release_sql, extend_sql, sweep_sql) < 0)
		s->setup_sql = NULL;
	if (s->conninfo == NULL || s->setup_sql == NULL) {
		free(s->conninfo);
		free(s->setup_sql);
		free(s);
		return NULL;
	}
	pthread_mutex_init(&s->mu, NULL);
	atomic_init(&s->up, 0);
	return &s->base;
}

int store_pg_migrate(const char *conninfo, char *err, size_t errlen)
{
	PGconn *pg = PQconnectdb(conninfo);
	PGresult *r;
	int rc = 0;

	if (PQstatus(pg) != CONNECTION_OK) {
		snprintf(err, errlen, "cannot connect: %s", PQerrorMessage(pg));
		PQfinish(pg);
		return -1;
	}
	r = PQexec(pg, store_pg_schema_sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK &&
	    PQresultStatus(r) != PGRES_COMMAND_OK) {
		snprintf(err, errlen, "migration failed: %s", PQerrorMessage(pg));
		rc = -1;
	}
	PQclear(r);
	PQfinish(pg);
	return rc;
}
