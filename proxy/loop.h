/*
 * loop.h - what a worker's event loop lends the client connections on it:
 * the loop, its current config, the upstream pool, the store, the TLS
 * listener, the engine's environment, and the two lists a connection is
 * on. The worker owns and sets up all of it (worker.c); a connection
 * (conn.c) borrows it through c->loop and never sees the worker.
 */
#ifndef IDEMPROXY_LOOP_H
#define IDEMPROXY_LOOP_H

#include <sys/queue.h>

#include <event2/event.h>

#include "idem.h"

struct config;
struct conn;
struct pp_wait;
struct store;
struct tls_listener;
struct upstream_pool;

TAILQ_HEAD(conn_list, conn);
TAILQ_HEAD(pp_wait_list, pp_wait);

struct conn_loop {
	struct event_base *base;
	struct config *cfg;		/* this loop's current config (a ref) */
	struct upstream_pool *pool;
	struct store *store;		/* shared by all workers */
	struct tls_listener *tls;	/* shared; NULL: the listener is plain */
	struct idem_env idem;		/* what the engine borrows */
	struct conn_list conns;		/* every open client connection */
	struct conn_list reap;		/* closed, to be freed next turn */
	struct pp_wait_list pp_waits;	/* accepted, their PROXY header due
					 * (pp_accept.c) */
	struct event *reap_ev;		/* frees l->reap (worker.c) */
};

/* Free the connections on l->reap on the next loop turn. */
static inline void conn_loop_reap_later(struct conn_loop *l)
{
	event_active(l->reap_ev, EV_TIMEOUT, 1);
}

#endif
