/*
 * store_pg_conn.c - the PostgreSQL store's connections (see store_pg.c for
 * the whole picture): connecting, the setup, following the primary, and
 * the listener, each driven by libevent. What a connection carries - the
 * queue, the batches and their results - is store_pg_batch.c's: it hands
 * its pool's connections a table of hooks (struct pg_conn_hooks).
 *
 *   connection: DOWN ──start──▶ CONNECTING ──ok──▶ SETUP ──ok──▶ IDLE ⇄ BUSY
 *                 ▲  back-off      │ (PQconnectPoll)  (migrate,      (one
 *                 └────────────────┴── any failure ──  PREPARE)      batch)
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
 * synchronous replication": a cancelled or terminated wait) is marked on
 * the connection (notice_cb) for the batch's results to see.
 */
#include "store_pg_conn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"

#define PG_CONNECT_TIMEOUT_MS 5000
#define PG_BACKOFF_MIN_MS 100
/* A PostgreSQL that is down is asked again at least this often: a
 * failover's new primary is found within it (docs/ha.md). */
#define PG_BACKOFF_MAX_MS 500
#define PG_BACKOFF_PENDING_MS 250	/* reconnect this often while work waits */
/* How often check_replication's warning may repeat. */
#define PG_ASYNC_LOG_MS (10 * 60 * 1000)
/* The listener's backend, in its setup and its probes (and so in
 * pg_stat_activity). */
#define PG_SESSION_COLUMN "idemproxy_listener"
/* Several hosts (store_pg_hosts.h): each is connected to on its own. */
#define PG_HOST_CONNECT_MS 2000	/* one host's connect and startup */
#define PG_REPROBE_MS 200	/* a host that refused is asked again */
#define PG_PROBE_TICK_MS 50
/* A host where a statement timed out (a primary that lost its role and
 * waits for a standby that is gone, docs/ha.md) loses ties for this long,
 * or until a batch commits there: a probe that reaches it waits up to
 * PG_PARK_MS for another host to accept writes first. */
#define PG_SLOW_HOST_MS 30000
#define PG_PARK_MS 500
#define PG_LISTEN_PROBE_MS 1000	/* the listener proves it hears this often */
#define PG_LISTEN_DEADLINE_MS 2000	/* ... or is down this long after */

static void conn_start(struct pg_conn *c);
static void arm_io(struct pg_conn *c, short what);
static void io_cb(evutil_socket_t fd, short what, void *arg);
static void run_setup(struct pg_conn *c);
static void probes_stop(struct pg_conn *c);
static void probe_tick(struct pg_conn *c);
static void probe_cb(evutil_socket_t fd, short what, void *arg);
static void drain_results(struct pg_conn *c);

/* Is any statement connection of l up, or on its way up? */
bool pg_conn_may_serve(const struct pg_local *l)
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
void pg_conn_hasten(struct pg_local *l)
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

/* Fail the connection: close, reconnect later; its batch's outcome is
 * unknown. */
void pg_conn_fail(struct pg_conn *c, const char *why)
{
	struct pg_local *l = c->local;
	struct pg_store *s = l->s;
	struct timeval tv;
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
	/* the batch is sent again, fresh claims nothing can serve are refused
	 * (store_pg_batch.c): work that waits reconnects sooner */
	if (!c->listener && l->hooks->lost(c) && delay > PG_BACKOFF_PENDING_MS)
		delay = PG_BACKOFF_PENDING_MS;
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
		pg_conn_fail(c, "cannot watch its socket");
}

/* Send what libpq has buffered; watch for writability until done. */
void pg_conn_flush(struct pg_conn *c)
{
	int rc = PQflush(c->pg);

	if (rc < 0)
		pg_conn_fail(c, "send failed");
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
void pg_conn_shared(struct pg_conn *c, const char *seen)
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
bool pg_conn_not_ours(const PGresult *r)
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
		pg_conn_fail(c, "setup");
		return;
	}
	pg_conn_flush(c);
}

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
		pg_conn_fail(c, c->listener ? "the listener did not answer its "
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
		pg_conn_fail(c, "the listener's probe");
		return;
	}
	c->state = PGC_BUSY;
	evtimer_add(c->timer, &tv);
	pg_conn_flush(c);
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
			pg_conn_shared(c, "the listener's probe ran in another "
				       "session than its LISTEN");
		if (st != PGRES_TUPLES_OK)
			pg_conn_fail(c, "the listener's probe failed");
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
		pg_conn_fail(c, "connect timed out");
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
 * the log through pg_conn_fail. */
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

void pg_conn_shut(PGconn **pg, struct event **io)
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
	pg_conn_shut(&p->pg, &p->io);
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
		pg_conn_fail(c, why);
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
		pg_conn_fail(c, why);
		return;
	}
	c->pg = PQconnectStartParams(h->keywords, values, 0);
	free(values);
	if (!pg_ready(c, c->pg)) {
		pg_conn_fail(c, "cannot start a connection");
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
			if (pg_conn_not_ours(r))
				pg_conn_shared(c, "a new connection's session "
					       "had its statements already");
			pg_conn_fail(c, "setup failed");
		}
		PQclear(r);
		return;
	}
	/* the setup is over: statement connections work in pipelines */
	if (!c->listener && PQenterPipelineMode(c->pg) != 1) {
		pg_conn_fail(c, "cannot enter pipeline mode");
		return;
	}
	c->backoff_ms = PG_BACKOFF_MIN_MS;
	evtimer_del(c->timer);	/* the connect deadline */
	set_up(c, true);
	c->state = PGC_IDLE;
	if (c->listener)
		listen_probe_later(c);
	pg_conn_drop_stale(c->local);
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
			c->local->hooks->result(c, r);
	}
	while (c->pg != NULL && (n = PQnotifies(c->pg)) != NULL) {
		c->local->hooks->notified(c->local, n->extra);
		PQfreemem(n);
		/* a statement connection never LISTENs: another client did
		 * in this session */
		if (!c->listener)
			pg_conn_shared(c, "a statement connection heard a "
				       "notification");
	}
	if (c->pg != NULL && c->state == PGC_IDLE && !c->listener)
		c->local->hooks->idle(c->local);
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
			pg_conn_fail(c, "connect failed");
			return;
		}
	}
	if (what & EV_WRITE) {
		pg_conn_flush(c);
		if (c->pg == NULL)
			return;
	}
	if (what & EV_READ) {
		if (!PQconsumeInput(c->pg)) {
			pg_conn_fail(c, "connection lost");
			return;
		}
		drain_results(c);
	}
}

/*
 * The primary moved (a connection of any thread found it on another
 * host): this thread's connections elsewhere - idle, busy (their batch
 * is sent again), or the listener, which would hear nothing from the new
 * primary - reconnect.
 */
void pg_conn_drop_stale(struct pg_local *l)
{
	if (!l->s->hosts.probe)
		return;		/* one host: nothing to be stale against */
	for (int i = 0; i < l->nconns; i++)
		if (l->conns[i].state != PGC_DOWN && stale(&l->conns[i]))
			pg_conn_fail(&l->conns[i], "the primary moved");
	if (l->listen.used && l->listen.state != PGC_DOWN && stale(&l->listen))
		pg_conn_fail(&l->listen, "the primary moved");
}

int pg_conn_init(struct pg_local *l, struct pg_conn *c, bool listener)
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

/* Thread shutdown: close (the pool freed the batch on the wire first). */
void pg_conn_close(struct pg_conn *c)
{
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
	memset(c, 0, sizeof(*c));
}
