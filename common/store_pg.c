/*
 * store_pg.c - PostgreSQL store (see store_pg.h).
 *
 *   thread_init ──▶ per-thread pool: N worker connections + 1 listener
 *
 *   connection: DOWN ──start──▶ CONNECTING ──ok──▶ SETUP ──ok──▶ IDLE ⇄ BUSY
 *                 ▲  back-off      │ (PQconnectPoll)  (migrate,      (one
 *                 └────────────────┴── any failure ──  PREPARE)      statement)
 *
 * Operations wait in the thread's queue for an idle connection, run as one
 * prepared statement each (PQsendQueryPrepared, non-blocking, results read
 * as libpq makes them available), and report through an event on the
 * caller's loop. With no connection up, operations fail at once
 * (STORE_ERROR): the engine then applies --store-down. A statement that
 * takes longer than PG_OP_TIMEOUT_MS fails its operation and the connection
 * is reset (libpq 15 has no non-blocking cancel).
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

#include "log.h"
#include "metrics.h"

#define PG_POLL_MS 500
#define PG_OP_TIMEOUT_MS 5000
#define PG_CONNECT_TIMEOUT_MS 5000
#define PG_BACKOFF_MIN_MS 100
#define PG_BACKOFF_MAX_MS 5000
#define PG_SWEEP_BATCH 1000
#define PG_CLAIM_RETRIES 5
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
 * One row: ('won') when the insert or the takeover happened; else the
 * existing record as it was when the statement started. No row: the record
 * changed under us (e.g. released meanwhile); claim again.
 */
const char store_pg_claim_sql[] =
	"WITH ins AS (\n"
	"  INSERT INTO idempotency_keys AS k\n"
	"    (scope, key, fingerprint, state, owner, lease_until, expires_at)\n"
	"  VALUES ($1, $2, $3, 'in_flight', $4,\n"
	"          now() + $5 * interval '1 millisecond',\n"
	"          now() + greatest($5, $6) * interval '1 millisecond')\n"
	"  ON CONFLICT (scope, key) DO UPDATE\n"
	"    SET fingerprint = excluded.fingerprint, state = 'in_flight',\n"
	"        owner = excluded.owner, lease_until = excluded.lease_until,\n"
	"        status = NULL, headers = NULL, body = NULL, created_at = now(),\n"
	"        expires_at = excluded.expires_at\n"
	"    WHERE k.expires_at <= now()\n"
	"       OR (k.state = 'in_flight' AND k.lease_until <= now()\n"
	"           AND k.fingerprint = excluded.fingerprint)\n"
	"  RETURNING 1)\n"
	"SELECT 'won'::text, NULL::bytea, NULL::int, NULL::bytea, NULL::bytea,\n"
	"       NULL::bigint\n"
	"  FROM ins\n"
	"UNION ALL\n"
	"SELECT k.state, k.fingerprint, k.status, k.headers, k.body,\n"
	"       greatest(0, extract(epoch FROM k.expires_at - now()) * 1000)::bigint\n"
	"  FROM idempotency_keys k\n"
	" WHERE k.scope = $1 AND k.key = $2 AND NOT EXISTS (SELECT 1 FROM ins)";

/* $1 scope, $2 key, $3 owner, $4 status, $5 headers, $6 body (NULL: not
 * stored), $7 ttl ms. One row when completed, none when fenced. */
const char store_pg_complete_sql[] =
	"WITH u AS (\n"
	"  UPDATE idempotency_keys\n"
	"     SET state = 'completed', status = $4, headers = $5, body = $6,\n"
	"         owner = NULL, lease_until = NULL,\n"
	"         expires_at = now() + $7 * interval '1 millisecond'\n"
	"   WHERE scope = $1 AND key = $2 AND owner = $3 AND state = 'in_flight'\n"
	"  RETURNING 1)\n"
	"SELECT pg_notify('idemproxy', $1 || ':' || $2) FROM u";

static const char release_sql[] =
	"WITH d AS (\n"
	"  DELETE FROM idempotency_keys\n"
	"   WHERE scope = $1 AND key = $2 AND owner = $3 AND state = 'in_flight'\n"
	"  RETURNING 1)\n"
	"SELECT pg_notify('idemproxy', $1 || ':' || $2) FROM d";

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

struct pg_local;
struct pg_op;
TAILQ_HEAD(pg_ops, pg_op);

struct pg_op {
	struct store_op op;		/* first: the generic handle */
	enum pg_kind kind;
	struct pg_local *local;
	store_cb cb;			/* NULL: internal, or cancelled */
	void *arg;
	struct event *ev;		/* delivery; a waiter's poll timeout */
	struct store_result res;
	TAILQ_ENTRY(pg_op) link;	/* on local->queue or local->watchers */
	enum {
		OP_NEW, OP_QUEUED, OP_RUNNING, OP_WATCHING, OP_DELIVERING,
	} where;
	bool cancelled;
	int attempts;

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
	PGC_IDLE,
	PGC_BUSY,		/* one operation's statement */
};

struct pg_conn {
	struct pg_local *local;
	PGconn *pg;
	struct event *io;
	struct event *timer;		/* back-off, or the statement deadline */
	enum pgc_state state;
	struct pg_op *op;
	int backoff_ms;
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
};

static const struct store_ops pg_ops_table;
static void conn_start(struct pg_conn *c);
static void dispatch(struct pg_local *l);
static void grow(struct pg_local *l);
static int conn_init(struct pg_local *l, struct pg_conn *c, bool listener);

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

static void op_free(struct pg_op *o)
{
	if (o->ev != NULL)
		event_free(o->ev);
	stored_response_unref(o->resp);
	stored_response_unref(o->res.resp);
	free(o);
}

static void deliver_cb(evutil_socket_t fd, short what, void *arg)
{
	struct pg_op *o = arg;

	if (o->where == OP_WATCHING) {
		/* the poll timeout: claim again */
		TAILQ_REMOVE(&o->local->watchers, o, link);
		o->res.status = STORE_SETTLED;
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
	o->where = OP_DELIVERING;
	event_active(o->ev, EV_TIMEOUT, 1);
}

static struct pg_op *op_new(struct pg_store *s, struct event_base *base,
			    enum pg_kind kind, const struct store_key *k,
			    store_cb cb, void *arg)
{
	struct pg_local *l = local_for(s, base);
	struct pg_op *o;

	if (l == NULL) {
		log_error("postgres store used on a loop it was not set up for");
		return NULL;
	}
	o = calloc(1, sizeof(*o));
	if (o == NULL)
		return NULL;
	o->op.store = &s->base;
	o->kind = kind;
	o->local = l;
	o->cb = cb;
	o->arg = arg;
	if (k != NULL)
		o->key = *k;
	o->ev = event_new(base, -1, 0, deliver_cb, o);
	if (o->ev == NULL) {
		free(o);
		return NULL;
	}
	return o;
}

/* Is any statement connection of l up, or on its way up? */
static bool may_serve(const struct pg_local *l)
{
	for (int i = 0; i < l->nconns; i++)
		if (l->conns[i].used && l->conns[i].state != PGC_DOWN)
			return true;
	return false;
}

/* Queue for a connection, or fail at once when none is up or coming up
 * (a connection on its way is bounded by PG_CONNECT_TIMEOUT_MS). */
static struct store_op *op_submit(struct pg_op *o)
{
	struct pg_local *l = o->local;

	if (!may_serve(l)) {
		op_finish(o, STORE_ERROR);
		return &o->op;
	}
	o->where = OP_QUEUED;
	TAILQ_INSERT_TAIL(&l->queue, o, link);
	dispatch(l);
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
	if (c->listener)
		return;
	c->local->up += up ? 1 : -1;
	if (up) {
		if (atomic_fetch_add(&s->up, 1) == 0 &&
		    atomic_exchange(&s->down_logged, false))
			log_info("postgres store reachable again");
	} else {
		atomic_fetch_sub(&s->up, 1);
	}
}

static void arm_io(struct pg_conn *c, short what);

/* Fail the connection: report its operation, close, reconnect later. */
static void conn_fail(struct pg_conn *c, const char *why)
{
	struct pg_local *l = c->local;
	struct pg_store *s = l->s;
	struct timeval tv;
	struct pg_op *o;

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
	if ((o = c->op) != NULL) {
		c->op = NULL;
		op_finish(o, STORE_ERROR);
	}
	if (!may_serve(l)) {
		/* nothing can serve the queue: fail fast, do not hang */
		while ((o = TAILQ_FIRST(&l->queue)) != NULL) {
			TAILQ_REMOVE(&l->queue, o, link);
			op_finish(o, STORE_ERROR);
		}
	}
	tv.tv_sec = c->backoff_ms / 1000;
	tv.tv_usec = (c->backoff_ms % 1000) * 1000;
	evtimer_add(c->timer, &tv);
	c->backoff_ms = c->backoff_ms * 2 > PG_BACKOFF_MAX_MS ?
				PG_BACKOFF_MAX_MS : c->backoff_ms * 2;
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
		struct timeval tv = { PG_CONNECT_TIMEOUT_MS / 1000,
				      (PG_CONNECT_TIMEOUT_MS % 1000) * 1000 };

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

/* The claim statement's row: won, or the existing record. */
static void claim_result(struct pg_op *o, const PGresult *r)
{
	const char *state;
	int slen;

	if (PQntuples(r) == 0) {
		/* the record changed under the statement: claim again */
		if (++o->attempts >= PG_CLAIM_RETRIES) {
			op_finish(o, STORE_ERROR);
			return;
		}
		o->where = OP_QUEUED;
		TAILQ_INSERT_HEAD(&o->local->queue, o, link);
		return;
	}
	state = PQgetvalue(r, 0, 0);
	slen = PQgetlength(r, 0, 0);
	if (slen == 3 && memcmp(state, "won", 3) == 0) {
		memcpy(o->res.owner, o->owner, sizeof(o->owner));
		if (o->cancelled) {
			/* nobody will execute it: give the key back now rather
			 * than leave it stuck for a lease */
			o->kind = PG_RELEASE;
			o->where = OP_QUEUED;
			TAILQ_INSERT_HEAD(&o->local->queue, o, link);
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

/* The statement of c->op produced this result. */
static void op_result(struct pg_conn *c, struct pg_op *o, const PGresult *r)
{
	ExecStatusType st = PQresultStatus(r);

	if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
		log_warn("postgres store: %s: %s", stmt_names[o->kind],
			 PQresultErrorMessage(r));
		metrics_store_error(STORE_KIND_POSTGRES);
		op_finish(o, STORE_ERROR);
		return;
	}
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

/* Wake the waiters of "<scope>:<key>". */
static void notified(struct pg_local *l, const char *payload)
{
	struct pg_op *o, *next;
	const char *colon = strchr(payload, ':');
	size_t slen;

	if (colon == NULL)
		return;
	slen = (size_t)(colon - payload);
	for (o = TAILQ_FIRST(&l->watchers); o != NULL; o = next) {
		next = TAILQ_NEXT(o, link);
		if (strlen(o->key.scope) == slen &&
		    memcmp(o->key.scope, payload, slen) == 0 &&
		    strcmp(o->key.key, colon + 1) == 0) {
			TAILQ_REMOVE(&l->watchers, o, link);
			event_del(o->ev);
			op_finish(o, STORE_SETTLED);
		}
	}
}

/* Everything libpq has for us: results, notifications, the end of a
 * statement. */
static void drain_results(struct pg_conn *c)
{
	PGnotify *n;

	while (c->pg != NULL && !PQisBusy(c->pg)) {
		PGresult *r = PQgetResult(c->pg);

		if (r == NULL) {
			/* the statement (or setup batch) is over */
			if (c->state == PGC_SETUP) {
				c->backoff_ms = PG_BACKOFF_MIN_MS;
				evtimer_del(c->timer);	/* the connect deadline */
				set_up(c, true);
			}
			if (c->state == PGC_BUSY)
				evtimer_del(c->timer);
			c->state = PGC_IDLE;
			c->op = NULL;
			break;
		}
		if (c->state == PGC_SETUP) {
			ExecStatusType st = PQresultStatus(r);

			PQclear(r);
			if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
				conn_fail(c, "setup failed");
				return;
			}
			continue;
		}
		if (c->state == PGC_BUSY && c->op != NULL) {
			struct pg_op *o = c->op;

			c->op = NULL;	/* a result per statement: the rest is drained */
			op_result(c, o, r);
		}
		PQclear(r);
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

/* Text parameters except the binary ones (fingerprint, headers, body). */
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
	/* results in binary: bytea and int4 arrive as they are stored */
	if (!PQsendQueryPrepared(c->pg, stmt_names[o->kind], n, v, len, fmt, 1))
		return -1;
	return 0;
}

/* Give queued operations to idle connections. */
static void dispatch(struct pg_local *l)
{
	for (int i = 0; i < l->nconns && !TAILQ_EMPTY(&l->queue); i++) {
		struct pg_conn *c = &l->conns[i];
		struct timeval tv = { PG_OP_TIMEOUT_MS / 1000,
				      (PG_OP_TIMEOUT_MS % 1000) * 1000 };
		struct pg_op *o;

		if (c->state != PGC_IDLE)
			continue;
		o = TAILQ_FIRST(&l->queue);
		TAILQ_REMOVE(&l->queue, o, link);
		o->where = OP_RUNNING;
		c->op = o;
		c->state = PGC_BUSY;
		if (send_op(c, o) < 0) {
			conn_fail(c, "send failed");
			continue;
		}
		evtimer_add(c->timer, &tv);
		flush(c);
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
	c->timer = evtimer_new(l->base, timer_cb, c);
	if (c->timer == NULL)
		return -1;
	conn_start(c);
	return 0;
}

static void conn_close(struct pg_conn *c)
{
	if (c->io != NULL)
		event_free(c->io);
	if (c->timer != NULL)
		event_free(c->timer);
	if (c->pg != NULL)
		PQfinish(c->pg);
	set_up(c, false);
	if (c->op != NULL)
		op_free(c->op);	/* cancelled, or nobody left to tell */
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
				    struct stored_response *resp, uint64_t ttl_ms,
				    store_cb cb, void *arg)
{
	struct pg_op *o = op_new((struct pg_store *)st, base, PG_COMPLETE, k,
				 cb, arg);

	if (o == NULL)
		return NULL;
	snprintf(o->owner, sizeof(o->owner), "%s", owner);
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
	struct timeval tv = { PG_POLL_MS / 1000, (PG_POLL_MS % 1000) * 1000 };

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

static void pg_cancel(struct store_op *op)
{
	struct pg_op *o = (struct pg_op *)op;

	switch (o->where) {
	case OP_QUEUED:
	case OP_WATCHING:
		TAILQ_REMOVE(o->where == OP_QUEUED ? &o->local->queue :
						     &o->local->watchers, o, link);
		op_free(o);
		return;
	case OP_RUNNING:
		/* the statement is on the wire: forget the caller; a claim
		 * that wins anyway is released (claim_result) */
		o->cb = NULL;
		o->cancelled = true;
		return;
	case OP_NEW:
	case OP_DELIVERING:
		op_free(o);	/* event_free drops a pending activation */
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
	 * listener when the first duplicate waits */
	if (conn_init(l, &l->conns[0], false) < 0)
		log_error("postgres store: cannot set up a connection");
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
