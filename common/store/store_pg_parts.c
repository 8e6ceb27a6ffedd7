/*
 * store_pg_parts.c - retention of the partitioned table: whole partitions
 * dropped, on the main thread's loop, by a connection of its own.
 *
 *   tick ──▶ DOWN? connect ──▶ IDLE ──▶ PLAN: idemproxy_parts_plan(width)
 *                                         │ rows: what may go now
 *                                         ▼
 *              STEP: for each partition, alone on the connection
 *                detach:   ALTER TABLE ... DETACH PARTITION p CONCURRENTLY
 *                finalize: ALTER TABLE ... DETACH PARTITION p FINALIZE
 *                detach_now (Citus): ALTER TABLE ... DETACH PARTITION p,
 *                          under a statement timeout (add_steps)
 *                then:     DROP TABLE p; forget it
 *                                         │
 *                                         ▼ IDLE until the next tick
 *
 * The plan (store_pg_schema.c) creates the partitions ahead, and lists a
 * partition only when the clock is past its end, every transaction that
 * could still write into it has ended, and it holds no live record (the
 * last few are moved forward first). Nothing can make a record in it live
 * again: every write that does (a claim, a takeover, a completion, an
 * extension) writes into the current partition. It takes no lock that a
 * claim waits for: DETACH ... CONCURRENTLY takes SHARE UPDATE EXCLUSIVE
 * on the table (claims take ROW EXCLUSIVE) and waits for the queries that
 * still see the partition - a long-running one delays retention, never a
 * claim. It cannot run in a transaction or a pipeline, hence this
 * connection. One instance plans at a time (an advisory lock); any
 * instance takes over when that one is gone. A detach cut by a crash is
 * finished (FINALIZE) by the next plan.
 */
#include "store_pg_parts.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "store_pg_conn.h"
#include "store_pg_priv.h"

#define PARTS_TICK_MIN_MS 500
#define PARTS_TICK_MAX_MS 10000
#define PARTS_STEPS_MAX 32		/* partitions dropped in one round */
#define PARTS_LOCK_MS 5000		/* the longest a step waits */
#define PARTS_CITUS_DETACH_MS 1000	/* the longest a Citus detach
					 * holds claims up */
#define PARTS_STMT_MS 30000		/* a plan or step still running then:
					 * the server cannot commit */

enum pp_state {
	PP_DOWN,
	PP_CONNECTING,
	PP_IDLE,
	PP_PLAN,			/* the plan is running */
	PP_STEP,			/* steps[at] is running */
};

struct pp_step {
	char sql[256];
	char part[64];
	bool drops;			/* the last statement of a partition */
};

struct pg_parts {
	struct pg_store *s;
	struct event_base *base;
	PGconn *pg;
	struct event *io, *tick;
	enum pp_state state;
	uint64_t sent_ms;		/* PLAN, STEP: when it was sent */
	uint64_t tick_ms;
	bool failing;			/* a failure was logged */
	struct pp_step steps[2 * PARTS_STEPS_MAX];
	int nsteps, at;
	bool step_failed;
	bool forgot;			/* the step's DELETE removed the entry */
	bool replan;			/* the plan failed: reconnect */
};

static void pp_io_cb(evutil_socket_t fd, short what, void *arg);

static void pp_arm(struct pg_parts *p, short what)
{
	if (p->io != NULL)
		event_free(p->io);
	p->io = event_new(p->base, PQsocket(p->pg), what | EV_PERSIST,
			  pp_io_cb, p);
	if (p->io != NULL)
		event_add(p->io, NULL);
}

static void pp_close(struct pg_parts *p)
{
	pg_conn_shut(&p->pg, &p->io);
	p->state = PP_DOWN;
}

static void pp_fail(struct pg_parts *p, const char *why)
{
	const char *msg = p->pg != NULL ? PQerrorMessage(p->pg) : "";

	if (!p->failing)
		log_warn("postgres store: partition maintenance: %s%s%s", why,
			 msg[0] ? ": " : "", msg);
	p->failing = true;
	pp_close(p);
}

static void pp_connect(struct pg_parts *p)
{
	const struct pg_hosts *h = &p->s->hosts;
	int host = atomic_load(&p->s->primary);
	const char **values;
	char why[160];

	values = pg_dns_values(p->s->dns, h, host >= 0 ? host : 0, why,
			       sizeof(why));
	if (values == NULL) {
		log_debug("postgres store: partition maintenance: %s", why);
		return;
	}
	p->pg = PQconnectStartParams(h->keywords, values, 0);
	free(values);
	if (p->pg == NULL || PQstatus(p->pg) == CONNECTION_BAD) {
		pp_fail(p, "cannot connect");
		return;
	}
	p->state = PP_CONNECTING;
	pp_arm(p, EV_WRITE);
}

/* Send what comes next: the plan, or steps[at]. */
static void pp_send(struct pg_parts *p, const char *sql)
{
	if (!PQsendQuery(p->pg, sql)) {
		pp_fail(p, "cannot send");
		return;
	}
	p->sent_ms = clock_ms();
	pp_arm(p, EV_READ);
	if (PQflush(p->pg) == 1)
		pp_arm(p, EV_READ | EV_WRITE);
}

static void pp_plan(struct pg_parts *p)
{
	char sql[192];

	/* lock_timeout bounds a detach's wait for old queries too: one
	 * still running (a pg_dump) leaves the partition pending, to be
	 * finished later, instead of holding the table's SHARE UPDATE
	 * EXCLUSIVE lock - which creating the next partitions needs */
	snprintf(sql, sizeof(sql), "SET lock_timeout = '%d'; SET "
		 "statement_timeout = 0; SELECT action, part, n FROM "
		 "idemproxy_parts_plan(%llu)", PARTS_LOCK_MS,
		 (unsigned long long)p->s->part_width_ms);
	p->state = PP_PLAN;
	p->nsteps = 0;
	p->at = 0;
	pp_send(p, sql);
}

/* One more step (drops: the last of its partition's). */
static void add_step(struct pg_parts *p, const char *part, bool drops,
		     const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void add_step(struct pg_parts *p, const char *part, bool drops,
		     const char *fmt, ...)
{
	struct pp_step *st = &p->steps[p->nsteps++];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(st->sql, sizeof(st->sql), fmt, ap);
	va_end(ap);
	snprintf(st->part, sizeof(st->part), "%s", part);
	st->drops = drops;
}

/*
 * The steps that take partition `part` away: "detach" or "finalize"
 * first, or only "drop" (it was detached already). On a Citus coordinator
 * ("detach_now", "drop_now") every statement goes alone - Citus sends a
 * DDL statement's text to the workers as it came - and the detach is a
 * plain one, Citus having no DETACH ... CONCURRENTLY: it takes the shards'
 * tables ACCESS EXCLUSIVE on every worker, where claims queue behind it,
 * so a statement timeout of its own (the workers' waits end with the
 * coordinator's) bounds that to PARTS_CITUS_DETACH_MS, once a partition.
 * The next plan resets it (pp_plan).
 */
static void add_steps(struct pg_parts *p, const char *action,
		      const char *part)
{
	bool citus = strcmp(action, "detach_now") == 0 ||
		     strcmp(action, "drop_now") == 0;
	char *id, *lit;

	if (p->nsteps + 5 > (int)(sizeof(p->steps) / sizeof(p->steps[0])) ||
	    strncmp(part, "idempotency_keys_", 17) != 0 ||
	    strlen(part) >= sizeof(p->steps[0].part))
		return;
	id = PQescapeIdentifier(p->pg, part, strlen(part));
	lit = PQescapeLiteral(p->pg, part, strlen(part));
	if (id == NULL || lit == NULL) {
		PQfreemem(id);
		PQfreemem(lit);
		return;
	}
	if (strcmp(action, "detach_now") == 0) {
		add_step(p, part, false, "SET statement_timeout = %d",
			 PARTS_CITUS_DETACH_MS);
		add_step(p, part, false, "ALTER TABLE idempotency_keys DETACH "
			 "PARTITION %s", id);
		add_step(p, part, false, "SET statement_timeout = 0");
	} else if (strcmp(action, "detach") == 0 ||
		   strcmp(action, "finalize") == 0) {
		add_step(p, part, false, "ALTER TABLE idempotency_keys DETACH "
			 "PARTITION %s %s", id, action[0] == 'd' ?
			 "CONCURRENTLY" : "FINALIZE");
	}
	if (citus) {
		add_step(p, part, false, "DROP TABLE IF EXISTS %s", id);
		add_step(p, part, true, "DELETE FROM idempotency_keys_parts "
			 "WHERE name = %s", lit);
	} else {
		add_step(p, part, true, "DROP TABLE IF EXISTS %s; DELETE FROM "
			 "idempotency_keys_parts WHERE name = %s", id, lit);
	}
	PQfreemem(id);
	PQfreemem(lit);
}

static void plan_result(struct pg_parts *p, const PGresult *r)
{
	for (int i = 0; i < PQntuples(r); i++) {
		const char *action = PQgetvalue(r, i, 0);
		long n = strtol(PQgetvalue(r, i, 2), NULL, 10);

		if (strcmp(action, "stats") == 0)
			metrics_gauge_set(GAUGE_store_partitions, n);
		else if (strcmp(action, "lag") == 0)
			metrics_gauge_set(GAUGE_sweep_lag_seconds, n);
		else
			add_steps(p, action, PQgetvalue(r, i, 1));
	}
}

/* A statement finished (its last result read). */
static void pp_next(struct pg_parts *p)
{
	if (p->state == PP_STEP) {
		const struct pp_step *st = &p->steps[p->at];

		if (st->drops && !p->step_failed && p->forgot) {
			metrics_count(COUNTER_sweep_partitions_dropped_total);
			log_info("postgres store: partition %s dropped", st->part);
		}
		/* a failed detach skips the rest of its partition's steps:
		 * the next plan says again */
		p->at++;
		if (p->step_failed && !st->drops) {
			while (p->at < p->nsteps && !p->steps[p->at].drops)
				p->at++;
			p->at++;
		}
	}
	p->step_failed = false;
	p->forgot = false;
	if (p->at >= p->nsteps) {
		p->state = PP_IDLE;
		if (p->io != NULL)
			event_del(p->io);
		return;
	}
	p->state = PP_STEP;
	pp_send(p, p->steps[p->at].sql);
}

static void pp_read(struct pg_parts *p)
{
	PGresult *r;

	if (!PQconsumeInput(p->pg)) {
		pp_fail(p, "connection lost");
		return;
	}
	while (!PQisBusy(p->pg)) {
		r = PQgetResult(p->pg);
		if (r == NULL && p->replan) {
			p->replan = false;
			pp_close(p);
			return;
		}
		if (r == NULL) {
			pp_next(p);
			return;
		}
		switch (PQresultStatus(r)) {
		case PGRES_TUPLES_OK:
			if (p->state == PP_PLAN)
				plan_result(p, r);
			break;
		case PGRES_COMMAND_OK:
			/* dropped here, not by an instance racing us */
			if (strcmp(PQcmdStatus(r), "DELETE 1") == 0)
				p->forgot = true;
			break;
		default:
			/* a lock not granted in time, a concurrent detach: the
			 * next round tries again */
			log_info("postgres store: partition maintenance: %s",
				 PQresultErrorMessage(r));
			p->step_failed = true;
			/* a plan that failed (a read-only server: the primary
			 * moved) is made again on a new connection */
			if (p->state == PP_PLAN)
				p->replan = true;
			break;
		}
		PQclear(r);
	}
}

static void pp_io_cb(evutil_socket_t fd, short what, void *arg)
{
	struct pg_parts *p = arg;

	(void)fd;
	if (p->state == PP_CONNECTING) {
		switch (PQconnectPoll(p->pg)) {
		case PGRES_POLLING_READING:
			pp_arm(p, EV_READ);
			return;
		case PGRES_POLLING_WRITING:
			pp_arm(p, EV_WRITE);
			return;
		case PGRES_POLLING_OK:
			if (p->failing)
				log_info("postgres store: partition maintenance "
					 "connected");
			p->failing = false;
			p->state = PP_IDLE;
			PQsetnonblocking(p->pg, 1);
			event_del(p->io);
			pp_plan(p);
			return;
		default:
			pp_fail(p, "cannot connect");
			return;
		}
	}
	if ((what & EV_WRITE) && PQflush(p->pg) == 0)
		pp_arm(p, EV_READ);
	if (what & EV_READ)
		pp_read(p);
}

/*
 * Lock waits end at PARTS_LOCK_MS, so a statement still running long
 * after is stuck where no timeout reaches: a commit waiting for a
 * synchronous standby that is not coming (a primary that lost its role
 * without knowing it, docs/ha.md), a flow dropped without a reset that
 * keepalives do not see (a proxy in between answers them). The
 * connection goes; the next tick connects where the statement
 * connections last committed (by then, not there). A detach cut here is
 * finished by the next plan. A connection on another host than theirs is
 * left alone otherwise: two poolers of one primary look just the same.
 */
static void pp_check(struct pg_parts *p)
{
	if ((p->state == PP_PLAN || p->state == PP_STEP) &&
	    clock_ms() - p->sent_ms >= PARTS_STMT_MS)
		pp_fail(p, "a statement did not end in 30 s");
}

static void pp_tick(evutil_socket_t fd, short what, void *arg)
{
	struct pg_parts *p = arg;
	struct timeval tv = clock_tv(p->tick_ms);

	(void)fd;
	(void)what;
	evtimer_add(p->tick, &tv);
	/* no statement connection set up: the schema (a new database) may
	 * not be there yet, and the server is out of reach anyway */
	if (atomic_load(&p->s->up) == 0 && p->state <= PP_IDLE)
		return;
	pp_check(p);
	if (p->state == PP_DOWN)
		pp_connect(p);
	else if (p->state == PP_IDLE)
		pp_plan(p);
	/* else the last round is still under way (a detach waits for
	 * old queries): it goes on */
}

uint64_t pg_part_width(uint64_t ttl_ms)
{
	uint64_t w = ttl_ms / 4;

	return w < PG_PART_MIN_MS ? PG_PART_MIN_MS :
	       w > PG_PART_MAX_MS ? PG_PART_MAX_MS : w;
}

struct event_base *pg_parts_base(const struct pg_parts *p)
{
	return p->base;
}

struct pg_parts *pg_parts_start(struct pg_store *s, struct event_base *base)
{
	struct pg_parts *p = calloc(1, sizeof(*p));
	struct timeval now = { 0, 0 };

	if (p == NULL)
		return NULL;
	p->s = s;
	p->base = base;
	p->state = PP_DOWN;
	/* often enough that a partition goes soon after it may */
	p->tick_ms = s->part_width_ms / 2;
	if (p->tick_ms > PARTS_TICK_MAX_MS)
		p->tick_ms = PARTS_TICK_MAX_MS;
	if (p->tick_ms < PARTS_TICK_MIN_MS)
		p->tick_ms = PARTS_TICK_MIN_MS;
	p->tick = evtimer_new(base, pp_tick, p);
	if (p->tick == NULL) {
		free(p);
		return NULL;
	}
	evtimer_add(p->tick, &now);
	return p;
}

void pg_parts_free(struct pg_parts *p)
{
	if (p == NULL)
		return;
	pp_close(p);
	event_free(p->tick);
	free(p);
}
