/*
 * conn_pass.c - a request forwarded as it is (DESIGN.md §1 item 1): the
 * exchange with the upstream, the body streamed to it, the response
 * streamed back.
 *
 * Content-Length bodies move from the client's input buffer to the
 * upstream's output buffer without copying; chunked bodies go through
 * llhttp (conn_feed_parser) and are re-chunked. Back-pressure both ways:
 * when the receiving side holds more than CONN_HIGH bytes, the sending
 * side stops reading (CLIENT_PAUSED here, upstream_pause_read there) until
 * it drains. A request without a body that is idempotent is sent again
 * once when a pooled connection turns out closed; nothing else is. A
 * request asking for an upgrade that the upstream accepts (101) turns the
 * connection into a tunnel (conn_tunnel.c).
 */
#include "conn_pass.h"
#include "conn_priv.h"
#include "conn_tunnel.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <llhttp.h>

#include "clock.h"
#include "config.h"
#include "h1.h"
#include "log.h"
#include "metrics.h"
#include "reqhead.h"
#include "upstream.h"
#include "loop.h"

static const struct upstream_cbs up_cbs;

static bool idempotent_method(int method)
{
	return method == HTTP_GET || method == HTTP_HEAD ||
	       method == HTTP_OPTIONS || method == HTTP_TRACE;
}

/* Open the exchange and send the head; the body follows in
 * conn_pass_pump. */
static int start_exchange(struct conn *c, bool fresh)
{
	struct reqhead rh = {
		.method = c->method,
		.target = c->fwd,
		.fields = &c->head.fields, .peer = c->peer,
		.tls = c->ssl != NULL, .cfg = c->cfg,
		.body = c->req_body, .length = c->req_length,
		.client_subject = c->tls_subject, .client_san = c->tls_san,
		.request_id = reqlog_upstream_id(&c->rl, c->cfg, c->policy),
		.traceparent = reqlog_traceparent(&c->rl),
		.upgrade = cf_has(c, CF(UPGRADE)),
	};

	/* a request that is not retried on a stale connection (it has a
	 * body, or is not idempotent) is sent on one checked alive */
	unsigned how = fresh ? UPSTREAM_FRESH :
		       c->req_body == BODY_NONE && idempotent_method(c->method) ?
		       0 : UPSTREAM_CHECK;

	if (rh.upgrade)
		how |= UPSTREAM_UPGRADE;
	c->up = upstream_acquire(c->loop->pool, &up_cbs, c,
				 c->cfg->upstream_timeout_ms,
				 c->method == HTTP_HEAD, how);
	if (c->up == NULL)
		return -1;
	c->mode = CONN_MODE_PASS;
	c->up_start_ms = clock_ms();
	c->rl.forwarded = true;
	reqlog_phase_begin(&c->rl, REQLOG_UPSTREAM);
	reqhead_write(upstream_output(c->up), &rh);
	return 0;
}

/* The whole request has been read and queued for the upstream. */
static void request_complete(struct conn *c)
{
	cf_set(c, CF(REQ_DONE));
	c->ops->read_timeout(c, 0);
	if (cf_has(c, CF(CLIENT_PAUSED))) {
		cf_clr(c, CF(CLIENT_PAUSED));
		c->ops->read_on(c);
	}
	if (c->up != NULL)
		upstream_request_sent(c->up);
}

/*
 * Move request body bytes from the client to the upstream, as far as the
 * input and the upstream's buffer allow.
 */
void conn_pass_pump(struct conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);

	if (cf_has(c, CF(REQ_DONE)) || c->state != CONN_ST_FORWARD || c->up == NULL)
		return;
	if (c->req_body == BODY_LENGTH) {
		size_t n = evbuffer_get_length(in);

		if (n > c->req_remaining)
			n = (size_t)c->req_remaining;
		if (n > 0)
			evbuffer_remove_buffer(in, upstream_output(c->up), n);
		c->req_remaining -= n;
		if (c->req_remaining == 0) {
			request_complete(c);
			return;
		}
	} else {
		int rc = c->ops->feed_parser(c);

		if (rc < 0)
			return;
		if (rc == 1) {
			h1_last_chunk(upstream_output(c->up));
			request_complete(c);
			return;
		}
	}
	if (c->up != NULL && upstream_output_pending(c->up) > CONN_HIGH &&
	    !cf_has(c, CF(CLIENT_PAUSED))) {
		cf_set(c, CF(CLIENT_PAUSED));
		bufferevent_disable(c->bev, EV_READ);
	}
}

/* Forward the request as it is (DESIGN.md §1 item 1). */
void conn_pass_forward(struct conn *c)
{
	c->ops->set_state(c, CONN_ST_FORWARD);
	if (start_exchange(c, false) < 0) {
		metrics_upstream_error(UPSTREAM_ERROR_CONNECT);
		c->ops->answer(c, PROBLEM_UPSTREAM_UNAVAILABLE,
			    "cannot open a connection to the upstream",
			    c->outcome, false);
		return;
	}
	if (c->req_body == BODY_NONE) {
		request_complete(c);
		return;
	}
	c->ops->read_timeout(c, c->cfg->client_timeout_ms);
	if (c->req_body == BODY_CHUNKED)
		llhttp_resume(&c->parser);
	conn_pass_pump(c);
}

static void up_on_head(void *arg, const struct upstream_resp *r)
{
	struct conn *c = arg;

	c->ops->client_head(c, r);
	if (r->status == 101) {		/* asked for, and the request is out */
		struct bufferevent *up = upstream_detach(c->up);

		c->up = NULL;
		conn_tunnel_start(c, up);
	}
}

static void up_on_body(void *arg, struct evbuffer *src, size_t len)
{
	struct conn *c = arg;

	if (c->ops->client_body(c, src, len))
		upstream_pause_read(c->up, true);
}

static void up_on_done(void *arg)
{
	struct conn *c = arg;

	c->ops->client_done(c);
	metrics_observe(HISTOGRAM_upstream_seconds,
			(double)(clock_ms() - c->up_start_ms) / 1e3);
	reqlog_phase_end(&c->rl, REQLOG_UPSTREAM);
	if (!cf_has(c, CF(REQ_DONE))) {
		/* The upstream answered before reading the whole body. The
		 * connection cannot carry another request. */
		upstream_abort(c->up);
		cf_set(c, CF(CLOSE_AFTER));
	} else {
		upstream_release(c->up);
	}
	c->up = NULL;
	c->ops->end_request(c);
}

static void up_on_error(void *arg, enum upstream_error err, unsigned how)
{
	struct conn *c = arg;

	c->up = NULL;
	if ((how & UPSTREAM_RETRYABLE) && !cf_has(c, CF(RETRIED)) && !cf_has(c, CF(RESP_STARTED)) &&
	    c->req_body == BODY_NONE && idempotent_method(c->method)) {
		/* A pooled connection the upstream had closed: nothing was
		 * executed, and a request without a body can be sent again. */
		cf_set(c, CF(RETRIED));
		if (start_exchange(c, true) == 0) {
			upstream_request_sent(c->up);
			return;
		}
	}
	reqlog_phase_end(&c->rl, REQLOG_UPSTREAM);
	c->rl.upstream_error = upstream_error_name(err);
	log_warn_req(c->rl.request_id, "conn %s: upstream %s on %s %s", c->peer,
		 upstream_error_name(err),
		 llhttp_method_name((llhttp_method_t)c->method), c->head.target);
	if (c->ops->upstream_error(c, err))
		c->ops->end_request(c);
}

static void up_on_drain(void *arg)
{
	struct conn *c = arg;

	if (!cf_has(c, CF(CLIENT_PAUSED)))
		return;
	cf_clr(c, CF(CLIENT_PAUSED));
	c->ops->read_on(c);
	conn_pass_pump(c);
}

static const struct upstream_cbs up_cbs = {
	.on_head = up_on_head,
	.on_body = up_on_body,
	.on_done = up_on_done,
	.on_error = up_on_error,
	.on_drain = up_on_drain,
};
