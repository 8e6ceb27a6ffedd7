/*
 * admin_conn.c - the admin listener's connections: two rooms, a deadline.
 *
 * evhttp tells no one when it frees a connection. So each connection's
 * bufferevent is made here with a second reference, which keeps it (and
 * its socket) alive after evhttp's bufferevent_free. That free clears the
 * bufferevent's callbacks, which evhttp otherwise always has set: a reaper
 * timer, running while any connection is open, drops our reference to
 * those and so closes them, at most ADMIN_REAP_MS after evhttp let go, or
 * ADMIN_REAP_SOON_MS after this module shut one. (A filter bufferevent
 * would announce its free, but evhttp then shuts the socket before the
 * filter's output has reached it.)
 *
 * evhttp makes the bufferevent before it sets its socket, so a connection
 * is sorted into its room (admin_conn.h) a moment later: when the next one
 * is accepted, when a request arrives, or on the same turn of the loop,
 * whichever comes first - always before evhttp has read from it.
 *
 *   accepted ─▶ NEW ─sort─▶ ANY ◀─────────┐ at a request, once both
 *                  │                      │ caps have room again
 *                  └──────▶ PROBE ────────┘
 *   refused, evicted, deadline: ─▶ GONE (holds no place) ─▶ reaped
 */
#include "admin_conn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event_struct.h>
#include <event2/listener.h>

#include "clock.h"
#include "log.h"

#define ADMIN_MAX_LISTENERS 8
#define ADMIN_REAP_MS 200
#define ADMIN_REAP_SOON_MS 5		/* evhttp lets go on the next turn */
#define ADMIN_WARN_MS 10000		/* one warning about the caps per 10 s */

enum aconn_state {
	ACONN_NEW,			/* accepted; its socket not looked at */
	ACONN_ANY,			/* a place under both caps */
	ACONN_PROBE,			/* a place of the reserve */
	ACONN_GONE,			/* shut by us: no place; reaped soon */
};

/* A client address, host part only (an IPv4-mapped IPv6 one as IPv4). */
struct aconn_addr {
	int family;			/* AF_INET, AF_INET6; AF_UNSPEC: unknown */
	unsigned char host[16];
};

struct aconn {
	struct admin_conns *owner;
	struct bufferevent *bev;	/* ours and, until it frees it, evhttp's */
	struct evbuffer_cb_entry *out_cb;
	struct event deadline;		/* the request must be read by then */
	enum aconn_state state;
	bool busy;			/* a request read, its answer not yet out */
	struct aconn_addr addr;
	struct aconn *prev, *next;	/* oldest first */
};

struct admin_conns {
	struct evconnlistener *lev[ADMIN_MAX_LISTENERS];
	int nlev;
	int open;			/* connections not yet reaped */
	int any, probe;			/* places taken in each room */
	bool paused;			/* listeners disabled at ADMIN_MAX_OPEN */
	bool reap_soon;			/* the reaper is due in REAP_SOON_MS */
	uint64_t warned_ms;
	struct event reaper;
	struct event sort;		/* sorts the connection accepted last */
	struct aconn *conns, *last;
};

/* At most one warning about the caps per ADMIN_WARN_MS. */
static bool warn_due(struct admin_conns *ac)
{
	uint64_t now = clock_ms();

	if (ac->warned_ms != 0 && now - ac->warned_ms < ADMIN_WARN_MS)
		return false;
	ac->warned_ms = now;
	return true;
}

static void set_accepting(struct admin_conns *ac, bool on)
{
	if (ac->paused == !on)
		return;
	ac->paused = !on;
	for (int i = 0; i < ac->nlev; i++) {
		if (on)
			evconnlistener_enable(ac->lev[i]);
		else
			evconnlistener_disable(ac->lev[i]);
	}
	if (!on && warn_due(ac))
		log_warn("admin listener: %d connections open or closing, not "
			 "accepting more until some are gone", ac->open);
}

static void arm(struct aconn *c)
{
	struct timeval tv = clock_tv(c->state == ACONN_PROBE ? ADMIN_PROBE_MS :
				     ADMIN_REQUEST_MS);

	evtimer_add(&c->deadline, &tv);
}

static void reap_soon(struct admin_conns *ac)
{
	struct timeval tv = clock_tv(ADMIN_REAP_SOON_MS);

	if (ac->reap_soon)
		return;
	ac->reap_soon = true;
	evtimer_add(&ac->reaper, &tv);
}

/* Give up c's place and shut its socket: evhttp reads its end and frees
 * the connection, and the reaper closes it. */
static void shut(struct aconn *c)
{
	struct admin_conns *ac = c->owner;
	evutil_socket_t s = bufferevent_getfd(c->bev);

	if (c->state == ACONN_ANY)
		ac->any--;
	else if (c->state == ACONN_PROBE)
		ac->probe--;
	c->state = ACONN_GONE;
	event_del(&c->deadline);
	if (s >= 0)
		shutdown(s, SHUT_RDWR);
	reap_soon(ac);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	struct aconn *c = arg;

	(void)fd;
	(void)what;
	log_debug("admin listener: no whole request in %d ms; closing",
		  c->state == ACONN_PROBE ? ADMIN_PROBE_MS : ADMIN_REQUEST_MS);
	shut(c);
}

/* An answer going out gives the connection's next request (or the rest
 * of this answer's write) a new deadline. */
static void output_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info,
		      void *arg)
{
	struct aconn *c = arg;

	(void)buf;
	if (info->n_added == 0)
		return;
	c->busy = false;
	if (c->state != ACONN_GONE)
		arm(c);
}

static void reap(struct aconn *c)
{
	struct admin_conns *ac = c->owner;

	if (c->state == ACONN_ANY)
		ac->any--;
	else if (c->state == ACONN_PROBE)
		ac->probe--;
	evbuffer_remove_cb_entry(bufferevent_get_output(c->bev), c->out_cb);
	event_del(&c->deadline);
	bufferevent_decref(c->bev);	/* the last reference: closes */
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		ac->conns = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	else
		ac->last = c->prev;
	free(c);
	ac->open--;
}

static bool freed_by_evhttp(const struct aconn *c)
{
	bufferevent_data_cb r, w;
	bufferevent_event_cb e;
	void *arg;

	bufferevent_getcb(c->bev, &r, &w, &e, &arg);
	return r == NULL && w == NULL && e == NULL;
}

/* Drop our reference to the connections evhttp has let go of. Returns
 * how many of those shut here it still holds. */
static int reap_freed(struct admin_conns *ac)
{
	struct aconn *next;
	int gone = 0;

	for (struct aconn *c = ac->conns; c != NULL; c = next) {
		next = c->next;
		if (freed_by_evhttp(c))
			reap(c);
		else if (c->state == ACONN_GONE)
			gone++;
	}
	if (ac->open < ADMIN_MAX_OPEN)
		set_accepting(ac, true);
	return gone;
}

static void reaper_cb(evutil_socket_t fd, short what, void *arg)
{
	struct admin_conns *ac = arg;
	struct timeval every = clock_tv(ADMIN_REAP_MS);

	(void)fd;
	(void)what;
	ac->reap_soon = false;
	if (reap_freed(ac) > 0)
		reap_soon(ac);
	else if (ac->open > 0)
		evtimer_add(&ac->reaper, &every);
}

static void peer_of(struct aconn *c)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	evutil_socket_t fd = bufferevent_getfd(c->bev);

	c->addr.family = AF_UNSPEC;
	if (fd < 0 || getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
		return;
	if (ss.ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;

		c->addr.family = AF_INET;
		memcpy(c->addr.host, &in->sin_addr, 4);
	} else if (ss.ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 =
			(const struct sockaddr_in6 *)&ss;

		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
			c->addr.family = AF_INET;
			memcpy(c->addr.host, &in6->sin6_addr.s6_addr[12], 4);
		} else {
			c->addr.family = AF_INET6;
			memcpy(c->addr.host, &in6->sin6_addr, 16);
		}
	}
}

static bool same_addr(const struct aconn_addr *a, const struct aconn_addr *b)
{
	return a->family == b->family &&
	       memcmp(a->host, b->host, sizeof(a->host)) == 0;
}

/* The places connections from addr hold: in ANY only, or in both rooms. */
static int held_by(const struct admin_conns *ac, const struct aconn_addr *addr,
		   bool any_only)
{
	int n = 0;

	for (const struct aconn *c = ac->conns; c != NULL; c = c->next) {
		if ((c->state == ACONN_ANY ||
		     (c->state == ACONN_PROBE && !any_only)) &&
		    same_addr(&c->addr, addr))
			n++;
	}
	return n;
}

/* Whether c has sent anything: bytes evhttp has read but not yet as a
 * whole request, or bytes still in the socket (a probe whose request has
 * arrived but was not read on this turn of the loop). */
static bool has_sent(const struct aconn *c)
{
	evutil_socket_t fd = bufferevent_getfd(c->bev);
	int pending = 0;

	if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
		return true;
	return fd >= 0 && ioctl(fd, FIONREAD, &pending) == 0 && pending > 0;
}

/*
 * The place of the reserve that newcomer may take when it is full: one
 * not being answered, of the address that holds the most places - the
 * oldest that has sent nothing, else the oldest - if that address holds
 * at least as many as the newcomer's (a client that holds more may not
 * push out another's probe). NULL: none. Preferring the silent ones keeps
 * a probe whose request has arrived from being pushed out by a burst of
 * connections accepted on the same turn.
 */
static struct aconn *pick_victim(const struct admin_conns *ac,
				 const struct aconn *newcomer)
{
	struct aconn *best = NULL;
	int best_n = -1;
	bool best_silent = false;

	for (struct aconn *c = ac->conns; c != NULL; c = c->next) {
		bool silent;
		int n;

		if (c->state != ACONN_PROBE || c->busy)
			continue;
		n = held_by(ac, &c->addr, false);
		if (n < best_n)
			continue;
		silent = !has_sent(c);
		if (n > best_n || (silent && !best_silent)) {
			best = c;
			best_n = n;
			best_silent = silent;
		}
	}
	return best_n >= held_by(ac, &newcomer->addr, false) ? best : NULL;
}

static void warn_full(struct admin_conns *ac, const struct aconn *c, int mine)
{
	char host[INET6_ADDRSTRLEN] = "an unknown address";

	if (!warn_due(ac))
		return;
	if (c->addr.family != AF_UNSPEC)
		inet_ntop(c->addr.family, c->addr.host, host, sizeof(host));
	log_warn("admin listener: %d connections (at most %d), %d of them from "
		 "%s (at most %d from one address): newer ones are answered "
		 "for probes only", ac->any, ADMIN_MAX_CONNS, mine, host,
		 ADMIN_MAX_PER_ADDR);
}

static void sort_one(struct aconn *c)
{
	struct admin_conns *ac = c->owner;
	struct aconn *victim;
	int mine;

	peer_of(c);
	mine = held_by(ac, &c->addr, true);
	if (ac->any < ADMIN_MAX_CONNS && mine < ADMIN_MAX_PER_ADDR) {
		c->state = ACONN_ANY;
		ac->any++;
		return;
	}
	warn_full(ac, c, mine);
	if (ac->probe >= ADMIN_RESERVE) {
		victim = pick_victim(ac, c);
		if (victim == NULL) {
			log_debug("admin listener: the reserve is full; closing a "
				  "new connection");
			shut(c);
			return;
		}
		shut(victim);
	}
	c->state = ACONN_PROBE;
	ac->probe++;
	arm(c);
}

/* Sort the connections accepted since the last sort (at the end of the
 * list): evhttp has given each its socket by now. Those evhttp has let
 * go of are reaped first, so that the places are counted right. */
static void sort_new(struct admin_conns *ac)
{
	struct aconn *c;

	if (ac->last == NULL || ac->last->state != ACONN_NEW)
		return;
	reap_freed(ac);
	c = ac->last;
	while (c != NULL && c->prev != NULL && c->prev->state == ACONN_NEW)
		c = c->prev;
	for (; c != NULL; c = c->next) {
		if (c->state == ACONN_NEW)
			sort_one(c);
	}
}

static void sort_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	sort_new(arg);
}

static struct bufferevent *conn_new(struct event_base *base, void *arg)
{
	struct admin_conns *ac = arg;
	struct aconn *c;
	struct timeval every = clock_tv(ADMIN_REAP_MS);

	sort_new(ac);
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;	/* evhttp makes a plain one: served, uncounted */
	c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (c->bev == NULL) {
		free(c);
		return NULL;
	}
	c->out_cb = evbuffer_add_cb(bufferevent_get_output(c->bev), output_cb,
				    c);
	if (c->out_cb == NULL) {
		bufferevent_free(c->bev);
		free(c);
		return NULL;
	}
	bufferevent_incref(c->bev);
	bufferevent_setwatermark(c->bev, EV_READ, 0, ADMIN_READ_AHEAD);
	c->owner = ac;
	c->state = ACONN_NEW;
	evtimer_assign(&c->deadline, base, deadline_cb, c);
	arm(c);
	c->prev = ac->last;
	if (ac->last != NULL)
		ac->last->next = c;
	else
		ac->conns = c;
	ac->last = c;
	ac->open++;
	if (!evtimer_pending(&ac->reaper, NULL))
		evtimer_add(&ac->reaper, &every);
	if (ac->open >= ADMIN_MAX_OPEN)
		set_accepting(ac, false);
	event_active(&ac->sort, EV_TIMEOUT, 1);
	return c->bev;
}

struct admin_conns *admin_conns_new(struct event_base *base,
				    struct evhttp *http)
{
	struct admin_conns *ac = calloc(1, sizeof(*ac));

	if (ac == NULL)
		return NULL;
	evtimer_assign(&ac->reaper, base, reaper_cb, ac);
	event_assign(&ac->sort, base, -1, 0, sort_cb, ac);
	evhttp_set_bevcb(http, conn_new, ac);
	return ac;
}

void admin_conns_listen(struct admin_conns *ac, struct evhttp_bound_socket *b)
{
	if (ac->nlev < ADMIN_MAX_LISTENERS)
		ac->lev[ac->nlev++] = evhttp_bound_socket_get_listener(b);
}

enum admin_room admin_conns_request_read(struct admin_conns *ac,
					 struct evhttp_request *req)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct bufferevent *bev;
	struct aconn *c;

	if (evcon == NULL)
		return ADMIN_ROOM_ANY;
	sort_new(ac);
	bev = evhttp_connection_get_bufferevent(evcon);
	for (c = ac->conns; c != NULL && c->bev != bev; c = c->next)
		;
	if (c == NULL)
		return ADMIN_ROOM_ANY;	/* made by evhttp: uncounted */
	event_del(&c->deadline);
	c->busy = true;
	if (c->state == ACONN_PROBE)
		reap_freed(ac);		/* counted right, before a move */
	if (c->state == ACONN_PROBE && ac->any < ADMIN_MAX_CONNS &&
	    held_by(ac, &c->addr, true) < ADMIN_MAX_PER_ADDR) {
		ac->probe--;
		ac->any++;
		c->state = ACONN_ANY;
	}
	return c->state == ACONN_ANY ? ADMIN_ROOM_ANY : ADMIN_ROOM_PROBE;
}

void admin_conns_free(struct admin_conns *ac)
{
	if (ac == NULL)
		return;
	while (ac->conns != NULL)
		reap(ac->conns);
	event_del(&ac->reaper);
	event_del(&ac->sort);
	free(ac);
}
