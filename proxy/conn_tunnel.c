/*
 * conn_tunnel.c - a connection upgraded by the upstream (101 Switching
 * Protocols: a WebSocket, or any protocol but h2c) becomes one byte tunnel:
 * what either side sends goes to the other as it is. HTTP is over on it;
 * nothing is parsed, keyed or stored.
 *
 *   CONN_ST_FORWARD ──101──▶ CONN_ST_TUNNEL ──both ends shut, an error,
 *                                            idle, drain timeout──▶ closed
 *
 * Each direction is a pump from one bufferevent's input to the other's
 * output. Back-pressure: when the receiving side's output holds more than
 * CONN_HIGH bytes, the sending side stops reading until it drains below
 * CONN_LOW, so a slow reader holds at most about CONN_HIGH + CONN_READ_HIGH
 * bytes of ours per direction whatever the other side pushes.
 *
 * Half-close: a side's end of stream (EOF, or TLS close_notify) is passed
 * on once its bytes are written - shutdown(SHUT_WR), after close_notify
 * over TLS - and the other direction goes on. The tunnel ends when both
 * directions have ended, on an error on either side, when no byte moved
 * either way for --tunnel-idle-timeout, or at the drain timeout after
 * SIGTERM (both sides get their end of stream first).
 *
 * The client's bufferevent stays conn.c's (its callbacks dispatch here in
 * CONN_ST_TUNNEL; its output is flushed by conn.c's end-of-turn writer);
 * the upstream's is this module's from upstream_detach() on.
 */
#include "conn_tunnel.h"
#include "conn_priv.h"

#include <stdlib.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>

#include "clock.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "tls.h"
#include "loop.h"

/* One direction of the tunnel. */
struct tun_dir {
	bool eof;		/* its source ended (EOF, close_notify) */
	bool shut;		/* ... and that was passed on to the sink */
	bool paused;		/* its source stopped reading: the sink is full */
};

struct tunnel {
	struct bufferevent *up;		/* the upstream's connection */
	struct event *idle;		/* --tunnel-idle-timeout */
	uint64_t idle_ms;
	uint64_t last_ms;		/* a byte moved either way */
	struct tun_dir c2u;		/* client to upstream */
	struct tun_dir u2c;		/* upstream to client */
};

static void up_read_cb(struct bufferevent *bev, void *arg);
static void up_write_cb(struct bufferevent *bev, void *arg);
static void up_event_cb(struct bufferevent *bev, short what, void *arg);

/*
 * The tunnel is over. The access-log line is written (error NULL: a side
 * closed it), then the connection closes, which frees the tunnel
 * (conn_tunnel_free): callers return at once.
 */
static void tunnel_end(struct conn *c, const char *why, const char *error)
{
	log_debug("conn %s: tunnel ends: %s", c->peer, why);
	c->ops->log_request(c, error);
	c->ops->close(c, why);
}

/* Shut the write side of bev's socket, after close_notify over TLS. */
static void shut_write(struct bufferevent *bev, struct ssl_st *ssl)
{
	tls_close_notify(ssl);
	(void)shutdown(bufferevent_getfd(bev), SHUT_WR);
}

/* Both directions ended and were passed on? Then the tunnel is done
 * (true: c is closing). */
static bool both_done(struct conn *c)
{
	struct tunnel *t = c->tun;

	if (!t->c2u.shut || !t->u2c.shut)
		return false;
	tunnel_end(c, "tunnel closed", NULL);
	return true;
}

/* One direction's end of stream, passed on once its sink (`to`, TLS `ssl`)
 * has written everything. True when the tunnel is done (c is closing). */
static bool shut_if_flushed(struct conn *c, struct tun_dir *d,
			    struct bufferevent *to, struct ssl_st *ssl)
{
	if (!d->eof || d->shut || evbuffer_get_length(bufferevent_get_output(to)) > 0)
		return false;
	d->shut = true;
	shut_write(to, ssl);
	return both_done(c);
}

static bool c2u_shut_if_flushed(struct conn *c)
{
	struct tunnel *t = c->tun;

	return shut_if_flushed(c, &t->c2u, t->up, bufferevent_openssl_get_ssl(t->up));
}

static bool u2c_shut_if_flushed(struct conn *c)
{
	return shut_if_flushed(c, &c->tun->u2c, c->bev, c->ssl);
}

/* Move what `from` holds to `to`; stop reading `from` once `to` is full.
 * Returns the bytes moved. */
static size_t pump(struct tunnel *t, struct tun_dir *d, struct bufferevent *from,
		   struct bufferevent *to, enum counter bytes)
{
	struct evbuffer *in = bufferevent_get_input(from);
	struct evbuffer *out = bufferevent_get_output(to);
	size_t n = evbuffer_get_length(in);

	if (n > 0) {
		evbuffer_add_buffer(out, in);
		metrics_count_n(bytes, n);
		t->last_ms = clock_ms();
	}
	if (!d->paused && evbuffer_get_length(out) > CONN_HIGH) {
		d->paused = true;
		bufferevent_disable(from, EV_READ);
	}
	return n;
}

/* Client to upstream (bytes_out is counted as the client's output grows,
 * bytes_in here). */
static void pump_c2u(struct conn *c)
{
	c->rl.bytes_in += pump(c->tun, &c->tun->c2u, c->bev, c->tun->up,
			       COUNTER_tunnel_client_bytes_total);
}

static void pump_u2c(struct conn *c)
{
	(void)pump(c->tun, &c->tun->u2c, c->tun->up, c->bev,
		   COUNTER_tunnel_upstream_bytes_total);
}

static void idle_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	struct tunnel *t = c->tun;
	uint64_t quiet = clock_ms() - t->last_ms;
	struct timeval tv;

	if (quiet >= t->idle_ms) {
		tunnel_end(c, "tunnel idle timeout", "tunnel idle timeout");
		return;
	}
	tv = clock_tv(t->idle_ms - quiet);
	evtimer_add(t->idle, &tv);
}

void conn_tunnel_start(struct conn *c, struct bufferevent *up)
{
	struct tunnel *t = calloc(1, sizeof(*t));
	struct timeval tv;

	c->ops->set_state(c, CONN_ST_TUNNEL);
	c->mode = CONN_MODE_TUNNEL;
	if (t == NULL || (t->idle = evtimer_new(c->loop->base, idle_cb, c)) == NULL) {
		free(t);
		bufferevent_free(up);
		c->ops->close(c, "out of memory");
		return;
	}
	c->tun = t;
	t->up = up;
	t->idle_ms = c->cfg->tunnel_idle_timeout_ms;
	t->last_ms = clock_ms();
	metrics_gauge_add(GAUGE_tunnels_open, 1);
	metrics_count(COUNTER_tunnels_total);
	if (c->method >= 0)
		metrics_outcome(c->outcome);	/* the request is done */
	c->method = -1;
	reqlog_phase_end(&c->rl, REQLOG_UPSTREAM);
	reqlog_responded(&c->rl);
	log_debug("conn %s: tunnel to the upstream", c->peer);

	/* neither side's timeouts: the tunnel times itself as a whole */
	bufferevent_set_timeouts(c->bev, NULL, NULL);
	c->read_timeout_ms = RT_UNSET;
	bufferevent_setcb(up, up_read_cb, up_write_cb, up_event_cb, c);
	bufferevent_setwatermark(up, EV_READ, 0, CONN_READ_HIGH);
	bufferevent_setwatermark(up, EV_WRITE, CONN_LOW, 0);
	bufferevent_enable(up, EV_READ | EV_WRITE);
	tv = clock_tv(t->idle_ms);
	evtimer_add(t->idle, &tv);

	/* what either side sent after the upgrade's head is the new
	 * protocol's: a client that did not wait for the 101 */
	pump_c2u(c);
	pump_u2c(c);
	c->ops->read_on(c);
}

void conn_tunnel_client_read(struct conn *c)
{
	pump_c2u(c);
}

/* The client's output fell below the low watermark, or is empty. */
void conn_tunnel_client_write(struct conn *c)
{
	struct tunnel *t = c->tun;

	t->last_ms = clock_ms();
	if (t->u2c.paused &&
	    evbuffer_get_length(bufferevent_get_output(c->bev)) <= CONN_LOW) {
		t->u2c.paused = false;
		bufferevent_enable(t->up, EV_READ);
		pump_u2c(c);	/* what it held while paused */
	}
	(void)u2c_shut_if_flushed(c);
}

void conn_tunnel_client_event(struct conn *c, short what)
{
	struct tunnel *t = c->tun;

	if (!(what & BEV_EVENT_EOF) || t->c2u.eof) {
		tunnel_end(c, "client error", "client error");
		return;
	}
	pump_c2u(c);
	t->c2u.eof = true;
	bufferevent_disable(c->bev, EV_READ);
	/* the upstream's write callback once its output is empty */
	bufferevent_setwatermark(t->up, EV_WRITE, 0, 0);
	(void)c2u_shut_if_flushed(c);
}

static void up_read_cb(struct bufferevent *bev, void *arg)
{
	pump_u2c(arg);
}

static void up_write_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	struct tunnel *t = c->tun;

	t->last_ms = clock_ms();
	if (t->c2u.paused && !t->c2u.eof &&
	    evbuffer_get_length(bufferevent_get_output(bev)) <= CONN_LOW) {
		t->c2u.paused = false;
		c->ops->read_on(c);
		pump_c2u(c);	/* what the client's input held meanwhile */
	}
	(void)c2u_shut_if_flushed(c);
}

static void up_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct conn *c = arg;
	struct tunnel *t = c->tun;

	if (!(what & BEV_EVENT_EOF) || t->u2c.eof) {
		log_debug("conn %s: tunnel: upstream %s", c->peer,
			  (what & BEV_EVENT_TIMEOUT) ? "timeout" : "error");
		tunnel_end(c, "upstream error", "upstream error");
		return;
	}
	pump_u2c(c);
	t->u2c.eof = true;
	bufferevent_disable(bev, EV_READ);
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
	(void)u2c_shut_if_flushed(c);
}

void conn_tunnel_abort(struct conn *c)
{
	struct tunnel *t = c->tun;

	if (!t->c2u.shut)
		shut_write(t->up, bufferevent_openssl_get_ssl(t->up));
	if (!t->u2c.shut)
		shut_write(c->bev, c->ssl);
	t->c2u.shut = t->u2c.shut = true;
	tunnel_end(c, "drain timeout", "drain timeout");
}

void conn_tunnel_free(struct conn *c)
{
	struct tunnel *t = c->tun;

	if (t == NULL)
		return;
	c->tun = NULL;
	event_free(t->idle);
	tls_close_notify(bufferevent_openssl_get_ssl(t->up));
	bufferevent_free(t->up);
	free(t);
	metrics_gauge_add(GAUGE_tunnels_open, -1);
}
