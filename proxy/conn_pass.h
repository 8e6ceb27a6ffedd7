/*
 * conn_pass.h - a request forwarded as it is (conn_pass.c).
 */
#ifndef IDEMPROXY_CONN_PASS_H
#define IDEMPROXY_CONN_PASS_H

struct conn;

/* Forward the request as it is (the head now, the body as it comes), and
 * move more of its body when bytes arrive or the upstream drains. */
void conn_pass_forward(struct conn *c);
void conn_pass_pump(struct conn *c);

#endif
