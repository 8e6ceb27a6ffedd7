/*
 * conn_tls.h - the TLS side of a client connection (conn_tls.c).
 */
#ifndef IDEMPROXY_CONN_TLS_H
#define IDEMPROXY_CONN_TLS_H

struct conn;

/* A connection on a TLS listener. Accept: the bufferevent that runs the
 * handshake (c->bev, c->ssl, c->tls_pump; -1 on failure, what was made is
 * left for conn_new to free). Then the handshake's end, either way, from
 * event_cb; and, whenever reading may go on, a look for bytes OpenSSL
 * holds (no-op on a plain connection). */
int conn_tls_accept(struct conn *c, int fd);
void conn_tls_established(struct conn *c);
void conn_tls_failed(struct conn *c, short what);
void conn_tls_pump_later(struct conn *c);

#endif
