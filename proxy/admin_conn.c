/*
 * admin_conn.c - the admin listener's connections: a cap and a deadline.
 *
 * evhttp tells no one when it frees a connection. So each connection's
 * bufferevent is made here with a second reference, which keeps it (and
 * its socket) alive after evhttp's bufferevent_free. That free clears the
 * bufferevent's callbacks, which evhttp otherwise always has set: a reaper
 * timer, running while any connection is open, drops our reference to
 * those and so closes them, at most ADMIN_REAP_MS after evhttp let go.
 * (A filter bufferevent would announce its free, but evhttp then
 * shuts the socket before the filter's output has reached it.)
 */
#include "admin_conn.h"

#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event_struct.h>
#include <event2/listener.h>

#include "log.h"

#define ADMIN_MAX_LISTENERS 8
#define ADMIN_REAP_MS 200

struct aconn {
	struct admin_conns *owner;
	struct bufferevent *bev;	/* ours and, until it frees it, evhttp's */
	struct evbuffer_cb_entry *out_cb;
	struct event deadline;		/* the request must be read by then */
	struct aconn *prev, *next;
};

struct admin_conns {
	struct evconnlistener *lev[ADMIN_MAX_LISTENERS];
	int nlev;
	int open;			/* connections not yet reaped */
	bool paused;			/* listeners disabled at the cap */
	struct event reaper;
	struct aconn *conns;
};

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
	if (!on)
		log_warn("admin listener: %d connections open, not accepting "
			 "more until one closes", ac->open);
}

static void arm(struct aconn *c)
{
	struct timeval tv = { ADMIN_REQUEST_MS / 1000,
			      (ADMIN_REQUEST_MS % 1000) * 1000 };

	evtimer_add(&c->deadline, &tv);
}

/* Shut the socket: evhttp reads its end and frees the connection. */
static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	struct aconn *c = arg;
	evutil_socket_t s = bufferevent_getfd(c->bev);

	(void)fd;
	(void)what;
	log_debug("admin listener: no whole request in %d ms; closing",
		  ADMIN_REQUEST_MS);
	if (s >= 0)
		shutdown(s, SHUT_RDWR);
}

/* An answer going out gives the connection's next request (or the rest
 * of this answer's write) a new deadline. */
static void output_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info,
		      void *arg)
{
	(void)buf;
	if (info->n_added > 0)
		arm(arg);
}

static void reap(struct aconn *c)
{
	struct admin_conns *ac = c->owner;

	evbuffer_remove_cb_entry(bufferevent_get_output(c->bev), c->out_cb);
	event_del(&c->deadline);
	bufferevent_decref(c->bev);	/* the last reference: closes */
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		ac->conns = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
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

static void reaper_cb(evutil_socket_t fd, short what, void *arg)
{
	struct admin_conns *ac = arg;
	struct aconn *next;

	(void)fd;
	(void)what;
	for (struct aconn *c = ac->conns; c != NULL; c = next) {
		next = c->next;
		if (freed_by_evhttp(c))
			reap(c);
	}
	if (ac->open < ADMIN_MAX_CONNS)
		set_accepting(ac, true);
	if (ac->open == 0)
		event_del(&ac->reaper);
}

static struct bufferevent *conn_new(struct event_base *base, void *arg)
{
	struct admin_conns *ac = arg;
	struct aconn *c = calloc(1, sizeof(*c));
	struct timeval every = { 0, ADMIN_REAP_MS * 1000 };

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
	evtimer_assign(&c->deadline, base, deadline_cb, c);
	arm(c);
	c->next = ac->conns;
	if (ac->conns != NULL)
		ac->conns->prev = c;
	ac->conns = c;
	if (ac->open++ == 0)
		event_add(&ac->reaper, &every);
	if (ac->open >= ADMIN_MAX_CONNS)
		set_accepting(ac, false);
	return c->bev;
}

struct admin_conns *admin_conns_new(struct event_base *base,
				    struct evhttp *http)
{
	struct admin_conns *ac = calloc(1, sizeof(*ac));

	if (ac == NULL)
		return NULL;
	event_assign(&ac->reaper, base, -1, EV_PERSIST, reaper_cb, ac);
	evhttp_set_bevcb(http, conn_new, ac);
	return ac;
}

void admin_conns_listen(struct admin_conns *ac, struct evhttp_bound_socket *b)
{
	if (ac->nlev < ADMIN_MAX_LISTENERS)
		ac->lev[ac->nlev++] = evhttp_bound_socket_get_listener(b);
}

void admin_conns_request_read(struct admin_conns *ac,
			      struct evhttp_request *req)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct bufferevent *bev;

	if (evcon == NULL)
		return;
	bev = evhttp_connection_get_bufferevent(evcon);
	for (struct aconn *c = ac->conns; c != NULL; c = c->next) {
		if (c->bev == bev) {
			event_del(&c->deadline);
			return;
		}
	}
}

void admin_conns_free(struct admin_conns *ac)
{
	if (ac == NULL)
		return;
	while (ac->conns != NULL)
		reap(ac->conns);
	event_del(&ac->reaper);
	free(ac);
}
