/*
 * store_redis.c - the Redis fast path layered over another store (see
 * store_redis.h; its connections are store_redis_conn.c's).
 *
 *   claim ──▶ connection of this base up? ──no──▶ inner claim (its handle)
 *                    │yes
 *                    ▼
 *             GET idemproxy:<scope>:<key>  + timer (50 ms)
 *                    │
 *     ┌──────────────┼─────────────────────────┬──────────────────┐
 *   value of this   value of this epoch,  nil / tombstone /    timer first
 *   epoch, same fp  other fp              error / NULL /       drop the
 *   COMPLETED       MISMATCH              other epoch          connection,
 *   (delivered next loop turn)            inner claim (result  inner claim
 *                                         passed through)
 *
 *   complete ──▶ inner complete ──OK──▶ PUT_LUA (no reply awaited)
 *   purge    ──▶ inner purge ──▶ PURGE_LUA: the old value, and a tombstone
 *                                in its place
 *
 * A copy is written by a script that the server runs against its own
 * clock: the copy's absolute expiry is never later than its record's, a
 * tombstone younger than the moment the record was learned refuses it, and
 * a copy of the current epoch already there stays (NX). So a write however
 * late - a stalled process, a slow network - can neither outlive the
 * record nor bring a purged response back.
 *
 * One connection per (store, event_base), found through a thread-specific
 * list, so operations never take a lock. A GET's reply callback gets a
 * "ticket" rather than the claim: hiredis runs every callback exactly once
 * (with the reply, or with NULL when the connection goes away), while a claim
 * may be cancelled or time out first; it then only clears ticket->op.
 *
 * A timed-out lookup drops the whole connection (redisAsyncFree runs the
 * other pending callbacks with NULL, so they fall back too) and reconnects
 * after the back-off: that bounds what can pile up behind a stuck Redis and
 * notices a dead peer that never sent a reset. The back-off is reset only by
 * a good reply to a GET or a write, so a Redis that accepts connections but
 * answers slowly is retried ever less often, up to every 5 s.
 */
#include "store_redis.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "store_redis_priv.h"

/* Which operation a handle of ours is. */
enum redis_op_kind {
	OP_CLAIM,		/* struct redis_claim */
	OP_COMPLETE,		/* struct redis_complete */
	OP_ADMIN,		/* struct redis_admin: inspect or purge */
};

enum claim_state {
	CLAIM_LOOKUP,		/* GET sent: ticket and timer pending */
	CLAIM_INNER,		/* handed to the inner store: inner pending */
	CLAIM_DELIVER,		/* answered here: delivery event active */
};

struct redis_claim;

/* The private data of one GET; freed by its reply callback. */
struct ticket {
	struct redis_claim *op;		/* NULL: cancelled or timed out */
};

struct redis_claim {
	struct store_op op;		/* first: the generic handle */
	enum redis_op_kind kind;	/* OP_CLAIM */
	struct redis_store *rs;
	struct event_base *base;
	enum claim_state state;
	struct store_claim claim;
	store_cb cb;
	void *arg;
	struct rconn *rc;		/* CLAIM_LOOKUP */
	struct ticket *ticket;		/* CLAIM_LOOKUP */
	struct store_op *inner;		/* CLAIM_INNER */
	struct event *ev;		/* lookup timer, then delivery */
	struct store_result res;	/* CLAIM_DELIVER */
	uint64_t start_ms;		/* monotonic: the call */
};

struct redis_complete {
	struct store_op op;		/* first: the generic handle */
	enum redis_op_kind kind;	/* OP_COMPLETE */
	struct redis_store *rs;
	struct event_base *base;
	struct store_key key;
	uint8_t fp[FP_LEN];
	struct stored_response *resp;	/* our reference */
	uint64_t ttl_ms;
	uint64_t start_ms;		/* monotonic: the call */
	store_cb cb;
	void *arg;
	struct store_op *inner;
};

/*
 * An operator's inspect or purge: the inner store's first, then Redis'
 * copy (GET, or the purge script), bounded by ADMIN_TIMEOUT_MS; a Redis that cannot be
 * asked is named in rec.unreached, never an error.
 */
enum admin_state {
	ADMIN_INNER,		/* the inner store's call pending */
	ADMIN_CONNECT,		/* this base's connection coming up: timer */
	ADMIN_REDIS,		/* GET or EVAL sent: ticket and timer pending */
	ADMIN_DELIVER,		/* the delivery event is active */
};

#define ADMIN_TIMEOUT_MS 1000

struct admin_ticket {
	struct redis_admin *op;		/* NULL: cancelled or timed out */
};

struct redis_admin {
	struct store_op op;		/* first: the generic handle */
	enum redis_op_kind kind;	/* OP_ADMIN */
	enum admin_state state;
	struct redis_store *rs;
	struct event_base *base;
	struct store_key key;
	bool purge, body;
	store_cb cb;
	void *arg;
	struct store_op *inner;		/* ADMIN_INNER */
	struct admin_ticket *ticket;	/* ADMIN_REDIS */
	struct event *ev;		/* the Redis timer, then delivery */
	struct store_result res;
	uint64_t deadline_ms;		/* monotonic: Redis' part gives up */
};

static const struct store_ops redis_ops;

/* ---- the value format ---- */

static void put32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

char *store_redis_encode(const uint8_t fp[FP_LEN], const char *epoch,
			 const struct stored_response *resp, size_t *len)
{
	unsigned char *buf, *p;
	size_t n;

	if (resp->head_len > UINT32_MAX || resp->body_len > UINT32_MAX ||
	    resp->status < 0 || resp->status > 0xffff ||
	    strlen(epoch) != STORE_REDIS_EPOCH_LEN ||
	    resp->head_len + resp->body_len > SIZE_MAX - STORE_REDIS_HDR_LEN)
		return NULL;
	n = STORE_REDIS_HDR_LEN + resp->head_len + resp->body_len;
	buf = malloc(n);
	if (buf == NULL)
		return NULL;
	p = buf;
	memcpy(p, STORE_REDIS_MAGIC, 4);
	p += 4;
	memcpy(p, epoch, STORE_REDIS_EPOCH_LEN);
	p += STORE_REDIS_EPOCH_LEN;
	memcpy(p, fp, FP_LEN);
	p += FP_LEN;
	*p++ = (unsigned char)(resp->status >> 8);
	*p++ = (unsigned char)resp->status;
	*p++ = resp->body_stored ? 1 : 0;
	put32(p, (uint32_t)resp->head_len);
	p += 4;
	if (resp->head_len > 0)
		memcpy(p, resp->head, resp->head_len);
	p += resp->head_len;
	put32(p, (uint32_t)resp->body_len);
	p += 4;
	if (resp->body_len > 0)
		memcpy(p, resp->body, resp->body_len);
	*len = n;
	return (char *)buf;
}

struct stored_response *store_redis_decode(const char *buf, size_t len,
					   uint8_t fp[FP_LEN],
					   char epoch[STORE_REDIS_EPOCH_LEN + 1])
{
	const unsigned char *p = (const unsigned char *)buf;
	const size_t at = 4 + STORE_REDIS_EPOCH_LEN + FP_LEN;	/* status */
	size_t head_len, body_len;
	int status;
	bool body_stored;

	if (len < STORE_REDIS_HDR_LEN || memcmp(p, STORE_REDIS_MAGIC, 4) != 0)
		return NULL;
	status = p[at] << 8 | p[at + 1];
	if (status < 100 || status > 999 || p[at + 2] > 1)
		return NULL;
	body_stored = p[at + 2] == 1;
	head_len = get32(p + at + 3);
	if (head_len > len - STORE_REDIS_HDR_LEN)
		return NULL;
	body_len = get32(p + at + 7 + head_len);
	if (body_len != len - STORE_REDIS_HDR_LEN - head_len)
		return NULL;
	memcpy(epoch, p + 4, STORE_REDIS_EPOCH_LEN);
	epoch[STORE_REDIS_EPOCH_LEN] = '\0';
	memcpy(fp, p + 4 + STORE_REDIS_EPOCH_LEN, FP_LEN);
	return stored_response_new(status, buf + at + 7, head_len,
				   buf + at + 11 + head_len, body_len,
				   body_stored);
}

/* A copy this connection may serve: well formed and of its epoch. */
static struct stored_response *decode_current(const struct rconn *rc,
					      const redisReply *reply,
					      uint8_t fp[FP_LEN])
{
	char epoch[STORE_REDIS_EPOCH_LEN + 1];
	struct stored_response *resp;

	resp = store_redis_decode(reply->str, reply->len, fp, epoch);
	if (resp != NULL && (rc == NULL || strcmp(epoch, rc->epoch) != 0)) {
		stored_response_unref(resp);
		return NULL;	/* written before a failover or a restart */
	}
	return resp;
}

static bool is_tombstone(const redisReply *r)
{
	return r->type == REDIS_REPLY_STRING &&
	       r->len >= sizeof(TOMBSTONE) - 1 &&
	       memcmp(r->str, TOMBSTONE, sizeof(TOMBSTONE) - 1) == 0;
}

static int make_key(const struct store_key *k, char buf[KEY_MAX])
{
	return snprintf(buf, KEY_MAX, KEY_PREFIX "%s:%s", k->scope, k->key);
}

/* ---- claim ---- */

static void claim_free(struct redis_claim *o)
{
	event_free(o->ev);
	stored_response_unref(o->res.resp);
	free(o);
}

static void claim_post(struct redis_claim *o, enum store_status st)
{
	o->state = CLAIM_DELIVER;
	o->res.status = st;
	event_active(o->ev, EV_TIMEOUT, 1);
}

static void cache_put(struct redis_store *rs, struct event_base *base,
		      const struct store_key *k, const uint8_t fp[FP_LEN],
		      const struct stored_response *resp, uint64_t start_ms,
		      uint64_t ttl_ms);

static void claim_inner_cb(void *arg, const struct store_result *res)
{
	struct redis_claim *o = arg;

	o->inner = NULL;
	/* read-through: a replay PostgreSQL served (Redis flushed, restarted,
	 * or the record predates it) is cached for the record's remaining life */
	if (res->status == STORE_COMPLETED && res->ttl_left_ms > 0)
		cache_put(o->rs, o->base, &o->claim.key, o->claim.fp, res->resp,
			  o->start_ms,
			  res->ttl_left_ms);
	o->cb(o->arg, res);
	claim_free(o);
}

/* Let the inner store decide. */
static void claim_fallback(struct redis_claim *o)
{
	o->state = CLAIM_INNER;
	o->rc = NULL;
	o->inner = store_claim(o->rs->inner, o->base, &o->claim,
			       claim_inner_cb, o);
	if (o->inner == NULL)
		claim_post(o, STORE_ERROR);
}

static void claim_ev_cb(evutil_socket_t fd, short what, void *arg)
{
	struct redis_claim *o = arg;

	(void)fd;
	(void)what;

	switch (o->state) {
	case CLAIM_LOOKUP:
		/* Redis is slow: give up on this connection, not on the claim */
		o->ticket->op = NULL;
		o->ticket = NULL;
		rc_drop(o->rc, "lookup timed out");
		claim_fallback(o);
		break;
	case CLAIM_DELIVER:
		o->cb(o->arg, &o->res);
		claim_free(o);
		break;
	default:
		log_error("store_redis: claim event in state %d", (int)o->state);
		abort();
	}
}

static void get_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct ticket *t = priv;
	struct redis_claim *o = t->op;
	struct rconn *rc = ac->data;
	redisReply *reply = r;
	struct stored_response *resp;
	uint8_t fp[FP_LEN];

	free(t);
	if (rc != NULL && rc->pending > 0)
		rc->pending--;
	if (o == NULL)
		return;		/* cancelled or timed out */
	o->ticket = NULL;
	evtimer_del(o->ev);
	if (reply == NULL) {
		if (o->rc->closing)
			claim_post(o, STORE_ERROR);
		else
			claim_fallback(o);	/* the connection went away */
		return;
	}
	if (reply->type == REDIS_REPLY_NIL) {
		if (rc != NULL)
			rc->backoff_ms = BACKOFF_MIN_MS;
		claim_fallback(o);
		return;
	}
	if (reply->type != REDIS_REPLY_STRING) {
		metrics_store_error(STORE_KIND_REDIS);
		log_debug("redis: GET: unexpected reply type %d %.100s",
			  reply->type, reply->type == REDIS_REPLY_ERROR ?
			  reply->str : "");
		claim_fallback(o);
		return;
	}
	if (rc != NULL)
		rc->backoff_ms = BACKOFF_MIN_MS;
	if (is_tombstone(reply)) {
		claim_fallback(o);	/* purged: ask the inner store */
		return;
	}
	resp = decode_current(o->rc, reply, fp);
	if (resp == NULL) {
		/* not ours, another format or epoch, or out of memory */
		claim_fallback(o);
		return;
	}
	if (memcmp(fp, o->claim.fp, FP_LEN) != 0) {
		stored_response_unref(resp);
		claim_post(o, STORE_MISMATCH);
		return;
	}
	metrics_count(COUNTER_redis_hits_total);
	o->res.resp = resp;
	claim_post(o, STORE_COMPLETED);
}

/*
 * Every claim gets our handle, also when it goes straight to the inner
 * store: a replay the inner store served is cached on its way back.
 */
static struct store_op *redis_claim(struct store *s, struct event_base *base,
				    const struct store_claim *c, store_cb cb,
				    void *arg)
{
	struct redis_store *rs = (struct redis_store *)s;
	struct rconn *rc = rc_get(rs, base, true);
	struct redis_claim *o = calloc(1, sizeof(*o));
	char key[KEY_MAX];
	struct timeval tv;
	unsigned ms;
	int klen;

	if (o == NULL)
		return NULL;
	o->op.store = s;
	o->kind = OP_CLAIM;
	o->rs = rs;
	o->base = base;
	o->claim = *c;
	o->start_ms = clock_ms();
	o->cb = cb;
	o->arg = arg;
	o->ev = event_new(base, -1, 0, claim_ev_cb, o);
	if (o->ev == NULL) {
		free(o);
		return NULL;
	}
	if (rc == NULL || rc->state != RC_UP || rc->pending >= MAX_PENDING ||
	    (o->ticket = malloc(sizeof(*o->ticket))) == NULL)
		goto inner;
	o->ticket->op = o;
	klen = make_key(&c->key, key);
	if (redisAsyncCommand(rc->ac, get_cb, o->ticket, "GET %b", key,
			      (size_t)klen) != REDIS_OK) {
		free(o->ticket);
		o->ticket = NULL;
		goto inner;
	}
	rc->pending++;
	o->state = CLAIM_LOOKUP;
	o->rc = rc;
	ms = atomic_load_explicit(&rs->timeout_ms, memory_order_relaxed);
	tv = clock_tv(ms);
	evtimer_add(o->ev, &tv);
	return &o->op;
inner:
	claim_fallback(o);
	if (o->state == CLAIM_DELIVER) {	/* the inner store failed at once */
		claim_free(o);
		return NULL;
	}
	return &o->op;
}

static void claim_cancel(struct redis_claim *o)
{
	switch (o->state) {
	case CLAIM_LOOKUP:
		o->ticket->op = NULL;	/* the reply callback frees it */
		break;
	case CLAIM_INNER:
		if (o->inner != NULL)
			store_cancel(o->inner);
		break;
	case CLAIM_DELIVER:
		break;
	}
	claim_free(o);
}

/* ---- complete, with write-through ---- */

static void set_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct rconn *rc = ac->data;
	redisReply *reply = r;

	(void)priv;

	if (rc != NULL && rc->pending > 0)
		rc->pending--;
	if (reply == NULL) {
		metrics_store_error(STORE_KIND_REDIS);
		return;
	}
	if (reply->type == REDIS_REPLY_ERROR) {
		rc_reply_error(rc, "write", reply->str);
		return;
	}
	if (rc != NULL)
		rc->backoff_ms = BACKOFF_MIN_MS;
}

/*
 * Cache a completed record that lives ttl_ms from a moment after start_ms
 * (the store's clock ran from when it executed the call made at start_ms).
 * On the server's clock, the copy expires ttl_ms after start_ms, so never
 * after the record, and says it learned the record no earlier than
 * start_ms, so that a purge after that moment refuses it (PUT_LUA).
 * Failures are counted, never reported.
 */
static void cache_put(struct redis_store *rs, struct event_base *base,
		      const struct store_key *k, const uint8_t fp[FP_LEN],
		      const struct stored_response *resp, uint64_t start_ms,
		      uint64_t ttl_ms)
{
	struct rconn *rc = rc_get(rs, base, true);
	int64_t learned, expires;
	char key[KEY_MAX];
	char *val;
	size_t vlen;
	int klen;

	if (rc == NULL || rc->state != RC_UP || clock_ms() - start_ms >= ttl_ms)
		return;		/* down: the outage is counted already */
	if (rc->pending >= MAX_PENDING) {
		metrics_store_error(STORE_KIND_REDIS);
		return;
	}
	val = store_redis_encode(fp, rc->epoch, resp, &vlen);
	if (val == NULL) {
		metrics_store_error(STORE_KIND_REDIS);
		return;
	}
	learned = (int64_t)start_ms + rc->clock_lo;
	expires = learned + (int64_t)ttl_ms;
	klen = make_key(k, key);
	if (redisAsyncCommand(rc->ac, set_cb, NULL,
			      "EVALSHA %s 1 %b %b %" PRId64 " %" PRId64 " %s",
			      rc->put_sha, key, (size_t)klen, val, vlen, expires,
			      learned, rc->epoch) == REDIS_OK)
		rc->pending++;
	else
		metrics_store_error(STORE_KIND_REDIS);
	free(val);
}

static void complete_free(struct redis_complete *o)
{
	stored_response_unref(o->resp);
	free(o);
}

static void complete_inner_cb(void *arg, const struct store_result *res)
{
	struct redis_complete *o = arg;

	o->inner = NULL;
	/* an unknown outcome is never a copy: its owner may replace it */
	if (res->status == STORE_OK && !o->resp->unknown)
		cache_put(o->rs, o->base, &o->key, o->fp, o->resp,
			  o->start_ms, o->ttl_ms);
	o->cb(o->arg, res);
	complete_free(o);
}

static struct store_op *redis_complete(struct store *s, struct event_base *base,
				       const struct store_key *k, const char *owner,
				       const uint8_t fp[FP_LEN],
				       struct stored_response *resp,
				       uint64_t ttl_ms, store_cb cb, void *arg)
{
	struct redis_store *rs = (struct redis_store *)s;
	struct redis_complete *o = calloc(1, sizeof(*o));

	if (o == NULL)
		return NULL;
	o->op.store = s;
	o->kind = OP_COMPLETE;
	o->rs = rs;
	o->base = base;
	o->key = *k;
	memcpy(o->fp, fp, FP_LEN);
	o->resp = stored_response_ref(resp);
	o->ttl_ms = ttl_ms;
	o->start_ms = clock_ms();
	o->cb = cb;
	o->arg = arg;
	o->inner = store_complete(rs->inner, base, k, owner, fp, resp, ttl_ms,
				  complete_inner_cb, o);
	if (o->inner == NULL) {
		complete_free(o);
		return NULL;
	}
	return &o->op;
}

/* ---- inspect and purge ---- */

static void admin_free(struct redis_admin *o)
{
	event_free(o->ev);
	stored_response_unref(o->res.resp);
	free(o);
}

static void admin_post(struct redis_admin *o)
{
	o->state = ADMIN_DELIVER;
	event_active(o->ev, EV_TIMEOUT, 1);
}

static void admin_ask(struct redis_admin *o);

static void admin_ev_cb(evutil_socket_t fd, short what, void *arg)
{
	struct redis_admin *o = arg;

	(void)fd;
	(void)what;
	if (o->state == ADMIN_CONNECT) {
		admin_ask(o);
		return;
	}
	if (o->state == ADMIN_REDIS) {
		/* Redis is slow: report without its copy */
		o->ticket->op = NULL;
		o->ticket = NULL;
		o->res.rec.unreached |= STORE_IN_REDIS;
		admin_post(o);
		return;
	}
	o->cb(o->arg, &o->res);
	admin_free(o);
}

/* What Redis said of its copy. A copy the inner store has no record for
 * (it would still be replayed) is reported from here. */
static void admin_reply(struct redis_admin *o, const redisReply *reply)
{
	struct store_record *rec = &o->res.rec;
	struct stored_response *resp;
	uint8_t fp[FP_LEN];

	if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
		rec->unreached |= STORE_IN_REDIS;
		return;
	}
	if (reply->type != REDIS_REPLY_STRING || is_tombstone(reply))
		return;		/* nil: no copy */
	if (o->purge) {
		rec->found |= STORE_IN_REDIS;
		if (o->res.status == STORE_ABSENT) {
			o->res.status = STORE_OK;
			rec->completed = true;
		}
		return;
	}
	resp = decode_current(rc_get(o->rs, o->base, false), reply, fp);
	if (resp == NULL)
		return;		/* never served */
	rec->found |= STORE_IN_REDIS;
	if (o->res.status == STORE_ABSENT) {
		o->res.status = STORE_OK;
		rec->completed = true;
		memcpy(rec->fp, fp, FP_LEN);
		rec->status = resp->status;
		rec->head_len = resp->head_len;
		rec->body_len = resp->body_len;
		rec->body_stored = resp->body_stored;
		if (o->body) {
			o->res.resp = resp;
			return;
		}
	}
	stored_response_unref(resp);
}

static void admin_redis_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct admin_ticket *t = priv;
	struct redis_admin *o = t->op;
	struct rconn *rc = ac->data;
	const redisReply *reply = r;

	free(t);
	if (rc != NULL && rc->pending > 0)
		rc->pending--;
	if (reply != NULL && reply->type == REDIS_REPLY_ERROR)
		rc_reply_error(rc, "inspect or purge", reply->str);
	if (o == NULL)
		return;		/* cancelled or timed out */
	o->ticket = NULL;
	evtimer_del(o->ev);
	admin_reply(o, r);
	admin_post(o);
}

/* Send GET, or the purge script, on this base's connection; one still coming up (the
 * admin listener's first call) is waited for until the deadline. */
static void admin_ask(struct redis_admin *o)
{
	struct rconn *rc = rc_get(o->rs, o->base, true);
	uint64_t now = clock_ms(), keep_ms;
	char key[KEY_MAX];
	struct timeval tv;
	int klen;

	if (rc != NULL && (rc->state == RC_ASKING ||
			   rc->state == RC_CONNECTING ||
			   rc->state == RC_PREPARING) && now < o->deadline_ms) {
		o->state = ADMIN_CONNECT;
		tv = clock_tv(10);
		evtimer_add(o->ev, &tv);
		return;
	}
	if (rc == NULL || rc->state != RC_UP || rc->pending >= MAX_PENDING ||
	    now >= o->deadline_ms ||
	    (o->ticket = malloc(sizeof(*o->ticket))) == NULL)
		goto unreached;
	o->ticket->op = o;
	klen = make_key(&o->key, key);
	/* the tombstone outlives whatever the purged record could still
	 * have been copied with */
	keep_ms = o->res.ttl_left_ms + 1000 > TOMBSTONE_MS ?
		  o->res.ttl_left_ms + 1000 : TOMBSTONE_MS;
	if ((o->purge ?
	     redisAsyncCommand(rc->ac, admin_redis_cb, o->ticket,
			       "EVALSHA %s 1 %b %" PRIu64, rc->purge_sha, key,
			       (size_t)klen, keep_ms) :
	     redisAsyncCommand(rc->ac, admin_redis_cb, o->ticket, "GET %b",
			       key, (size_t)klen)) != REDIS_OK) {
		free(o->ticket);
		o->ticket = NULL;
		goto unreached;
	}
	rc->pending++;
	o->state = ADMIN_REDIS;
	tv = clock_tv(o->deadline_ms - now);
	evtimer_add(o->ev, &tv);
	return;
unreached:
	o->res.rec.unreached |= STORE_IN_REDIS;
	admin_post(o);
}

static void admin_inner_cb(void *arg, const struct store_result *res)
{
	struct redis_admin *o = arg;

	o->inner = NULL;
	o->res = *res;
	if (res->resp != NULL)
		o->res.resp = stored_response_ref(res->resp);
	if (res->status == STORE_ERROR && !o->purge) {
		admin_post(o);
		return;
	}
	o->deadline_ms = clock_ms() + ADMIN_TIMEOUT_MS;
	admin_ask(o);
}

static struct store_op *redis_admin(struct store *s, struct event_base *base,
				    const struct store_key *k, bool purge,
				    bool body, store_cb cb, void *arg)
{
	struct redis_store *rs = (struct redis_store *)s;
	struct redis_admin *o = calloc(1, sizeof(*o));

	if (o == NULL)
		return NULL;
	o->op.store = s;
	o->kind = OP_ADMIN;
	o->state = ADMIN_INNER;
	o->rs = rs;
	o->base = base;
	o->key = *k;
	o->purge = purge;
	o->body = body;
	o->cb = cb;
	o->arg = arg;
	o->ev = event_new(base, -1, 0, admin_ev_cb, o);
	if (o->ev == NULL) {
		free(o);
		return NULL;
	}
	o->inner = purge ? store_purge(rs->inner, base, k, admin_inner_cb, o) :
			   store_inspect(rs->inner, base, k, body,
					 admin_inner_cb, o);
	if (o->inner == NULL) {
		admin_free(o);
		return NULL;
	}
	return &o->op;
}

static struct store_op *redis_inspect(struct store *s, struct event_base *base,
				      const struct store_key *k, bool body,
				      store_cb cb, void *arg)
{
	return redis_admin(s, base, k, false, body, cb, arg);
}

/* The inner store first: a claim can no longer find the record there and
 * put it back into Redis by reading it through. */
static struct store_op *redis_purge(struct store *s, struct event_base *base,
				    const struct store_key *k, store_cb cb,
				    void *arg)
{
	return redis_admin(s, base, k, true, false, cb, arg);
}

static void admin_cancel(struct redis_admin *o)
{
	switch (o->state) {
	case ADMIN_INNER:
		if (o->inner != NULL)
			store_cancel(o->inner);
		break;
	case ADMIN_REDIS:
		o->ticket->op = NULL;	/* the reply callback frees it */
		break;
	case ADMIN_CONNECT:
	case ADMIN_DELIVER:
		break;
	}
	admin_free(o);
}

/* ---- the rest: the inner store's ---- */

static struct store_op *redis_release(struct store *s, struct event_base *base,
				      const struct store_key *k, const char *owner,
				      store_cb cb, void *arg)
{
	struct redis_store *rs = (struct redis_store *)s;

	return store_release(rs->inner, base, k, owner, cb, arg);
}

static struct store_op *redis_extend(struct store *s, struct event_base *base,
				     const struct store_key *k, const char *owner,
				     uint64_t lease_ms, store_cb cb, void *arg)
{
	struct redis_store *rs = (struct redis_store *)s;

	return store_extend(rs->inner, base, k, owner, lease_ms, cb, arg);
}

static struct store_op *redis_watch(struct store *s, struct event_base *base,
				    const struct store_key *k, store_cb cb,
				    void *arg)
{
	struct redis_store *rs = (struct redis_store *)s;

	return store_watch(rs->inner, base, k, cb, arg);
}

/* Our handles only: release, extend and watch hand out the inner store's. */
static void redis_cancel(struct store_op *op)
{
	struct redis_complete *c;

	switch (((struct redis_claim *)op)->kind) {
	case OP_CLAIM:
		claim_cancel((struct redis_claim *)op);
		break;
	case OP_COMPLETE:
		c = (struct redis_complete *)op;
		if (c->inner != NULL)
			store_cancel(c->inner);
		complete_free(c);
		break;
	case OP_ADMIN:
		admin_cancel((struct redis_admin *)op);
		break;
	}
}

static bool redis_ready(struct store *s)
{
	return store_ready(((struct redis_store *)s)->inner);
}

static size_t redis_degraded(struct store *s, char *buf, size_t len)
{
	return store_degraded(((struct redis_store *)s)->inner, buf, len);
}

static void redis_sweep(struct store *s, struct event_base *base)
{
	struct redis_store *rs = (struct redis_store *)s;

	if (!atomic_load_explicit(&rs->resolved, memory_order_acquire) &&
	    redis_resolve(rs))
		log_info("redis %s: resolved", rs->label);
	store_sweep(rs->inner, base);
}

/*
 * Close every connection still open - those of the calling thread and of
 * threads that never exited (their bases must be alive) - then free inner.
 */
static void redis_free(struct store *s)
{
	struct redis_store *rs = (struct redis_store *)s;
	struct rconn *rc;

	pthread_setspecific(rs->tl_key, NULL);
	for (;;) {
		pthread_mutex_lock(&rs->mu);
		rc = LIST_FIRST(&rs->conns);
		if (rc != NULL)
			LIST_REMOVE(rc, link);
		pthread_mutex_unlock(&rs->mu);
		if (rc == NULL)
			break;
		rc_free(rc);
	}
	pthread_key_delete(rs->tl_key);
	pthread_mutex_destroy(&rs->mu);
	store_free(rs->inner);
	free(rs->master);
	free(rs);
}

/* The inner store's per-thread connections come and go with the thread. */
static int redis_thread_init(struct store *s, struct event_base *base)
{
	return store_thread_init(((struct redis_store *)s)->inner, base);
}

static void redis_thread_done(struct store *s, struct event_base *base)
{
	store_redis_thread_done(s, base);
	store_thread_done(((struct redis_store *)s)->inner, base);
}

static const struct store_ops redis_ops = {
	.name = "redis",
	.claim = redis_claim,
	.complete = redis_complete,
	.release = redis_release,
	.extend = redis_extend,
	.watch = redis_watch,
	.inspect = redis_inspect,
	.purge = redis_purge,
	.cancel = redis_cancel,
	.ready = redis_ready,
	.degraded = redis_degraded,
	.sweep = redis_sweep,
	.thread_init = redis_thread_init,
	.thread_done = redis_thread_done,
	.free = redis_free,
};

/* What both constructors share; NULL with err set (inner not freed). */
static struct redis_store *redis_alloc(struct store *inner, int db, char *err,
				       size_t errlen)
{
	struct redis_store *rs;

	if (db < 0) {
		snprintf(err, errlen, "redis: bad database index %d", db);
		return NULL;
	}
	rs = calloc(1, sizeof(*rs));
	if (rs == NULL || pthread_key_create(&rs->tl_key, rc_thread_exit) != 0) {
		snprintf(err, errlen, "redis: out of memory");
		free(rs);
		return NULL;
	}
	rs->base.ops = &redis_ops;
	rs->inner = inner;
	rs->db = db;
	atomic_init(&rs->resolved, false);
	atomic_init(&rs->cur, 0);
	atomic_init(&rs->timeout_ms, STORE_REDIS_TIMEOUT_MS);
	pthread_mutex_init(&rs->mu, NULL);
	LIST_INIT(&rs->conns);
	return rs;
}

struct store *store_redis_new(struct store *inner, const char *host,
			      const char *port, int db, char *err, size_t errlen)
{
	struct redis_store *rs = NULL;
	char *end;
	long p;

	if (inner == NULL) {
		snprintf(err, errlen, "redis: no store to put it in front of");
		return NULL;
	}
	p = strtol(port, &end, 10);
	if (host[0] == '\0' || strlen(host) >= sizeof(rs->host)) {
		snprintf(err, errlen, "redis: bad host \"%.300s\"", host);
		goto fail;
	}
	if (end == port || *end != '\0' || p < 1 || p > 65535) {
		snprintf(err, errlen, "redis: bad port \"%.30s\"", port);
		goto fail;
	}
	rs = redis_alloc(inner, db, err, errlen);
	if (rs == NULL)
		goto fail;
	snprintf(rs->host, sizeof(rs->host), "%s", host);
	rs->port = (int)p;
	snprintf(rs->label, sizeof(rs->label), "%s:%d", host, rs->port);
	if (!redis_resolve(rs))
		log_warn("redis %s: cannot resolve the host yet; the fast path "
			 "is off until it can", rs->label);
	return &rs->base;
fail:
	store_free(inner);
	return NULL;
}

struct store *store_redis_new_sentinel(struct store *inner,
				       const char *sentinels,
				       const char *master, int db, char *err,
				       size_t errlen)
{
	struct redis_store *rs = NULL;
	char *list = NULL, *item, *save = NULL;

	if (inner == NULL) {
		snprintf(err, errlen, "redis: no store to put it in front of");
		return NULL;
	}
	rs = redis_alloc(inner, db, err, errlen);
	list = strdup(sentinels);
	if (rs == NULL || list == NULL)
		goto fail;
	rs->master = strdup(master);
	if (rs->master == NULL)
		goto fail;
	for (item = strtok_r(list, ",", &save); item != NULL;
	     item = strtok_r(NULL, ",", &save)) {
		struct hostport hp = { 0 };

		if (rs->nsentinels == HOSTPORT_SENTINELS_MAX ||
		    hostport_parse(item, "26379", 1, &hp, err, errlen) < 0 ||
		    strlen(hp.host) >= sizeof(rs->sentinels[0].host)) {
			if (rs->nsentinels == HOSTPORT_SENTINELS_MAX)
				snprintf(err, errlen, "redis: too many sentinels");
			hostport_clear(&hp);
			goto fail;
		}
		snprintf(rs->sentinels[rs->nsentinels].host,
			 sizeof(rs->sentinels[0].host), "%s", hp.host);
		rs->sentinels[rs->nsentinels].port = atoi(hp.port);
		rs->nsentinels++;
		hostport_clear(&hp);
	}
	if (rs->nsentinels == 0) {
		snprintf(err, errlen, "redis: no sentinel");
		goto fail;
	}
	free(list);
	snprintf(rs->label, sizeof(rs->label), "master %.64s (sentinels %.200s)",
		 master, sentinels);
	if (!redis_resolve(rs))
		log_warn("redis %s: no sentinel resolves yet; the fast path is "
			 "off until one does", rs->label);
	return &rs->base;
fail:
	free(list);
	if (rs != NULL) {
		free(rs->master);
		pthread_key_delete(rs->tl_key);
		pthread_mutex_destroy(&rs->mu);
		free(rs);
	}
	store_free(inner);
	return NULL;
}

void store_redis_set_timeout(struct store *s, unsigned ms)
{
	struct redis_store *rs = (struct redis_store *)s;

	atomic_store_explicit(&rs->timeout_ms, ms, memory_order_relaxed);
}

