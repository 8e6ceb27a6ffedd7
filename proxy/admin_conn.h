/*
 * admin_conn.h - the admin listener's connections: how many, and how long.
 *
 * libevent 2.1's HTTP server has neither a connection cap nor a deadline
 * for a whole request. This module makes each accepted connection's
 * bufferevent itself (evhttp_set_bevcb) and keeps a reference to it:
 *
 *   - at ADMIN_MAX_CONNS open connections the listeners stop accepting
 *     (further connections wait in the kernel's backlog, as with haproxy's
 *     maxconn) and resume when one is gone;
 *   - a request must arrive whole within ADMIN_REQUEST_MS of the
 *     connection opening or of its previous answer going out, or the
 *     connection is shut down: a head trickled a byte at a time within
 *     the idle timeout cannot hold a slot;
 *   - a connection reads at most ADMIN_READ_AHEAD bytes ahead of evhttp.
 */
#ifndef IDEMPROXY_ADMIN_CONN_H
#define IDEMPROXY_ADMIN_CONN_H

#include <event2/event.h>
#include <event2/http.h>

#define ADMIN_MAX_CONNS 128
#define ADMIN_REQUEST_MS 10000
#define ADMIN_READ_AHEAD (64 * 1024)

struct admin_conns;

/* Count and time the connections of http (bound afterwards, with
 * admin_conns_listen for each bound socket). */
struct admin_conns *admin_conns_new(struct event_base *base,
				    struct evhttp *http);
void admin_conns_listen(struct admin_conns *ac, struct evhttp_bound_socket *b);

/* A whole request arrived on req's connection: its deadline is off until
 * the answer goes out. */
void admin_conns_request_read(struct admin_conns *ac,
			      struct evhttp_request *req);

/* After evhttp_free, which has let go of every connection. */
void admin_conns_free(struct admin_conns *ac);

#endif
