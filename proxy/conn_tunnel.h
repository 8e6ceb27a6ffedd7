/*
 * conn_tunnel.h - a client connection after 101 Switching Protocols: one
 * byte tunnel to the upstream (conn_tunnel.c).
 */
#ifndef IDEMPROXY_CONN_TUNNEL_H
#define IDEMPROXY_CONN_TUNNEL_H

struct bufferevent;
struct conn;

/* The 101 head is queued for the client: from here c and `up` (the
 * upstream's connection, upstream_detach) carry bytes both ways until
 * either side ends. Closes c when the tunnel cannot be set up. */
void conn_tunnel_start(struct conn *c, struct bufferevent *up);
/* The client's socket callbacks, in CONN_ST_TUNNEL. */
void conn_tunnel_client_read(struct conn *c);
void conn_tunnel_client_write(struct conn *c);
void conn_tunnel_client_event(struct conn *c, short what);
/* Drain timeout: pass the end on to both sides, then close. */
void conn_tunnel_abort(struct conn *c);
/* The connection closes: free the upstream side (drop_mode). */
void conn_tunnel_free(struct conn *c);

#endif
