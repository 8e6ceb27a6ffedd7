/*
 * store_pg_batch.c - the PostgreSQL store's work (see store_pg.c for the
 * whole picture): per thread, a queue of operations, the batches that
 * its connections (store_pg_conn.c) carry, their results, and the order
 * in which operations settle.
 *
 * An idle connection takes what is queued as one batch (one pipeline, one
 * Sync: one transaction), its operations in the order of their keys'
 * locks (order_batch). Results are held until the Sync; a connection
 * lost before it leaves the batch's outcome unknown, and its operations
 * are queued again until their deadlines. Completions and releases go
 * ahead of claims in the queue (enqueue_settling). A batch that hit a
 * read-only server is sent again to the primary; one whose commit the
 * synchronous standby did not acknowledge is not an outcome: its
 * operations are sent again, and only an acknowledged commit of theirs
 * (each re-send writes) counts. What a statement is and what its result
 * means is store_pg.c's, through s->meaning (struct pg_meaning).
 */
#include "store_pg_batch.h"

#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "siphash.h"
#include "store_pg_conn.h"

#define PG_OP_TIMEOUT_MS 5000	/* a batch on the wire; an operation's life */
#define PG_STMT_ERRORS 3	/* a statement failing on its own */
/* A batch in flight holds the queue for at most this long, while at least
 * PG_HOLD_SIBLINGS operations are outstanding (hold()). */
#define PG_HOLD_US 2000
#define PG_HOLD_SIBLINGS 4

static void dispatch(struct pg_local *l);
static void grow(struct pg_local *l);

static _Thread_local struct {
	struct pg_store *s;
	struct event_base *base;
	struct pg_local *local;
} tl_cache;

static void op_clear_attempt(struct pg_op *o)
{
	if (o->result != NULL) {
		PQclear(o->result);
		o->result = NULL;
	}
	o->stmt_failed = false;
}

void pg_op_free(struct pg_op *o)
{
	if (o->ev != NULL)
		event_free(o->ev);
	op_clear_attempt(o);
	if (o->unacked != NULL)
		PQclear(o->unacked);
	stored_response_unref(o->resp);
	stored_response_unref(o->res.resp);
	free(o);
}

static void op_ev_cb(evutil_socket_t fd, short what, void *arg)
{
	struct pg_op *o = arg;

	switch (o->where) {
	case OP_QUEUED:
		/* its deadline passed before a connection could take it */
		TAILQ_REMOVE(&o->local->queue, o, link);
		o->where = OP_NEW;
		o->local->s->meaning->give_up(o);
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
	pg_op_free(o);
}

/* Report the result on the caller's loop (next turn). */
void pg_op_finish(struct pg_op *o, enum store_status st)
{
	o->res.status = st;
	if (o->cb == NULL) {
		pg_op_free(o);	/* internal or cancelled: nobody to tell */
		return;
	}
	event_del(o->ev);
	o->where = OP_DELIVERING;
	event_active(o->ev, EV_TIMEOUT, 1);
}

/* See store_pg_batch.h. */
int64_t pg_lock_id(const struct store_key *k)
{
	static const char lock_key[] = "idemproxy-lock-1";	/* 16 bytes */
	char buf[sizeof(k->scope) + sizeof(k->key)];
	size_t a = strlen(k->scope), b = strlen(k->key);

	memcpy(buf, k->scope, a);
	buf[a] = '\0';
	memcpy(buf + a + 1, k->key, b);
	return (int64_t)siphash24((const uint8_t *)lock_key, buf, a + 1 + b);
}

struct pg_op *pg_op_alloc(struct pg_local *l, enum pg_kind kind,
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
	if (k != NULL) {
		o->key = *k;
		o->lock = pg_lock_id(k);
	}
	o->deadline_ms = clock_ms() + PG_OP_TIMEOUT_MS;
	o->ev = event_new(l->base, -1, 0, op_ev_cb, o);
	if (o->ev == NULL) {
		free(o);
		return NULL;
	}
	return o;
}

struct pg_op *pg_op_new(struct pg_store *s, struct event_base *base,
			enum pg_kind kind, const struct store_key *k,
			store_cb cb, void *arg)
{
	struct pg_local *l = pg_local_for(s, base);

	if (l == NULL) {
		log_error("postgres store used on a loop it was not set up for");
		return NULL;
	}
	return pg_op_alloc(l, kind, k, cb, arg);
}

/*
 * The queue goes to idle connections at the end of the loop turn in which
 * it grew, not at each operation: the claims of all the requests one turn
 * read leave as one batch (one round trip, one transaction) rather than
 * one on each idle connection. A lone claim still leaves in its own turn.
 */
static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
	dispatch(arg);
}

/*
 * Put o on the queue right after `after` (NULL: at the head) with its
 * deadline armed; idle connections take it at the end of the turn.
 */
static void enqueue_after(struct pg_op *o, struct pg_op *after)
{
	struct pg_local *l = o->local;
	uint64_t now = clock_ms();
	struct timeval tv = clock_tv(o->deadline_ms > now ? o->deadline_ms - now : 0);

	o->where = OP_QUEUED;
	if (after == NULL)
		TAILQ_INSERT_HEAD(&l->queue, o, link);
	else
		TAILQ_INSERT_AFTER(&l->queue, after, o, link);
	event_add(o->ev, &tv);
	if (!pg_conn_may_serve(l))
		pg_conn_hasten(l);
	event_active(l->kick, EV_TIMEOUT, 1);
}

/* At the head for a retry (keeping its turn), else at the tail. */
void pg_enqueue(struct pg_op *o, bool head)
{
	enqueue_after(o, head ? NULL : TAILQ_LAST(&o->local->queue, pg_ops));
}

/* An owner's outcome: what settles a key someone may be waiting for. */
static bool settles(const struct pg_op *o)
{
	return o->kind == PG_COMPLETE || o->kind == PG_RELEASE;
}

/*
 * Put settling operation o behind the others at the head of the queue,
 * ahead of claims and the rest. After an outage the queue holds both
 * the completions of requests executed before it and claims of their
 * retries: a completion that goes first makes the retry a replay, while
 * a claim that goes first, once the lease ran out, takes the key over
 * and executes it again (and fences the completion off).
 */
static void enqueue_settling(struct pg_op *o)
{
	struct pg_op *after = NULL, *x;

	TAILQ_FOREACH(x, &o->local->queue, link) {
		if (!settles(x))
			break;
		after = x;
	}
	enqueue_after(o, after);
}

/* Submit a new operation. A fresh claim with no connection up or coming
 * up fails at once: nothing was sent, so "not claimed" is exact. */
struct store_op *pg_op_submit(struct pg_op *o)
{
	if (o->kind == PG_CLAIM && !pg_conn_may_serve(o->local)) {
		metrics_store_error(STORE_KIND_POSTGRES);
		pg_op_finish(o, STORE_ERROR);
		return &o->op;
	}
	if (settles(o))
		enqueue_settling(o);
	else
		pg_enqueue(o, false);
	return &o->op;
}

/*
 * o's attempt is over without an outcome: rolled back (known: nothing
 * happened) or unknown (it may have committed). Send it again while its
 * deadline lasts. Cancelled operations are dropped, except releases and
 * abandoned claims (see pg_abandon(), store_pg_outcome.c).
 */
static void retry_op(struct pg_op *o)
{
	op_clear_attempt(o);
	o->where = OP_NEW;
	if (o->kind == PG_SWEEP) {
		o->local->sweeping = false;
		pg_op_free(o);	/* the next interval sweeps again */
	} else if (o->cb == NULL && o->kind != PG_RELEASE && !o->abandoned) {
		pg_op_free(o);	/* cancelled: nobody to tell */
	} else if (o->errors >= PG_STMT_ERRORS || clock_ms() >= o->deadline_ms) {
		o->local->s->meaning->give_up(o);
	} else {
		pg_enqueue(o, true);
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
	if (!failed && c->local->s->hosts.probe &&
	    atomic_load_explicit(&c->local->s->slow_at[c->host],
				 memory_order_relaxed) != 0)
		atomic_store(&c->local->s->slow_at[c->host], 0);
	TAILQ_FOREACH(o, &ops, link) {
		blamed |= o->stmt_failed;
		n++;
	}
	while ((o = TAILQ_FIRST(&ops)) != NULL) {
		TAILQ_REMOVE(&ops, o, link);
		o->where = OP_NEW;
		if (!failed && o->result != NULL) {
			o->local->s->meaning->committed(o);
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
			pg_op_finish(o, STORE_SETTLED);
		}
	}
}

/* SQLSTATE 25006 read_only_sql_transaction: a standby, or a session that
 * is read-only. */
static bool read_only(const PGresult *r)
{
	const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);

	return state != NULL && strcmp(state, "25006") == 0;
}

/*
 * The batch committed, but the wait for the synchronous standby was
 * cancelled: its changes may vanish in a failover. Nothing in it is an
 * outcome yet; every operation is sent again, and a re-send writes (the
 * claim's `own`, the completion's `again`, a purge's NOTIFY, ...), so its
 * commit waits for the standby - and covers this one, earlier in the WAL.
 */
static void batch_unacked(struct pg_conn *c)
{
	struct pg_op *o;
	int n = 0;

	TAILQ_FOREACH(o, &c->batch, link) {
		n++;
		if (o->result != NULL && !o->stmt_failed &&
		    (o->unacked == NULL || PQgetisnull(o->unacked, 0, 0))) {
			/* kept for the re-send's report (store_pg.c): the
			 * first that did something (a release, a purge) */
			if (o->unacked != NULL)
				PQclear(o->unacked);
			o->unacked = o->result;
			o->result = NULL;
		}
	}
	c->unacked = false;
	metrics_count_n(COUNTER_store_unacknowledged_commits_total,
			(unsigned long)n);
	log_warn("postgres store: %s: a commit of %d operation%s was not "
		 "acknowledged by the synchronous standby (its wait was "
		 "cancelled); written again", c->local->s->hosts.label[c->host],
		 n, n == 1 ? "" : "s");
	batch_unknown(c);
}

/* The wake-up's results (pg_send_wake): nothing to keep, and its Sync
 * frees the connection. A wake-up that failed leaves the waiters to their
 * poll. */
static void wake_result(struct pg_conn *c, PGresult *r)
{
	if (r == NULL)
		return;
	switch (PQresultStatus(r)) {
	case PGRES_PIPELINE_SYNC:
		evtimer_del(c->timer);
		c->waking = false;
		c->state = PGC_IDLE;
		break;
	case PGRES_TUPLES_OK:
	case PGRES_PIPELINE_ABORTED:
		break;
	default:
		log_warn("postgres store: waking waiters: %s(they poll)",
			 PQresultErrorMessage(r));
		break;
	}
	PQclear(r);
}

/* One result of the batch on the wire (NULL: the end of one statement's
 * results). */
static void batch_result(struct pg_conn *c, PGresult *r)
{
	struct pg_op *o = c->reading;
	int wake;

	if (c->waking) {
		wake_result(c, r);
		return;
	}
	if (r == NULL) {
		if (o != NULL && (o->result != NULL || o->stmt_failed))
			c->reading = TAILQ_NEXT(o, link);
		return;
	}
	switch (PQresultStatus(r)) {
	case PGRES_PIPELINE_SYNC:
		PQclear(r);
		if (c->read_only) {
			/* rolled back; not the statements' fault: all of them
			 * go to the primary, wherever it is now */
			pg_conn_fail(c, "the server is read-only (a standby, not "
				  "the primary)");
			return;
		}
		if (c->unacked && !c->batch_failed) {
			evtimer_del(c->timer);
			c->state = PGC_IDLE;
			batch_unacked(c);
			return;
		}
		c->unacked = false;
		/* committed: the waiters of its completions are woken by a
		 * transaction of their own; the connection stays busy until
		 * that answers (its deadline still running) */
		wake = c->batch_failed ? 0 : c->local->s->meaning->wake(c);
		if (wake == 1) {
			c->waking = true;
		} else {
			evtimer_del(c->timer);
			c->state = PGC_IDLE;
		}
		batch_done(c);		/* outcomes now */
		if (wake < 0)
			pg_conn_fail(c, "send failed");
		else if (wake == 1)
			pg_conn_flush(c);
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
		if (read_only(r))
			c->read_only = true;	/* pg_conn_fail says it, once */
		if (pg_conn_not_ours(r))
			pg_conn_shared(c, "a prepared statement was missing");
		if (o != NULL && o->result == NULL && !o->stmt_failed) {
			o->stmt_failed = true;
			if (!c->read_only)
				log_warn("postgres store: %s: %s",
					 c->local->s->meaning->name(o->kind),
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

/* A batch's operation, and where it was queued. */
struct ranked {
	struct pg_op *o;
	int at;
};

static int by_lock(const void *a, const void *b)
{
	const struct ranked *x = a, *y = b;

	if (x->o->lock != y->o->lock)
		return x->o->lock < y->o->lock ? -1 : 1;
	return x->at - y->at;	/* one key's operations: as queued */
}

/*
 * Put the operations of batch in the order of their keys' locks. A claim
 * holds its key's advisory lock until the commit, and a claim that marks a
 * record, takes it over or inserts it, a completion, a release, an
 * extension and a purge hold the key's row: every batch then takes the
 * locks it shares with another in the same order, and two batches never
 * wait for each other in a cycle.
 */
static void order_batch(struct pg_ops *batch)
{
	struct ranked ops[PG_BATCH_MAX];
	struct pg_op *o;
	int n = 0;

	while ((o = TAILQ_FIRST(batch)) != NULL && n < PG_BATCH_MAX) {
		TAILQ_REMOVE(batch, o, link);
		ops[n].o = o;
		ops[n].at = n;
		n++;
	}
	qsort(ops, (size_t)n, sizeof(ops[0]), by_lock);
	for (int i = 0; i < n; i++)
		TAILQ_INSERT_TAIL(batch, ops[i].o, link);
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
		if (alone)
			break;
	}
	order_batch(&c->batch);
	TAILQ_FOREACH(o, &c->batch, link)
		if (l->s->meaning->send(c, o) < 0) {
			pg_conn_fail(c, "send failed");
			return;
		}
	if (PQpipelineSync(c->pg) != 1) {
		pg_conn_fail(c, "send failed");
		return;
	}
	c->state = PGC_BUSY;
	c->sent_us = clock_us();
	c->unacked = false;
	c->read_only = false;
	c->reading = TAILQ_FIRST(&c->batch);
	evtimer_add(c->timer, &tv);
	pg_conn_flush(c);
}

/*
 * Whether the queue waits for the batch in flight rather than leaving now
 * on another connection, and if so for how long at most (*wait_us).
 *
 * Under load, a batch sent while another is in flight is a transaction of
 * its own - a commit, a round trip, and reads and writes on both sides -
 * for the few operations that queued meanwhile. Held, they leave together
 * when the batch in flight returns: with 8 clients PostgreSQL's CPU per
 * new key fell from 336-431 us to 179-192 us (docs/benchmarks.md, issue
 * 22, "The queue waits for the batch in flight"). PostgreSQL's own
 * commit_delay waits like this only while enough other transactions are
 * active (commit_siblings); so does this, while at least PG_HOLD_SIBLINGS
 * operations are outstanding (in flight and queued), so that a request
 * among few still leaves at once. A lone operation (nothing in flight)
 * and a full batch never wait, and nothing waits past PG_HOLD_US after
 * the youngest batch left: behind a batch waiting for a lock or a slow
 * pg_conn_flush, the rest go to another connection then, as before.
 */
static bool hold(const struct pg_local *l, uint64_t now, uint64_t *wait_us)
{
	const struct pg_op *o;
	uint64_t youngest = 0;
	int n = 0;

	TAILQ_FOREACH(o, &l->queue, link)
		if (++n >= PG_BATCH_MAX)
			return false;
	for (int i = 0; i < l->nconns; i++) {
		const struct pg_conn *c = &l->conns[i];

		if (c->state != PGC_BUSY)
			continue;
		if (c->sent_us > youngest)
			youngest = c->sent_us;
		TAILQ_FOREACH(o, &c->batch, link)
			n++;
	}
	if (youngest == 0 || n < PG_HOLD_SIBLINGS ||
	    now >= youngest + PG_HOLD_US)
		return false;
	*wait_us = youngest + PG_HOLD_US - now;
	return true;
}

static void hold_cb(evutil_socket_t fd, short what, void *arg)
{
	dispatch(arg);
}

/* Whether the queue is held; if so, dispatch runs again when it may go. */
static bool held(struct pg_local *l)
{
	uint64_t wait_us;
	struct timeval tv = { 0, 0 };

	if (!hold(l, clock_us(), &wait_us))
		return false;
	tv.tv_usec = (suseconds_t)wait_us;
	evtimer_add(l->hold, &tv);
	return true;
}

/* Give queued operations to idle connections, unless they are held; open
 * one more when work waits that nothing holds and none is idle. */
static void dispatch(struct pg_local *l)
{
	pg_conn_drop_stale(l);
	for (int i = 0; i < l->nconns && !TAILQ_EMPTY(&l->queue); i++) {
		struct pg_conn *c = &l->conns[i];

		if (c->state != PGC_IDLE)
			continue;
		if (held(l))
			return;
		send_batch(c);
	}
	if (!TAILQ_EMPTY(&l->queue) && !held(l))
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
	if (unused >= 0 && pg_conn_init(l, &l->conns[unused], false) < 0)
		log_error("postgres store: cannot set up a connection");
}

/* Thread shutdown: c closes; whatever is on the wire is dropped
 * unanswered (its callers are gone: the worker aborted its engines
 * first). */
static void conn_free(struct pg_conn *c)
{
	struct pg_op *o;

	if (c->used) {
		while ((o = TAILQ_FIRST(&c->batch)) != NULL) {
			TAILQ_REMOVE(&c->batch, o, link);
			pg_op_free(o);
		}
	}
	pg_conn_close(c);
}

/*
 * c failed (pg_conn_fail, before it reconnects): its batch's outcome is
 * unknown, and every operation in it is sent again; when nothing can
 * serve the queue any more, a fresh claim is refused (never sent, so not
 * claimed) and everything else waits for a connection until its
 * deadline. True when work waits for the connection.
 */
static bool conn_lost(struct pg_conn *c)
{
	struct pg_local *l = c->local;
	struct pg_op *o, *next;
	bool waits = false;

	if (!TAILQ_EMPTY(&c->batch)) {
		batch_unknown(c);	/* may requeue: pg_conn_hasten sees the timer */
		waits = true;
	}
	if (!pg_conn_may_serve(l)) {
		for (o = TAILQ_FIRST(&l->queue); o != NULL; o = next) {
			next = TAILQ_NEXT(o, link);
			if (o->kind != PG_CLAIM || o->sent)
				continue;
			TAILQ_REMOVE(&l->queue, o, link);
			o->where = OP_NEW;
			metrics_store_error(STORE_KIND_POSTGRES);
			pg_op_finish(o, STORE_ERROR);
		}
		if (!TAILQ_EMPTY(&l->queue))
			waits = true;
	}
	return waits;
}

/* What a thread's connections tell this module. */
static const struct pg_conn_hooks conn_hooks = {
	.lost = conn_lost,
	.result = batch_result,
	.notified = notified,
	.idle = dispatch,
};

struct pg_local *pg_local_for(struct pg_store *s, struct event_base *base)
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

void pg_local_free(struct pg_local *l)
{
	struct pg_op *o;

	if (tl_cache.local == l)
		memset(&tl_cache, 0, sizeof(tl_cache));
	while ((o = TAILQ_FIRST(&l->queue)) != NULL) {
		TAILQ_REMOVE(&l->queue, o, link);
		pg_op_free(o);
	}
	while ((o = TAILQ_FIRST(&l->watchers)) != NULL) {
		TAILQ_REMOVE(&l->watchers, o, link);
		pg_op_free(o);
	}
	for (int i = 0; i < l->nconns; i++)
		conn_free(&l->conns[i]);
	conn_free(&l->listen);
	if (l->kick != NULL)
		event_free(l->kick);
	if (l->hold != NULL)
		event_free(l->hold);
	free(l->conns);
	free(l);
}

struct pg_local *pg_local_new(struct pg_store *s, struct event_base *base)
{
	struct pg_local *l = calloc(1, sizeof(*l));

	if (l == NULL)
		return NULL;
	l->s = s;
	l->base = base;
	TAILQ_INIT(&l->queue);
	TAILQ_INIT(&l->watchers);
	l->hooks = &conn_hooks;
	l->nconns = s->conns_per_thread;
	l->conns = calloc((size_t)l->nconns, sizeof(*l->conns));
	l->kick = event_new(base, -1, 0, kick_cb, l);
	l->hold = evtimer_new(base, hold_cb, l);
	if (l->conns == NULL || l->kick == NULL || l->hold == NULL) {
		if (l->kick != NULL)
			event_free(l->kick);
		if (l->hold != NULL)
			event_free(l->hold);
		free(l->conns);
		free(l);
		return NULL;
	}
	/* one connection now (so that /readyz tells); more under load; the
	 * listener when the first duplicate waits, or at once when every
	 * notification is wanted (a cache to keep coherent) */
	if (pg_conn_init(l, &l->conns[0], false) < 0)
		log_error("postgres store: cannot set up a connection");
	if (s->notify_fn != NULL && pg_conn_init(l, &l->listen, true) < 0)
		log_error("postgres store: cannot set up the listener");
	return l;
}

void pg_watch_add(struct pg_op *o)
{
	struct pg_local *l = o->local;
	struct timeval tv = clock_tv(PG_POLL_MS);

	if (!l->listen.used && pg_conn_init(l, &l->listen, true) < 0)
		log_error("postgres store: cannot set up the listener");
	o->where = OP_WATCHING;
	TAILQ_INSERT_TAIL(&l->watchers, o, link);
	event_add(o->ev, &tv);	/* the bounded poll */
}
