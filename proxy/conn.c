/*
 * conn.c - a client connection: parse requests, decide, forward, respond.
 *
 *          accept
 *             │
 *             ▼      first byte                 head complete
 *   ┌──▶ CONN_ST_IDLE ─────────▶ CONN_ST_READ_HEAD ─────────▶ CONN_ST_DECIDE
 *   │                                  │ 400/408/431          │    │ keyed
 *   │                                  ▼          pass-through│    ▼
 *   │                            CONN_ST_RESPOND ◀─┐          │ CONN_ST_BODY
 *   │                              ▲   │ 4xx/409/  │          │    │ buffered
 *   │                    replay,   │   │ 422/503   │          │    ▼
 *   │                    problem   └───┼───────────┼──── CONN_ST_CLAIM
 *   │                                  │           │ 502/504  │    │ won
 *   │  keep-alive                      │           │          ▼    ▼
 *   └──────────────────────────────────┴──── response done ─ CONN_ST_FORWARD
 *                                      │ Connection: close
 *                                      ▼
 *                              CONN_ST_CLOSING ──▶ CONN_ST_LINGER ──▶ freed
 *
 * One request is handled at a time. Pipelined requests wait in the input
 * buffer (bounded by the read watermark) until the response before them is
 * complete, so responses always leave in request order.
 *
 * The parser pauses at the end of the head (DECIDE). Requests that are not
 * protected, or carry no key, are forwarded with their bodies streamed:
 * Content-Length bodies move from the client's input buffer to the
 * upstream's output buffer without copying; chunked bodies go through
 * llhttp and are re-chunked. Back-pressure in both directions: when the
 * receiving side's output holds more than CONN_HIGH bytes, the sending side
 * stops reading until it falls below the low watermark.
 *
 * Keyed requests are buffered whole (BODY, up to max_body), prepared for
 * the engine by keyed.c (key, fingerprint, signature, scope, the upstream
 * head) and handed to the idempotency engine (idem.c), which claims the key
 * and answers through the sink below: a replay, a problem, or the winner's
 * upstream response. The winner's exchange belongs to the engine, so
 * closing this connection never aborts it.
 *
 * Who does what: conn.c is the connection (state machine, lifecycle, socket
 * callbacks, parsing); conn_pass.c streams a pass-through exchange;
 * conn_keyed.c is the keyed side; conn_tls.c the TLS side (conn.c calls
 * the three; they reach conn.c only through c->ops, conn_ops_table);
 * h1.c collects heads and frames chunks for both sides; reqhead.c writes
 * the upstream request head;
 * reply.c writes every response the proxy makes itself; keyed.c prepares
 * keyed requests; issue.c mints and checks issued keys.
 */
#include "conn.h"
#include "conn_priv.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <llhttp.h>

#include "clock.h"
#include "config.h"
#include "conn_keyed.h"
#include "conn_pass.h"
#include "conn_tls.h"
#include "conn_tunnel.h"
#include "h1.h"
#include "httphdr.h"
#include "idem.h"
#include "log.h"
#include "metrics.h"
#include "pp_accept.h"
#include "problem.h"
#include "reply.h"
#include "reqhead.h"
#include "store.h"
#include "tls.h"
#include "upstream.h"
#include "loop.h"

static const char *const state_names[] = {
	"idle", "read_head", "decide", "body", "claim", "forward", "respond",
	"settle", "tunnel", "closing", "linger", "closed",
};

/* The machinery the helpers reach through c->ops (conn_ops_table). */
static void conn_set_state(struct conn *c, enum conn_state next);
static void conn_read_timeout(struct conn *c, uint64_t ms);
static struct reply_conn conn_reply_conn(const struct conn *c);
static void conn_answer(struct conn *c, enum problem p, const char *detail,
			enum outcome o, bool close);
static bool conn_upstream_error(struct conn *c, enum upstream_error err);
static bool conn_exchange_problem(struct conn *c, enum problem p,
				  const char *detail);
static void conn_end_request(struct conn *c);
static void conn_close(struct conn *c, const char *reason);
static void log_request(struct conn *c, const char *error);
static int conn_feed_parser(struct conn *c);
static void conn_read_on(struct conn *c);
static void conn_client_head(struct conn *c, const struct upstream_resp *r);
static bool conn_client_body(struct conn *c, struct evbuffer *src, size_t len);
static void conn_client_done(struct conn *c);

static const struct conn_ops conn_ops_table = {
	.set_state = conn_set_state,
	.read_timeout = conn_read_timeout,
	.reply_conn = conn_reply_conn,
	.answer = conn_answer,
	.upstream_error = conn_upstream_error,
	.exchange_problem = conn_exchange_problem,
	.end_request = conn_end_request,
	.close = conn_close,
	.log_request = log_request,
	.feed_parser = conn_feed_parser,
	.read_on = conn_read_on,
	.client_head = conn_client_head,
	.client_body = conn_client_body,
	.client_done = conn_client_done,
};

static void conn_parse(struct conn *c);

static const llhttp_settings_t parser_settings;

/* "keep_alive|req_done" for logs. */
static const char *conn_flags_str(unsigned flags, char *buf, size_t len)
{
	static const char *const names[] = {
#define X(name, label) label,
		CONN_FLAG_LIST(X)
#undef X
	};

	return log_flags(flags, names, sizeof(names) / sizeof(names[0]), buf, len);
}

/*
 * All state changes go through here. The table lists what may follow what;
 * anything else is a bug in this file.
 */
static void conn_set_state(struct conn *c, enum conn_state next)
{
	static const unsigned legal[] = {
		[CONN_ST_IDLE] = 1u << CONN_ST_READ_HEAD | 1u << CONN_ST_RESPOND |
			1u << CONN_ST_CLOSING,
		[CONN_ST_READ_HEAD] = 1u << CONN_ST_DECIDE |
			1u << CONN_ST_RESPOND | 1u << CONN_ST_CLOSING,
		[CONN_ST_DECIDE] = 1u << CONN_ST_FORWARD | 1u << CONN_ST_BODY |
			1u << CONN_ST_CLAIM | 1u << CONN_ST_RESPOND |
			1u << CONN_ST_CLOSING,
		[CONN_ST_BODY] = 1u << CONN_ST_CLAIM | 1u << CONN_ST_RESPOND,
		[CONN_ST_CLAIM] = 1u << CONN_ST_FORWARD | 1u << CONN_ST_RESPOND,
		[CONN_ST_FORWARD] = 1u << CONN_ST_RESPOND | 1u << CONN_ST_IDLE |
			1u << CONN_ST_SETTLE | 1u << CONN_ST_TUNNEL |
			1u << CONN_ST_CLOSING,
		[CONN_ST_RESPOND] = 1u << CONN_ST_IDLE | 1u << CONN_ST_SETTLE |
			1u << CONN_ST_CLOSING,
		[CONN_ST_SETTLE] = 1u << CONN_ST_IDLE | 1u << CONN_ST_CLOSING,
		[CONN_ST_TUNNEL] = 0,		/* closed when it ends */
		[CONN_ST_CLOSING] = 1u << CONN_ST_LINGER,
		[CONN_ST_LINGER] = 0,
		[CONN_ST_CLOSED] = 0,
	};

	if (next != CONN_ST_CLOSED && !(legal[c->state] & (1u << next))) {
		log_error("conn %s: illegal transition %s -> %s", c->peer,
			  state_names[c->state], state_names[next]);
		abort();
	}
	c->state = next;
}

static void conn_read_timeout(struct conn *c, uint64_t ms)
{
	struct timeval rd = clock_tv(ms);
	struct timeval wr = clock_tv(c->loop->cfg->idle_timeout_ms);

	/* setting them re-adds the bufferevent's events: only on a change */
	if (ms == c->read_timeout_ms)
		return;
	c->read_timeout_ms = ms;
	bufferevent_set_timeouts(c->bev, ms ? &rd : NULL, &wr);
}

/* How the connection goes on after the response being written. */
static struct reply_conn conn_reply_conn(const struct conn *c)
{
	struct reply_conn rc = { cf_has(c, CF(CLOSE_AFTER)), c->http_minor == 0,
				 c->loop->cfg->request_id_header, NULL };

	if (c->rl.active) {
		rc.rid_name = c->cfg->request_id_header;
		rc.rid = c->rl.request_id;
	}
	return rc;
}

/* ---- responses of our own ------------------------------------------- */

/*
 * Queue a problem response; `close` forces Connection: close, and so does
 * a request whose body was not read in full. Returns false when the
 * connection was cut instead (a response was already under way).
 */
static bool write_problem(struct conn *c, enum problem p, const char *detail,
			  bool close)
{
	if (c->mode == CONN_MODE_PASS && c->up != NULL) {
		upstream_abort(c->up);
		c->up = NULL;
	}
	if (close || !cf_has(c, CF(REQ_DONE)) || !cf_has(c, CF(KEEP_ALIVE)) ||
	    c->draining)
		cf_set(c, CF(CLOSE_AFTER));
	if (cf_has(c, CF(RESP_STARTED))) {
		/* The client already has part of another response: all we
		 * can do is cut the connection. */
		conn_close(c, problem_slug(p));
		return false;
	}
	c->rl.status = problem_status(p);
	reqlog_need_id(&c->rl);
	reply_problem(bufferevent_get_output(c->bev), p, detail, conn_reply_conn(c));
	reqlog_responded(&c->rl);
	log_debug("conn %s: %d %s", c->peer, problem_status(p), problem_slug(p));
	cf_set(c, CF(RESP_STARTED));
	conn_set_state(c, CONN_ST_RESPOND);
	return true;
}

static void respond_problem(struct conn *c, enum problem p, const char *detail,
			    bool close)
{
	if (write_problem(c, p, detail, close))
		conn_end_request(c);
}

/* Answer with a problem and count the request's outcome. */
static void conn_answer(struct conn *c, enum problem p, const char *detail,
			enum outcome o, bool close)
{
	c->outcome = o;
	respond_problem(c, p, detail, close);
}

/* A request that never became one: bad syntax, too large, too slow. */
static void refuse(struct conn *c, enum problem p, enum client_error e,
		   const char *detail)
{
	metrics_client_error(e);
	c->refused = (int)e;
	c->method = -1;		/* not counted as a request */
	cf_clr(c, CF(REQ_DONE));	/* forces the close */
	respond_problem(c, p, detail, true);
}

/* 502 or 504 for a failed exchange; false when the connection was cut. */
static bool conn_upstream_error(struct conn *c, enum upstream_error err)
{
	const char *detail;
	enum problem p = problem_upstream(err, &detail);

	return write_problem(c, p, detail, false);
}

/* The engine's answer to a keyed exchange that failed or is late (502,
 * 504); false when the connection was cut. */
static bool conn_exchange_problem(struct conn *c, enum problem p,
				  const char *detail)
{
	return write_problem(c, p, detail, false);
}

/* ---- reading --------------------------------------------------------- */

/* Read from the client again (after a pause, or for the next request). */
static void conn_read_on(struct conn *c)
{
	if (!(bufferevent_get_enabled(c->bev) & EV_READ))
		bufferevent_enable(c->bev, EV_READ);
	conn_tls_pump_later(c);
}

/* ---- lifecycle --------------------------------------------------------- */

/* Return a connection whose output has drained to the closed state: shut
 * the write side and swallow input for a moment, so that a client still
 * sending (a body we refused) reads our response rather than a reset. */
static void start_linger(struct conn *c)
{
	struct timeval tv = clock_tv(CONN_LINGER_MS);
	evutil_socket_t fd = bufferevent_getfd(c->bev);

	conn_set_state(c, CONN_ST_LINGER);
	tls_close_notify(c->ssl);	/* the response is whole: say so */
	if (shutdown(fd, SHUT_WR) < 0) {
		conn_close(c, "shutdown");
		return;
	}
	evbuffer_drain(bufferevent_get_input(c->bev),
		       evbuffer_get_length(bufferevent_get_input(c->bev)));
	bufferevent_set_timeouts(c->bev, NULL, NULL);
	c->read_timeout_ms = RT_UNSET;
	bufferevent_enable(c->bev, EV_READ);
	evtimer_add(c->timer, &tv);
}

/* Flush what is queued, then linger and close. */
static void start_closing(struct conn *c)
{
	conn_set_state(c, CONN_ST_CLOSING);
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
	bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
	evtimer_del(c->timer);
	if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
		start_linger(c);
	else
		bufferevent_enable(c->bev, EV_WRITE);	/* write_cb lingers */
}

/* Let go of whoever serves the request: abort a pass-through exchange,
 * cancel an issue, detach from the engine (a winner goes on without us). */
static void drop_mode(struct conn *c)
{
	switch (c->mode) {
	case CONN_MODE_PASS:
		if (c->up != NULL)
			upstream_abort(c->up);
		c->up = NULL;
		break;
	case CONN_MODE_KEYED:
		if (c->idem != NULL)
			idem_detach(c->idem);
		c->idem = NULL;
		break;
	case CONN_MODE_ISSUE:
		if (c->issue_op != NULL)
			store_cancel(c->issue_op);
		c->issue_op = NULL;
		break;
	case CONN_MODE_TUNNEL:
		conn_tunnel_free(c);
		break;
	case CONN_MODE_NONE:
		break;
	}
	c->mode = CONN_MODE_NONE;
}

/* "HTTP/1.1" as the request line said; NULL when it did not get that far. */
static const char *protocol_of(const struct conn *c)
{
	unsigned major = c->rl_head ? c->http_major : c->parser.http_major;
	unsigned minor = c->rl_head ? c->http_minor : c->parser.http_minor;

	if (major != 1)
		return major == 0 ? NULL : "HTTP/?";
	return minor == 0 ? "HTTP/1.0" : "HTTP/1.1";
}

/*
 * The request is over (error NULL), or cut short (error says why): its
 * access-log line and spans (reqlog.c). Once per request: reqlog_finish()
 * clears rl.active.
 */
static void log_request(struct conn *c, const char *error)
{
	struct reqlog_end e;

	if (!c->rl.active)
		return;
	e = (struct reqlog_end){
		.cfg = c->cfg,
		.fields = c->rl_method != NULL ? &c->head.fields : NULL,
		.peer = c->peer,
		.tls = c->ssl != NULL,
		.method = c->rl_method,
		.target = c->head.target,
		.protocol = protocol_of(c),
		.route = c->route,
		.outcome = c->refused >= 0 ?
			   client_error_name((enum client_error)c->refused) :
			   outcome_name(c->outcome),
		.key = c->key.key,
		.error = error,
	};
	if (c->req_body == BODY_LENGTH)
		c->rl.bytes_in += c->req_length - c->req_remaining;
	reqlog_finish(&c->rl, &e);
}

/*
 * Close now and put the connection on the reap list: the memory is freed on
 * the next loop turn, after every callback that might still look at it has
 * returned.
 */
static void conn_close(struct conn *c, const char *reason)
{
	char flags[160];

	if (c->state == CONN_ST_CLOSED)
		return;
	log_debug("conn %s: close (%s) in %s [%s]", c->peer, reason,
		  state_names[c->state],
		  conn_flags_str(c->flags, flags, sizeof(flags)));
	drop_mode(c);
	log_request(c, reason);		/* one cut short */
	evtimer_del(c->timer);
	event_del(c->kick);
	event_del(c->flush);
	c->flush_armed = false;
	if (c->tls_pump != NULL)
		event_del(c->tls_pump);
	bufferevent_disable(c->bev, EV_READ | EV_WRITE);
	bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
	conn_set_state(c, CONN_ST_CLOSED);
	TAILQ_REMOVE(&c->loop->conns, c, link);
	TAILQ_INSERT_TAIL(&c->loop->reap, c, link);
	conn_loop_reap_later(c->loop);
}

struct conn *conn_next(struct conn *c)
{
	return TAILQ_NEXT(c, link);
}

void conn_free(struct conn *c)
{
	TAILQ_REMOVE(&c->loop->reap, c, link);
	if (c->cfg != NULL)
		config_unref(c->cfg);
	bufferevent_free(c->bev);
	event_free(c->timer);
	event_free(c->kick);
	event_free(c->flush);
	if (c->tls_pump != NULL)
		event_free(c->tls_pump);
	h1_head_free(&c->head);
	body_clear(&c->body);
	free(c->paths);
	free(c->tls_subject);
	free(c->tls_san);
	free(c);
	metrics_gauge_add(GAUGE_connections, -1);
}

/* Forget the request; the parser starts afresh at the next byte. */
static void reset_request(struct conn *c)
{
	if (c->cfg != NULL) {
		config_unref(c->cfg);
		c->cfg = NULL;
	}
	h1_head_reset(&c->head, c->loop->cfg->max_header_size);
	c->fwd = c->match = NULL;
	c->flags = 0;
	c->mode = CONN_MODE_NONE;
	c->req_body = BODY_NONE;
	c->req_length = c->req_remaining = 0;
	c->outcome = OUTCOME_PASSTHROUGH;
	c->policy = NULL;
	c->route = NULL;
	c->key.key[0] = '\0';
	c->key.pending = false;
	c->refused = -1;
	c->rl_method = NULL;
	c->rl_head = false;
	c->rl.active = false;
	body_clear(&c->body);
	llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings);
	c->parser.data = c;
}

/*
 * The response is out (queued) and the request consumed, or the request was
 * answered by the proxy. Count it, then either wait for the next request or
 * close.
 */
static void conn_end_request(struct conn *c)
{
	bool close = cf_has(c, CF(CLOSE_AFTER)) || cf_has(c, CF(CLIENT_EOF)) ||
		     c->draining;

	drop_mode(c);		/* an engine still working records on its own */
	if (c->method >= 0)
		metrics_outcome(c->outcome);
	log_request(c, NULL);
	c->method = -1;
	reset_request(c);
	if (close) {
		start_closing(c);
		return;
	}
	conn_set_state(c, CONN_ST_IDLE);
	conn_read_on(c);
	conn_read_timeout(c, c->loop->cfg->idle_timeout_ms);
	/* Pipelined requests are parsed on the next loop turn (kick_cb), not
	 * here: we may be deep inside an upstream callback. */
	if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
		event_active(c->kick, EV_TIMEOUT, 1);
}

void conn_drain(struct conn *c)
{
	c->draining = true;
	if (c->state == CONN_ST_IDLE) {
		tls_close_notify(c->ssl);
		conn_close(c, "draining");
	}
}

void conn_abort(struct conn *c)
{
	if (c->state == CONN_ST_TUNNEL && c->tun != NULL) {
		conn_tunnel_abort(c);
		return;
	}
	conn_close(c, "drain timeout");
}

/* ---- request parsing ----------------------------------------------------- */

static int on_message_begin(llhttp_t *p)
{
	struct conn *c = p->data;
	struct timeval tv;

	conn_set_state(c, CONN_ST_READ_HEAD);
	c->cfg = config_ref(c->loop->cfg);
	reqlog_begin(&c->rl);
	c->head.max = c->cfg->max_header_size;
	tv = clock_tv(c->cfg->client_timeout_ms);
	conn_read_timeout(c, 0);
	if (c->tls == CONN_TLS_FIRST)
		c->tls = CONN_TLS_OPEN;	/* the deadline set at accept holds */
	else
		evtimer_add(c->timer, &tv);
	return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
	struct conn *c = p->data;

	/* the method is known from here: a request refused later (a bad
	 * field, a head too large) is logged with its request line */
	c->rl_method = llhttp_method_name((llhttp_method_t)p->method);
	return h1_head_target(&c->head, at, len);
}

/*
 * Fields after the head are a chunked body's trailers: they never become
 * header fields (a second Host, another key); only their size counts,
 * against the head's cap.
 */
static bool is_trailer(struct conn *c, size_t len)
{
	if (c->state == CONN_ST_READ_HEAD)
		return false;
	c->head.bytes += len;
	return true;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct conn *c = p->data;

	if (is_trailer(c, len))
		return c->head.bytes > c->head.max ? -1 : 0;
	return h1_head_name(&c->head, at, len);
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	struct conn *c = p->data;

	if (is_trailer(c, len))
		return c->head.bytes > c->head.max ? -1 : 0;
	return h1_head_value(&c->head, at, len);
}

static int on_header_value_complete(llhttp_t *p)
{
	struct conn *c = p->data;

	if (is_trailer(c, 0))
		return 0;
	return h1_head_end_field(&c->head);
}

static int on_headers_complete(llhttp_t *p)
{
	return HPE_PAUSED;
}

/* Chunked request bodies only: buffer a keyed one, re-chunk the others
 * for the upstream. */
static int on_body(llhttp_t *p, const char *at, size_t len)
{
	struct conn *c = p->data;

	if (c->state == CONN_ST_BODY)
		return conn_keyed_chunk(c, at, len);
	if (c->mode == CONN_MODE_PASS && c->up != NULL)
		h1_chunk(upstream_output(c->up), at, len);
	return 0;	/* else answered already; swallow the rest */
}

static int on_message_complete(llhttp_t *p)
{
	return HPE_PAUSED;
}

static const llhttp_settings_t parser_settings = {
	.on_message_begin = on_message_begin,
	.on_url = on_url,
	.on_header_field = on_header_field,
	.on_header_value = on_header_value,
	.on_header_value_complete = on_header_value_complete,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

/* llhttp refused the input: say why. */
static void parse_failed(struct conn *c)
{
	char detail[160];

	if (cf_has(c, CF(BODY_BUSY))) {
		conn_keyed_refused(c, BODY_BUSY);
	} else if (cf_has(c, CF(BODY_TOO_LARGE))) {
		conn_answer(c, PROBLEM_BODY_TOO_LARGE, "the request body is larger "
		       "than max_body", OUTCOME_TOO_LARGE, true);
	} else if (c->head.too_large) {
		refuse(c, PROBLEM_HEADERS_TOO_LARGE, CLIENT_ERROR_HEADERS_TOO_LARGE,
		       "the request head is larger than max_header_size");
	} else {
		snprintf(detail, sizeof(detail), "malformed request: %s",
			 llhttp_get_error_reason(&c->parser));
		refuse(c, PROBLEM_BAD_REQUEST, CLIENT_ERROR_BAD_REQUEST, detail);
	}
}

/*
 * Run llhttp over the buffered input until it pauses (end of head, end of a
 * chunked body), fails, or the input runs out. Returns 1 when paused, 0 when
 * more input is needed, -1 after answering a parse error.
 */
static int conn_feed_parser(struct conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);

	while (evbuffer_get_length(in) > 0) {
		struct evbuffer_iovec v;
		enum llhttp_errno err;
		size_t used;

		if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
			return 0;
		err = llhttp_execute(&c->parser, v.iov_base, v.iov_len);
		switch (err) {
		case HPE_OK:
			c->rl.bytes_in += v.iov_len;
			evbuffer_drain(in, v.iov_len);
			continue;
		case HPE_PAUSED:
		case HPE_PAUSED_UPGRADE:
			used = (size_t)(llhttp_get_error_pos(&c->parser) -
					(const char *)v.iov_base);
			c->rl.bytes_in += used;
			evbuffer_drain(in, used);
			return 1;
		default:
			/* what llhttp read of it counts as the request's */
			if (llhttp_get_error_pos(&c->parser) != NULL)
				c->rl.bytes_in += (size_t)(llhttp_get_error_pos(&c->parser) -
							   (const char *)v.iov_base);
			parse_failed(c);
			return -1;
		}
	}
	return 0;
}

/* ---- the head ------------------------------------------------------------ */

/* What llhttp leaves to us: a request we refuse before deciding. NULL when
 * it is fine. */
static const char *head_unacceptable(struct conn *c, enum problem *p)
{
	const struct hdrlist *f = &c->head.fields;
	int host = hdrlist_find(f, "host", 0);

	*p = PROBLEM_BAD_REQUEST;
	if (httphdr_validate(f) < 0)
		return "malformed header field";
	if ((host >= 0 && hdrlist_find(f, "host", (uint32_t)host + 1) >= 0) ||
	    (host < 0 && c->http_minor >= 1))
		return "a request needs exactly one Host field";
	if (c->method == HTTP_CONNECT) {
		*p = PROBLEM_NOT_IMPLEMENTED;
		return "CONNECT is not supported";
	}
	if (hdrlist_find(f, "transfer-encoding", 0) >= 0) {
		/* RFC 9112 §6.3: chunked must be the final coding, and the
		 * proxy forwards no other (it re-chunks what it de-chunked) */
		if (!h1_only_chunked(f))
			return "unsupported Transfer-Encoding (only chunked)";
		if (hdrlist_find(f, "content-length", 0) >= 0)
			return "both Content-Length and Transfer-Encoding";
	}
	if (reqhead_origin_target(c->head.target, c->method) == NULL)
		return "unsupported request-target form";
	if (2 * (c->head.target_len + 1) > c->paths_cap) {
		size_t cap = 2 * (c->head.target_len + 1);
		char *buf = realloc(c->paths, cap < 512 ? 512 : cap);

		if (buf == NULL)
			return "out of memory";
		c->paths = buf;
		c->paths_cap = cap < 512 ? 512 : cap;
	}
	c->fwd = c->paths;
	c->match = c->paths + c->head.target_len + 1;
	if (reqhead_normalise(c->head.target, c->method, c->fwd, c->match) < 0)
		c->match = NULL;	/* decided in conn_keyed_decide: refused
					 * where routes or protection apply,
					 * else forwarded as it came */
	return NULL;
}

/*
 * The head is complete and the parser paused. Check what llhttp leaves to
 * us, then decide what to do with the request.
 */
static void head_complete(struct conn *c)
{
	llhttp_t *p = &c->parser;
	enum problem prob;
	const char *why;

	evtimer_del(c->timer);
	conn_set_state(c, CONN_ST_DECIDE);
	c->method = p->method;
	c->http_major = p->http_major;
	c->http_minor = p->http_minor;
	c->rl_head = true;
	if (h1_keep_alive(&c->head.fields, c->http_major, c->http_minor))
		cf_set(c, CF(KEEP_ALIVE));
	reqlog_head(&c->rl, c->cfg, &c->head.fields);
	why = head_unacceptable(c, &prob);
	if (why != NULL) {
		refuse(c, prob, CLIENT_ERROR_BAD_REQUEST, why);
		return;
	}
	if (reqhead_upgrade(&c->head.fields, c->http_minor))
		cf_set(c, CF(UPGRADE));
	if (p->flags & F_CHUNKED) {
		c->req_body = BODY_CHUNKED;
		if (c->http_minor == 0)
			cf_set(c, CF(CLOSE_AFTER));	/* RFC 9112 §6.1 */
	} else if (p->flags & F_CONTENT_LENGTH) {
		c->req_body = BODY_LENGTH;
		c->req_length = c->req_remaining = p->content_length;
	} else {
		c->req_body = BODY_NONE;
	}
	/* From here the parser sees the body only when it is chunked; for the
	 * rest it must start afresh at the next request. */
	if (c->req_body != BODY_CHUNKED) {
		llhttp_init(p, HTTP_REQUEST, &parser_settings);
		p->data = c;
	}
	conn_keyed_decide(c);
}

/*
 * With --proxy-protocol, a header from a source it does not list (or a
 * second one): close, with a log line. Its address would otherwise be
 * trusted, or it would be read as a request. True when closed.
 */
static bool stray_proxy_header(struct conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);
	size_t n = evbuffer_get_length(in);
	const char *first;

	if (c->loop->cfg->proxy_protocol == NULL)
		return false;
	first = (const char *)evbuffer_pullup(in, n < 12 ? (ssize_t)n : 12);
	if (first == NULL || !pp_accept_looks_like_header(first, n < 12 ? n : 12))
		return false;
	metrics_client_error(CLIENT_ERROR_PROXY_PROTOCOL);
	log_warn("conn %s: PROXY protocol header from a source --proxy-protocol "
		 "does not list; closed", c->peer);
	conn_close(c, "proxy protocol not allowed");
	return true;
}

/* Parse what the client sent while no exchange is in progress. */
static void conn_parse(struct conn *c)
{
	if (c->state == CONN_ST_IDLE && stray_proxy_header(c))
		return;
	while (c->state == CONN_ST_IDLE || c->state == CONN_ST_READ_HEAD) {
		int rc = conn_feed_parser(c);

		if (rc <= 0)
			return;
		if (c->state != CONN_ST_READ_HEAD) {
			/* paused without a head: a stray pause; cannot happen */
			conn_close(c, "parser state");
			return;
		}
		head_complete(c);
	}
}

/* ---- the client side of a response from the upstream ------------------- */

/* Write a response head (interim or final) from the upstream. */
static void conn_client_head(struct conn *c, const struct upstream_resp *r)
{
	bool interim = r->status < 200 && r->status != 101;
	bool keep_cl = c->method == HTTP_HEAD || r->status == 304;

	if (interim && (c->http_minor == 0 || cf_has(c, CF(RESP_STARTED))))
		return;		/* HTTP/1.0 clients get no 1xx */
	if (r->status == 101) {		/* conn_pass.c opens the tunnel */
		cf_set(c, CF(RESP_STARTED));
		c->rl.status = r->status;
	} else if (!interim) {
		/* an upgrade refused: what follows on the connection may be
		 * the protocol the client hoped for, not a request */
		if (cf_has(c, CF(UPGRADE)))
			cf_set(c, CF(CLOSE_AFTER));
		if (!cf_has(c, CF(REQ_DONE)) || !cf_has(c, CF(KEEP_ALIVE)) || c->draining)
			cf_set(c, CF(CLOSE_AFTER));
		if (r->body == BODY_CHUNKED || r->body == BODY_EOF) {
			if (c->http_minor >= 1)
				cf_set(c, CF(RESP_CHUNKED));
			else
				cf_set(c, CF(CLOSE_AFTER));
		}
		cf_set(c, CF(RESP_STARTED));
		c->rl.status = r->status;
	}
	reply_relay_head(bufferevent_get_output(c->bev), r, keep_cl,
			 cf_has(c, CF(RESP_CHUNKED)), conn_reply_conn(c));
}

/* Move len body bytes to the client. Returns true when its output is
 * full and the upstream should stop reading. */
static bool conn_client_body(struct conn *c, struct evbuffer *src, size_t len)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);

	if (cf_has(c, CF(RESP_CHUNKED)))
		h1_chunk_move(out, src, len);
	else
		evbuffer_remove_buffer(src, out, len);
	return evbuffer_get_length(out) > CONN_HIGH;
}

static void conn_client_done(struct conn *c)
{
	reqlog_responded(&c->rl);
	if (cf_has(c, CF(RESP_CHUNKED)))
		h1_last_chunk(bufferevent_get_output(c->bev));
}

/* ---- client socket callbacks --------------------------------------- */

static void read_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);

	switch (c->state) {
	case CONN_ST_IDLE:
	case CONN_ST_READ_HEAD:
		conn_parse(c);
		break;
	case CONN_ST_TUNNEL:
		conn_tunnel_client_read(c);
		break;
	case CONN_ST_FORWARD:
		conn_pass_pump(c);	/* pipelined input waits once req_done */
		break;
	case CONN_ST_BODY:
		conn_keyed_body(c);
		break;
	case CONN_ST_DECIDE:
	case CONN_ST_CLAIM:
	case CONN_ST_SETTLE:
		break;		/* parser paused: the bytes wait */
	case CONN_ST_RESPOND:
	case CONN_ST_CLOSING:
	case CONN_ST_LINGER:
		/* nothing more will be read as a request */
		evbuffer_drain(in, evbuffer_get_length(in));
		break;
	case CONN_ST_CLOSED:
	default:
		log_error("conn %s: read in state %s", c->peer,
			  state_names[c->state]);
		abort();
	}
	conn_tls_pump_later(c);	/* records read ahead */
}

static void write_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;

	if (evbuffer_get_length(bufferevent_get_output(bev)) == 0 &&
	    c->state != CONN_ST_CLOSING &&
	    (bufferevent_get_enabled(bev) & EV_WRITE))
		bufferevent_disable(bev, EV_WRITE);	/* back to flush_cb */
	if (c->state == CONN_ST_CLOSING) {
		if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
			start_linger(c);
		return;
	}
	if (c->state == CONN_ST_TUNNEL) {
		conn_tunnel_client_write(c);
		return;
	}
	if (c->state != CONN_ST_FORWARD)
		return;
	if (c->mode == CONN_MODE_PASS && c->up != NULL)
		upstream_pause_read(c->up, false);
	else if (c->mode == CONN_MODE_KEYED && c->idem != NULL)
		idem_resume(c->idem);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct conn *c = arg;
	bool req_done = cf_has(c, CF(REQ_DONE));

	if (c->state == CONN_ST_LINGER) {
		conn_close(c, "linger done");
		return;
	}
	if (what & BEV_EVENT_CONNECTED) {
		conn_tls_established(c);
		return;
	}
	if (c->state == CONN_ST_TUNNEL) {
		conn_tunnel_client_event(c, what);
		return;
	}
	if (c->tls == CONN_TLS_HANDSHAKE) {
		conn_tls_failed(c, what);
		return;
	}
	if (what & BEV_EVENT_TIMEOUT) {
		if ((what & BEV_EVENT_READING) &&
		    h1_socket_readable(bufferevent_getfd(bev))) {
			/* late, not slow: the client's bytes are waiting */
			bufferevent_enable(bev, EV_READ);
			return;
		}
		if ((what & BEV_EVENT_READING) &&
		    (c->state == CONN_ST_FORWARD || c->state == CONN_ST_BODY) &&
		    !req_done && !cf_has(c, CF(RESP_STARTED))) {
			refuse(c, PROBLEM_REQUEST_TIMEOUT,
			       CLIENT_ERROR_REQUEST_TIMEOUT,
			       "the request body stopped arriving");
			return;
		}
		if (c->state == CONN_ST_IDLE)
			tls_close_notify(c->ssl);
		conn_close(c, (what & BEV_EVENT_READING) ? "idle timeout" :
							  "write timeout");
		return;
	}
	if ((what & BEV_EVENT_EOF) && c->state == CONN_ST_IDLE &&
	    evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
		/* half-closed after its last request: finish writing what is
		 * queued (a large replay), then close */
		start_closing(c);
		return;
	}
	if ((what & BEV_EVENT_EOF) && c->state == CONN_ST_SETTLE) {
		/* nothing more will come: the response is out */
		conn_end_request(c);
		return;
	}
	if ((what & BEV_EVENT_EOF) && req_done &&
	    (c->state == CONN_ST_FORWARD || c->state == CONN_ST_CLAIM)) {
		/* Half-close after a complete request: answer, then close. */
		cf_set(c, CF(CLIENT_EOF) | CF(CLOSE_AFTER));
		bufferevent_disable(bev, EV_READ);
		return;
	}
	conn_close(c, (what & BEV_EVENT_EOF) ? "client closed" : "client error");
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;

	if (c->state == CONN_ST_LINGER) {
		conn_close(c, "linger timeout");
		return;
	}
	if (c->tls == CONN_TLS_HANDSHAKE) {
		metrics_tls_error(TLS_ERROR_TIMEOUT);
		log_debug("conn %s: TLS handshake timed out", c->peer);
		conn_close(c, "tls handshake timeout");
		return;
	}
	if (c->state == CONN_ST_IDLE && c->tls == CONN_TLS_FIRST) {
		tls_close_notify(c->ssl);
		conn_close(c, "no request after the TLS handshake");
		return;
	}
	if (c->state == CONN_ST_READ_HEAD)
		refuse(c, PROBLEM_REQUEST_TIMEOUT, CLIENT_ERROR_REQUEST_TIMEOUT,
		       "the request head did not arrive in time");
	else if (c->state == CONN_ST_BODY)
		refuse(c, PROBLEM_REQUEST_TIMEOUT, CLIENT_ERROR_REQUEST_TIMEOUT,
		       "the request body did not arrive in time");
}

/* Pipelined input left after a response: see conn_end_request(). */
static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;

	if (c->state == CONN_ST_IDLE)
		conn_parse(c);
}

/*
 * Output is written straight to the socket at the end of the loop turn in
 * which it was queued, with one writev: no write event is armed (two
 * epoll_ctl calls and a loop turn per response) unless the socket does not
 * take everything. Then the bufferevent's write event carries on, and
 * write_cb turns it off again once the output is empty.
 */
static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	struct evbuffer *out = bufferevent_get_output(c->bev);

	c->flush_armed = false;
	if (c->state == CONN_ST_CLOSED || evbuffer_get_length(out) == 0 ||
	    (bufferevent_get_enabled(c->bev) & EV_WRITE))
		return;
	if (c->ssl != NULL) {
		tls_flush(c->bev);
		return;
	}
	/* a bufferevent keeps the front of its output frozen: only it drains */
	evbuffer_unfreeze(out, 1);
	(void)evbuffer_write(out, bufferevent_getfd(c->bev));
	evbuffer_freeze(out, 1);
	if (evbuffer_get_length(out) > 0) {
		bufferevent_enable(c->bev, EV_WRITE);	/* full, or an error */
		return;
	}
	write_cb(c->bev, c);	/* drained: what the write event would do */
}

/* Bytes were queued for the client: flush them at the end of this turn
 * (once: every add to the buffer lands here). */
static void output_added(struct evbuffer *buf, const struct evbuffer_cb_info *info,
			 void *arg)
{
	struct conn *c = arg;

	c->rl.bytes_out += info->n_added;
	if (info->n_added > 0 && !c->flush_armed &&
	    !(bufferevent_get_enabled(c->bev) & EV_WRITE)) {
		c->flush_armed = true;
		event_active(c->flush, EV_WRITE, 1);
	}
}

struct conn *conn_new(struct conn_loop *l, evutil_socket_t fd,
		      const struct sockaddr *peer, socklen_t peerlen)
{
	struct conn *c = calloc(1, sizeof(*c));
	int one = 1;

	if (c == NULL)
		goto fail;
	c->ops = &conn_ops_table;
	c->loop = l;
	c->method = -1;
	c->refused = -1;
	c->read_timeout_ms = RT_UNSET;
	if (l->tls != NULL) {
		if (conn_tls_accept(c, fd) < 0) {
			fd = -1;	/* closed with c->bev, or leaked (OOM) */
			goto fail;
		}
	} else {
		c->bev = bufferevent_socket_new(l->base, fd, BEV_OPT_CLOSE_ON_FREE);
	}
	if (c->bev == NULL)
		goto fail;
	fd = -1;	/* the bufferevent owns it now */
	c->timer = evtimer_new(l->base, timer_cb, c);
	c->kick = event_new(l->base, -1, 0, kick_cb, c);
	c->flush = event_new(l->base, -1, 0, flush_cb, c);
	if (c->timer == NULL || c->kick == NULL || c->flush == NULL ||
	    evbuffer_add_cb(bufferevent_get_output(c->bev), output_added, c) == NULL)
		goto fail;
	setsockopt(bufferevent_getfd(c->bev), IPPROTO_TCP, TCP_NODELAY, &one,
		   sizeof(one));
	if (peer->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)peer)->sin_addr,
			  c->peer, sizeof(c->peer));
	else if (peer->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)peer)->sin6_addr,
			  c->peer, sizeof(c->peer));
	else
		strcpy(c->peer, "unknown");
	h1_head_init(&c->head, l->cfg->max_header_size);
	llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings);
	c->parser.data = c;
	c->state = CONN_ST_IDLE;
	bufferevent_setcb(c->bev, read_cb, write_cb, event_cb, c);
	bufferevent_setwatermark(c->bev, EV_READ, 0, CONN_READ_HIGH);
	bufferevent_setwatermark(c->bev, EV_WRITE, CONN_LOW, 0);
	conn_read_timeout(c, l->cfg->idle_timeout_ms);
	if (c->tls == CONN_TLS_HANDSHAKE) {
		struct timeval tv = clock_tv(l->cfg->client_timeout_ms);

		evtimer_add(c->timer, &tv);
	}
	bufferevent_enable(c->bev, EV_READ);	/* writes: flush_cb */
	TAILQ_INSERT_TAIL(&l->conns, c, link);
	metrics_gauge_add(GAUGE_connections, 1);
	return c;
fail:
	if (c != NULL) {
		if (c->bev != NULL)
			bufferevent_free(c->bev);
		if (c->timer != NULL)
			event_free(c->timer);
		if (c->kick != NULL)
			event_free(c->kick);
		if (c->flush != NULL)
			event_free(c->flush);
		if (c->tls_pump != NULL)
			event_free(c->tls_pump);
		free(c);
	}
	if (fd >= 0)
		evutil_closesocket(fd);
	return NULL;
}
