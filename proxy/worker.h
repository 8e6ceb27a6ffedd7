/*
 * worker.h - one event loop on one thread: its listener, its client
 * connections and its upstream pool. Workers share nothing but the config
 * (by reference), the metrics and the idempotency store.
 */
#ifndef IDEMPROXY_WORKER_H
#define IDEMPROXY_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/queue.h>

#include <event2/util.h>

#include "addrs.h"
#include "compiler.h"
#include "idem.h"
#include "loop.h"
#include "store.h"
#include "upstream.h"

struct config;
struct conn;
struct tls_listener;
struct worker;

/* Called on the worker's own thread when its loop has ended. */
typedef void (*worker_done_fn)(struct worker *w, void *arg);

struct worker {
	int id;
	pthread_t thread;
	/* bound and listening, made by main: one per address of --listen,
	 * each with its read event; the worker closes them */
	evutil_socket_t listen_fds[ADDRS_MAX];
	struct event *listeners[ADDRS_MAX];
	int nlisten;
	struct conn_loop loop;		/* what its connections borrow:
					 * base, cfg, pool, store, lists */
	int nconns;
	bool listener_paused;		/* at max_connections */
	bool draining;

	int notify_fd;			/* main thread -> worker: an eventfd */
	struct event *notify;		/* notify_fd readable */
	struct event *drain_timer;
	struct event *accept_retry;
	_Atomic(struct config *) next_cfg;	/* set by main on SIGHUP */
	atomic_bool stop;			/* set by main on SIGTERM */
	atomic_bool exited;		/* set by its thread: loop ended by
					 * loopexit (drained) */
	worker_done_fn done_fn;
	void *done_arg;
};

/* Set up the loop; the nfds listening sockets in fds are the worker's from
 * now on (it closes them, also when this fails).
 * tls (NULL: plain HTTP) and store are shared and outlive the worker. */
int worker_init(struct worker *w, int id, struct config *cfg,
		const evutil_socket_t *fds, int nfds,
		const struct upstream_target *t,
		struct store *store, struct tls_listener *tls) MUSTCHECK;
int worker_start(struct worker *w) MUSTCHECK;
/* Thread-safe: hand a new config to the worker (takes a reference). */
void worker_post_config(struct worker *w, struct config *cfg);
/* Thread-safe: start draining; the thread ends when drained or timed out. */
void worker_post_stop(struct worker *w);
/* Thread-safe: has the loop ended as asked (drained or timed out)? False
 * while it runs, and when it ended any other way. */
bool worker_exited(struct worker *w);
void worker_join(struct worker *w);
void worker_free(struct worker *w);

/* Set by main before starting workers, to be woken when a loop ends. */
void worker_on_done(struct worker *w, worker_done_fn fn, void *arg);

#endif
