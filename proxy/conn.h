/*
 * conn.h - one client connection and its state machine (see conn.c).
 */
#ifndef IDEMPROXY_CONN_H
#define IDEMPROXY_CONN_H

#include <sys/socket.h>

#include <event2/util.h>

struct conn_loop;
struct conn;

/* Take over an accepted socket. Returns NULL (socket closed) on failure. */
struct conn *conn_new(struct conn_loop *l, evutil_socket_t fd,
		      const struct sockaddr *peer, socklen_t peerlen);
/* SIGTERM: close if idle, else finish the current exchange and close. */
void conn_drain(struct conn *c);
/* Drain timeout: close now, whatever the state. */
void conn_abort(struct conn *c);
/* Free a connection that was closed: it is on the worker's reap list. */
void conn_free(struct conn *c);
/* The next connection on the same worker list (conns or reap). */
struct conn *conn_next(struct conn *c);

#endif
