/*
 * store_cache.c - the in-process cache of completed responses (see
 * store_cache.h).
 *
 *   claim ──▶ entry, live? ──yes, same fp──▶ COMPLETED (delivered next turn)
 *                │          ──yes, other fp─▶ MISMATCH  (delivered next turn)
 *                │no
 *                ▼
 *           inner claim ──COMPLETED──▶ fill (unless a purge was heard since
 *                                      the claim started), pass the result on
 *
 *   complete ──▶ inner complete ──OK──▶ fill
 *
 * Generations: every purge heard bumps the counter of its key's slot (and
 * "purge:*", or a change in hearing, bumps them all through the global
 * one); a fill carries the generations read when its call started and is
 * dropped if either moved. Collisions only cost a miss.
 */
#include "store_cache.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/event.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"

#define NBUCKETS_MIN 1024
#define NGENS 4096		/* purge generation slots */
#define ENTRY_OVERHEAD 96	/* bookkeeping per entry, counted in bytes */
#define PURGE_PREFIX "purge:"
#define HEAR_POLL_MS 1		/* a purge waits for its own echo: each */
#define HEAR_WAIT_MS 1000	/* and at most */

struct entry {
	struct entry *next;		/* hash chain */
	TAILQ_ENTRY(entry) age;		/* oldest first */
	uint64_t hash;
	uint64_t expires_ms;		/* monotonic */
	size_t bytes;
	uint8_t fp[FP_LEN];
	struct stored_response *resp;	/* our reference */
	size_t id_len;
	char id[];			/* "<scope>\n<key>" */
};

struct cache_store {
	struct store base;
	struct store *inner;
	uint64_t max_bytes;
	pthread_mutex_t mu;		/* everything below */
	struct entry **buckets;
	size_t nbuckets, count, bytes;
	TAILQ_HEAD(, entry) ages;
	int listening;			/* listeners up; 0: purges unheard */
	bool deaf;			/* for good: purges may go unheard */
	atomic_uint global_gen;
	atomic_uint gens[NGENS];
};

enum cop_kind {
	COP_CLAIM,
	COP_COMPLETE,
	COP_INSPECT,
	COP_PURGE,
};

/* Our handle: a claim or completion passed to the inner store, or a hit
 * being delivered. */
struct cop {
	struct store_op op;		/* first: the generic handle */
	enum cop_kind kind;
	struct cache_store *cs;
	struct event_base *base;
	store_cb cb;
	void *arg;
	struct store_op *inner;		/* NULL once it answered */
	struct event *ev;		/* a hit's delivery; a purge's wait */
	struct store_result res;	/* a hit; a purge's outcome */
	struct store_key key;
	struct store_claim claim;	/* claim: re-sent if a hit goes stale */
	uint8_t fp[FP_LEN];
	uint64_t start_ms;
	uint64_t hash;			/* of the key's id */
	unsigned global_gen, gen;	/* at the start */
	struct stored_response *resp;	/* complete: our reference */
	uint64_t ttl_ms;
	bool body;			/* inspect: the stored response too */
};

static const struct store_ops cache_ops;

/* ---- the table (under mu) --------------------------------------------- */

static struct entry **find_slot(struct cache_store *cs, const char *id,
				size_t len, uint64_t h)
{
	struct entry **pp = &cs->buckets[h & (cs->nbuckets - 1)];

	while (*pp != NULL && !((*pp)->hash == h && (*pp)->id_len == len &&
				memcmp((*pp)->id, id, len) == 0))
		pp = &(*pp)->next;
	return pp;
}

static void publish_size(const struct cache_store *cs)
{
	metrics_gauge_set(GAUGE_response_cache_bytes, (long)cs->bytes);
	metrics_gauge_set(GAUGE_response_cache_entries, (long)cs->count);
}

/* Unlink *pp (and from the age list) and free it. */
static void drop(struct cache_store *cs, struct entry **pp)
{
	struct entry *e = *pp;

	*pp = e->next;
	TAILQ_REMOVE(&cs->ages, e, age);
	cs->count--;
	cs->bytes -= e->bytes;
	stored_response_unref(e->resp);
	free(e);
}

static void drop_all(struct cache_store *cs)
{
	for (size_t i = 0; i < cs->nbuckets; i++)
		while (cs->buckets[i] != NULL)
			drop(cs, &cs->buckets[i]);
	publish_size(cs);
}

static void grow(struct cache_store *cs)
{
	size_t n = cs->nbuckets * 2;
	struct entry **b = calloc(n, sizeof(*b));

	if (b == NULL)
		return;		/* longer chains, still correct */
	for (size_t i = 0; i < cs->nbuckets; i++) {
		struct entry *e = cs->buckets[i], *next;

		for (; e != NULL; e = next) {
			next = e->next;
			e->next = b[e->hash & (n - 1)];
			b[e->hash & (n - 1)] = e;
		}
	}
	free(cs->buckets);
	cs->buckets = b;
	cs->nbuckets = n;
}

static unsigned gen_of(const struct cache_store *cs, uint64_t h)
{
	return atomic_load_explicit(&cs->gens[h % NGENS], memory_order_acquire);
}

/*
 * Keep resp for the record (k, fp) until expires_ms, unless a purge was
 * heard since the call started (generations moved), nobody is listening,
 * or it is too large for the cache.
 */
static void fill(struct cache_store *cs, const struct cop *o,
		 struct stored_response *resp, uint64_t expires_ms)
{
	char id[STORE_ID_MAX];
	size_t len = store_key_id(&o->key, id);
	uint64_t h = o->hash;
	size_t bytes = ENTRY_OVERHEAD + len + resp->head_len + resp->body_len;
	struct entry *e, **pp;

	if (bytes > cs->max_bytes / 8 || expires_ms <= clock_ms())
		return;
	e = malloc(sizeof(*e) + len + 1);
	if (e == NULL)
		return;
	memcpy(e->id, id, len + 1);
	e->id_len = len;
	e->hash = h;
	e->expires_ms = expires_ms;
	e->bytes = bytes;
	memcpy(e->fp, o->fp, FP_LEN);
	e->resp = stored_response_ref(resp);
	pthread_mutex_lock(&cs->mu);
	if (cs->listening == 0 || cs->deaf ||
	    atomic_load(&cs->global_gen) != o->global_gen ||
	    gen_of(cs, h) != o->gen) {
		pthread_mutex_unlock(&cs->mu);
		stored_response_unref(e->resp);
		free(e);
		return;
	}
	pp = find_slot(cs, id, len, h);
	if (*pp != NULL)
		drop(cs, pp);
	while (cs->bytes + bytes > cs->max_bytes && !TAILQ_EMPTY(&cs->ages)) {
		struct entry *old = TAILQ_FIRST(&cs->ages);

		drop(cs, find_slot(cs, old->id, old->id_len, old->hash));
	}
	e->next = cs->buckets[h & (cs->nbuckets - 1)];
	cs->buckets[h & (cs->nbuckets - 1)] = e;
	TAILQ_INSERT_TAIL(&cs->ages, e, age);
	cs->count++;
	cs->bytes += bytes;
	if (cs->count > cs->nbuckets)
		grow(cs);
	publish_size(cs);
	pthread_mutex_unlock(&cs->mu);
}

/*
 * Look o's key up. A live entry with o's fingerprint: STORE_COMPLETED
 * with a reference in *resp; with another one: STORE_MISMATCH; an expired
 * one is dropped. Otherwise STORE_ERROR (miss).
 */
static enum store_status lookup(struct cache_store *cs, const struct cop *o,
				struct stored_response **resp, uint64_t *ttl_left)
{
	char id[STORE_ID_MAX];
	size_t len = store_key_id(&o->key, id);
	uint64_t h = o->hash, now = clock_ms();
	enum store_status st = STORE_ERROR;
	struct entry **pp;

	pthread_mutex_lock(&cs->mu);
	if (cs->listening == 0 || cs->deaf || cs->count == 0)
		goto out;
	pp = find_slot(cs, id, len, h);
	if (*pp == NULL)
		goto out;
	if ((*pp)->expires_ms <= now) {
		drop(cs, pp);
		publish_size(cs);
		goto out;
	}
	if (memcmp((*pp)->fp, o->fp, FP_LEN) != 0) {
		st = STORE_MISMATCH;
		goto out;
	}
	*resp = stored_response_ref((*pp)->resp);
	*ttl_left = (*pp)->expires_ms - now;
	st = STORE_COMPLETED;
out:
	pthread_mutex_unlock(&cs->mu);
	return st;
}

/* ---- operations ------------------------------------------------------ */

static void cop_free(struct cop *o)
{
	if (o->ev != NULL)
		event_free(o->ev);
	stored_response_unref(o->res.resp);
	stored_response_unref(o->resp);
	free(o);
}

static struct cop *cop_new(struct cache_store *cs, struct event_base *base,
			   enum cop_kind kind, const struct store_key *k,
			   store_cb cb, void *arg)
{
	struct cop *o = calloc(1, sizeof(*o));
	char id[STORE_ID_MAX];

	if (o == NULL)
		return NULL;
	o->op.store = &cs->base;
	o->kind = kind;
	o->cs = cs;
	o->base = base;
	o->cb = cb;
	o->arg = arg;
	o->key = *k;
	o->start_ms = clock_ms();
	o->global_gen = atomic_load(&cs->global_gen);
	o->hash = store_id_hash(id, store_key_id(k, id));
	o->gen = gen_of(cs, o->hash);
	return o;
}

/* Purges of o's key heard since o started (its own purge included). */
static unsigned purges_since(const struct cop *o)
{
	if (atomic_load(&o->cs->global_gen) != o->global_gen)
		return UINT_MAX;
	return gen_of(o->cs, o->hash) - o->gen;
}

static void claim_inner_cb(void *arg, const struct store_result *res);

/*
 * A hit, one loop turn after its lookup. A purge heard in between (this
 * turn's listener, or another worker's) makes it stale: the store behind
 * answers instead.
 */
static void hit_cb(evutil_socket_t fd, short what, void *arg)
{
	struct cop *o = arg;

	if (purges_since(o) == 0) {
		if (o->res.status == STORE_COMPLETED)
			metrics_count(COUNTER_response_cache_hits_total);
		o->cb(o->arg, &o->res);
		cop_free(o);
		return;
	}
	event_free(o->ev);
	o->ev = NULL;
	stored_response_unref(o->res.resp);
	memset(&o->res, 0, sizeof(o->res));
	o->inner = store_claim(o->cs->inner, o->base, &o->claim,
			       claim_inner_cb, o);
	if (o->inner == NULL) {
		o->res.status = STORE_ERROR;
		o->cb(o->arg, &o->res);
		cop_free(o);
	}
}

static void claim_inner_cb(void *arg, const struct store_result *res)
{
	struct cop *o = arg;

	o->inner = NULL;
	if (res->status == STORE_COMPLETED && res->ttl_left_ms > 0)
		fill(o->cs, o, res->resp, o->start_ms + res->ttl_left_ms);
	o->cb(o->arg, res);
	cop_free(o);
}

static struct store_op *cache_claim(struct store *s, struct event_base *base,
				    const struct store_claim *c, store_cb cb,
				    void *arg)
{
	struct cache_store *cs = (struct cache_store *)s;
	struct cop *o = cop_new(cs, base, COP_CLAIM, &c->key, cb, arg);

	if (o == NULL)
		return NULL;
	o->claim = *c;
	memcpy(o->fp, c->fp, FP_LEN);
	o->res.status = lookup(cs, o, &o->res.resp,
			       &o->res.ttl_left_ms);
	if (o->res.status != STORE_ERROR) {
		/* answered here: on the next loop turn, never inside the call */
		o->ev = event_new(base, -1, 0, hit_cb, o);
		if (o->ev == NULL) {
			cop_free(o);
			return NULL;
		}
		event_active(o->ev, EV_TIMEOUT, 1);
		return &o->op;
	}
	o->inner = store_claim(cs->inner, base, c, claim_inner_cb, o);
	if (o->inner == NULL) {
		cop_free(o);
		return NULL;
	}
	return &o->op;
}

static void complete_inner_cb(void *arg, const struct store_result *res)
{
	struct cop *o = arg;

	o->inner = NULL;
	/* an unknown outcome is never a copy: its owner may replace it */
	if (res->status == STORE_OK && !o->resp->unknown)
		fill(o->cs, o, o->resp, o->start_ms + o->ttl_ms);
	o->cb(o->arg, res);
	cop_free(o);
}

static struct store_op *cache_complete(struct store *s, struct event_base *base,
				       const struct store_key *k, const char *owner,
				       const uint8_t fp[FP_LEN],
				       struct stored_response *resp,
				       uint64_t ttl_ms, store_cb cb, void *arg)
{
	struct cache_store *cs = (struct cache_store *)s;
	struct cop *o = cop_new(cs, base, COP_COMPLETE, k, cb, arg);

	if (o == NULL)
		return NULL;
	memcpy(o->fp, fp, FP_LEN);
	o->resp = stored_response_ref(resp);
	o->ttl_ms = ttl_ms;
	o->inner = store_complete(cs->inner, base, k, owner, fp, resp, ttl_ms,
				  complete_inner_cb, o);
	if (o->inner == NULL) {
		cop_free(o);
		return NULL;
	}
	return &o->op;
}

/*
 * Our copy of k, for an operator: its record and where, added to what the
 * store behind said (res). A copy the store behind no longer has (a row
 * deleted by hand, its purge unheard) is reported from here. With forget,
 * the copy is dropped, and fills in progress are refused.
 */
static void own_copy(struct cache_store *cs, struct cop *o, bool forget)
{
	struct store_record *rec = &o->res.rec;
	char id[STORE_ID_MAX];
	size_t len = store_key_id(&o->key, id);
	uint64_t h = o->hash, now = clock_ms();
	struct entry **pp, *e;

	pthread_mutex_lock(&cs->mu);
	if (forget)
		atomic_fetch_add(&cs->gens[h % NGENS], 1);
	pp = find_slot(cs, id, len, h);
	e = *pp;
	if (e == NULL || e->expires_ms <= now)
		goto out;
	rec->found |= STORE_IN_MEMORY;
	if (o->res.status == STORE_ABSENT) {
		o->res.status = STORE_OK;
		rec->completed = true;
		memcpy(rec->fp, e->fp, FP_LEN);
		rec->expires_ms = store_unix_ms(e->expires_ms, now);
		rec->status = e->resp->status;
		rec->head_len = e->resp->head_len;
		rec->body_len = e->resp->body_len;
		rec->body_stored = e->resp->body_stored;
		if (o->body && o->res.resp == NULL)
			o->res.resp = stored_response_ref(e->resp);
	}
out:
	if (forget && e != NULL) {
		drop(cs, pp);
		publish_size(cs);
	}
	pthread_mutex_unlock(&cs->mu);
}

static void purge_done(struct cop *o)
{
	o->cb(o->arg, &o->res);
	cop_free(o);
}

/*
 * A committed purge answers once this process heard its notification:
 * its own bump of the key's generation and at least one more (a listener
 * heard it; the global one moving counts too). Every instance's listener
 * was told by the same commit, so an answer means the others are hearing
 * it about now, not within the 3 s bound for a listener cut silently. A
 * listener slower than HEAR_WAIT_MS does not hold the operator longer.
 */
static void purge_hear_cb(evutil_socket_t fd, short what, void *arg)
{
	struct cop *o = arg;
	struct timeval tv = clock_tv(HEAR_POLL_MS);

	if (purges_since(o) >= 2 || clock_ms() - o->start_ms >= HEAR_WAIT_MS) {
		purge_done(o);
		return;
	}
	evtimer_add(o->ev, &tv);
}

static void purge_hear(struct cop *o)
{
	struct cache_store *cs = o->cs;
	bool listening;

	pthread_mutex_lock(&cs->mu);
	listening = cs->listening > 0 && !cs->deaf;
	pthread_mutex_unlock(&cs->mu);
	if ((o->res.status != STORE_OK && o->res.status != STORE_ABSENT) ||
	    !listening || purges_since(o) >= 2)
		goto done;
	o->ev = evtimer_new(o->base, purge_hear_cb, o);
	if (o->ev == NULL)
		goto done;
	purge_hear_cb(-1, 0, o);
	return;
done:
	purge_done(o);
}

static void inspect_inner_cb(void *arg, const struct store_result *res)
{
	struct cop *o = arg;

	o->inner = NULL;
	o->res = *res;
	if (res->resp != NULL)
		o->res.resp = stored_response_ref(res->resp);
	if (o->kind == COP_PURGE) {
		own_copy(o->cs, o, true);
		purge_hear(o);
		return;
	}
	if (res->status != STORE_ERROR)
		own_copy(o->cs, o, false);
	o->cb(o->arg, &o->res);
	cop_free(o);
}

static struct store_op *cache_inspect(struct store *s, struct event_base *base,
				      const struct store_key *k, bool body,
				      store_cb cb, void *arg)
{
	struct cache_store *cs = (struct cache_store *)s;
	struct cop *o = cop_new(cs, base, COP_INSPECT, k, cb, arg);

	if (o == NULL)
		return NULL;
	o->body = body;
	o->inner = store_inspect(cs->inner, base, k, body, inspect_inner_cb, o);
	if (o->inner == NULL) {
		cop_free(o);
		return NULL;
	}
	return &o->op;
}

/* The store behind first (it tells every instance), then our copy. */
static struct store_op *cache_purge(struct store *s, struct event_base *base,
				    const struct store_key *k, store_cb cb,
				    void *arg)
{
	struct cache_store *cs = (struct cache_store *)s;
	struct cop *o = cop_new(cs, base, COP_PURGE, k, cb, arg);

	if (o == NULL)
		return NULL;
	o->inner = store_purge(cs->inner, base, k, inspect_inner_cb, o);
	if (o->inner == NULL) {
		cop_free(o);
		return NULL;
	}
	return &o->op;
}

/* ---- the rest: the inner store's --------------------------------------- */

static struct store_op *cache_release(struct store *s, struct event_base *base,
				      const struct store_key *k, const char *owner,
				      store_cb cb, void *arg)
{
	return store_release(((struct cache_store *)s)->inner, base, k, owner,
			     cb, arg);
}

static struct store_op *cache_extend(struct store *s, struct event_base *base,
				     const struct store_key *k, const char *owner,
				     uint64_t lease_ms, store_cb cb, void *arg)
{
	return store_extend(((struct cache_store *)s)->inner, base, k, owner,
			    lease_ms, cb, arg);
}

static struct store_op *cache_watch(struct store *s, struct event_base *base,
				    const struct store_key *k, store_cb cb,
				    void *arg)
{
	return store_watch(((struct cache_store *)s)->inner, base, k, cb, arg);
}

/* Our handles are claims, completions, inspections and purges: release,
 * extend and watch hand out the inner store's. */
static void cache_cancel(struct store_op *op)
{
	struct cop *o = (struct cop *)op;

	if (o->inner != NULL)
		store_cancel(o->inner);
	cop_free(o);		/* event_free drops a pending delivery */
}

static bool cache_ready(struct store *s)
{
	return store_ready(((struct cache_store *)s)->inner);
}

static size_t cache_degraded(struct store *s, char *buf, size_t len)
{
	return store_degraded(((struct cache_store *)s)->inner, buf, len);
}

static void cache_sweep(struct store *s, struct event_base *base)
{
	struct cache_store *cs = (struct cache_store *)s;
	uint64_t now = clock_ms();
	struct entry *e, *next;

	/* expired entries (the table is bounded by bytes: a short walk) */
	pthread_mutex_lock(&cs->mu);
	for (e = TAILQ_FIRST(&cs->ages); e != NULL; e = next) {
		next = TAILQ_NEXT(e, age);
		if (e->expires_ms <= now)
			drop(cs, find_slot(cs, e->id, e->id_len, e->hash));
	}
	publish_size(cs);
	pthread_mutex_unlock(&cs->mu);
	store_sweep(cs->inner, base);
}

static int cache_thread_init(struct store *s, struct event_base *base)
{
	return store_thread_init(((struct cache_store *)s)->inner, base);
}

static void cache_thread_done(struct store *s, struct event_base *base)
{
	store_thread_done(((struct cache_store *)s)->inner, base);
}

static void cache_free(struct store *s)
{
	struct cache_store *cs = (struct cache_store *)s;

	/* first: the store behind may still report its listeners closing */
	store_free(cs->inner);
	drop_all(cs);
	free(cs->buckets);
	pthread_mutex_destroy(&cs->mu);
	free(cs);
}

static const struct store_ops cache_ops = {
	.name = "cache",
	.claim = cache_claim,
	.complete = cache_complete,
	.release = cache_release,
	.extend = cache_extend,
	.watch = cache_watch,
	.inspect = cache_inspect,
	.purge = cache_purge,
	.cancel = cache_cancel,
	.ready = cache_ready,
	.degraded = cache_degraded,
	.sweep = cache_sweep,
	.thread_init = cache_thread_init,
	.thread_done = cache_thread_done,
	.free = cache_free,
};

/* ---- what the store behind heard ---------------------------------------- */

/* Everything goes, and fills in progress are refused. Under mu. */
static void forget_all(struct cache_store *cs)
{
	atomic_fetch_add(&cs->global_gen, 1);
	drop_all(cs);
}

void store_cache_notified(struct store *s, const char *payload)
{
	struct cache_store *cs = (struct cache_store *)s;
	const char *sk, *colon;
	char id[STORE_ID_MAX];
	struct entry **pp;
	size_t len;
	uint64_t h;

	if (strncmp(payload, PURGE_PREFIX, sizeof(PURGE_PREFIX) - 1) != 0)
		return;		/* completion or release: no cached record changes */
	sk = payload + sizeof(PURGE_PREFIX) - 1;
	if (strcmp(sk, "*") == 0) {
		pthread_mutex_lock(&cs->mu);
		forget_all(cs);
		pthread_mutex_unlock(&cs->mu);
		log_info("response cache: purged (all)");
		return;
	}
	colon = strchr(sk, ':');
	if (colon == NULL || (size_t)(colon - sk) > STORE_SCOPE_LEN ||
	    strlen(colon + 1) > IDEMKEY_MAX)
		return;
	len = store_id(sk, (size_t)(colon - sk), colon + 1, strlen(colon + 1), id);
	h = store_id_hash(id, len);
	pthread_mutex_lock(&cs->mu);
	atomic_fetch_add(&cs->gens[h % NGENS], 1);
	pp = find_slot(cs, id, len, h);
	if (*pp != NULL) {
		drop(cs, pp);
		publish_size(cs);
	}
	pthread_mutex_unlock(&cs->mu);
}

void store_cache_listening(struct store *s, bool up)
{
	struct cache_store *cs = (struct cache_store *)s;

	pthread_mutex_lock(&cs->mu);
	if (up ? cs->listening++ == 0 : --cs->listening == 0)
		forget_all(cs);	/* purges may have gone unheard */
	pthread_mutex_unlock(&cs->mu);
}

void store_cache_deaf(struct store *s)
{
	struct cache_store *cs = (struct cache_store *)s;

	pthread_mutex_lock(&cs->mu);
	cs->deaf = true;
	forget_all(cs);
	pthread_mutex_unlock(&cs->mu);
}

struct store *store_cache_new(struct store *inner, uint64_t max_bytes)
{
	struct cache_store *cs;

	if (inner == NULL)
		return NULL;
	cs = calloc(1, sizeof(*cs));
	if (cs == NULL)
		goto fail;
	cs->nbuckets = NBUCKETS_MIN;
	cs->buckets = calloc(cs->nbuckets, sizeof(*cs->buckets));
	if (cs->buckets == NULL)
		goto fail;
	cs->base.ops = &cache_ops;
	cs->inner = inner;
	cs->max_bytes = max_bytes;
	pthread_mutex_init(&cs->mu, NULL);
	TAILQ_INIT(&cs->ages);
	return &cs->base;
fail:
	if (cs != NULL)
		free(cs->buckets);
	free(cs);
	store_free(inner);
	return NULL;
}
