/*
 * store_memory.c - the embedded store (see store_memory.h).
 *
 * One hash table behind one mutex. Every operation decides under the lock
 * at once, then reports through an event on the caller's loop (so that no
 * callback runs inside the call). Waiters ("watch") hang off the in-flight
 * record; whoever settles the record - on any thread - wakes them. A
 * waiter's event also carries a timeout at the end of the record's lease,
 * so a duplicate wakes to take over a claim whose owner is stuck, without
 * any polling.
 *
 * Waking crosses threads without touching another loop's events: the
 * workers' bases have no lock (EVENT_BASE_FLAG_NOLOCK). Each loop given to
 * store_thread_init() has a mailbox (struct mem_local): the settling thread
 * moves the waiter onto the mailbox's list and writes the mailbox's
 * eventfd, all under mu; the waiter's own loop reads the eventfd and
 * activates the waiters' events. A waiter leaves whichever list it is on,
 * under mu, before it is freed (woken by a timeout, or cancelled).
 *
 *    thread B (settles)                 thread A (waits)
 *    mu: e->waiters -> l->woken,        l->ev readable: mu: l->woken ->
 *        eventfd_write(l->efd) once         event_active(o->ev)
 *
 * No operation's time under the lock grows with the table:
 *
 *   - Buckets are chosen by SipHash-2-4 under a key drawn for this store, so
 *     clients cannot pile their keys into one chain.
 *   - The table doubles incrementally: when records outnumber buckets, a
 *     second table of twice the size is allocated and every operation moves
 *     the next few buckets of the old one into it; meanwhile new records go
 *     into the new table and lookups try both.
 *
 *        t[0]  [moved|moved|moved|  b3  |  b4  | ... ]   move_pos = 3
 *        t[1]  [ ... twice as many buckets ...        ]   new records here
 *
 *   - Expired records are swept by a cursor over the buckets, a bounded
 *     batch at a time: by the sweep timer, and by a claim or completion
 *     that finds the store at its bound. Slot i of the cursor is bucket i
 *     of t[0] and, while doubling, buckets i and i + n of t[1]: the two a
 *     record of bucket i moves to. A record no sweep has reached yet is
 *     still never served after its expiry: every lookup checks it.
 */
#include "store_memory.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/queue.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/rand.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "siphash.h"

#define NBUCKETS_MIN 1024
#define SWEEP_BATCH 4096	/* the timer's batch: buckets moved, swept */

struct mem_op;
TAILQ_HEAD(mem_waiters, mem_op);

struct mem_entry {
	struct mem_entry *next;		/* hash chain */
	uint64_t hash;
	size_t id_len;
	uint8_t fp[FP_LEN];
	bool completed;			/* resp set: completed, or unknown
					 * (resp->unknown) */
	char owner[STORE_OWNER_LEN + 1];	/* kept once completed: an
						 * unknown outcome's owner
						 * may still resolve it */
	uint64_t lease_until;		/* in flight */
	uint64_t created_at;		/* claimed (or taken over) */
	uint64_t expires_at;
	struct stored_response *resp;	/* completed */
	size_t bytes;			/* accounted */
	struct mem_waiters waiters;
	char id[];			/* scope "\n" key, NUL-terminated */
};

struct mem_table {
	struct mem_entry **b;
	size_t n;			/* buckets, a power of two; 0: none */
};

/* A loop's mailbox for wake-ups from other threads (see the top). */
struct mem_local {
	struct mem_local *next;		/* m->locals, under mu */
	struct mem_store *m;
	struct event_base *base;
	int efd;			/* an eventfd */
	struct event *ev;		/* efd readable, on base */
	bool signalled;			/* under mu: efd written, not read yet */
	struct mem_waiters woken;	/* under mu */
};

struct mem_store {
	struct store base;
	pthread_mutex_t mu;
	struct mem_local *locals;	/* under mu */
	struct mem_table t[2];		/* t[1]: the doubled table being filled */
	size_t move_pos;		/* t[0]'s buckets below it are moved */
	size_t count;
	size_t bytes, max_bytes;
	size_t sweep_pos;		/* the next slot the sweeper looks at */
	uint8_t hash_key[SIPHASH_KEY_LEN];
	store_clock_fn clock;
	/* work besides the operation's own record, for store_memory_stats() */
	size_t op_buckets, op_records;	/* the current operation's */
	size_t op_buckets_max, op_records_max;
};

struct mem_op {
	struct store_op op;		/* first: the generic handle */
	struct event *ev;
	store_cb cb;
	void *arg;
	struct store_result res;
	bool watch;			/* a watch: other threads may touch it */
	struct store_key key;		/* a claim's key, to undo a cancelled win */
	bool took_over;			/* that win took a lapsed record over */
	/* a watch's place, under mu: on watching->waiters, on local->woken
	 * (woken), or on neither */
	struct mem_local *local;	/* its loop's mailbox; NULL: none */
	struct mem_entry *watching;
	bool woken;
	TAILQ_ENTRY(mem_op) wlink;
};

static const struct store_ops mem_ops;

/* ---- the table (under mu) --------------------------------------------- */

static bool doubling(const struct mem_store *m)
{
	return m->t[1].n != 0;
}

static uint64_t id_hash(const struct mem_store *m, const char *id, size_t len)
{
	return siphash24(m->hash_key, id, len);
}

static struct mem_entry **find_in(const struct mem_table *t, const char *id,
				  size_t len, uint64_t h)
{
	struct mem_entry **pp = &t->b[h & (t->n - 1)];

	for (; *pp != NULL; pp = &(*pp)->next)
		if ((*pp)->hash == h && (*pp)->id_len == len &&
		    memcmp((*pp)->id, id, len) == 0)
			return pp;
	return NULL;
}

/* The link that points at the record id (hash h), or NULL. While the table
 * doubles, a record is in t[0] until its bucket moves, or in t[1]. */
static struct mem_entry **find(struct mem_store *m, const char *id, size_t len,
			       uint64_t h)
{
	struct mem_entry **pp = find_in(&m->t[0], id, len, h);

	if (pp == NULL && doubling(m))
		pp = find_in(&m->t[1], id, len, h);
	return pp;
}

/* Start doubling: allocate t[1]. If that fails, chains grow longer and the
 * next insertion tries again; lookups stay correct. */
static void start_doubling(struct mem_store *m)
{
	size_t n = m->t[0].n * 2;
	struct mem_entry **b = calloc(n, sizeof(*b));

	if (b == NULL)
		return;
	m->t[1].b = b;
	m->t[1].n = n;
	m->move_pos = 0;
}

/* Move up to `buckets` buckets of t[0] to t[1]; switch to t[1] when all
 * are moved. */
static void move_some(struct mem_store *m, size_t buckets)
{
	struct mem_table *from = &m->t[0], *to = &m->t[1];

	if (!doubling(m))
		return;
	for (size_t i = 0; i < buckets && m->move_pos < from->n; i++) {
		struct mem_entry *e = from->b[m->move_pos], *next;

		from->b[m->move_pos++] = NULL;
		m->op_buckets++;
		for (; e != NULL; e = next) {
			struct mem_entry **head = &to->b[e->hash & (to->n - 1)];

			next = e->next;
			e->next = *head;
			*head = e;
			m->op_records++;
		}
	}
	if (m->move_pos == from->n) {
		free(from->b);
		*from = *to;
		to->b = NULL;
		to->n = 0;
		m->move_pos = 0;
		/* sweep_pos < the old size: still a slot of the new table */
	}
}

/* Link a new record e in, and start doubling when records outnumber
 * buckets. */
static void insert(struct mem_store *m, struct mem_entry *e)
{
	struct mem_table *t = &m->t[doubling(m) ? 1 : 0];
	struct mem_entry **head = &t->b[e->hash & (t->n - 1)];

	e->next = *head;
	*head = e;
	m->count++;
	m->bytes += e->bytes;
	if (!doubling(m) && m->count > m->t[0].n)
		start_doubling(m);
}

/* Hand w to its loop's mailbox. Under mu. */
static void local_post(struct mem_local *l, struct mem_op *w)
{
	TAILQ_INSERT_TAIL(&l->woken, w, wlink);
	w->woken = true;
	if (!l->signalled) {
		l->signalled = true;
		/* EAGAIN only with the counter at its maximum: still readable.
		 * Any other failure: the next post tries again, and this
		 * waiter wakes at its lease's end at the latest. */
		if (eventfd_write(l->efd, 1) < 0 && errno != EAGAIN) {
			l->signalled = false;
			log_error("memory store: waking a loop: %s",
				  strerror(errno));
		}
	}
}

/* Wake every waiter of e (the record is settling). Under mu. */
static void wake_waiters(struct mem_entry *e)
{
	struct mem_op *w;

	while ((w = TAILQ_FIRST(&e->waiters)) != NULL) {
		TAILQ_REMOVE(&e->waiters, w, wlink);
		w->watching = NULL;
		w->res.status = STORE_SETTLED;
		if (w->local != NULL)
			local_post(w->local, w);
		else	/* a base the store was not given: it has a lock */
			event_active(w->ev, EV_TIMEOUT, 1);
	}
}

/* Take a watch off the list it is on, if any. Under mu. */
static void unwatch(struct mem_op *o)
{
	if (o->watching != NULL)
		TAILQ_REMOVE(&o->watching->waiters, o, wlink);
	else if (o->woken)
		TAILQ_REMOVE(&o->local->woken, o, wlink);
	o->watching = NULL;
	o->woken = false;
}

/* Unlink *pp and free it. */
static void remove_entry(struct mem_store *m, struct mem_entry **pp)
{
	struct mem_entry *e = *pp;

	*pp = e->next;
	wake_waiters(e);
	m->count--;
	m->bytes -= e->bytes;
	stored_response_unref(e->resp);
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

/* Remove the expired records of one chain. Returns the records looked at. */
static size_t sweep_chain(struct mem_store *m, struct mem_entry **pp, uint64_t now)
{
	size_t seen = 0;

	while (*pp != NULL) {
		seen++;
		if (expired(*pp, now))
			remove_entry(m, pp);
		else
			pp = &(*pp)->next;
	}
	return seen;
}

/*
 * Remove expired records from the slots after the cursor, stopping after
 * `buckets` buckets, or after the chain in which `records` records were
 * looked at, or after one turn of the table.
 */
static void sweep_some(struct mem_store *m, size_t buckets, size_t records,
		       uint64_t now)
{
	size_t n = m->t[0].n, nb = 0, nr = 0;

	for (size_t i = 0; i < n && nb < buckets && nr < records; i++) {
		size_t pos = m->sweep_pos;

		nr += sweep_chain(m, &m->t[0].b[pos], now);
		nb++;
		if (doubling(m)) {
			nr += sweep_chain(m, &m->t[1].b[pos], now);
			nr += sweep_chain(m, &m->t[1].b[pos + n], now);
			nb += 2;
		}
		m->sweep_pos = (pos + 1) & (n - 1);
	}
	m->op_buckets += nb;
	m->op_records += nr;
}

/* Every operation on the table starts with its share of the doubling... */
static void op_begin(struct mem_store *m)
{
	m->op_buckets = 0;
	m->op_records = 0;
	move_some(m, STORE_MEMORY_MOVE_BUCKETS);
}

/* ... and ends by keeping count of the work it did. */
static void op_end(struct mem_store *m)
{
	if (m->op_buckets > m->op_buckets_max)
		m->op_buckets_max = m->op_buckets;
	if (m->op_records > m->op_records_max)
		m->op_records_max = m->op_records;
}

/* ---- operations ------------------------------------------------------ */

static void deliver_cb(evutil_socket_t fd, short what, void *arg)
{
	struct mem_op *o = arg;
	struct mem_store *m = (struct mem_store *)o->op.store;

	if (o->watch) {
		/* woken by a settling thread, or the lease ran out first */
		pthread_mutex_lock(&m->mu);
		if (o->watching != NULL) {
			struct mem_entry *e = o->watching;
			uint64_t now = m->clock();

			if (!e->completed && e->lease_until > now &&
			    !expired(e, now)) {
				/* the timer came early by the store's clock
				 * (libevent measures from the time it cached at
				 * the top of its loop): wait out the rest, so
				 * that the watcher's claim finds the lease over */
				struct timeval tv = clock_tv(e->lease_until - now);

				event_add(o->ev, &tv);
				pthread_mutex_unlock(&m->mu);
				return;
			}
		}
		unwatch(o);	/* the timeout may come before the mailbox */
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

/* Record the outcome of in-flight e, whose lease ran out, as unknown: it
 * lives ttl from now, keeps its owner (who may still complete it), and
 * its waiters wake to replay it. Under mu. 0, or -1 out of memory. */
static int make_unknown(struct mem_store *m, struct mem_entry *e,
			const struct store_claim *c, uint64_t now)
{
	struct stored_response *r = stored_response_unknown(NULL, NULL);
	size_t size;

	if (r == NULL)
		return -1;
	size = r->head_len + r->body_len + sizeof(*r);
	e->completed = true;
	e->resp = r;
	e->bytes += size;
	m->bytes += size;
	e->lease_until = 0;
	e->expires_at = now + c->ttl_ms;
	wake_waiters(e);
	return 0;
}

static struct store_op *mem_claim(struct store *s, struct event_base *base,
				  const struct store_claim *c, store_cb cb, void *arg)
{
	struct mem_store *m = (struct mem_store *)s;
	struct mem_op *o = op_new(m, base, cb, arg);
	char id[STORE_ID_MAX];
	size_t len = store_key_id(&c->key, id);
	uint64_t h = id_hash(m, id, len);
	struct mem_entry **pp, *e = NULL;
	enum store_status st;
	uint64_t now;

	if (o == NULL)
		return NULL;
	o->key = c->key;
	pthread_mutex_lock(&m->mu);
	op_begin(m);
	now = m->clock();
	pp = find(m, id, len, h);
	if (pp != NULL && expired(*pp, now)) {
		remove_entry(m, pp);
		pp = NULL;
	}
	if (pp == NULL) {
		size_t need = sizeof(*e) + len + 1;

		if (m->bytes + need > m->max_bytes)
			sweep_some(m, STORE_MEMORY_SWEEP_BUCKETS,
				   STORE_MEMORY_SWEEP_RECORDS, now);
		if (m->bytes + need > m->max_bytes ||
		    store_new_owner(o->res.owner) < 0 ||
		    (e = calloc(1, need)) == NULL) {
			st = STORE_FULL;
			metrics_store_error(STORE_KIND_MEMORY);
			goto out;
		}
		memcpy(e->id, id, len + 1);
		e->hash = h;
		e->id_len = len;
		memcpy(e->fp, c->fp, FP_LEN);
		memcpy(e->owner, o->res.owner, sizeof(e->owner));
		e->lease_until = now + c->lease_ms;
		e->created_at = now;
		e->expires_at = now + inflight_ttl(c);
		e->bytes = need;
		TAILQ_INIT(&e->waiters);
		insert(m, e);
		st = STORE_WON;
		goto out;
	}
	e = *pp;
	if (memcmp(e->fp, c->fp, FP_LEN) != 0) {
		st = STORE_MISMATCH;	/* before the in-flight state */
	} else if (e->completed) {
		o->res.resp = stored_response_ref(e->resp);
		st = e->resp->unknown ? STORE_UNKNOWN : STORE_COMPLETED;
		if (st == STORE_UNKNOWN)
			memcpy(o->res.owner, e->owner, sizeof(e->owner));
	} else if (e->lease_until <= now && !c->takeover) {
		/* the owner is gone, stuck or cut off: the request may have
		 * executed, and is never executed again */
		st = make_unknown(m, e, c, now) == 0 ? STORE_UNKNOWN : STORE_ERROR;
		if (st == STORE_UNKNOWN) {
			o->res.resp = stored_response_ref(e->resp);
			memcpy(o->res.owner, e->owner, sizeof(e->owner));
			o->res.lapsed = true;
		}
	} else if (e->lease_until <= now) {
		/* the owner is gone or stuck: take over */
		if (store_new_owner(o->res.owner) < 0) {
			st = STORE_ERROR;
			goto out;
		}
		memcpy(e->owner, o->res.owner, sizeof(e->owner));
		e->lease_until = now + c->lease_ms;
		e->created_at = now;
		e->expires_at = now + inflight_ttl(c);
		o->took_over = true;
		st = STORE_WON;
	} else {
		st = STORE_IN_FLIGHT;
	}
out:
	op_end(m);
	pthread_mutex_unlock(&m->mu);
	return op_post(o, st);
}

/* Find the record k owned by owner: in flight, or (unknown_too) of
 * unknown outcome. Under mu. */
static struct mem_entry **find_owned(struct mem_store *m, const struct store_key *k,
				     const char *owner, bool unknown_too)
{
	char id[STORE_ID_MAX];
	size_t len = store_key_id(k, id);
	struct mem_entry **pp = find(m, id, len, id_hash(m, id, len));

	if (pp == NULL || strcmp((*pp)->owner, owner) != 0)
		return NULL;
	if ((*pp)->completed && !(unknown_too && (*pp)->resp->unknown))
		return NULL;
	return pp;
}

/* e's unknown outcome goes: its placeholder response is dropped. */
static void drop_unknown(struct mem_store *m, struct mem_entry *e)
{
	size_t size = e->resp->head_len + e->resp->body_len + sizeof(*e->resp);

	e->bytes -= size;
	m->bytes -= size;
	stored_response_unref(e->resp);
	e->resp = NULL;
	e->completed = false;
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
	op_begin(m);
	pp = find_owned(m, k, owner, true);
	if (pp == NULL)
		goto out;
	if ((*pp)->completed)
		drop_unknown(m, *pp);	/* replaced by what is known now */
	size = resp->head_len + resp->body_len + sizeof(*resp);
	if (m->bytes + size > m->max_bytes) {
		uint64_t now = m->clock();

		if (expired(*pp, now)) {
			/* at the bound, sweeping removes the expired record
			 * before anything else: it is no longer ours */
			remove_entry(m, pp);
			goto out;
		}
		sweep_some(m, STORE_MEMORY_SWEEP_BUCKETS,
			   STORE_MEMORY_SWEEP_RECORDS, now);
		pp = find_owned(m, k, owner, false);	/* a neighbour may have gone */
		if (pp == NULL)
			goto out;
	}
	e = *pp;
	if (m->bytes + size > m->max_bytes && resp->body_stored) {
		/* keep the record, drop the body: a duplicate then gets 409
		 * response-not-stored */
		struct stored_response *slim = stored_response_new(
			resp->status, "", 0, "", 0, false);

		if (slim != NULL) {
			slim->unknown = resp->unknown;
			resp = slim;
		}
		size = sizeof(*resp);
	} else {
		stored_response_ref(resp);
	}
	e->completed = true;
	e->resp = resp;
	e->bytes += size;
	m->bytes += size;
	e->lease_until = 0;
	e->expires_at = m->clock() + ttl_ms;
	wake_waiters(e);
	st = STORE_OK;
out:
	op_end(m);
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
	op_begin(m);
	pp = find_owned(m, k, owner, true);
	if (pp != NULL) {
		remove_entry(m, pp);
		st = STORE_OK;
	}
	op_end(m);
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
	op_begin(m);
	pp = find_owned(m, k, owner, false);
	if (pp != NULL) {
		struct mem_entry *e = *pp;

		e->lease_until = m->clock() + lease_ms;
		/* never expire under a live owner */
		if (e->expires_at < e->lease_until)
			e->expires_at = e->lease_until;
		st = STORE_OK;
	}
	op_end(m);
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
	struct mem_entry **pp, *e;
	struct timeval tv;
	uint64_t now;

	if (o == NULL)
		return NULL;
	o->watch = true;
	pthread_mutex_lock(&m->mu);
	op_begin(m);
	now = m->clock();
	pp = find(m, id, len, id_hash(m, id, len));
	e = pp != NULL ? *pp : NULL;
	if (e == NULL || e->completed || e->lease_until <= now ||
	    expired(e, now)) {
		op_end(m);
		pthread_mutex_unlock(&m->mu);
		return op_post(o, STORE_SETTLED);
	}
	tv = clock_tv(e->lease_until - now);
	for (o->local = m->locals; o->local != NULL; o->local = o->local->next)
		if (o->local->base == base)
			break;
	o->watching = e;
	TAILQ_INSERT_TAIL(&e->waiters, o, wlink);
	event_add(o->ev, &tv);
	op_end(m);
	pthread_mutex_unlock(&m->mu);
	return &o->op;
}

/* The live record k, or NULL. Under mu. */
static struct mem_entry **find_live(struct mem_store *m, const struct store_key *k,
				    uint64_t now)
{
	char id[STORE_ID_MAX];
	size_t len = store_key_id(k, id);
	struct mem_entry **pp = find(m, id, len, id_hash(m, id, len));

	return pp != NULL && !expired(*pp, now) ? pp : NULL;
}

/* What an operator sees of e. Under mu. */
static void describe(const struct mem_entry *e, uint64_t now,
		     struct store_record *rec)
{
	rec->found = STORE_IN_MEMORY;
	rec->completed = e->completed;
	rec->unknown = e->completed && e->resp->unknown;
	memcpy(rec->fp, e->fp, FP_LEN);
	rec->created_ms = store_unix_ms(e->created_at, now);
	rec->expires_ms = store_unix_ms(e->expires_at, now);
	if (e->completed) {
		rec->status = e->resp->status;
		rec->head_len = e->resp->head_len;
		rec->body_len = e->resp->body_len;
		rec->body_stored = e->resp->body_stored;
	} else {
		memcpy(rec->owner, e->owner, sizeof(rec->owner));
		rec->lease_until_ms = store_unix_ms(e->lease_until, now);
	}
}

static struct store_op *mem_inspect(struct store *s, struct event_base *base,
				    const struct store_key *k, bool body,
				    store_cb cb, void *arg)
{
	struct mem_store *m = (struct mem_store *)s;
	struct mem_op *o = op_new(m, base, cb, arg);
	struct mem_entry **pp;
	enum store_status st = STORE_ABSENT;
	uint64_t now;

	if (o == NULL)
		return NULL;
	pthread_mutex_lock(&m->mu);
	op_begin(m);
	now = m->clock();
	pp = find_live(m, k, now);
	if (pp != NULL) {
		describe(*pp, now, &o->res.rec);
		if (body && (*pp)->completed)
			o->res.resp = stored_response_ref((*pp)->resp);
		st = STORE_OK;
	}
	op_end(m);
	pthread_mutex_unlock(&m->mu);
	return op_post(o, st);
}

/* Remove k whatever its state: its owner finds its record gone (FENCED),
 * its waiters wake and claim again. */
static struct store_op *mem_purge(struct store *s, struct event_base *base,
				  const struct store_key *k, store_cb cb, void *arg)
{
	struct mem_store *m = (struct mem_store *)s;
	struct mem_op *o = op_new(m, base, cb, arg);
	struct mem_entry **pp;
	enum store_status st = STORE_ABSENT;
	uint64_t now;

	if (o == NULL)
		return NULL;
	pthread_mutex_lock(&m->mu);
	op_begin(m);
	now = m->clock();
	pp = find_live(m, k, now);
	if (pp != NULL) {
		describe(*pp, now, &o->res.rec);
		o->res.ttl_left_ms = (*pp)->expires_at - now;
		remove_entry(m, pp);
		st = STORE_OK;
	}
	op_end(m);
	pthread_mutex_unlock(&m->mu);
	return op_post(o, st);
}

static void mem_cancel(struct store_op *op)
{
	struct mem_op *o = (struct mem_op *)op;
	struct mem_store *m = (struct mem_store *)op->store;

	/* o->watch first: a watch's status is written by the thread that
	 * wakes it, under mu; any other op's only by this loop */
	if (!o->watch && o->res.status == STORE_WON) {
		/* a win nobody will execute: give the key back at once instead
		 * of leaving it in flight for a whole lease. A record taken
		 * over was another request's, which may have executed: it
		 * stays, its fingerprint bound until it expires, and only its
		 * lease ends now (a retry takes over, another body gets 422) */
		struct mem_entry **pp;

		pthread_mutex_lock(&m->mu);
		pp = find_owned(m, &o->key, o->res.owner, false);
		if (pp != NULL && o->took_over) {
			(*pp)->lease_until = m->clock();
			wake_waiters(*pp);
		} else if (pp != NULL) {
			remove_entry(m, pp);
		}
		pthread_mutex_unlock(&m->mu);
	}
	if (o->watch) {
		/* under the lock, so that no thread is waking it meanwhile */
		pthread_mutex_lock(&m->mu);
		unwatch(o);
		pthread_mutex_unlock(&m->mu);
	}
	/* removes a pending activation too (made by its own loop, or by
	 * another thread on a base with a lock) */
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
	/* a bounded batch per call keeps the lock short; the batch also
	 * finishes a doubling that operations alone would leave pending */
	move_some(m, SWEEP_BATCH);
	sweep_some(m, SWEEP_BATCH, SWEEP_BATCH, m->clock());
	pthread_mutex_unlock(&m->mu);
}

/* ---- the loops' mailboxes --------------------------------------------- */

/* Waiters woken by other threads: activate them here, on their loop. */
static void local_cb(evutil_socket_t fd, short what, void *arg)
{
	struct mem_local *l = arg;
	struct mem_op *o;
	eventfd_t n;

	if (eventfd_read(l->efd, &n) < 0 && errno != EAGAIN)
		log_error("memory store: reading a wake-up: %s", strerror(errno));
	pthread_mutex_lock(&l->m->mu);
	while ((o = TAILQ_FIRST(&l->woken)) != NULL) {
		TAILQ_REMOVE(&l->woken, o, wlink);
		o->woken = false;
		event_active(o->ev, EV_TIMEOUT, 1);
	}
	l->signalled = false;
	pthread_mutex_unlock(&l->m->mu);
}

static void local_free(struct mem_local *l)
{
	if (l->ev != NULL)
		event_free(l->ev);
	if (l->efd >= 0)
		close(l->efd);
	free(l);
}

static int mem_thread_init(struct store *s, struct event_base *base)
{
	struct mem_store *m = (struct mem_store *)s;
	struct mem_local *l = calloc(1, sizeof(*l));

	if (l == NULL) {
		log_error("memory store: out of memory for a loop's mailbox");
		return -1;
	}
	l->m = m;
	l->base = base;
	TAILQ_INIT(&l->woken);
	l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (l->efd >= 0)
		l->ev = event_new(base, l->efd, EV_READ | EV_PERSIST, local_cb, l);
	if (l->efd < 0 || l->ev == NULL || event_add(l->ev, NULL) < 0) {
		log_error("memory store: cannot set up a loop's mailbox: %s",
			  l->efd < 0 ? strerror(errno) : "out of memory");
		local_free(l);
		return -1;
	}
	pthread_mutex_lock(&m->mu);
	l->next = m->locals;
	m->locals = l;
	pthread_mutex_unlock(&m->mu);
	return 0;
}

/* After every watch of the loop is delivered or cancelled. */
static void mem_thread_done(struct store *s, struct event_base *base)
{
	struct mem_store *m = (struct mem_store *)s;
	struct mem_local **pp, *l = NULL;

	pthread_mutex_lock(&m->mu);
	for (pp = &m->locals; *pp != NULL; pp = &(*pp)->next) {
		if ((*pp)->base == base) {
			l = *pp;
			*pp = l->next;
			break;
		}
	}
	pthread_mutex_unlock(&m->mu);
	if (l != NULL)
		local_free(l);
}

static void mem_free(struct store *s)
{
	struct mem_store *m = (struct mem_store *)s;

	for (int t = 0; t < 2; t++) {
		for (size_t i = 0; i < m->t[t].n; i++)
			while (m->t[t].b[i] != NULL)
				remove_entry(m, &m->t[t].b[i]);
		free(m->t[t].b);
	}
	while (m->locals != NULL) {	/* thread_done not called: bases alive */
		struct mem_local *l = m->locals;

		m->locals = l->next;
		local_free(l);
	}
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
	.inspect = mem_inspect,
	.purge = mem_purge,
	.cancel = mem_cancel,
	.ready = mem_ready,
	.sweep = mem_sweep,
	.thread_init = mem_thread_init,
	.thread_done = mem_thread_done,
	.free = mem_free,
};

struct store *store_memory_new(size_t max_bytes, store_clock_fn clock)
{
	struct mem_store *m = calloc(1, sizeof(*m));

	if (m == NULL)
		return NULL;
	m->base.ops = &mem_ops;
	m->t[0].n = NBUCKETS_MIN;
	m->t[0].b = calloc(m->t[0].n, sizeof(*m->t[0].b));
	if (m->t[0].b == NULL ||
	    RAND_bytes(m->hash_key, sizeof(m->hash_key)) != 1) {
		free(m->t[0].b);
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

static size_t table_longest_chain(const struct mem_table *t)
{
	size_t longest = 0;

	for (size_t i = 0; i < t->n; i++) {
		size_t len = 0;

		for (const struct mem_entry *e = t->b[i]; e != NULL; e = e->next)
			len++;
		if (len > longest)
			longest = len;
	}
	return longest;
}

void store_memory_stats(struct store *s, struct store_memory_stats *st)
{
	struct mem_store *m = (struct mem_store *)s;

	pthread_mutex_lock(&m->mu);
	st->count = m->count;
	st->doubling = doubling(m);
	st->nbuckets = m->t[st->doubling ? 1 : 0].n;
	st->op_buckets_max = m->op_buckets_max;
	st->op_records_max = m->op_records_max;
	m->op_buckets_max = 0;
	m->op_records_max = 0;
	pthread_mutex_unlock(&m->mu);
}

size_t store_memory_longest_chain(struct store *s)
{
	struct mem_store *m = (struct mem_store *)s;
	size_t l0, l1;

	pthread_mutex_lock(&m->mu);
	l0 = table_longest_chain(&m->t[0]);
	l1 = table_longest_chain(&m->t[1]);
	pthread_mutex_unlock(&m->mu);
	return l0 > l1 ? l0 : l1;
}
