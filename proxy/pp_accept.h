/*
 * pp_accept.h - the PROXY protocol header at the start of a connection
 * from a load balancer (--proxy-protocol), read before the connection is
 * one (pp_accept.c).
 */
#ifndef IDEMPROXY_PP_ACCEPT_H
#define IDEMPROXY_PP_ACCEPT_H

#include <stdbool.h>
#include <sys/socket.h>

#include <event2/util.h>

struct conn_loop;

/* The header was read: fd goes on from the byte after it, peer is the
 * client it names (the socket's own peer for a LOCAL header). */
typedef void (*pp_accept_done)(void *arg, evutil_socket_t fd,
			       const struct sockaddr *peer, socklen_t len);

/* Must a connection from peer start with a PROXY header? */
bool pp_accept_expected(const struct conn_loop *l, const struct sockaddr *peer);

/* Read the header of fd (accepted from peer) within --client-timeout;
 * then done(), or a log line and the socket closed. */
void pp_accept_start(struct conn_loop *l, evutil_socket_t fd,
		     const struct sockaddr *peer, socklen_t len,
		     pp_accept_done done, void *arg);

/* Close every connection whose header is still due (drain, exit). */
void pp_accept_close_all(struct conn_loop *l);

/* Do the first bytes of a connection from a source not allowed to send a
 * header look like one? (conn.c closes it.) */
bool pp_accept_looks_like_header(const char *buf, size_t len);

#endif
