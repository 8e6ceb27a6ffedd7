/*
 * store_pg_pool.c - the PostgreSQL store's connections (see store_pg.c for
 * the whole picture): per thread, a queue of operations, up to N statement
 * connections in pipeline mode and one listener, each driven by libevent.
 *
 *   connection: DOWN ──start──▶ CONNECTING ──ok──▶ SETUP ──ok──▶ IDLE ⇄ BUSY
 *                 ▲  back-off      │ (PQconnectPoll)  (migrate,      (one
 *                 └────────────────┴── any failure ──  PREPARE)      batch)
 *
 * An idle connection takes what is queued as one batch (one pipeline, one
 * Sync: one transaction). Results are held until the Sync; a connection
 * lost before it leaves the batch's outcome unknown, and its operations
 * are queued again until their deadlines.
 *
 * A replicated cluster (docs/ha.md). With several hosts, CONNECTING races
 * a probe per host (store_pg_hosts.h), each with its own deadline, a host
 * that refused (down, or a standby: read-write is asked for) asked again
 * every PG_REPROBE_MS; the first to accept writes wins and becomes the
 * store's primary, and any connection of this thread on another host is
 * dropped. A statement that finds the server read-only (SQLSTATE 25006:
 * demoted, or a VIP/pooler that lags) drops its connection too; its batch
 * rolled back and is sent again. A commit that PostgreSQL made without the
 * synchronous standby's acknowledgement (the WARNING "canceling wait for
 * synchronous replication": a cancelled or terminated wait) is not an
 * outcome: its operations are sent again, and only an acknowledged commit
 * of theirs (each re-send writes) counts.
 */
#include "store_pg_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"

static void conn_start(struct pg_conn *c);
static void dispatch(struct pg_local *l);
static void grow(struct pg_local *l);
static int pg_conn_init(struct pg_local *l, struct pg_conn *c, bool listener);
static void arm_io(struct pg_conn *c, short what);
static void io_cb(evutil_socket_t fd, short what, void *arg);
static void run_setup(struct pg_conn *c);
static void probes_stop(struct pg_conn *c);
static void drop_stale(struct pg_local *l);

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
		pg_give_up(o);
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

/* Is any statement connection of l up, or on its way up? */
bool pg_may_serve(const struct pg_local *l)
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
	if (!pg_may_serve(l))
		hasten(l);
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
	if (o->kind == PG_CLAIM && !pg_may_serve(o->local)) {
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
		pg_op_free(o);	/* the next interval sweeps again */
	} else if (o->cb == NULL && o->kind != PG_RELEASE && !o->abandoned) {
		pg_op_free(o);	/* cancelled: nobody to tell */
	} else if (o->errors >= PG_STMT_ERRORS || clock_ms() >= o->deadline_ms) {
		pg_give_up(o);
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

/* Fail the connection: close, reconnect later; its batch's outcome is
 * unknown. */
static void conn_fail(struct pg_conn *c, const char *why)
{
	struct pg_local *l = c->local;
	struct pg_store *s = l->s;
	struct timeval tv;
	struct pg_op *o, *next;
	int delay;

	if (!atomic_exchange(&s->down_logged, true))
		log_warn("postgres store: %s%s%s", why, c->pg != NULL ? ": " : "",
			 c->pg != NULL ? PQerrorMessage(c->pg) : "");
	metrics_store_error(STORE_KIND_POSTGRES);
	pg_dns_stale(s->dns);		/* the name may have moved */
	if (c->pg != NULL && s->hosts.probe)
		atomic_store(&s->failed[c->host], true);
	if (c->io != NULL) {
		event_free(c->io);
		c->io = NULL;
	}
	evtimer_del(c->timer);
	probes_stop(c);
	if (c->pg != NULL) {
		PQfinish(c->pg);
		c->pg = NULL;
	}
	set_up(c, false);
	c->state = PGC_DOWN;
	c->unacked = false;
	c->read_only = false;
	c->waking = false;
	delay = c->backoff_ms;
	c->backoff_ms = c->backoff_ms * 2 > PG_BACKOFF_MAX_MS ?
				PG_BACKOFF_MAX_MS : c->backoff_ms * 2;
	if (!c->listener && !TAILQ_EMPTY(&c->batch)) {
		batch_unknown(c);	/* may requeue: hasten sees the timer */
		if (delay > PG_BACKOFF_PENDING_MS)
			delay = PG_BACKOFF_PENDING_MS;
	}
	if (!c->listener && !pg_may_serve(l)) {
		/* nothing can serve the queue now: a fresh claim is refused
		 * (never sent, so not claimed); everything else waits for a
		 * connection until its deadline */
		for (o = TAILQ_FIRST(&l->queue); o != NULL; o = next) {
			next = TAILQ_NEXT(o, link);
			if (o->kind != PG_CLAIM || o->sent)
				continue;
			TAILQ_REMOVE(&l->queue, o, link);
			o->where = OP_NEW;
			metrics_store_error(STORE_KIND_POSTGRES);
			pg_op_finish(o, STORE_ERROR);
		}
		if (!TAILQ_EMPTY(&l->queue) && delay > PG_BACKOFF_PENDING_MS)
			delay = PG_BACKOFF_PENDING_MS;
	}
	c->retry_at = clock_ms() + (uint64_t)delay;
	tv = clock_tv((uint64_t)delay);
	evtimer_add(c->timer, &tv);
}

/*
 * (Re)arm the socket event. Until the connection is set up its socket can
 * change between connect steps (another address, another host; a closed
 * socket's number may come back for the next), so each step makes a new
 * event. Once it is IDLE or BUSY the socket stays, and the event is left
 * alone unless what it waits for changes: no epoll_ctl per batch.
 */
static void arm_io(struct pg_conn *c, short what)
{
	int fd = PQsocket(c->pg);

	if (c->io != NULL && (c->state == PGC_IDLE || c->state == PGC_BUSY) &&
	    c->io_fd == fd && c->io_what == what)
		return;
	if (c->io != NULL)
		event_free(c->io);
	c->io_fd = fd;
	c->io_what = what;
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

/*
 * The session behind c is not ours alone: a pooler between us and
 * PostgreSQL hands it to other clients between transactions (pgbouncer's
 * pool_mode = transaction or statement), or handed it on without a reset.
 * Prepared statements then go missing or exist already, and a LISTEN
 * hears for whoever holds the session when a notification comes: purges
 * go unheard while the response cache replays what they deleted. Said
 * once as an error, and the cache turns off for good: any listener may be
 * deaf without knowing. The connections go on as they can (a transaction
 * is still atomic, and every claim is one).
 */
static void session_shared(struct pg_conn *c, const char *seen)
{
	struct pg_store *s = c->local->s;

	if (!atomic_exchange(&s->shared, true)) {
		log_error("postgres store: %s: a pooler between idemproxy and "
			  "PostgreSQL gives sessions to other clients, or "
			  "hands them on without a reset; each connection "
			  "needs a session of its own (pgbouncer: pool_mode = "
			  "session, server_reset_query = DISCARD ALL; "
			  "docs/ha.md). The response cache is off until "
			  "idemproxy restarts", seen);
		if (s->notify_fn != NULL)
			s->notify_fn(s->notify_arg, STORE_PG_SHARED, NULL);
	}
}

/* SQLSTATE 42P05 duplicate_prepared_statement on a new connection, or
 * 26000 invalid_sql_statement_name on one that prepared its statements:
 * either way another client's session. */
static bool session_not_ours(const PGresult *r)
{
	const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);

	return state != NULL && (strcmp(state, "42P05") == 0 ||
				 strcmp(state, "26000") == 0);
}

/* A new connection migrates (idempotent, under the advisory lock) and
 * prepares its statements before it takes work; the listener LISTENs and
 * notes which backend its session is (probes compare). */
static void run_setup(struct pg_conn *c)
{
	c->state = PGC_SETUP;
	c->session_pid = 0;
	if (!PQsendQuery(c->pg, c->listener ? "LISTEN idemproxy; "
				"SELECT pg_backend_pid() AS " PG_SESSION_COLUMN :
				c->local->s->setup_sql)) {
		conn_fail(c, "setup");
		return;
	}
	flush(c);
}

static void probe_tick(struct pg_conn *c);
static void drain_results(struct pg_conn *c);

/*
 * A batch's deadline passed. The results may be in the socket already:
 * after this process was stalled (SIGSTOP, a paused VM) the timer and the
 * socket are ready together, and libevent may run the timer first. Read
 * them before giving up - a claim PostgreSQL committed is an outcome, not
 * an unknown. The connection fails only when the batch is still on the
 * wire after that (a batch sent from here on has a deadline of its own).
 */
static void busy_timeout(struct pg_conn *c)
{
	if (PQconsumeInput(c->pg))
		drain_results(c);
	if (c->pg != NULL && c->state == PGC_BUSY &&
	    !evtimer_pending(c->timer, NULL)) {
		if (!c->listener && c->local->s->hosts.probe)
			atomic_store(&c->local->s->slow_at[c->host], clock_ms());
		conn_fail(c, c->listener ? "the listener did not answer its "
			  "probe" : "statement timed out");
	}
}

/*
 * The listener proves it still hears. A connection whose flow a NAT or a
 * load balancer dropped without a reset looks healthy until TCP gives up
 * (keepalives: store_pg_hosts.c), and meanwhile every purge goes unheard
 * while the response cache serves what was purged. So every
 * PG_LISTEN_PROBE_MS it runs a query: PostgreSQL sends a session the
 * notifications committed before its query ends ahead of the query's
 * result, so an answer proves every purge committed before the probe was
 * sent has been heard. No answer within PG_LISTEN_DEADLINE_MS and the
 * listener is down: the cache forgets everything and serves nothing
 * until a new listener is up (store_cache_listening). A purge is thus
 * unheard for at most PG_LISTEN_PROBE_MS + PG_LISTEN_DEADLINE_MS.
 */
static void listen_probe_later(struct pg_conn *c)
{
	struct timeval tv = clock_tv(PG_LISTEN_PROBE_MS);

	evtimer_add(c->timer, &tv);
}

static void listen_probe(struct pg_conn *c)
{
	struct timeval tv = clock_tv(PG_LISTEN_DEADLINE_MS);

	if (!PQsendQuery(c->pg, "SELECT pg_backend_pid() AS "
			 PG_SESSION_COLUMN)) {
		conn_fail(c, "the listener's probe");
		return;
	}
	c->state = PGC_BUSY;
	evtimer_add(c->timer, &tv);
	flush(c);
}

static void listen_probe_result(struct pg_conn *c, PGresult *r)
{
	if (r != NULL) {
		ExecStatusType st = PQresultStatus(r);
		bool moved = st == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
			     c->session_pid != 0 &&
			     atoi(PQgetvalue(r, 0, 0)) != c->session_pid;

		PQclear(r);
		if (moved)
			session_shared(c, "the listener's probe ran in another "
				       "session than its LISTEN");
		if (st != PGRES_TUPLES_OK)
			conn_fail(c, "the listener's probe failed");
		return;
	}
	c->state = PGC_IDLE;
	evtimer_del(c->timer);
	listen_probe_later(c);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct pg_conn *c = arg;

	if (c->probing)
		probe_tick(c);
	else if (c->state == PGC_DOWN)
		conn_start(c);
	else if (c->state == PGC_BUSY)
		busy_timeout(c);
	else if (c->state == PGC_IDLE && c->listener)
		listen_probe(c);
	else if (c->state == PGC_CONNECTING || c->state == PGC_SETUP)
		conn_fail(c, "connect timed out");
}

/* Is this the server saying it committed without the synchronous
 * standby (syncrep.c: "canceling wait for synchronous replication due to
 * user request", "canceling the wait for synchronous replication and
 * terminating connection due to administrator command")? English
 * messages (lc_messages): docs/ha.md. */
static bool sync_wait_cancelled(const PGresult *r)
{
	const char *sev = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
	const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);

	return sev != NULL && strcmp(sev, "WARNING") == 0 && msg != NULL &&
	       strncmp(msg, "canceling ", 10) == 0 &&
	       strstr(msg, "wait for synchronous replication") != NULL;
}

/* The server's notices: a cancelled synchronous wait marks the batch;
 * the rest (e.g. FATAL at shutdown) are not ours to print, failures reach
 * the log through conn_fail. */
static void notice_cb(void *arg, const PGresult *r)
{
	struct pg_conn *c = arg;

	if (sync_wait_cancelled(r)) {
		c->unacked = true;
		return;
	}
	log_debug("postgres: %s", PQresultErrorMessage(r));
}

/* A new PGconn of c's: non-blocking, its notices to c. */
static bool pg_ready(struct pg_conn *c, PGconn *pg)
{
	if (pg == NULL || PQstatus(pg) == CONNECTION_BAD ||
	    PQsetnonblocking(pg, 1) != 0)
		return false;
	PQsetNoticeReceiver(pg, notice_cb, c);
	return true;
}

/* ---- several hosts: a probe per host ---------------------------------- */

void pg_close_conn(PGconn **pg, struct event **io)
{
	if (*io != NULL) {
		event_free(*io);
		*io = NULL;
	}
	if (*pg != NULL) {
		PQfinish(*pg);
		*pg = NULL;
	}
}

static void probe_stop(struct pg_probe *p)
{
	pg_close_conn(&p->pg, &p->io);
	p->parked_at = 0;
}

static void probes_stop(struct pg_conn *c)
{
	if (c->probes == NULL)
		return;
	for (int i = 0; i < c->local->s->hosts.n; i++)
		probe_stop(&c->probes[i]);
	c->probing = false;
}

static void probe_failed(struct pg_probe *p, const char *why)
{
	const char *msg = p->pg != NULL ? PQerrorMessage(p->pg) : "";
	size_t n;

	snprintf(p->why, sizeof(p->why), "%s%s%s", why, msg[0] ? ": " : "",
		 msg);
	n = strlen(p->why);
	while (n > 0 && (p->why[n - 1] == '\n' || p->why[n - 1] == ' '))
		p->why[--n] = '\0';
	log_debug("postgres store: %s: %s",
		  p->c->local->s->hosts.label[p->host], p->why);
	atomic_store(&p->c->local->s->failed[p->host], true);
	pg_dns_stale(p->c->local->s->dns);
	probe_stop(p);
	p->next_at = clock_ms() + PG_REPROBE_MS;
}

static void probe_cb(evutil_socket_t fd, short what, void *arg);

static void probe_arm(struct pg_probe *p, short what)
{
	if (p->io != NULL)
		event_free(p->io);
	p->io = event_new(p->c->local->base, PQsocket(p->pg),
			  what | EV_PERSIST, probe_cb, p);
	if (p->io == NULL || event_add(p->io, NULL) < 0)
		probe_failed(p, "cannot watch its socket");
}

static void probe_launch(struct pg_probe *p)
{
	const struct pg_hosts *h = &p->c->local->s->hosts;
	const char **values;
	char why[160];

	p->started = clock_ms();
	values = pg_dns_values(p->c->local->s->dns, h, p->host, why,
			       sizeof(why));
	if (values == NULL) {
		probe_failed(p, why);
		return;
	}
	p->pg = PQconnectStartParams(h->keywords, values, 0);
	free(values);
	if (!pg_ready(p->c, p->pg)) {
		probe_failed(p, "cannot start a connection");
		return;
	}
	probe_arm(p, EV_WRITE);
}

/*
 * p reached a server that accepts writes: it is c's connection now. It
 * becomes the store's primary - and connections elsewhere are dropped -
 * only when the primary known so far has failed since it last came up:
 * two hosts that both take writes (two poolers in front of one primary)
 * must not chase each other's connections away.
 */
static void probe_won(struct pg_conn *c, struct pg_probe *p)
{
	struct pg_store *s = c->local->s;
	struct timeval tv = clock_tv(PG_CONNECT_TIMEOUT_MS);
	int was = atomic_load(&s->primary);

	c->pg = p->pg;
	c->host = p->host;
	p->pg = NULL;
	probes_stop(c);
	evtimer_del(c->timer);
	evtimer_add(c->timer, &tv);	/* the setup's deadline */
	atomic_store(&s->failed[c->host], false);
	if (was != c->host &&
	    (was < 0 || atomic_load(&s->failed[was])) &&
	    atomic_compare_exchange_strong(&s->primary, &was, c->host))
		log_info("postgres store: the primary is %s", s->hosts.label[c->host]);
	run_setup(c);
}

/* Is a probe of p's connection other than p still connecting? */
static bool others_connecting(const struct pg_probe *p)
{
	const struct pg_conn *c = p->c;

	for (int i = 0; i < c->local->s->hosts.n; i++)
		if (i != p->host && c->probes[i].pg != NULL &&
		    c->probes[i].parked_at == 0)
			return true;
	return false;
}

/*
 * p reached a server that accepts writes, but one where a statement timed
 * out lately (PG_SLOW_HOST_MS): a primary that lost its role still
 * accepts writes and holds every commit (docs/ha.md). While another host
 * is still being asked, p waits for one of them to win instead, at most
 * PG_PARK_MS (probe_tick); a pooler of the same primary, or the only
 * primary there is, is then taken all the same.
 */
static bool probe_parks(struct pg_probe *p)
{
	const struct pg_store *s = p->c->local->s;
	uint64_t slow = atomic_load(&s->slow_at[p->host]);
	uint64_t now = clock_ms();

	if (slow == 0 || now - slow >= PG_SLOW_HOST_MS || !others_connecting(p))
		return false;
	if (p->io != NULL) {
		event_free(p->io);
		p->io = NULL;
	}
	p->parked_at = now;
	log_debug("postgres store: %s accepts writes, but a statement timed "
		  "out there %llu ms ago: another host first", s->hosts.label[p->host],
		  (unsigned long long)(now - slow));
	return true;
}

static void probe_cb(evutil_socket_t fd, short what, void *arg)
{
	struct pg_probe *p = arg;

	switch (PQconnectPoll(p->pg)) {
	case PGRES_POLLING_READING:
		probe_arm(p, EV_READ);
		return;
	case PGRES_POLLING_WRITING:
		probe_arm(p, EV_WRITE);
		return;
	case PGRES_POLLING_OK:
		if (!probe_parks(p))
			probe_won(p->c, p);
		return;
	default:
		probe_failed(p, "refused");
		return;
	}
}

/*
 * Every PG_PROBE_TICK_MS while probing: a probe past its own deadline
 * fails (a frozen host: its kernel accepted, nothing answers), a host that
 * failed is asked again, and the whole search ends at PG_CONNECT_TIMEOUT_MS.
 */
static void probe_tick(struct pg_conn *c)
{
	const struct pg_hosts *h = &c->local->s->hosts;
	struct timeval tick = clock_tv(PG_PROBE_TICK_MS);
	uint64_t now = clock_ms();

	for (int i = 0; i < h->n; i++) {
		struct pg_probe *p = &c->probes[i];

		if (p->parked_at != 0 && (now - p->parked_at >= PG_PARK_MS ||
					  !others_connecting(p))) {
			probe_won(c, p);
			return;
		}
	}
	if (now >= c->probe_deadline) {
		char why[1024];
		size_t n = 0;

		n += (size_t)snprintf(why, sizeof(why), "no primary among %d hosts",
				      h->n);
		for (int i = 0; i < h->n && n < sizeof(why); i++)
			n += (size_t)snprintf(why + n, sizeof(why) - n, "; %s: %s",
					      h->label[i], c->probes[i].pg != NULL ?
					      "no answer" : c->probes[i].why);
		probes_stop(c);
		conn_fail(c, why);
		return;
	}
	for (int i = 0; i < h->n; i++) {
		struct pg_probe *p = &c->probes[i];

		if (p->pg != NULL && p->parked_at == 0 &&
		    now - p->started >= PG_HOST_CONNECT_MS)
			probe_failed(p, "no answer in time");
		else if (p->pg == NULL && now >= p->next_at)
			probe_launch(p);
	}
	evtimer_add(c->timer, &tick);
}

/* Look for the primary on every host at once. */
static void probes_start(struct pg_conn *c)
{
	const struct pg_hosts *h = &c->local->s->hosts;
	struct timeval tick = clock_tv(PG_PROBE_TICK_MS);

	c->state = PGC_CONNECTING;
	c->probing = true;
	c->probe_deadline = clock_ms() + PG_CONNECT_TIMEOUT_MS;
	/* a probe wins only in probe_cb, never while being launched */
	for (int i = 0; i < h->n; i++) {
		c->probes[i].why[0] = '\0';
		c->probes[i].next_at = 0;
		probe_launch(&c->probes[i]);
	}
	evtimer_add(c->timer, &tick);
}

static void conn_start(struct pg_conn *c)
{
	const struct pg_hosts *h = &c->local->s->hosts;
	const char **values;
	char why[160];

	if (h->probe) {
		probes_start(c);
		return;
	}
	c->host = 0;
	values = pg_dns_values(c->local->s->dns, h, 0, why, sizeof(why));
	if (values == NULL) {
		conn_fail(c, why);
		return;
	}
	c->pg = PQconnectStartParams(h->keywords, values, 0);
	free(values);
	if (!pg_ready(c, c->pg)) {
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

/* Is c on a host other than the primary, one that failed since it last
 * came up (the old primary: frozen, demoted, gone)? */
static bool stale(const struct pg_conn *c)
{
	const struct pg_store *s = c->local->s;
	int primary = atomic_load_explicit(&s->primary, memory_order_relaxed);

	return s->hosts.probe && c->pg != NULL && primary >= 0 &&
	       c->host != primary && atomic_load(&s->failed[c->host]);
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
			pg_op_committed(o);
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

/*
 * The primary streams WAL to someone but waits for no standby, or lets
 * this session not wait: a failover to such a standby can lose claims and
 * completions already acknowledged, whose keys then execute again
 * (docs/ha.md, "What each replication mode guarantees"). A warning only:
 * a WAL sender may be a backup or logical decoding, never promoted. At most
 * once per PG_ASYNC_LOG_MS for the whole store, from whichever connection
 * of whichever thread sees it.
 */
static void check_replication(struct pg_conn *c, const PGresult *r)
{
	struct pg_store *s = c->local->s;
	const char *senders, *names, *commit, *why;
	uint64_t now = clock_ms(), last;

	if (PQntuples(r) != 1)
		return;
	senders = PQgetvalue(r, 0, 0);
	names = PQgetvalue(r, 0, 1);
	commit = PQgetvalue(r, 0, 2);
	if (strcmp(senders, "0") == 0)
		return;
	if (names[0] == '\0')
		why = "synchronous_standby_names is empty";
	else if (strcmp(commit, "local") == 0 || strcmp(commit, "off") == 0)
		why = commit[0] == 'l' ? "synchronous_commit is local" :
					 "synchronous_commit is off";
	else
		return;
	last = atomic_load(&s->async_logged_ms);
	if ((last != 0 && now - last < PG_ASYNC_LOG_MS) ||
	    !atomic_compare_exchange_strong(&s->async_logged_ms, &last, now))
		return;
	log_warn("postgres store: %s:%s streams WAL to %s sender(s) but %s: "
		 "a failover to a standby can lose claims and completions "
		 "already acknowledged, and their keys run again "
		 "(docs/ha.md)", PQhost(c->pg), PQport(c->pg), senders, why);
}

/* The setup batch (or the listener's LISTEN) answered. */
static void setup_result(struct pg_conn *c, PGresult *r)
{
	if (r != NULL) {
		ExecStatusType st = PQresultStatus(r);

		if (st == PGRES_TUPLES_OK && PQnfields(r) == 3 &&
		    strcmp(PQfname(r, 0), PG_REPLICATION_COLUMN) == 0)
			check_replication(c, r);
		if (st == PGRES_TUPLES_OK && PQnfields(r) == 1 &&
		    PQntuples(r) == 1 &&
		    strcmp(PQfname(r, 0), PG_SESSION_COLUMN) == 0)
			c->session_pid = atoi(PQgetvalue(r, 0, 0));
		if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
			if (session_not_ours(r))
				session_shared(c, "a new connection's session "
					       "had its statements already");
			conn_fail(c, "setup failed");
		}
		PQclear(r);
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
	if (c->listener)
		listen_probe_later(c);
	drop_stale(c->local);
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
			conn_fail(c, "the server is read-only (a standby, not "
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
		wake = c->batch_failed ? 0 : pg_send_wake(c);
		if (wake == 1) {
			c->waking = true;
		} else {
			evtimer_del(c->timer);
			c->state = PGC_IDLE;
		}
		batch_done(c);		/* outcomes now */
		if (wake < 0)
			conn_fail(c, "send failed");
		else if (wake == 1)
			flush(c);
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
			c->read_only = true;	/* conn_fail says it, once */
		if (session_not_ours(r))
			session_shared(c, "a prepared statement was missing");
		if (o != NULL && o->result == NULL && !o->stmt_failed) {
			o->stmt_failed = true;
			if (!c->read_only)
				log_warn("postgres store: %s: %s",
					 pg_stmt_name(o->kind),
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
		else if (c->listener)
			listen_probe_result(c, r);
		else
			batch_result(c, r);
	}
	while (c->pg != NULL && (n = PQnotifies(c->pg)) != NULL) {
		notified(c->local, n->extra);
		PQfreemem(n);
		/* a statement connection never LISTENs: another client did
		 * in this session */
		if (!c->listener)
			session_shared(c, "a statement connection heard a "
				       "notification");
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
		if (pg_send_op(c, o) < 0) {
			conn_fail(c, "send failed");
			return;
		}
	if (PQpipelineSync(c->pg) != 1) {
		conn_fail(c, "send failed");
		return;
	}
	c->state = PGC_BUSY;
	c->sent_us = clock_us();
	c->unacked = false;
	c->read_only = false;
	c->reading = TAILQ_FIRST(&c->batch);
	evtimer_add(c->timer, &tv);
	flush(c);
}

/*
 * The primary moved (a connection of any thread found it on another
 * host): this thread's connections elsewhere - idle, busy (their batch
 * is sent again), or the listener, which would hear nothing from the new
 * primary - reconnect.
 */
static void drop_stale(struct pg_local *l)
{
	if (!l->s->hosts.probe)
		return;		/* one host: nothing to be stale against */
	for (int i = 0; i < l->nconns; i++)
		if (l->conns[i].state != PGC_DOWN && stale(&l->conns[i]))
			conn_fail(&l->conns[i], "the primary moved");
	if (l->listen.used && l->listen.state != PGC_DOWN && stale(&l->listen))
		conn_fail(&l->listen, "the primary moved");
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
 * flush, the rest go to another connection then, as before.
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
	drop_stale(l);
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

static int pg_conn_init(struct pg_local *l, struct pg_conn *c, bool listener)
{
	c->local = l;
	c->listener = listener;
	c->used = true;
	c->backoff_ms = PG_BACKOFF_MIN_MS;
	TAILQ_INIT(&c->batch);
	c->timer = evtimer_new(l->base, timer_cb, c);
	if (c->timer == NULL)
		return -1;
	if (l->s->hosts.probe) {
		c->probes = calloc((size_t)l->s->hosts.n, sizeof(*c->probes));
		if (c->probes == NULL)
			return -1;
		for (int i = 0; i < l->s->hosts.n; i++) {
			c->probes[i].c = c;
			c->probes[i].host = i;
		}
	}
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
	if (c->used)
		probes_stop(c);
	free(c->probes);
	if (c->pg != NULL)
		PQfinish(c->pg);
	set_up(c, false);
	if (c->used) {
		while ((o = TAILQ_FIRST(&c->batch)) != NULL) {
			TAILQ_REMOVE(&c->batch, o, link);
			pg_op_free(o);
		}
	}
	memset(c, 0, sizeof(*c));
}

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
		conn_close(&l->conns[i]);
	conn_close(&l->listen);
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
