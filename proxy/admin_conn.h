/*
 * admin_conn.h - the admin listener's connections: how many, whose, and
 * how long.
 *
 * libevent 2.1's HTTP server has neither a connection cap nor a deadline
 * for a whole request. This module makes each accepted connection's
 * bufferevent itself (evhttp_set_bevcb) and keeps a reference to it, and
 * gives each connection one of two rooms:
 *
 *   - ANY: at most ADMIN_MAX_CONNS connections, and at most
 *     ADMIN_MAX_PER_ADDR of them from one client address, may ask any
 *     endpoint and stay open between requests;
 *   - PROBE: a connection past either cap gets one of ADMIN_RESERVE more
 *     places, where it may ask what orchestrators and scrapers poll
 *     (admin.c decides which paths), is closed after its answer and must
 *     send its request within ADMIN_PROBE_MS. When the reserve is full, a
 *     newcomer takes the place of one whose request is not being
 *     answered, from the address that holds the most connections (the
 *     oldest that has sent nothing, else the oldest), unless the
 *     newcomer's own address holds more; then it is closed.
 *
 * So the listener never stops accepting for want of room: whatever one
 * client holds, a probe that connects and asks at once is answered. Only
 * descriptors bound the rest: at ADMIN_MAX_OPEN (closing ones included)
 * the listeners pause until the closed ones are gone, a few milliseconds.
 * Besides:
 *
 *   - a request must arrive whole within ADMIN_REQUEST_MS of the
 *     connection opening or of its previous answer going out, or the
 *     connection is shut down: a head trickled a byte at a time within
 *     the idle timeout cannot hold a place;
 *   - a connection reads at most ADMIN_READ_AHEAD bytes ahead of evhttp.
 */
#ifndef IDEMPROXY_ADMIN_CONN_H
#define IDEMPROXY_ADMIN_CONN_H

#include <event2/event.h>
#include <event2/http.h>

#define ADMIN_MAX_CONNS 128
#define ADMIN_MAX_PER_ADDR 32
#define ADMIN_RESERVE 16
#define ADMIN_MAX_OPEN (2 * (ADMIN_MAX_CONNS + ADMIN_RESERVE))
#define ADMIN_REQUEST_MS 10000
#define ADMIN_PROBE_MS 2000
#define ADMIN_READ_AHEAD (64 * 1024)

/* What a connection may ask. */
enum admin_room {
	ADMIN_ROOM_ANY,		/* any endpoint; kept alive */
	ADMIN_ROOM_PROBE,	/* the reserve: a probe path, then closed */
};

struct admin_conns;

/* Count and time the connections of http (bound afterwards, with
 * admin_conns_listen for each bound socket). */
struct admin_conns *admin_conns_new(struct event_base *base,
				    struct evhttp *http);
void admin_conns_listen(struct admin_conns *ac, struct evhttp_bound_socket *b);

/* A whole request arrived on req's connection: its deadline is off until
 * the answer goes out. Says what the connection may ask; a connection of
 * the reserve moves to ANY when both caps have room for it again. */
enum admin_room admin_conns_request_read(struct admin_conns *ac,
					 struct evhttp_request *req);

/* After evhttp_free, which has let go of every connection. */
void admin_conns_free(struct admin_conns *ac);

#endif
