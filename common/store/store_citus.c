/*
 * store_citus.c - the PostgreSQL store over a Citus cluster (see
 * store_citus.h).
 *
 *   slots[0]      the coordinator's store (store_pg_new): the schema, the
 *                 partitions, and every key while the table is not
 *                 distributed or the map is not known yet
 *   slots[1..]    one store per worker group the map names (its primary
 *                 and secondaries, as a list of hosts)
 *                 (store_pg_new_worker); made by the map, never removed
 *   map           the coordinator's last answer (store_citus_map.h),
 *                 asked again every CITUS_MAP_EVERY_MS by a thread of its
 *                 own; a failed question keeps the last one
 *
 * An operation hashes its key as Citus does (citus_hash.h), finds its
 * shard's slot and is handed to that slot's store: the handle returned is
 * that store's own (cancelled there, its callback the caller's), so a
 * claim, its completion and its waiters all run on the worker that holds
 * the key, each batch of a loop on one worker in one local transaction.
 * A slot's store serves a loop from the loop's start when known by then,
 * else from the first operation routed to it there.
 *
 * Notifications fire on the node that holds the row: every slot the map
 * names listens, and a cache is told we listen only while each of them
 * has a listener up (slot_heard).
 */
#include "store_citus.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "citus_hash.h"
#include "log.h"
#include "store_pg.h"

#define CITUS_SLOTS 64
#define CITUS_MAP_EVERY_MS 2000		/* a distributed table's map */
#define CITUS_FLAT_EVERY_MS 10000	/* Citus, the table not distributed */

struct citus_store;

struct citus_slot {
	struct citus_store *cs;
	char nodes[CITUS_NODES_LEN + 1];	/* "host:port,..." of its
					 * group; "": the coordinator */
	struct store *st;
	atomic_int listening;		/* its listeners up, every loop */
	bool mapped;			/* the map sends keys here (notify_mu) */
	bool was_ready;			/* the map thread's, for the log */
};

/* What one loop has set up. */
struct citus_local {
	struct event_base *base;
	uint64_t inited;		/* bit i: slots[i] serves this loop */
	struct citus_local *next;
};

struct citus_store {
	struct store base;
	char *conninfo;
	int conns_per_thread;
	uint64_t ttl_ms;
	/* written by one thread at a time (the opener, then the map
	 * thread), published by nslots: a slot below it never changes */
	struct citus_slot slots[CITUS_SLOTS];
	atomic_int nslots;
	pthread_mutex_t mu;		/* map, locals */
	struct citus_map *map;
	struct citus_local *locals;
	pthread_mutex_t notify_mu;	/* slots' mapped, heard */
	bool heard;			/* the cache was told we listen */
	store_pg_notify_fn notify_fn;
	void *notify_arg;
	pthread_t thread;
	bool thread_started;
	int stop[2];			/* the map thread's wake-up */
};

static const struct store_ops citus_ops;

/* ---- slots --------------------------------------------------------------- */

/* Tell the cache when "every slot the map uses has a listener" changes;
 * under notify_mu. */
static void notify_settle(struct citus_store *cs)
{
	int n = atomic_load(&cs->nslots), mapped = 0;
	bool all = true;

	for (int i = 0; i < n; i++) {
		if (!cs->slots[i].mapped)
			continue;
		mapped++;
		if (atomic_load(&cs->slots[i].listening) == 0)
			all = false;
	}
	all = all && mapped > 0;
	if (cs->notify_fn == NULL || all == cs->heard)
		return;
	cs->heard = all;
	cs->notify_fn(cs->notify_arg, all ? STORE_PG_LISTEN_UP :
		      STORE_PG_LISTEN_DOWN, NULL);
}

/* What a slot's listeners heard (store_pg_notify_fn). */
static void slot_heard(void *arg, enum store_pg_event ev, const char *payload)
{
	struct citus_slot *sl = arg;
	struct citus_store *cs = sl->cs;

	switch (ev) {
	case STORE_PG_NOTIFY:
	case STORE_PG_SHARED:
		cs->notify_fn(cs->notify_arg, ev, payload);
		return;
	case STORE_PG_LISTEN_UP:
	case STORE_PG_LISTEN_DOWN:
		atomic_fetch_add(&sl->listening, ev == STORE_PG_LISTEN_UP ? 1 : -1);
		pthread_mutex_lock(&cs->notify_mu);
		notify_settle(cs);
		pthread_mutex_unlock(&cs->notify_mu);
		return;
	}
}

/* The slot of the group at nodes, made when new; 0 (the coordinator,
 * where claims are refused rather than misplaced) when the slots are used
 * up or its store cannot be made. The opener's or the map thread's. */
static int slot_for(struct citus_store *cs, const char *nodes)
{
	int n = atomic_load(&cs->nslots);
	struct citus_slot *sl;
	char err[256], *ci;

	for (int i = 1; i < n; i++)
		if (strcmp(cs->slots[i].nodes, nodes) == 0)
			return i;
	if (n == CITUS_SLOTS) {
		log_error("citus store: more than %d workers; keys on %s are "
			  "refused", CITUS_SLOTS - 1, nodes);
		return 0;
	}
	ci = citus_worker_conninfo(cs->conninfo, nodes, err, sizeof(err));
	if (ci == NULL) {
		log_error("citus store: the worker %s: %s", nodes, err);
		return 0;
	}
	sl = &cs->slots[n];
	sl->st = store_pg_new_worker(ci, cs->conns_per_thread, cs->ttl_ms);
	free(ci);
	if (sl->st == NULL) {
		log_error("citus store: no store for the worker %s", nodes);
		return 0;
	}
	sl->cs = cs;
	snprintf(sl->nodes, sizeof(sl->nodes), "%s", nodes);
	if (cs->notify_fn != NULL)
		store_pg_on_notify(sl->st, slot_heard, sl);
	atomic_store(&cs->nslots, n + 1);
	log_info("citus store: worker %s", nodes);
	return n;
}

/* The loop's record; under mu. */
static struct citus_local *local_for(struct citus_store *cs,
				     struct event_base *base)
{
	struct citus_local *l;

	for (l = cs->locals; l != NULL; l = l->next)
		if (l->base == base)
			return l;
	return NULL;
}

/* slots[i]'s store, serving base from now on. */
static struct store *slot_store(struct citus_store *cs, struct citus_local *l,
				int i)
{
	struct store *st = cs->slots[i].st;

	if (l != NULL && !(l->inited & (1ull << i))) {
		l->inited |= 1ull << i;		/* thread_done undoes even a
						 * failed start */
		if (store_thread_init(st, l->base) < 0)
			log_error("citus store: the worker %s cannot serve "
				  "this loop", cs->slots[i].nodes);
	}
	return st;
}

/* The store for key on base. */
static struct store *route(struct citus_store *cs, struct event_base *base,
			   const char *key)
{
	int32_t h = citus_hash_text(key, strlen(key));
	struct citus_local *l;
	int slot = 0;

	pthread_mutex_lock(&cs->mu);
	if (cs->map != NULL && cs->map->distributed) {
		const struct citus_shard *sh = citus_map_find(cs->map, h);

		if (sh != NULL)
			slot = sh->slot;
	}
	l = local_for(cs, base);
	pthread_mutex_unlock(&cs->mu);
	return slot_store(cs, l, slot);
}

/* ---- the map ------------------------------------------------------------- */

static bool same_map(const struct citus_map *a, const struct citus_map *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	if (a->citus != b->citus || a->distributed != b->distributed ||
	    a->n != b->n)
		return false;
	for (int i = 0; i < a->n; i++)
		if (a->shards[i].lo != b->shards[i].lo ||
		    strcmp(a->shards[i].nodes, b->shards[i].nodes) != 0)
			return false;
	return true;
}

/* Route by m from now on (taken). The opener's or the map thread's. */
static void install(struct citus_store *cs, struct citus_map *m)
{
	struct citus_map *old;
	bool changed;
	int n;

	if (m->citus)
		store_pg_no_row_sweep(cs->slots[0].st);
	for (int i = 0; i < m->n; i++)
		m->shards[i].slot = slot_for(cs, m->shards[i].nodes);
	pthread_mutex_lock(&cs->mu);
	old = cs->map;
	changed = !same_map(old, m);
	cs->map = m;
	pthread_mutex_unlock(&cs->mu);
	citus_map_unref(old);
	n = atomic_load(&cs->nslots);
	pthread_mutex_lock(&cs->notify_mu);
	for (int i = 0; i < n; i++) {
		bool used = !m->distributed && i == 0;

		for (int s = 0; s < m->n && !used; s++)
			used = m->shards[s].slot == i;
		cs->slots[i].mapped = used;
	}
	notify_settle(cs);
	pthread_mutex_unlock(&cs->notify_mu);
	if (!changed)
		return;
	if (m->distributed)
		log_info("citus store: idempotency_keys is distributed: %d "
			 "shards, statements straight to their workers", m->n);
	else if (m->citus)
		log_info("citus store: idempotency_keys is not distributed "
			 "(idemproxy migrate --distributed): all on the "
			 "coordinator");
}

/* Log each mapped worker that stopped or started answering. */
static void log_health(struct citus_store *cs)
{
	int n = atomic_load(&cs->nslots);

	for (int i = 1; i < n; i++) {
		struct citus_slot *sl = &cs->slots[i];
		bool ready = store_ready(sl->st), mapped;

		pthread_mutex_lock(&cs->notify_mu);
		mapped = sl->mapped;
		pthread_mutex_unlock(&cs->notify_mu);
		if (!mapped || ready == sl->was_ready)
			continue;
		sl->was_ready = ready;
		if (ready)
			log_info("citus store: worker %s is up", sl->nodes);
		else
			log_warn("citus store: worker %s is down: its keys get "
				 "503 until it is back, the others are served",
				 sl->nodes);
	}
}

static void *map_main(void *arg)
{
	struct citus_store *cs = arg;
	bool failing = false;
	PGconn *pg = NULL;		/* to the coordinator, kept */

	for (;;) {
		struct pollfd p = { .fd = cs->stop[0], .events = POLLIN };
		int every = CITUS_MAP_EVERY_MS, r;
		struct citus_map *m;
		char err[512];

		pthread_mutex_lock(&cs->mu);
		if (cs->map != NULL && !cs->map->distributed)
			every = CITUS_FLAT_EVERY_MS;
		pthread_mutex_unlock(&cs->mu);
		r = poll(&p, 1, every);

		if (r > 0 || (r < 0 && errno != EINTR))
			break;		/* citus_free */
		m = citus_map_fetch_on(&pg, cs->conninfo, cs->stop[0], err,
				       sizeof(err));
		if (m == NULL) {
			if (!failing)
				log_warn("citus store: cannot ask the coordinator "
					 "where the shards are (%s); routing by "
					 "the last answer", err);
			failing = true;
		} else {
			if (failing)
				log_info("citus store: the coordinator answers "
					 "again");
			failing = false;
			install(cs, m);
			if (!m->citus) {
				log_info("citus store: no Citus in this "
					 "database: one node, for good");
				break;
			}
		}
		log_health(cs);
	}
	PQfinish(pg);
	return NULL;
}

/* ---- operations ---------------------------------------------------------- */

static struct store_op *citus_claim(struct store *s, struct event_base *base,
				    const struct store_claim *c, store_cb cb,
				    void *arg)
{
	return store_claim(route((struct citus_store *)s, base, c->key.key),
			   base, c, cb, arg);
}

static struct store_op *citus_complete(struct store *s, struct event_base *base,
				       const struct store_key *k,
				       const char *owner, const uint8_t fp[FP_LEN],
				       struct stored_response *resp,
				       uint64_t ttl_ms, store_cb cb, void *arg)
{
	return store_complete(route((struct citus_store *)s, base, k->key), base,
			      k, owner, fp, resp, ttl_ms, cb, arg);
}

static struct store_op *citus_release(struct store *s, struct event_base *base,
				      const struct store_key *k,
				      const char *owner, store_cb cb, void *arg)
{
	return store_release(route((struct citus_store *)s, base, k->key), base,
			     k, owner, cb, arg);
}

static struct store_op *citus_extend(struct store *s, struct event_base *base,
				     const struct store_key *k, const char *owner,
				     uint64_t lease_ms, store_cb cb, void *arg)
{
	return store_extend(route((struct citus_store *)s, base, k->key), base,
			    k, owner, lease_ms, cb, arg);
}

static struct store_op *citus_watch(struct store *s, struct event_base *base,
				    const struct store_key *k, store_cb cb,
				    void *arg)
{
	return store_watch(route((struct citus_store *)s, base, k->key), base,
			   k, cb, arg);
}

static struct store_op *citus_inspect(struct store *s, struct event_base *base,
				      const struct store_key *k, bool body,
				      store_cb cb, void *arg)
{
	return store_inspect(route((struct citus_store *)s, base, k->key), base,
			     k, body, cb, arg);
}

static struct store_op *citus_purge(struct store *s, struct event_base *base,
				    const struct store_key *k, store_cb cb,
				    void *arg)
{
	return store_purge(route((struct citus_store *)s, base, k->key), base,
			   k, cb, arg);
}

/* Handles are the slots' stores' own (op->store): never ours. */
static void citus_cancel(struct store_op *op)
{
	(void)op;
}

/* Ready while some node that holds keys answers: a worker down costs its
 * keys, not every key (map_main logs which). */
static bool citus_ready(struct store *s)
{
	struct citus_store *cs = (struct citus_store *)s;
	int n = atomic_load(&cs->nslots);
	bool distributed, any = false;

	pthread_mutex_lock(&cs->mu);
	distributed = cs->map != NULL && cs->map->distributed;
	pthread_mutex_unlock(&cs->mu);
	if (!distributed)
		return store_ready(cs->slots[0].st);
	for (int i = 1; i < n && !any; i++) {
		bool mapped;

		pthread_mutex_lock(&cs->notify_mu);
		mapped = cs->slots[i].mapped;
		pthread_mutex_unlock(&cs->notify_mu);
		any = mapped && store_ready(cs->slots[i].st);
	}
	return any;
}

/* The workers the map uses that answer no statement connection:
 * "workers down: H:P[,H:P...] ...". */
static size_t citus_degraded(struct store *s, char *buf, size_t len)
{
	struct citus_store *cs = (struct citus_store *)s;
	int n = atomic_load(&cs->nslots);
	size_t at = 0;

	if (len == 0)
		return 0;
	buf[0] = '\0';
	for (int i = 1; i < n; i++) {
		bool mapped;
		int w;

		pthread_mutex_lock(&cs->notify_mu);
		mapped = cs->slots[i].mapped;
		pthread_mutex_unlock(&cs->notify_mu);
		if (!mapped || store_ready(cs->slots[i].st))
			continue;
		w = snprintf(buf + at, len - at, "%s%s", at == 0 ?
			     "workers down: " : " ", cs->slots[i].nodes);
		if (w < 0 || (size_t)w >= len - at)
			return len - 1;
		at += (size_t)w;
	}
	return at;
}

/* The coordinator keeps the partitions; every worker the map names
 * serves the main loop, so that each has a listener for the cache. */
static void citus_sweep(struct store *s, struct event_base *base)
{
	struct citus_store *cs = (struct citus_store *)s;
	int n = atomic_load(&cs->nslots);
	struct citus_local *l;

	pthread_mutex_lock(&cs->mu);
	l = local_for(cs, base);
	pthread_mutex_unlock(&cs->mu);
	for (int i = 1; i < n; i++)
		(void)slot_store(cs, l, i);
	store_sweep(cs->slots[0].st, base);
}

static int citus_thread_init(struct store *s, struct event_base *base)
{
	struct citus_store *cs = (struct citus_store *)s;
	struct citus_local *l = calloc(1, sizeof(*l));
	int n = atomic_load(&cs->nslots);

	if (l == NULL) {
		log_error("citus store: out of memory for a loop");
		return -1;
	}
	l->base = base;
	l->inited = 1;
	if (store_thread_init(cs->slots[0].st, base) < 0) {
		l->inited = 0;
		free(l);
		return -1;
	}
	pthread_mutex_lock(&cs->mu);
	l->next = cs->locals;
	cs->locals = l;
	if (!cs->thread_started && (cs->map == NULL || cs->map->citus)) {
		/* once every store's notify hook is set (store_citus_on_notify
		 * comes before any loop) */
		cs->thread_started = pthread_create(&cs->thread, NULL, map_main,
						    cs) == 0;
		if (!cs->thread_started)
			log_error("citus store: no thread to follow the "
				  "cluster: routing by the map at start");
	}
	pthread_mutex_unlock(&cs->mu);
	for (int i = 1; i < n; i++)
		(void)slot_store(cs, l, i);
	return 0;
}

static void citus_thread_done(struct store *s, struct event_base *base)
{
	struct citus_store *cs = (struct citus_store *)s;
	struct citus_local **pp, *l = NULL;
	int n = atomic_load(&cs->nslots);

	pthread_mutex_lock(&cs->mu);
	for (pp = &cs->locals; *pp != NULL; pp = &(*pp)->next) {
		if ((*pp)->base == base) {
			l = *pp;
			*pp = l->next;
			break;
		}
	}
	pthread_mutex_unlock(&cs->mu);
	if (l == NULL)
		return;
	for (int i = 0; i < n; i++)
		if (l->inited & (1ull << i))
			store_thread_done(cs->slots[i].st, base);
	free(l);
}

static void citus_free(struct store *s)
{
	struct citus_store *cs = (struct citus_store *)s;
	int n = atomic_load(&cs->nslots);

	if (cs->thread_started) {
		ssize_t w = write(cs->stop[1], "x", 1);

		(void)w;
		pthread_join(cs->thread, NULL);
	}
	while (cs->locals != NULL) {
		struct citus_local *l = cs->locals;

		cs->locals = l->next;
		free(l);
	}
	for (int i = 0; i < n; i++)
		store_free(cs->slots[i].st);
	citus_map_unref(cs->map);
	close(cs->stop[0]);
	close(cs->stop[1]);
	pthread_mutex_destroy(&cs->mu);
	pthread_mutex_destroy(&cs->notify_mu);
	free(cs->conninfo);
	free(cs);
}

static const struct store_ops citus_ops = {
	.name = "citus",
	.claim = citus_claim,
	.complete = citus_complete,
	.release = citus_release,
	.extend = citus_extend,
	.watch = citus_watch,
	.inspect = citus_inspect,
	.purge = citus_purge,
	.cancel = citus_cancel,
	.ready = citus_ready,
	.degraded = citus_degraded,
	.sweep = citus_sweep,
	.thread_init = citus_thread_init,
	.thread_done = citus_thread_done,
	.free = citus_free,
};

void store_citus_on_notify(struct store *s, store_pg_notify_fn fn, void *arg)
{
	struct citus_store *cs = (struct citus_store *)s;
	int n = atomic_load(&cs->nslots);

	cs->notify_fn = fn;
	cs->notify_arg = arg;
	for (int i = 0; i < n; i++)
		store_pg_on_notify(cs->slots[i].st, slot_heard, &cs->slots[i]);
}

bool store_is_citus(const struct store *s)
{
	return s != NULL && s->ops == &citus_ops;
}

struct store *store_citus_new(const char *conninfo, int conns_per_thread,
			      uint64_t ttl_ms, struct citus_map *map)
{
	struct citus_store *cs = calloc(1, sizeof(*cs));

	if (cs == NULL || pipe2(cs->stop, O_CLOEXEC | O_NONBLOCK) < 0) {
		log_error("citus store: %s", strerror(errno));
		free(cs);
		citus_map_unref(map);
		return NULL;
	}
	cs->base.ops = &citus_ops;
	cs->conns_per_thread = conns_per_thread;
	cs->ttl_ms = ttl_ms;
	pthread_mutex_init(&cs->mu, NULL);
	pthread_mutex_init(&cs->notify_mu, NULL);
	cs->conninfo = strdup(conninfo);
	cs->slots[0].cs = cs;
	cs->slots[0].mapped = true;	/* until a map says otherwise */
	cs->slots[0].st = store_pg_new(conninfo, conns_per_thread, ttl_ms);
	if (cs->conninfo == NULL || cs->slots[0].st == NULL) {
		citus_map_unref(map);
		citus_free(&cs->base);
		return NULL;
	}
	atomic_store(&cs->nslots, 1);
	if (map != NULL)
		install(cs, map);
	else
		log_warn("citus store: the coordinator cannot be asked where "
			 "the shards are yet; everything goes to it until it "
			 "answers");
	return &cs->base;
}
