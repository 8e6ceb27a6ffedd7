/*
 * main.c - start-up, signals and shutdown.
 *
 * The main thread parses the configuration, opens every listening socket
 * (so that a port in use is reported before anything runs), starts one
 * worker thread per --workers, then runs its own loop for the admin
 * listener and the signals: SIGTERM/SIGINT drain the workers and exit 0,
 * SIGHUP reloads the config file.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>
#include <event2/util.h>

#include "accesslog.h"
#include "addrs.h"
#include "admin.h"
#include "admin_keys.h"
#include "clock.h"
#include "config.h"
#include "hostport.h"
#include "keys.h"
#include "log.h"
#include "otel_export.h"
#include "store.h"
#include "store_cache.h"
#include "store_citus.h"
#include "store_memory.h"
#include "store_pg.h"
#include "units.h"
#include "store_redis.h"
#include "tls.h"
#include "upstream.h"
#include "worker.h"

#define LISTEN_BACKLOG 1024
/* PostgreSQL connections per worker loop (plus one for LISTEN). */

extern char **environ;

struct daemon {
	struct config *cfg;
	struct event_base *base;
	struct admin *admin;
	struct store *store;
	struct tls_listener *tls;	/* NULL: the listener speaks plain HTTP */
	struct tls_upstream *up_tls;	/* NULL: the upstream is http:// */
	struct event *sweep;
	struct worker *workers;
	int nworkers;
	int started;
	int done;		/* workers whose loop has ended */
	struct event *sig_term, *sig_int, *sig_hup, *sig_usr1;
	struct event *worker_done;
	bool stopping;
};

/*
 * SO_REUSEPORT would let us share a port with another process (a second
 * idemproxy started by mistake) and silently split its traffic. A probe
 * bound without it fails when anyone holds the port. Our own workers'
 * sockets are not bound yet when the first one probes.
 */
static bool port_free(const struct sockaddr *sa, socklen_t len)
{
	int fd, one = 1;
	bool ok;

	fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return true;	/* let the real bind report */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	ok = bind(fd, sa, len) == 0;
	close(fd);
	return ok;
}

static void set_port(struct sockaddr_storage *ss, const char *port)
{
	uint16_t p = htons((uint16_t)atoi(port));

	if (ss->ss_family == AF_INET6)
		((struct sockaddr_in6 *)ss)->sin6_port = p;
	else
		((struct sockaddr_in *)ss)->sin_port = p;
}

/* An address this host cannot have: IPv6 disabled, ::1 not on lo. */
static bool unavailable(int e)
{
	return e == EADDRNOTAVAIL || e == EAFNOSUPPORT;
}

/* One listening socket on ss (port already set); -1 with errno. */
static evutil_socket_t listen_on(const struct sockaddr_storage *ss,
				 socklen_t sslen, bool v6only)
{
	evutil_socket_t fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1, e;

	if (fd < 0)
		return -1;
	/* [::] alone takes IPv4 too; beside 0.0.0.0 it must not */
	if ((v6only && ss->ss_family == AF_INET6 &&
	     setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) < 0) ||
	    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0 ||
	    bind(fd, (const struct sockaddr *)ss, sslen) < 0 ||
	    listen(fd, LISTEN_BACKLOG) < 0 ||
	    evutil_make_socket_nonblocking(fd) < 0) {
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/*
 * Open a listening socket on every address of --listen (a name such as
 * "localhost" may have ::1 and 127.0.0.1, and clients use either) into
 * fds. With *port "0" the kernel picks for the first address, and *port is
 * rewritten so that the others, and the other workers, share it. probe:
 * check first that nobody else holds the port (the first worker). An
 * address this host cannot have (IPv6 off) is skipped with a warning
 * while another one binds. Returns the number of sockets, or -1 with err
 * set (none left open).
 */
static int open_listeners(const struct addrs *a, char *port, size_t portlen,
			  bool probe, evutil_socket_t *fds, char *err,
			  size_t errlen)
{
	char where[ADDRS_STRLEN];
	int n = 0, skipped = 0;

	for (int i = 0; i < a->n; i++) {
		struct sockaddr_storage ss = a->ss[i];
		socklen_t sslen = a->len[i];
		evutil_socket_t fd;

		set_port(&ss, port);
		addrs_str((struct sockaddr *)&ss, sslen, where, sizeof(where));
		if (probe && strcmp(port, "0") != 0 &&
		    !port_free((struct sockaddr *)&ss, sslen)) {
			errno = EADDRINUSE;
			goto fail;
		}
		fd = listen_on(&ss, sslen, a->n > 1);
		if (fd < 0 && unavailable(errno) && a->n > 1) {
			if (probe)
				log_warn("--listen %s: %s; not listening there",
					 where, strerror(errno));
			skipped++;
			continue;
		}
		if (fd < 0)
			goto fail;
		fds[n++] = fd;
		sslen = sizeof(ss);
		if (strcmp(port, "0") == 0 &&
		    getsockname(fd, (struct sockaddr *)&ss, &sslen) == 0)
			getnameinfo((struct sockaddr *)&ss, sslen, NULL, 0, port,
				    (socklen_t)portlen, NI_NUMERICSERV);
	}
	if (n > 0)
		return n;
	errno = EADDRNOTAVAIL;
fail:
	snprintf(err, errlen, "--listen %s: %s", where, strerror(errno));
	while (n-- > 0)
		close(fds[n]);
	return -1;
}

/* Runs on a worker's thread: wake the main loop. */
static void worker_finished(struct worker *w, void *arg)
{
	struct daemon *d = arg;

	event_active(d->worker_done, EV_TIMEOUT, 1);
}

static void worker_done_cb(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;
	int done = 0;

	/* Activations from several threads may coalesce: count by asking
	 * each worker's loop whether it has ended. */
	for (int i = 0; i < d->started; i++)
		if (worker_exited(&d->workers[i]))
			done++;
	d->done = done;
	if (d->done == d->started) {
		log_info("all workers drained, exiting");
		event_base_loopexit(d->base, NULL);
	} else if (!d->stopping) {
		log_error("a worker stopped unexpectedly; shutting down");
		raise(SIGTERM);
	}
}

static void on_stop(evutil_socket_t sig, short what, void *arg)
{
	struct daemon *d = arg;

	if (d->stopping)
		return;
	d->stopping = true;
	log_info("%s: draining (at most %llums)", sig == SIGINT ? "SIGINT" : "SIGTERM",
		 (unsigned long long)d->cfg->drain_timeout_ms);
	admin_set_draining(d->admin, true);
	for (int i = 0; i < d->started; i++)
		worker_post_stop(&d->workers[i]);
}

static void reload_config(struct daemon *d);

/* SIGUSR1: logrotate moved the access log; write to a new file. */
static void on_usr1(evutil_socket_t sig, short what, void *arg)
{
	log_info("SIGUSR1: reopening the access log");
	alog_reopen();
}

static void on_hup(evutil_socket_t sig, short what, void *arg)
{
	struct daemon *d = arg;
	char err[512];

	if (d->cfg->config_file != NULL)
		reload_config(d);
	else if (d->tls == NULL && d->cfg->admin_token_file == NULL)
		log_info("SIGHUP: no config file to reload");
	if (admin_set_config(d->admin, d->cfg, err, sizeof(err)) < 0)
		log_error("SIGHUP: keeping the running admin token: %s", err);
	if (d->tls != NULL &&
	    tls_listener_reload(d->tls, d->cfg, err, sizeof(err)) < 0)
		log_error("SIGHUP: tls: keeping the running certificate: %s", err);
	else if (d->tls == NULL && d->cfg->tls_cert != NULL)
		log_warn("SIGHUP: tls_cert is set, but the listener was started "
			 "without TLS: a restart is needed");
}

/* SIGHUP with a config file: build a new config and hand it out. */
static void reload_config(struct daemon *d)
{
	char err[512];
	struct config *cfg;

	cfg = config_reload(d->cfg, err, sizeof(err));
	if (cfg == NULL) {
		log_error("SIGHUP: keeping the running config: %s", err);
		return;
	}
	/* config_reload warned about, and kept, settings that need a restart */
	log_setup(cfg->log_level, cfg->log_format);
	if (alog_open(cfg->access_log, err, sizeof(err)) < 0)
		log_error("SIGHUP: keeping the running access log: %s", err);
	for (int i = 0; i < d->started; i++)
		worker_post_config(&d->workers[i], cfg);
	config_unref(d->cfg);
	d->cfg = cfg;
	if (d->sweep != NULL) {
		struct timeval tv = clock_tv(cfg->sweep_interval_ms);

		event_add(d->sweep, &tv);	/* re-armed at the new interval */
	}
	log_info("SIGHUP: reloaded %s", cfg->config_file);
}

/* What a PostgreSQL listener heard, for the response cache. */
static void cache_heard(void *arg, enum store_pg_event ev, const char *payload)
{
	switch (ev) {
	case STORE_PG_NOTIFY:
		store_cache_notified(arg, payload);
		return;
	case STORE_PG_LISTEN_UP:
	case STORE_PG_LISTEN_DOWN:
		store_cache_listening(arg, ev == STORE_PG_LISTEN_UP);
		return;
	case STORE_PG_SHARED:
		store_cache_deaf(arg);
		return;
	}
}

/* Expired records go in small batches (--sweep-interval). */
static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;

	store_sweep(d->store, d->base);
}

/*
 * PostgreSQL, one node or a Citus cluster: asked once, here, whether
 * idempotency_keys is distributed. A database that cannot be asked yet
 * may be either: the Citus store then, which serves one node as the plain
 * store does and follows the answer when it comes (store_citus.h).
 */
static struct store *open_pg(const struct config *cfg)
{
	struct citus_map *m;
	char err[512];

	m = citus_map_fetch(cfg->store, -1, err, sizeof(err));
	if (m != NULL && !m->citus) {
		citus_map_unref(m);
		return store_pg_new(cfg->store, cfg->store_connections,
				    cfg->ttl_ms);
	}
	if (m == NULL)
		log_warn("postgres store: cannot ask the store whether it is a "
			 "Citus cluster yet: %s", err);
	return store_citus_new(cfg->store, cfg->store_connections, cfg->ttl_ms,
			       m);
}

/*
 * The store the configuration asks for: memory, or PostgreSQL with Redis
 * (--redis) and the response cache (--response-cache) in front, the cache
 * kept coherent by PostgreSQL's listeners. NULL after logging why.
 */
static struct store *open_store(const struct config *cfg)
{
	struct store *s, *pg;
	char err[512];

	if (strcmp(cfg->store, "memory") == 0)
		return store_memory_new(cfg->memory_max_bytes, NULL);
	s = pg = open_pg(cfg);
	if (s != NULL && cfg->redis != NULL) {
		/* the fast path in front of PostgreSQL; takes the inner store */
		s = cfg->redis_master != NULL ?
			store_redis_new_sentinel(s, cfg->redis_hp.host,
						 cfg->redis_master,
						 cfg->redis_db, err, sizeof(err)) :
			store_redis_new(s, cfg->redis_hp.host, cfg->redis_hp.port,
					cfg->redis_db, err, sizeof(err));
		if (s == NULL)
			log_error("--redis %s: %s", cfg->redis, err);
	}
	if (s != NULL && cfg->response_cache > 0) {
		s = store_cache_new(s, cfg->response_cache);
		if (s != NULL && store_is_citus(pg))
			store_citus_on_notify(pg, cache_heard, s);
		else if (s != NULL)
			store_pg_on_notify(pg, cache_heard, s);
	}
	return s;
}

/* Every worker, set up with its listening sockets (port: the one bound,
 * for the log). */
static int workers_init(struct daemon *d, const struct upstream_target *t,
			char *port, size_t portlen)
{
	struct config *cfg = d->cfg;
	struct addrs listen;
	char err[512];

	d->workers = calloc((size_t)cfg->workers, sizeof(*d->workers));
	if (d->workers == NULL)
		return -1;
	d->nworkers = cfg->workers;
	snprintf(port, portlen, "%s", cfg->listen_hp.port);
	if (addrs_resolve(&listen, cfg->listen_hp.host, port, 1, "--listen",
			  err, sizeof(err)) < 0) {
		log_error("%s", err);
		return -1;
	}
	for (int i = 0; i < d->nworkers; i++) {
		evutil_socket_t fds[ADDRS_MAX];
		int nfds = open_listeners(&listen, port, portlen, i == 0,
					  fds, err, sizeof(err));

		if (nfds < 0) {
			log_error("%s", err);
			return -1;
		}
		if (worker_init(&d->workers[i], i, cfg, fds, nfds, t,
				d->store, d->tls) < 0)
			return -1;
		worker_on_done(&d->workers[i], worker_finished, d);
		d->started = i + 1;	/* initialised: worker_free is due */
	}
	return 0;
}

/* The main loop's own events: signals, workers ending, the sweeper. */
static int main_events(struct daemon *d)
{
	d->worker_done = event_new(d->base, -1, 0, worker_done_cb, d);
	d->sig_term = evsignal_new(d->base, SIGTERM, on_stop, d);
	d->sig_int = evsignal_new(d->base, SIGINT, on_stop, d);
	d->sig_hup = evsignal_new(d->base, SIGHUP, on_hup, d);
	d->sig_usr1 = evsignal_new(d->base, SIGUSR1, on_usr1, d);
	d->sweep = event_new(d->base, -1, EV_PERSIST, sweep_cb, d);
	if (d->sweep != NULL) {
		struct timeval tv = clock_tv(d->cfg->sweep_interval_ms);

		event_add(d->sweep, &tv);
		/* at once too: PostgreSQL's partition maintenance starts here,
		 * on its own timer */
		store_sweep(d->store, d->base);
	}
	if (d->worker_done == NULL || d->sig_term == NULL || d->sig_int == NULL ||
	    d->sig_hup == NULL || d->sig_usr1 == NULL ||
	    evsignal_add(d->sig_term, NULL) < 0 ||
	    evsignal_add(d->sig_int, NULL) < 0 || evsignal_add(d->sig_hup, NULL) < 0 ||
	    evsignal_add(d->sig_usr1, NULL) < 0)
		return -1;
	return 0;
}

static int run(struct daemon *d)
{
	struct config *cfg = d->cfg;
	struct upstream_target target = { .host = cfg->upstream_hp.host,
					  .port = cfg->upstream_hp.port,
					  .tls = d->up_tls };
	char port[32];
	char err[512];
	char store[1024];
	int rc = 1;

	if (upstream_resolve(&target, err, sizeof(err)) < 0) {
		log_error("%s", err);
		return 1;
	}
	d->store = open_store(cfg);
	d->base = event_base_new();
	if (d->store == NULL || d->base == NULL)
		return 1;
	if (store_thread_init(d->store, d->base) < 0)	/* the sweeper's */
		goto out;
	d->admin = admin_new(d->base, cfg->admin_hp.host, cfg->admin_hp.port,
			     d->store, err, sizeof(err));
	if (d->admin == NULL ||
	    admin_set_config(d->admin, cfg, err, sizeof(err)) < 0) {
		log_error("%s", err);
		goto out;
	}
	if (workers_init(d, &target, port, sizeof(port)) < 0 ||
	    main_events(d) < 0)
		goto out;
	for (int i = 0; i < d->nworkers; i++) {
		if (worker_start(&d->workers[i]) < 0) {
			/* stop the ones already running, then report */
			d->started = i;
			on_stop(SIGTERM, 0, d);
			event_base_dispatch(d->base);
			goto out;
		}
	}
	config_redact_conninfo(cfg->store, store, sizeof(store));
	log_info("idemproxy %s listening on %s:%s%s (%d worker%s), upstream %s, "
		 "store %s, admin on %s", IDEMPROXY_VERSION, cfg->listen_hp.host,
		 port, d->tls ? " (HTTPS)" : "", d->nworkers, d->nworkers == 1 ? "" : "s", cfg->upstream,
		 store, cfg->admin_listen);
	event_base_dispatch(d->base);
	rc = 0;
out:
	if (rc != 0 && d->workers != NULL)
		for (int i = 0; i < d->started; i++)
			d->workers[i].done_fn = NULL;
	return rc;
}

static void cleanup(struct daemon *d)
{
	for (int i = 0; i < d->started; i++) {
		if (d->workers[i].thread)
			worker_join(&d->workers[i]);
		worker_free(&d->workers[i]);
	}
	free(d->workers);
	if (d->sig_term)
		event_free(d->sig_term);
	if (d->sig_int)
		event_free(d->sig_int);
	if (d->sig_hup)
		event_free(d->sig_hup);
	if (d->sig_usr1)
		event_free(d->sig_usr1);
	if (d->worker_done)
		event_free(d->worker_done);
	if (d->sweep)
		event_free(d->sweep);
	admin_free(d->admin);
	if (d->store != NULL && d->base != NULL)
		store_thread_done(d->store, d->base);
	store_free(d->store);
	if (d->base)
		event_base_free(d->base);
	tls_listener_free(d->tls);
	tls_upstream_free(d->up_tls);
	config_unref(d->cfg);
}

/* The files the config names: TLS contexts and the admin token; -1 (exit
 * 2) when a certificate, a key, a CA file or the token cannot be used. */
static int load_files(struct daemon *d)
{
	unsigned char md[32];
	char err[512];

	if (d->cfg->tls_cert != NULL) {
		d->tls = tls_listener_new(d->cfg, err, sizeof(err));
		if (d->tls == NULL)
			goto fail;
	}
	if (d->cfg->upstream_tls) {
		d->up_tls = tls_upstream_new(d->cfg, err, sizeof(err));
		if (d->up_tls == NULL)
			goto fail;
	}
	if (d->cfg->admin_token_file != NULL &&
	    admin_token_read(d->cfg->admin_token_file, md, err, sizeof(err)) < 0)
		goto fail;
	return 0;
fail:
	fprintf(stderr, "idemproxy: %s\n", err);
	return -1;
}

/*
 * idemproxy migrate --store postgres://... : create or upgrade the schema
 * (blocking: this is a one-shot command, not the daemon).
 */
static int migrate(int argc, char **argv)
{
	const char *store = getenv("IDEMPROXY_STORE");
	const char *ttl = getenv("IDEMPROXY_TTL");
	bool distributed = false;
	uint64_t ttl_ms = 24ULL * 3600 * 1000;
	char err[512];

	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--store") == 0 && i + 1 < argc)
			store = argv[++i];
		else if (strncmp(argv[i], "--store=", 8) == 0)
			store = argv[i] + 8;
		else if (strcmp(argv[i], "--ttl") == 0 && i + 1 < argc)
			ttl = argv[++i];
		else if (strncmp(argv[i], "--ttl=", 6) == 0)
			ttl = argv[i] + 6;
		else if (strcmp(argv[i], "--distributed") == 0)
			distributed = true;
		else {
			fprintf(stderr, "idemproxy migrate: unexpected argument \"%s\" "
				"(usage: idemproxy migrate --store postgres://... "
				"[--ttl DUR] [--distributed])\n", argv[i]);
			return 2;
		}
	}
	if (ttl != NULL && (units_parse_duration(ttl, &ttl_ms) < 0 ||
			    ttl_ms == 0)) {
		fprintf(stderr, "idemproxy migrate: bad --ttl \"%s\"\n", ttl);
		return 2;
	}
	if (store == NULL || (strncmp(store, "postgres://", 11) != 0 &&
			      strncmp(store, "postgresql://", 13) != 0)) {
		fprintf(stderr, "idemproxy migrate: --store must be a postgres:// URL "
			"(the memory store has no schema)\n");
		return 2;
	}
	if (distributed) {
		if (citus_migrate(store, ttl_ms, err, sizeof(err)) < 0) {
			fprintf(stderr, "idemproxy migrate: %s\n", err);
			return 1;
		}
		printf("idemproxy migrate: schema is up to date, "
		       "idempotency_keys distributed by key\n");
		return 0;
	}
	if (store_pg_migrate(store, ttl_ms, err, sizeof(err)) < 0) {
		fprintf(stderr, "idemproxy migrate: %s\n", err);
		return 1;
	}
	printf("idemproxy migrate: schema is up to date\n");
	return 0;
}

/* ---- idemproxy keys ------------------------------------------------------ */

struct keys_run {
	struct event_base *base;
	struct store_result res;
	struct stored_response *resp;	/* ours */
	bool done;
};

static void keys_done(void *arg, const struct store_result *res)
{
	struct keys_run *r = arg;

	r->res = *res;
	if (res->resp != NULL)
		r->resp = r->res.resp = stored_response_ref(res->resp);
	r->done = true;
	event_base_loopbreak(r->base);
}

static int keys_usage(const char *why)
{
	fprintf(stderr, "idemproxy keys: %s\n"
		"usage: idemproxy keys get|delete KEY [--route NAME] [--scope VALUE]\n"
		"         [--body] [--config FILE] [--store postgres://...] "
		"[--redis redis://...]\n", why);
	return 2;
}

/*
 * idemproxy keys get|delete KEY: what GET and DELETE /keys/KEY on the admin
 * listener do, straight on PostgreSQL (and Redis), for when no instance
 * runs. Exit 0: found (deleted); 1: no such key; 2: usage; 3: the store
 * could not be reached. A one-shot command: its own loop, then gone.
 */
/* `idemproxy keys get|delete KEY [options]`, as given. */
struct keys_args {
	struct keys_query q;
	const char *file, *store_url, *redis_url;
	bool purge;
};

/* 0, or the exit code of a usage error (said on stderr). */
static int keys_args_parse(int argc, char **argv, struct keys_args *a)
{
	a->store_url = getenv("IDEMPROXY_STORE");
	a->redis_url = getenv("IDEMPROXY_REDIS");
	if (argc < 4 || (strcmp(argv[2], "get") != 0 &&
			 strcmp(argv[2], "delete") != 0))
		return keys_usage("get or delete, and a key");
	a->purge = strcmp(argv[2], "delete") == 0;
	a->q.key = argv[3];
	for (int i = 4; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(argv[i], "--body") == 0) {
			a->q.body = true;
			continue;
		}
		if (v == NULL)
			return keys_usage("an option without its value");
		if (strcmp(argv[i], "--route") == 0)
			a->q.route = v;
		else if (strcmp(argv[i], "--scope") == 0)
			a->q.scope = v;
		else if (strcmp(argv[i], "--config") == 0)
			a->file = v;
		else if (strcmp(argv[i], "--store") == 0)
			a->store_url = v;
		else if (strcmp(argv[i], "--redis") == 0)
			a->redis_url = v;
		else
			return keys_usage("unknown option");
		i++;
	}
	return 0;
}

/* Ask the stores of c about k (or delete it) and print the answer: 0
 * found (deleted), 1 not, 3 the store could not be reached. */
static int keys_ask(struct config *c, const struct keys_query *q,
		    const struct store_key *k, bool purge)
{
	struct keys_run r = { 0 };
	struct store *s = NULL;
	struct store_op *op;
	int rc = 3;

	log_setup(LOG_WARN, LOG_FORMAT_TEXT);
	r.base = event_base_new();
	s = r.base != NULL ? open_store(c) : NULL;
	if (s == NULL)
		goto out;
	op = store_thread_init(s, r.base) < 0 ? NULL :
	     purge ? store_purge(s, r.base, k, keys_done, &r) :
		     store_inspect(s, r.base, k, q->body, keys_done, &r);
	while (op != NULL && !r.done)
		event_base_loop(r.base, EVLOOP_ONCE);
	if (!r.done || r.res.status == STORE_ERROR) {
		fprintf(stderr, "idemproxy keys: the store could not be reached\n");
	} else {
		keys_render(stdout, q, k, purge, &r.res);
		rc = r.res.status == STORE_OK ? 0 : 1;
	}
	stored_response_unref(r.resp);
	store_thread_done(s, r.base);
out:
	store_free(s);
	if (r.base != NULL)
		event_base_free(r.base);
	return rc;
}

static int keys_cmd(int argc, char **argv)
{
	struct keys_args a = { 0 };
	struct config *cfg = NULL, c = { 0 };
	enum config_action action;
	struct store_key k;
	char err[512];
	int rc = keys_args_parse(argc, argv, &a);

	if (rc != 0)
		return rc;
	if (a.file != NULL) {
		/* the routes and stores of a running instance's config */
		char *cargv[] = { argv[0], "--config", (char *)a.file, NULL };

		if (config_parse(3, cargv, environ, &cfg, &action, err,
				 sizeof(err)) < 0) {
			fprintf(stderr, "idemproxy keys: %s\n", err);
			return 2;
		}
		if (a.store_url == NULL || strcmp(a.store_url, "memory") == 0)
			a.store_url = cfg->store;
		if (a.redis_url == NULL)
			a.redis_url = cfg->redis;
	}
	if (a.store_url == NULL || strcmp(a.store_url, "memory") == 0)
		rc = keys_usage("--store postgres://... needed: the memory store "
				"lives inside its instance (use GET or DELETE "
				"/keys/KEY on its admin listener)");
	else if (keys_address(cfg, &a.q, &k, err, sizeof(err)) < 0)
		rc = keys_usage(err);
	c.store = (char *)a.store_url;
	c.store_connections = 1;
	if (rc == 0 && a.redis_url != NULL && a.redis_url[0] != '\0') {
		c.redis = (char *)a.redis_url;
		if (hostport_parse_redis_url(a.redis_url, &c.redis_hp,
					     &c.redis_db, &c.redis_master, err,
					     sizeof(err)) < 0)
			rc = keys_usage(err);
	}
	if (rc == 0)
		rc = keys_ask(&c, &a.q, &k, a.purge);
	hostport_clear(&c.redis_hp);
	free(c.redis_master);
	config_unref(cfg);
	return rc;
}

/* How long the exit waits for the access log and the span exporter. */
#define EXIT_FLUSH_MS 2000

/* The access log's destination and the span exporter (with the OTEL_*
 * variables); -1 (exit 2) when the log cannot be opened or the exporter
 * cannot start. */
static int open_logs(const struct config *cfg)
{
	char err[512];

	if (alog_open(cfg->access_log, err, sizeof(err)) < 0) {
		log_error("--access-log: %s", err);
		return -1;
	}
	if (cfg->otel_warning != NULL)
		log_warn("%s", cfg->otel_warning);
	if (!cfg->otel.enabled)
		return 0;
	if (otel_export_start(&cfg->otel, IDEMPROXY_VERSION, err, sizeof(err)) < 0) {
		log_error("traces: %s", err);
		return -1;
	}
	log_info("traces: spans go to %s (sampler %s)", cfg->otel.endpoint,
		 cfg->otel_opt[OTEL_OPT_SAMPLER] ? cfg->otel_opt[OTEL_OPT_SAMPLER] :
		 "as OTEL_TRACES_SAMPLER says, else parentbased_always_on");
	return 0;
}

int main(int argc, char **argv)
{
	struct daemon d = { 0 };
	enum config_action action;
	char err[512];
	int rc;

	tls_alloc_init();	/* false only costs time: nothing to report */
	if (argc > 1 && strcmp(argv[1], "migrate") == 0)
		return migrate(argc, argv);
	if (argc > 1 && strcmp(argv[1], "keys") == 0)
		return keys_cmd(argc, argv);

	if (config_parse(argc, argv, environ, &d.cfg, &action, err,
			 sizeof(err)) < 0) {
		fprintf(stderr, "idemproxy: %s\n", err);
		return 2;
	}
	if (d.cfg != NULL && d.cfg->redis != NULL &&
	    strcmp(d.cfg->store, "memory") == 0) {
		fprintf(stderr, "idemproxy: --redis: the Redis fast path needs "
			"--store postgres://... (the memory store is faster)\n");
		config_unref(d.cfg);
		return 2;
	}
	switch (action) {
	case CONFIG_HELP:
		config_usage(stdout);
		return 0;
	case CONFIG_VERSION:
		printf("idemproxy %s\n", IDEMPROXY_VERSION);
		return 0;
	case CONFIG_CHECK:
		rc = load_files(&d) < 0 ? 2 : 0;
		if (rc == 0)
			config_print(d.cfg, stdout);
		cleanup(&d);
		return rc;
	case CONFIG_RUN:
		break;
	}
	log_setup(d.cfg->log_level, d.cfg->log_format);
	if (load_files(&d) < 0 || open_logs(d.cfg) < 0) {
		cleanup(&d);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGUSR1, SIG_IGN);	/* until the loop handles it: never die
					 * of a logrotate that comes early */
	if (evthread_use_pthreads() < 0) {
		log_error("libevent: no thread support");
		config_unref(d.cfg);
		return 1;
	}
	rc = run(&d);
	cleanup(&d);
	/* what is queued goes out, within bounds: a collector or a pipe that
	 * does not take it cannot hold the exit */
	otel_export_stop(EXIT_FLUSH_MS);
	alog_close(EXIT_FLUSH_MS);
	libevent_global_shutdown();
	return rc;
}
