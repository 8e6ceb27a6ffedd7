/*
 * conn_keyed.h - a connection's keyed requests and issued keys
 * (conn_keyed.c).
 */
#ifndef IDEMPROXY_CONN_KEYED_H
#define IDEMPROXY_CONN_KEYED_H

#include <stddef.h>

#include "body.h"

struct conn;

/* A head is complete (DECIDE); body bytes for a keyed request arrived
 * (BODY). */
void conn_keyed_decide(struct conn *c);
void conn_keyed_body(struct conn *c);
/* n bytes of a keyed chunked body (on_body); -1 with c's flags saying why
 * (BODY_TOO_LARGE, BODY_BUSY) when they cannot be taken. */
int conn_keyed_chunk(struct conn *c, const char *at, size_t len);
/* A keyed body that cannot be buffered: 503 server-busy (the budget is
 * spent), or closed (out of memory). */
void conn_keyed_refused(struct conn *c, enum body_err e);

#endif
