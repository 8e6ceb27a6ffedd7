/*
 * store_redis_conn.c - the Redis fast path's connections (see
 * store_redis.h and store_redis_priv.h): one per (store, event_base),
 * reconnected with back-off, in sentinel mode pointed at the master the
 * sentinels name.
 *
 *   RC_DOWN ──connect──▶ RC_CONNECTING ──TCP up──▶ (sentinel: ROLE master?)
 *      ▲  ▲                  │ refused: next address     │
 *      │  └──── back-off ────┘                           ▼
 *      │                                  RC_PREPARING: SELECT db, SCRIPT
 *      │                                  LOAD (the write and the purge),
 *      │                                  INFO replication, TIME, pipelined
 *      │                                             │ every answer good
 *      └──── error, READONLY, NOSCRIPT, timeout ── RC_UP
 *
 * What preparation learns makes copies safe across failovers and late
 * writes: the epoch is the server's replication id, which a replica
 * promoted at a failover (or a restarted server) changes, so a copy
 * written before it - perhaps one a purge deleted on the old master
 * without the replica hearing - is a miss, never a replay; the clock
 * bound turns our monotonic clock into the server's, so a copy carries
 * an absolute expiry and the moment its record was learned, both of which
 * the server checks when the write arrives, however late.
 */
#include <limits.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <hiredis/hiredis.h>
#include <hiredis/adapters/libevent.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "store_redis_priv.h"

static void rc_connect(struct rconn *rc);

static void sentinel_failed(struct rconn *rc, const char *why);
static void rc_connect_failed(struct rconn *rc, const char *why);

/*
 * rc->retry: while RC_DOWN, the time to connect again; while a sentinel is
 * asked, or a connection is made and prepared, its deadline (a server that
 * accepts TCP and never answers: frozen, or a black hole behind a NAT).
 */
static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
	struct rconn *rc = arg;
	char why[64];

	(void)fd;
	(void)what;
	snprintf(why, sizeof(why), "no answer in %d ms", RC_CONNECT_MS);
	switch (rc->state) {
	case RC_DOWN:
		rc_connect(rc);
		break;
	case RC_ASKING:
		sentinel_failed(rc, why);
		break;
	case RC_CONNECTING:
	case RC_PREPARING:
		rc_drop(rc, NULL);
		rc_connect_failed(rc, why);
		break;
	case RC_UP:
		break;
	}
}

static void arm_deadline(struct rconn *rc)
{
	struct timeval tv = clock_tv(RC_CONNECT_MS);

	evtimer_add(rc->retry, &tv);
}

/* The connection is gone (or never came): count, log once per outage,
 * reconnect after the back-off. */
static void rc_failed(struct rconn *rc, const char *why)
{
	struct redis_store *rs = rc->rs;
	struct timeval tv = clock_tv(rc->backoff_ms);

	metrics_store_error(STORE_KIND_REDIS);
	if (!rc->failing)
		log_warn("redis %s: %s; claims go to the store until it is back",
			 rs->label, why);
	else
		log_debug("redis %s: %s", rs->label, why);
	rc->failing = true;
	rc->state = RC_DOWN;
	rc->ac = NULL;
	rc->pending = 0;
	evtimer_add(rc->retry, &tv);
	rc->backoff_ms = rc->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
							       : rc->backoff_ms * 2;
}

/*
 * Close rc's connection ourselves: every pending reply callback runs with
 * NULL (at once, or when the callback we are in returns), and no
 * connect/disconnect callback acts on it (ac->data is cleared first). why:
 * reconnect after the back-off, counted and logged; NULL: for good.
 */
void rc_drop(struct rconn *rc, const char *why)
{
	redisAsyncContext *ac = rc->ac;

	if (ac == NULL)
		return;
	rc->ac = NULL;
	rc->state = RC_DOWN;
	rc->pending = 0;
	ac->data = NULL;
	redisAsyncFree(ac);
	if (why != NULL)
		rc_failed(rc, why);
}

/* ---- preparing a new connection ---- */

/* What a new connection asks, pipelined, in this order. */
enum prep_step {
	PREP_SELECT,		/* SELECT db */
	PREP_PUT,		/* SCRIPT LOAD PUT_LUA */
	PREP_PURGE,		/* SCRIPT LOAD PURGE_LUA */
	PREP_EPOCH,		/* INFO replication: master_replid */
	PREP_TIME,		/* TIME: the server's clock; the last */
};

static const char *const prep_what[] = {
	[PREP_SELECT] = "SELECT",
	[PREP_PUT] = "SCRIPT LOAD",
	[PREP_PURGE] = "SCRIPT LOAD",
	[PREP_EPOCH] = "INFO replication (Redis 4.0 or later)",
	[PREP_TIME] = "TIME",
};

static bool copy_sha(const redisReply *reply, char sha[41])
{
	if (reply->type != REDIS_REPLY_STRING || reply->len != 40)
		return false;
	memcpy(sha, reply->str, 41);
	return true;
}

/* The first STORE_REDIS_EPOCH_LEN characters of master_replid. */
static bool parse_epoch(const redisReply *reply,
			char epoch[STORE_REDIS_EPOCH_LEN + 1])
{
	static const char field[] = "master_replid:";
	const char *p;

	if (reply->type != REDIS_REPLY_STRING)
		return false;
	p = strstr(reply->str, field);
	if (p == NULL)
		return false;
	p += sizeof(field) - 1;
	if (strspn(p, "0123456789abcdef") < STORE_REDIS_EPOCH_LEN)
		return false;
	memcpy(epoch, p, STORE_REDIS_EPOCH_LEN);
	epoch[STORE_REDIS_EPOCH_LEN] = '\0';
	return true;
}

/*
 * The server read its clock (R) before its answer reached us (now), so at
 * any moment m of ours its clock read at least m + R - now: a lower bound,
 * off by at most the round trip, in the direction that makes a copy expire
 * early and a tombstone refuse more, never less.
 */
static bool parse_time(struct rconn *rc, const redisReply *reply)
{
	long long s, us;

	if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
	    reply->element[0]->type != REDIS_REPLY_STRING ||
	    reply->element[1]->type != REDIS_REPLY_STRING)
		return false;
	s = strtoll(reply->element[0]->str, NULL, 10);
	us = strtoll(reply->element[1]->str, NULL, 10);
	if (s <= 0 || s > INT64_MAX / 2000 || us < 0 || us >= 1000000)
		return false;
	rc->clock_lo = (int64_t)(s * 1000 + us / 1000) - (int64_t)clock_ms();
	return true;
}

static void on_prepare(redisAsyncContext *ac, void *r, void *priv)
{
	struct rconn *rc = ac->data;
	redisReply *reply = r;
	enum prep_step step = (enum prep_step)(intptr_t)priv;
	bool good = false;
	char why[200];

	if (rc == NULL || reply == NULL)
		return;		/* dropped: the disconnect callback acts */
	switch (step) {
	case PREP_SELECT:
		good = reply->type == REDIS_REPLY_STATUS;
		break;
	case PREP_PUT:
		good = copy_sha(reply, rc->put_sha);
		break;
	case PREP_PURGE:
		good = copy_sha(reply, rc->purge_sha);
		break;
	case PREP_EPOCH:
		good = parse_epoch(reply, rc->epoch);
		break;
	case PREP_TIME:
		good = parse_time(rc, reply);
		break;
	}
	if (!good) {
		snprintf(why, sizeof(why), "%s: %.100s", prep_what[step],
			 reply->type == REDIS_REPLY_ERROR ? reply->str :
			 "unexpected answer");
		rc_drop(rc, why);
		return;
	}
	if (step != PREP_TIME)
		return;
	evtimer_del(rc->retry);		/* the deadline */
	if (rc->failing)
		log_info("redis %s: connected", rc->rs->label);
	rc->failing = false;
	rc->state = RC_UP;
}

/* Connected (and, with sentinels, to the master): ask what a copy needs. */
static void rc_prepare(struct rconn *rc)
{
	redisAsyncContext *ac = rc->ac;

	rc->state = RC_PREPARING;
	if (redisAsyncCommand(ac, on_prepare, (void *)(intptr_t)PREP_SELECT,
			      "SELECT %d", rc->rs->db) != REDIS_OK ||
	    redisAsyncCommand(ac, on_prepare, (void *)(intptr_t)PREP_PUT,
			      "SCRIPT LOAD %s", PUT_LUA) != REDIS_OK ||
	    redisAsyncCommand(ac, on_prepare, (void *)(intptr_t)PREP_PURGE,
			      "SCRIPT LOAD %s", PURGE_LUA) != REDIS_OK ||
	    redisAsyncCommand(ac, on_prepare, (void *)(intptr_t)PREP_EPOCH,
			      "INFO replication") != REDIS_OK ||
	    redisAsyncCommand(ac, on_prepare, (void *)(intptr_t)PREP_TIME,
			      "TIME") != REDIS_OK)
		rc->state = RC_CONNECTING;	/* disconnecting: callback follows */
}

void rc_reply_error(struct rconn *rc, const char *cmd, const char *err)
{
	metrics_store_error(STORE_KIND_REDIS);
	log_debug("redis: %s: %.100s", cmd, err);
	if (rc == NULL)
		return;
	if (strncmp(err, "READONLY", 8) == 0)
		rc_drop(rc, "the master became a replica (READONLY); looking "
			"for the master again");
	else if (strncmp(err, "NOSCRIPT", 8) == 0)
		rc_drop(rc, "the server forgot our scripts (NOSCRIPT); loading "
			"them again");
}
/* A connect to rs->addrs[rc->addr] failed: when the name has an address
 * not tried in this round, try it at once; else the usual back-off. */
static void rc_connect_failed(struct rconn *rc, const char *why)
{
	struct redis_store *rs = rc->rs;

	if (++rc->tried < rs->naddrs) {
		struct timeval now = { 0, 0 };
		int next = (rc->addr + 1) % rs->naddrs;

		log_info("redis %s: %s: %s; trying %s", rs->label,
			 rs->addrs[rc->addr], why, rs->addrs[next]);
		rc->addr = next;
		rc->state = RC_DOWN;
		evtimer_add(rc->retry, &now);
		return;
	}
	rc->tried = 0;
	rc_failed(rc, why);
}

/* Sentinel mode: is the server a sentinel named really the master? (Its
 * view may lag a failover.) */
static void on_role(redisAsyncContext *ac, void *r, void *priv)
{
	struct rconn *rc = ac->data;
	redisReply *reply = r;
	char why[160];

	(void)priv;
	if (rc == NULL || reply == NULL)
		return;		/* dropped: the disconnect callback acts */
	if (reply->type == REDIS_REPLY_ARRAY && reply->elements > 0 &&
	    reply->element[0]->type == REDIS_REPLY_STRING &&
	    strcmp(reply->element[0]->str, "master") == 0) {
		rc_prepare(rc);
		return;
	}
	snprintf(why, sizeof(why), "%s:%d is not the master (a sentinel's "
		 "view lagged a failover)", rc->master_addr, rc->master_port);
	rc_drop(rc, why);
}

static void on_connect(const redisAsyncContext *cac, int status)
{
	struct rconn *rc = cac->data;

	if (rc == NULL)
		return;
	if (status != REDIS_OK) {
		const char *why = cac->errstr[0] != '\0' ? cac->errstr
							 : "cannot connect";

		/* hiredis frees the context when we return */
		rc->ac = NULL;
		rc_connect_failed(rc, why);
		return;
	}
	rc->tried = 0;
	atomic_store_explicit(&rc->rs->cur, rc->addr, memory_order_relaxed);
	rc->state = RC_PREPARING;
	if (rc->rs->master != NULL) {
		if (redisAsyncCommand(rc->ac, on_role, NULL, "ROLE") != REDIS_OK)
			rc->state = RC_CONNECTING;
		return;
	}
	rc_prepare(rc);
}

static void on_disconnect(const redisAsyncContext *cac, int status)
{
	struct rconn *rc = cac->data;

	(void)status;

	if (rc == NULL)
		return;		/* we closed it */
	rc->ac = NULL;
	rc_failed(rc, cac->errstr[0] != '\0' ? cac->errstr : "connection closed");
}

/* ---- sentinel mode: which server is the master ------------------------ */

/* Stop talking to the sentinel (its callbacks then ignore it). */
static void sentinel_close(struct rconn *rc)
{
	redisAsyncContext *sac = rc->sac;

	if (sac == NULL)
		return;
	rc->sac = NULL;
	sac->data = NULL;
	redisAsyncDisconnect(sac);
}

/* This sentinel could not say (why): the next one at once, or, when each
 * failed in a row, the back-off. */
static void sentinel_failed(struct rconn *rc, const char *why)
{
	struct redis_store *rs = rc->rs;
	int was = rc->sentinel;

	sentinel_close(rc);
	rc->state = RC_DOWN;
	rc->sentinel = (rc->sentinel + 1) % rs->nsentinels;
	if (++rc->asked < rs->nsentinels) {
		struct timeval now = { 0, 0 };

		log_debug("redis sentinel %s:%d: %s", rs->sentinels[was].host,
			  rs->sentinels[was].port, why);
		evtimer_add(rc->retry, &now);
		return;
	}
	rc->asked = 0;
	rc_failed(rc, why);
}

static void on_master_addr(redisAsyncContext *ac, void *r, void *priv)
{
	struct rconn *rc = ac->data;
	redisReply *reply = r;
	long port;

	(void)priv;
	if (rc == NULL)
		return;		/* closed by us */
	if (reply == NULL || reply->type != REDIS_REPLY_ARRAY ||
	    reply->elements != 2 ||
	    reply->element[0]->type != REDIS_REPLY_STRING ||
	    reply->element[1]->type != REDIS_REPLY_STRING ||
	    reply->element[0]->len >= sizeof(rc->master_addr) ||
	    (port = strtol(reply->element[1]->str, NULL, 10)) < 1 ||
	    port > 65535) {
		char why[200];

		snprintf(why, sizeof(why), "no address for master %s (%.100s)",
			 rc->rs->master, reply == NULL ? "no answer" :
			 reply->type == REDIS_REPLY_ERROR ? reply->str :
			 reply->type == REDIS_REPLY_NIL ? "unknown master" :
			 "unexpected answer");
		sentinel_failed(rc, why);
		return;
	}
	memcpy(rc->master_addr, reply->element[0]->str, reply->element[0]->len);
	rc->master_addr[reply->element[0]->len] = '\0';
	rc->master_port = (int)port;
	rc->have_master = true;
	rc->asked = 0;
	sentinel_close(rc);
	rc->state = RC_DOWN;
	rc_connect(rc);
}

static void on_sentinel_connect(const redisAsyncContext *cac, int status)
{
	struct rconn *rc = cac->data;

	if (rc == NULL)
		return;
	if (status != REDIS_OK) {
		/* hiredis frees it when we return, running the pending
		 * question's callback and the disconnect callback: neither
		 * may act again */
		((redisAsyncContext *)cac)->data = NULL;
		rc->sac = NULL;
		sentinel_failed(rc, cac->errstr[0] != '\0' ? cac->errstr :
					"cannot connect");
	}
}

static void on_sentinel_disconnect(const redisAsyncContext *cac, int status)
{
	struct rconn *rc = cac->data;

	(void)status;
	if (rc == NULL)
		return;		/* we closed it, or its question was answered */
	((redisAsyncContext *)cac)->data = NULL;
	rc->sac = NULL;
	sentinel_failed(rc, "the sentinel closed the connection");
}

/* Ask sentinel rc->sentinel for the master's address (RC_DOWN ->
 * RC_ASKING); the answer connects to it. */
static void rc_ask(struct rconn *rc)
{
	struct redis_store *rs = rc->rs;
	const char *addr = rs->sentinels[rc->sentinel].addr;
	redisAsyncContext *sac;

	if (addr[0] == '\0') {
		sentinel_failed(rc, "not resolved");
		return;
	}
	sac = redisAsyncConnect(addr, rs->sentinels[rc->sentinel].port);
	if (sac == NULL || sac->err != 0) {
		char why[160];

		snprintf(why, sizeof(why), "%.150s",
			 sac != NULL ? sac->errstr : "out of memory");
		if (sac != NULL)
			redisAsyncFree(sac);
		sentinel_failed(rc, why);
		return;
	}
	sac->data = rc;
	if (redisLibeventAttach(sac, rc->base) != REDIS_OK ||
	    redisAsyncSetConnectCallback(sac, on_sentinel_connect) != REDIS_OK ||
	    redisAsyncSetDisconnectCallback(sac, on_sentinel_disconnect) != REDIS_OK ||
	    redisAsyncCommand(sac, on_master_addr, NULL,
			      "SENTINEL get-master-addr-by-name %s",
			      rs->master) != REDIS_OK) {
		sac->data = NULL;
		redisAsyncFree(sac);
		sentinel_failed(rc, "cannot ask");
		return;
	}
	rc->sac = sac;
	rc->state = RC_ASKING;
	arm_deadline(rc);
}

/* Start connecting (RC_DOWN -> RC_CONNECTING), or schedule another try. */
static void rc_connect(struct rconn *rc)
{
	struct redis_store *rs = rc->rs;
	redisAsyncContext *ac;

	if (!atomic_load_explicit(&rs->resolved, memory_order_acquire)) {
		rc_failed(rc, "host not resolved yet");
		return;
	}
	if (rs->master != NULL && !rc->have_master) {
		rc_ask(rc);
		return;
	}
	if (rs->master != NULL) {
		rc->have_master = false;	/* the next connect asks again */
		ac = redisAsyncConnect(rc->master_addr, rc->master_port);
	} else {
		if (rc->tried == 0)	/* a new round starts where the last won */
			rc->addr = atomic_load_explicit(&rs->cur,
							memory_order_relaxed);
		ac = redisAsyncConnect(rs->addrs[rc->addr], rs->port);
	}
	if (ac == NULL || ac->err != 0) {
		char why[160];

		snprintf(why, sizeof(why), "%.150s",
			 ac != NULL ? ac->errstr : "out of memory");
		if (ac == NULL) {
			rc_failed(rc, why);
			return;
		}
		redisAsyncFree(ac);
		rc_connect_failed(rc, why);
		return;
	}
	ac->data = rc;
	if (redisLibeventAttach(ac, rc->base) != REDIS_OK) {
		ac->data = NULL;
		redisAsyncFree(ac);
		rc_failed(rc, "cannot attach to the event loop");
		return;
	}
	redisAsyncSetConnectCallback(ac, on_connect);
	redisAsyncSetDisconnectCallback(ac, on_disconnect);
	rc->ac = ac;
	rc->state = RC_CONNECTING;
	arm_deadline(rc);
}

/* This thread's connection for base; made (and started) if create. */
struct rconn *rc_get(struct redis_store *rs, struct event_base *base,
		     bool create)
{
	struct rconn *head = pthread_getspecific(rs->tl_key), *rc;

	for (rc = head; rc != NULL; rc = rc->tl_next)
		if (rc->base == base)
			return rc;
	if (!create || (rc = calloc(1, sizeof(*rc))) == NULL)
		return NULL;
	rc->rs = rs;
	rc->base = base;
	rc->state = RC_DOWN;
	rc->backoff_ms = BACKOFF_MIN_MS;
	rc->retry = evtimer_new(base, retry_cb, rc);
	rc->tl_next = head;
	if (rc->retry == NULL || pthread_setspecific(rs->tl_key, rc) != 0) {
		if (rc->retry != NULL)
			event_free(rc->retry);
		free(rc);
		return NULL;
	}
	pthread_mutex_lock(&rs->mu);
	LIST_INSERT_HEAD(&rs->conns, rc, link);
	pthread_mutex_unlock(&rs->mu);
	rc_connect(rc);
	return rc;
}

/* Close and free rc (already off every list); needs rc->base alive. Its
 * base is going away, so lookups still pending (their owners should have
 * cancelled them) get STORE_ERROR rather than new work in the inner store. */
void rc_free(struct rconn *rc)
{
	rc->closing = true;
	event_free(rc->retry);
	if (rc->sac != NULL) {
		rc->sac->data = NULL;
		redisAsyncFree(rc->sac);
		rc->sac = NULL;
	}
	rc_drop(rc, NULL);
	free(rc);
}

/* Thread exit: close the connections this thread made (their bases are
 * still alive: worker bases are freed after the join). */
void rc_thread_exit(void *v)
{
	struct rconn *rc = v, *next;

	for (; rc != NULL; rc = next) {
		next = rc->tl_next;
		pthread_mutex_lock(&rc->rs->mu);
		LIST_REMOVE(rc, link);
		pthread_mutex_unlock(&rc->rs->mu);
		rc_free(rc);
	}
}

void store_redis_thread_done(struct store *s, struct event_base *base)
{
	struct redis_store *rs = (struct redis_store *)s;
	struct rconn *head = pthread_getspecific(rs->tl_key), **pp, *rc;

	for (pp = &head; *pp != NULL; pp = &(*pp)->tl_next)
		if ((*pp)->base == base)
			break;
	rc = *pp;
	if (rc == NULL)
		return;
	*pp = rc->tl_next;
	pthread_setspecific(rs->tl_key, head);
	pthread_mutex_lock(&rs->mu);
	LIST_REMOVE(rc, link);
	pthread_mutex_unlock(&rs->mu);
	rc_free(rc);
}

bool store_redis_connected(struct store *s, struct event_base *base)
{
	struct rconn *rc = rc_get((struct redis_store *)s, base, false);

	return rc != NULL && rc->state == RC_UP;
}

/* The first address of each sentinel's name (IPv4 first); true when at
 * least one has one. Blocking, like redis_resolve(). */
static bool resolve_sentinels(struct redis_store *rs)
{
	int n = 0;

	for (int i = 0; i < rs->nsentinels; i++) {
		struct addrs a;
		char err[128], port[8];

		if (rs->sentinels[i].addr[0] != '\0') {
			n++;
			continue;
		}
		snprintf(port, sizeof(port), "%d", rs->sentinels[i].port);
		if (addrs_resolve(&a, rs->sentinels[i].host, port, 0, "sentinel",
				  err, sizeof(err)) < 0)
			continue;
		addrs_host((struct sockaddr *)&a.ss[0], a.len[0],
			   rs->sentinels[i].addr, sizeof(rs->sentinels[i].addr));
		n++;
	}
	if (n == 0)
		return false;
	atomic_store_explicit(&rs->resolved, true, memory_order_release);
	return true;
}

/* The numeric addresses of rs->host into rs->addrs, IPv4 first as hiredis
 * would pick them. May block in DNS: only at start and on the main
 * thread's sweep, until it first succeeds. */
bool redis_resolve(struct redis_store *rs)
{
	static const int families[] = { AF_INET, AF_INET6 };
	int n = 0;

	if (rs->master != NULL)
		return resolve_sentinels(rs);

	for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
		struct addrinfo hints = { .ai_family = families[i],
					  .ai_socktype = SOCK_STREAM };
		struct addrinfo *ai;
		struct addrs a;

		if (getaddrinfo(rs->host, NULL, &hints, &ai) != 0)
			continue;
		addrs_from_addrinfo(&a, ai);
		freeaddrinfo(ai);
		for (int j = 0; j < a.n && n < ADDRS_MAX; j++)
			if (addrs_host((struct sockaddr *)&a.ss[j], a.len[j],
				       rs->addrs[n], sizeof(rs->addrs[n]))[0] != '?')
				n++;
	}
	if (n == 0)
		return false;
	rs->naddrs = n;
	atomic_store_explicit(&rs->resolved, true, memory_order_release);
	return true;
}
