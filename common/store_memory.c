/*
 * store_memory.c - the embedded store (see store_memory.h).
 *
 * One hash table behind one mutex. Every operation decides under the lock
 * at once, then reports through an event on the caller's loop (so that no
 * callback runs inside the call). Waiters ("watch") hang off the in-flight
 * record; whoever settles the record - on any thread - activates their
 * events. A waiter's event also carries a timeout at the end of the
 * record's lease, so a duplicate wakes to take over a claim whose owner is
 * stuck, without any polling.
 */
#include "store_memory.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

#include <event2/event.h>

#include "clock.h"
#include "metrics.h"

#define NBUCKETS_MIN 1024

struct mem_op;
TAILQ_HEAD(mem_waiters, mem_op);

struct mem_entry {
	struct mem_entry *next;		/* hash chain */
	uint64_t hash;
	char *id;			/* scope "\n" key, NUL-terminated */
	size_t id_len;
	uint8_t fp[FP_LEN];
	bool completed;
	char owner[STORE_OWNER_LEN + 1];
	uint64_t lease_until;		/* in flight */
	uint64_t expires_at;
	struct stored_response *resp;	/* completed */
	size_t bytes;			/* accounted */
	struct mem_waiters waiters;
};

struct mem_store {
	struct store base;
	pthread_mutex_t mu;
	struct mem_entry **buckets;
	size_t nbuckets;
	size_t count;
	size_t bytes, max_bytes;
	size_t sweep_pos;		/* next bucket the sweeper looks at */
	store_clock_fn clock;
};

struct mem_op {
	struct store_op op;		/* first: the generic handle */
	struct event *ev;
	store_cb cb;
	void *arg;
	struct store_result res;
	bool watch;			/* a watch: other threads may touch it */
	struct store_key key;		/* a claim's key, to undo a cancelled win */
	struct mem_entry *watching;	/* on its waiter list, under mu */
	TAILQ_ENTRY(mem_op) wlink;
};

static const struct store_ops mem_ops;

static struct mem_entry **find_slot(struct mem_store *m, const char *id,
				    size_t len, uint64_t h)
{
	struct mem_entry **pp = &m->buckets[h & (m->nbuckets - 1)];

	for (; *pp != NULL; pp = &(*pp)->next)
		if ((*pp)->hash == h && (*pp)->id_len == len &&
		    memcmp((*pp)->id, id, len) == 0)
			break;
	return pp;
}

static void grow(struct mem_store *m)
{
	size_t n = m->nbuckets * 2;
	struct mem_entry **b = calloc(n, sizeof(*b));

	if (b == NULL)
		return;		/* longer chains, still correct */
	for (size_t i = 0; i < m->nbuckets; i++) {
		struct mem_entry *e = m->buckets[i], *next;

		for (; e != NULL; e = next) {
			next = e->next;
			e->next = b[e->hash & (n - 1)];
			b[e->hash & (n - 1)] = e;
		}
	}
	free(m->buckets);
	m->buckets = b;
	m->nbuckets = n;
	m->sweep_pos = 0;
}

/* Wake every waiter of e (the record is settling). Under mu. */
static void wake_waiters(struct mem_entry *e)
{
	struct mem_op *w;

	while ((w = TAILQ_FIRST(&e->waiters)) != NULL) {
		TAILQ_REMOVE(&e->waiters, w, wlink);
		w->watching = NULL;
		w->res.status = STORE_SETTLED;
		event_active(w->ev, EV_TIMEOUT, 1);
	}
}

/* Unlink *pp and free it. Under mu. */
static void remove_entry(struct mem_store *m, struct mem_entry **pp)
{
	struct mem_entry *e = *pp;

	*pp = e->next;
	wake_waiters(e);
	m->count--;
	m->bytes -= e->bytes;
	stored_response_unref(e->resp);
	free(e->id);
	free(e);
}

/* An in-flight record lives for ttl, and at least as long as its lease, so
 * that it never expires under a live owner. */
static uint64_t inflight_ttl(const struct store_claim *c)
{
	return c->ttl_ms > c->lease_ms ? c->ttl_ms : c->lease_ms;
}

static bool expired(const struct mem_entry *e, uint64_t now)
{
	return e->expires_at <= now;
}

/* Remove expired records from up to `buckets` buckets. Under mu. */
static void sweep_some(struct mem_store *m, size_t buckets, uint64_t now)
{
	for (size_t i = 0; i < buckets && i < m->nbuckets; i++) {
		struct mem_entry **pp = &m->buckets[m->sweep_pos];

		while (*pp != NULL) {
			if (expired(*pp, now))
				remove_entry(m, pp);
			else
				pp = &(*pp)->next;
		}
		m->sweep_pos = (m->sweep_pos + 1) & (m->nbuckets - 1);
	}
}

static void deliver_cb(evutil_socket_t fd, short what, void *arg)
{
	struct mem_op *o = arg;
	struct mem_store *m = (struct mem_store *)o->op.store;

	if (o->watch) {
		/* woken by a settling thread, or the lease ran out first */
		pthread_mutex_lock(&m->mu);
		if (o->watching != NULL) {
			TAILQ_REMOVE(&o->watching->waiters, o, wlink);
			o->watching = NULL;
		}
		pthread_mutex_unlock(&m->mu);
		o->res.status = STORE_SETTLED;
	}
	o->cb(o->arg, &o->res);
	stored_response_unref(o->res.resp);
	event_free(o->ev);
	free(o);
}

static struct mem_op *op_new(struct mem_store *m, struct event_base *base,
			     store_cb cb, void *arg)
{
	struct mem_op *o = calloc(1, sizeof(*o));

	if (o == NULL)
		return NULL;
	o->op.store = &m->base;
	o->cb = cb;
	o->arg = arg;
	o->ev = event_new(base, -1, 0, deliver_cb, o);
	if (o->ev == NULL) {
		free(o);
		return NULL;
	}
	return o;
}

/* Report on the caller's loop, next turn. */
static struct store_op *op_post(struct mem_op *o, enum store_status st)
{
	o->res.status = st;
	event_active(o->ev, EV_TIMEOUT, 1);
	return &o->op;
}

static struct store_op *mem_claim(struct store *s, struct event_base *base,
				  const struct store_claim *c, store_cb cb, void *arg)
{
	struct mem_store *m = (struct mem_store *)s;
	struct mem_op *o = op_new(m, base, cb, arg);
	char id[STORE_ID_MAX];
	size_t len = store_key_id(&c->key, id);
	uint64_t h = store_id_hash(id, len);
	struct mem_entry **pp, *e;
	enum store_status st;
	uint64_t now;

	if (o == NULL)
		return NULL;
	o->key = c->key;
	pthread_mutex_lock(&m->mu);
	now = m->clock();
	pp = find_slot(m, id, len, h);
	if (*pp != NULL && expired(*pp, now))
		remove_entry(m, pp);	/* *pp is now the next in chain */
	pp = find_slot(m, id, len, h);
	e = *pp;
	if (e == NULL) {
		size_t need = sizeof(*e) + len + 1;

		if (m->bytes + need > m->max_bytes)
			sweep_some(m, m->nbuckets, now);
		if (m->bytes + need > m->max_bytes ||
		    store_new_owner(o->res.owner) < 0 ||
		    (e = calloc(1, sizeof(*e))) == NULL ||
		    (e->id = strdup(id)) == NULL) {
			free(e);
			st = STORE_FULL;
			metrics_store_error(STORE_KIND_MEMORY);
			goto out;
		}
		e->hash = h;
		e->id_len = len;
		memcpy(e->fp, c->fp, FP_LEN);
		memcpy(e->owner, o->res.owner, sizeof(e->owner));
		e->lease_until = now + c->lease_ms;
		e->expires_at = now + inflight_ttl(c);
		e->bytes = need;
		TAILQ_INIT(&e->waiters);
		pp = find_slot(m, id, len, h);	/* sweeping may have moved it */
		e->next = *pp;
		*pp = e;
		m->count++;
		m->bytes += need;
		if (m->count > m->nbuckets)
			grow(m);
		st = STORE_WON;
	} else if (memcmp(e->fp, c->fp, FP_LEN) != 0) {
		st = STORE_MISMATCH;	/* before the in-flight state */
	} else if (e->completed) {
		o->res.resp = stored_response_ref(e->resp);
		st = STORE_COMPLETED;
	} else if (e->lease_until <= now) {
		/* the owner is gone or stuck: take over */
		if (store_new_owner(o->res.owner) < 0) {
			st = STORE_ERROR;
			goto out;
		}
		memcpy(e->owner, o->res.owner, sizeof(e->owner));
		e->lease_until = now + c->lease_ms;
		e->expires_at = now + inflight_ttl(c);
		st = STORE_WON;
	} else {
		st = STORE_IN_FLIGHT;
	}
out:
	pthread_mutex_unlock(&m->mu);
	return op_post(o, st);
}

/* Find the in-flight record k owned by owner. Under mu. */
static struct mem_entry **find_owned(struct mem_store *m, const struct store_key *k,
				     const char *owner)
{
	char id[STORE_ID_MAX];
	size_t len = store_key_id(k, id);
	struct mem_entry **pp = find_slot(m, id, len, store_id_hash(id, len));

	if (*pp == NULL || (*pp)->completed || strcmp((*pp)->owner, owner) != 0)
		return NULL;
	return pp;
}

static struct store_op *mem_complete(struct store *s, struct event_base *base,
				     const struct store_key *k, const char *owner,
				     const uint8_t fp[FP_LEN],
				     struct stored_response *resp, uint64_t ttl_ms,
				     store_cb cb, void *arg)
{
	struct mem_store *m = (struct mem_store *)s;
	struct mem_op *o = op_new(m, base, cb, arg);
	struct mem_entry **pp, *e;
	enum store_status st = STORE_FENCED;
	size_t size;

	if (o == NULL)
		return NULL;
	pthread_mutex_lock(&m->mu);
	pp = find_owned(m, k, owner);
	if (pp != NULL) {
		e = *pp;
		size = resp->head_len + resp->body_len + sizeof(*resp);
		if (m->bytes + size > m->max_bytes)
			sweep_some(m, m->nbuckets, m->clock());
		pp = find_owned(m, k, owner);	/* still ours: not expired */
		if (pp != NULL) {
			e = *pp;
			if (m->bytes + size > m->max_bytes && resp->body_stored) {
				/* keep the record, drop the body: a duplicate
				 * then gets 409 response-not-stored */
				struct stored_response *slim = stored_response_new(
					resp->status, "", 0, "", 0, false);

				if (slim != NULL)
					resp = slim;
				size = sizeof(*resp);
			} else {
				stored_response_ref(resp);
			}
			e->completed = true;
			e->resp = resp;
			e->bytes += size;
			m->bytes += size;
			e->expires_at = m->clock() + ttl_ms;
			wake_waiters(e);
			st = STORE_OK;
		}
	}
	pthread_mutex_unlock(&m->mu);
	return op_post(o, st);
}

static struct store_op *mem_release(struct store *s, struct event_base *base,
				    const struct store_key *k, const char *owner,
				    store_cb cb, void *arg)
{
	struct mem_store *m = (struct mem_store *)s;
	struct mem_op *o = op_new(m, base, cb, arg);
	struct mem_entry **pp;
	enum store_status st = STORE_FENCED;

	if (o == NULL)
		return NULL;
	pthread_mutex_lock(&m->mu);
	pp = find_owned(m, k, owner);
	if (pp != NULL) {
		remove_entry(m, pp);
		st = STORE_OK;
	}
	pthread_mutex_unlock(&m->mu);
	return op_post(o, st);
}

static struct store_op *mem_extend(struct store *s, struct event_base *base,
				   const struct store_key *k, const char *owner,
				   uint64_t lease_ms, store_cb cb, void *arg)
{
	struct mem_store *m = (struct mem_store *)s;
	struct mem_op *o = op_new(m, base, cb, arg);
	struct mem_entry **pp;
	enum store_status st = STORE_FENCED;

	if (o == NULL)
		return NULL;
	pthread_mutex_lock(&m->mu);
	pp = find_owned(m, k, owner);
	if (pp != NULL) {
		struct mem_entry *e = *pp;

		e->lease_until = m->clock() + lease_ms;
		/* never expire under a live owner */
		if (e->expires_at < e->lease_until)
			e->expires_at = e->lease_until;
		st = STORE_OK;
	}
	pthread_mutex_unlock(&m->mu);
	return op_post(o, st);
}

static struct store_op *mem_watch(struct store *s, struct event_base *base,
				  const struct store_key *k, store_cb cb, void *arg)
{
	struct mem_store *m = (struct mem_store *)s;
	struct mem_op *o = op_new(m, base, cb, arg);
	char id[STORE_ID_MAX];
	size_t len = store_key_id(k, id);
	struct mem_entry *e;
	uint64_t now;

	if (o == NULL)
		return NULL;
	o->watch = true;
	pthread_mutex_lock(&m->mu);
	now = m->clock();
	e = *find_slot(m, id, len, store_id_hash(id, len));
	if (e == NULL || e->completed || e->lease_until <= now ||
	    expired(e, now)) {
		pthread_mutex_unlock(&m->mu);
		return op_post(o, STORE_SETTLED);
	}
	{
		struct timeval tv = clock_tv(e->lease_until - now);

		o->watching = e;
		TAILQ_INSERT_TAIL(&e->waiters, o, wlink);
		event_add(o->ev, &tv);
	}
	pthread_mutex_unlock(&m->mu);
	return &o->op;
}

static void mem_cancel(struct store_op *op)
{
	struct mem_op *o = (struct mem_op *)op;
	struct mem_store *m = (struct mem_store *)op->store;

	if (o->res.status == STORE_WON && !o->watch) {
		/* a win nobody will execute: give the key back at once instead
		 * of leaving it in flight for a whole lease */
		struct mem_entry **pp;

		pthread_mutex_lock(&m->mu);
		pp = find_owned(m, &o->key, o->res.owner);
		if (pp != NULL)
			remove_entry(m, pp);
		pthread_mutex_unlock(&m->mu);
	}
	if (o->watch) {
		/* under the lock, so that no thread is activating it meanwhile */
		pthread_mutex_lock(&m->mu);
		if (o->watching != NULL)
			TAILQ_REMOVE(&o->watching->waiters, o, wlink);
		o->watching = NULL;
		pthread_mutex_unlock(&m->mu);
	}
	/* removes a pending activation too, even one made by another thread */
	event_free(o->ev);
	stored_response_unref(o->res.resp);
	free(o);
}

static bool mem_ready(struct store *s)
{
	return true;
}

static void mem_sweep(struct store *s, struct event_base *base)
{
	struct mem_store *m = (struct mem_store *)s;

	pthread_mutex_lock(&m->mu);
	/* a bounded batch per call keeps the lock short */
	sweep_some(m, 4096, m->clock());
	pthread_mutex_unlock(&m->mu);
}

static void mem_free(struct store *s)
{
	struct mem_store *m = (struct mem_store *)s;

	for (size_t i = 0; i < m->nbuckets; i++)
		while (m->buckets[i] != NULL)
			remove_entry(m, &m->buckets[i]);
	free(m->buckets);
	pthread_mutex_destroy(&m->mu);
	free(m);
}

static const struct store_ops mem_ops = {
	.name = "memory",
	.claim = mem_claim,
	.complete = mem_complete,
	.release = mem_release,
	.extend = mem_extend,
	.watch = mem_watch,
	.cancel = mem_cancel,
	.ready = mem_ready,
	.sweep = mem_sweep,
	.free = mem_free,
};

struct store *store_memory_new(size_t max_bytes, store_clock_fn clock)
{
	struct mem_store *m = calloc(1, sizeof(*m));

	if (m == NULL)
		return NULL;
	m->base.ops = &mem_ops;
	m->nbuckets = NBUCKETS_MIN;
	m->buckets = calloc(m->nbuckets, sizeof(*m->buckets));
	if (m->buckets == NULL) {
		free(m);
		return NULL;
	}
	pthread_mutex_init(&m->mu, NULL);
	m->max_bytes = max_bytes;
	m->clock = clock != NULL ? clock : clock_ms;
	return &m->base;
}

size_t store_memory_count(struct store *s)
{
	struct mem_store *m = (struct mem_store *)s;
	size_t n;

	pthread_mutex_lock(&m->mu);
	n = m->count;
	pthread_mutex_unlock(&m->mu);
	return n;
}

size_t store_memory_bytes(struct store *s)
{
	struct mem_store *m = (struct mem_store *)s;
	size_t n;

	pthread_mutex_lock(&m->mu);
	n = m->bytes;
	pthread_mutex_unlock(&m->mu);
	return n;
}
