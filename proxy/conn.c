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
 * Keyed requests are buffered whole (BODY, up to max_body), fingerprinted,
 * and handed to the idempotency engine (idem.c) which claims the key and
 * answers through the sink at the end of this file: a replay, a problem,
 * or the winner's upstream response. The winner's exchange belongs to the
 * engine, so closing this connection never aborts it.
 */
#include "conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <llhttp.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "config.h"
#include "fingerprint.h"
#include "idem.h"
#include "idemkey.h"
#include "keysrc.h"
#include "route.h"
#include "store.h"
#include "verify.h"
#include "httphdr.h"
#include "log.h"
#include "metrics.h"
#include "problem.h"
#include "upstream.h"
#include "worker.h"

/* Output above this pauses the side that fills it. */
#define CONN_HIGH (256 * 1024)
/* ... and below this resumes it. */
#define CONN_LOW (64 * 1024)
/* Pipelined bytes buffered while a request is in progress. */
#define CONN_READ_HIGH (64 * 1024)
/* After a close with unread input: how long to swallow it (lingering
 * close, so that the client reads our response instead of a reset). */
#define CONN_LINGER_S 2

enum conn_state {
	CONN_ST_IDLE,		/* keep-alive: waiting for a request's first byte */
	CONN_ST_READ_HEAD,	/* request line and header fields arriving */
	CONN_ST_DECIDE,		/* head complete, parser paused, deciding */
	CONN_ST_BODY,		/* keyed: buffering the body to fingerprint it */
	CONN_ST_CLAIM,		/* keyed: the engine claims, waits, decides */
	CONN_ST_FORWARD,	/* exchange with the upstream under way */
	CONN_ST_RESPOND,	/* a response of the proxy's own is queued */
	CONN_ST_SETTLE,		/* keyed: response out; the next request waits
				 * until the engine has recorded the outcome */
	CONN_ST_CLOSING,	/* flushing the output, then closing */
	CONN_ST_LINGER,		/* write side shut, swallowing input briefly */
	CONN_ST_CLOSED,		/* on the reap list */
};

static const char *const state_names[] = {
	"idle", "read_head", "decide", "body", "claim", "forward", "respond",
	"settle", "closing", "linger", "closed",
};

struct conn {
	struct worker *w;
	TAILQ_ENTRY(conn) link;
	struct bufferevent *bev;
	struct event *timer;		/* head timeout, then linger timeout */
	struct event *kick;		/* parse pipelined input next turn */
	struct event *flush;		/* write the output at the end of the turn */
	enum conn_state state;
	char peer[INET6_ADDRSTRLEN];
	llhttp_t parser;

	/* the request in progress; reset by end_request() */
	struct config *cfg;		/* a ref held for the request */
	struct hdrlist req;
	char *url;
	size_t url_len, url_cap;
	size_t head_bytes;
	enum problem head_problem;	/* why a parser callback failed */
	bool head_failed;
	int method;
	unsigned short http_major, http_minor;
	bool keep_alive;		/* the client allows another request */
	enum body_kind req_body;
	uint64_t req_remaining;		/* BODY_LENGTH */
	bool req_done;			/* the whole request is read */
	bool client_paused;		/* reading stopped: upstream is full */
	bool client_eof;		/* the client half-closed after sending */

	/* keyed requests (DESIGN.md §1 items 2-10, §4) */
	const struct policy *policy;	/* the route's, or the global one */
	const char *route;		/* its name, or NULL */
	bool key_pending;		/* the key comes from the body */
	struct store_op *issue_op;	/* GET /.well-known/idempotency-key */
	bool keyed;			/* the engine decides this request */
	char key[IDEMKEY_MAX + 1];
	struct evbuffer *body;		/* the buffered body while BODY */
	bool body_too_large;
	bool expect_answered;		/* we sent 100 Continue ourselves */
	struct idem *idem;		/* the engine's handle, or NULL */

	struct upstream *up;		/* a pass-through exchange, or NULL */
	struct timespec up_start;
	bool retried;			/* one retry on a stale pooled connection */
	bool resp_started;		/* final response head sent to client */
	bool resp_chunked;		/* we chunk the body for the client */
	bool resp_done;
	bool close_after;		/* close once this response is out */
	bool draining;
	enum outcome outcome;
};

static void conn_parse(struct conn *c);
static void pump_body(struct conn *c);
static void decide(struct conn *c);
static bool key_unusable(struct conn *c, bool missing);
static void answer_upstream_error(struct conn *c, enum upstream_error err);
static void end_request(struct conn *c);
static void conn_close(struct conn *c, const char *reason);

static const struct upstream_cbs up_cbs;

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
			1u << CONN_ST_SETTLE | 1u << CONN_ST_CLOSING,
		[CONN_ST_RESPOND] = 1u << CONN_ST_IDLE | 1u << CONN_ST_SETTLE |
			1u << CONN_ST_CLOSING,
		[CONN_ST_SETTLE] = 1u << CONN_ST_IDLE | 1u << CONN_ST_CLOSING,
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

static void set_read_timeout(struct conn *c, uint64_t ms)
{
	struct timeval rd = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000 };
	uint64_t wms = c->w->cfg->idle_timeout_ms;
	struct timeval wr = { (time_t)(wms / 1000), (suseconds_t)(wms % 1000) * 1000 };

	bufferevent_set_timeouts(c->bev, ms ? &rd : NULL, &wr);
}

static double elapsed_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) +
	       (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

/* ---- responses of our own ------------------------------------------- */

/*
 * Answer the current request with a problem document. `close` forces
 * Connection: close; so does a request whose body was not read in full.
 */
/*
 * Queue the problem response; returns false when the connection was cut
 * instead (a response was already under way).
 */
static bool write_problem(struct conn *c, enum problem p, const char *detail,
			  bool close)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);
	char body[1024];
	size_t len = problem_render(p, detail, body, sizeof(body));
	int status = problem_status(p);

	if (c->up != NULL) {
		upstream_abort(c->up);
		c->up = NULL;
	}
	if (close || !c->req_done || !c->keep_alive || c->draining)
		c->close_after = true;
	if (c->resp_started) {
		/* The client already has part of another response: all we
		 * can do is cut the connection. */
		conn_close(c, problem_slug(p));
		return false;
	}
	evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n"
			    "Content-Type: application/problem+json\r\n"
			    "Content-Length: %zu\r\n%s%s\r\n",
			    status, http_reason(status), len,
			    (status == 503 || p == PROBLEM_IN_PROGRESS) ?
				    "Retry-After: 1\r\n" : "",
			    c->close_after ? "Connection: close\r\n" : "");
	evbuffer_add(out, body, len);
	log_debug("conn %s: %d %s", c->peer, status, problem_slug(p));
	c->resp_started = true;
	c->resp_done = true;
	conn_set_state(c, CONN_ST_RESPOND);
	return true;
}

static void respond_problem(struct conn *c, enum problem p, const char *detail,
			    bool close)
{
	if (write_problem(c, p, detail, close))
		end_request(c);
}

/* A request that never became one: bad syntax, too large, too slow. */
static void refuse(struct conn *c, enum problem p, enum client_error e,
		   const char *detail)
{
	metrics_client_error(e);
	c->method = -1;		/* not counted as a request */
	c->req_done = false;	/* forces the close */
	respond_problem(c, p, detail, true);
}

/* ---- lifecycle --------------------------------------------------------- */

/* Return a connection whose output has drained to the closed state: shut
 * the write side and swallow input for a moment, so that a client still
 * sending (a body we refused) reads our response rather than a reset. */
static void start_linger(struct conn *c)
{
	struct timeval tv = { CONN_LINGER_S, 0 };
	evutil_socket_t fd = bufferevent_getfd(c->bev);

	conn_set_state(c, CONN_ST_LINGER);
	if (shutdown(fd, SHUT_WR) < 0) {
		conn_close(c, "shutdown");
		return;
	}
	evbuffer_drain(bufferevent_get_input(c->bev),
		       evbuffer_get_length(bufferevent_get_input(c->bev)));
	bufferevent_set_timeouts(c->bev, NULL, NULL);
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

/*
 * Close now and put the connection on the reap list: the memory is freed on
 * the next loop turn, after every callback that might still look at it has
 * returned.
 */
static void conn_close(struct conn *c, const char *reason)
{
	if (c->state == CONN_ST_CLOSED)
		return;
	log_debug("conn %s: close (%s) in %s", c->peer, reason,
		  state_names[c->state]);
	if (c->up != NULL) {
		upstream_abort(c->up);
		c->up = NULL;
	}
	if (c->idem != NULL) {
		idem_detach(c->idem);	/* a winner goes on without us */
		c->idem = NULL;
	}
	if (c->issue_op != NULL) {
		store_cancel(c->issue_op);
		c->issue_op = NULL;
	}
	evtimer_del(c->timer);
	event_del(c->kick);
	event_del(c->flush);
	bufferevent_disable(c->bev, EV_READ | EV_WRITE);
	bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
	conn_set_state(c, CONN_ST_CLOSED);
	TAILQ_REMOVE(&c->w->conns, c, link);
	TAILQ_INSERT_TAIL(&c->w->reap, c, link);
	worker_reap_later(c->w);
}

struct conn *conn_next(struct conn *c)
{
	return TAILQ_NEXT(c, link);
}

void conn_free(struct conn *c)
{
	TAILQ_REMOVE(&c->w->reap, c, link);
	if (c->cfg != NULL)
		config_unref(c->cfg);
	bufferevent_free(c->bev);
	event_free(c->timer);
	event_free(c->kick);
	event_free(c->flush);
	hdrlist_free(&c->req);
	if (c->body != NULL)
		evbuffer_free(c->body);
	free(c->url);
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
	hdrlist_reset(&c->req);
	if (c->url_cap > 1024) {
		free(c->url);
		c->url = NULL;
		c->url_cap = 0;
	}
	c->url_len = 0;
	c->head_bytes = 0;
	c->head_failed = false;
	c->req_body = BODY_NONE;
	c->req_remaining = 0;
	c->req_done = false;
	c->client_paused = false;
	c->retried = false;
	c->resp_started = false;
	c->resp_chunked = false;
	c->resp_done = false;
	c->outcome = OUTCOME_PASSTHROUGH;
	c->keyed = false;
	c->policy = NULL;
	c->route = NULL;
	c->key_pending = false;
	c->body_too_large = false;
	c->expect_answered = false;
	if (c->body != NULL) {
		evbuffer_free(c->body);
		c->body = NULL;
	}
	llhttp_init(&c->parser, HTTP_REQUEST, c->parser.settings);
	c->parser.data = c;
}

/*
 * The response is out (queued) and the request consumed, or the request was
 * answered by the proxy. Count it, then either wait for the next request or
 * close.
 */
static void end_request(struct conn *c)
{
	if (c->idem != NULL) {
		/* closing: the engine records the outcome on its own */
		idem_detach(c->idem);
		c->idem = NULL;
	}
	if (c->method >= 0)
		metrics_outcome(c->outcome);
	c->method = -1;
	if (c->close_after || c->client_eof || c->draining) {
		reset_request(c);
		start_closing(c);
		return;
	}
	reset_request(c);
	conn_set_state(c, CONN_ST_IDLE);
	bufferevent_enable(c->bev, EV_READ);
	set_read_timeout(c, c->w->cfg->idle_timeout_ms);
	/* Pipelined requests are parsed on the next loop turn (kick_cb), not
	 * here: we may be deep inside an upstream callback. */
	if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
		event_active(c->kick, EV_TIMEOUT, 1);
}

void conn_drain(struct conn *c)
{
	c->draining = true;
	if (c->state == CONN_ST_IDLE)
		conn_close(c, "draining");
}

void conn_abort(struct conn *c)
{
	conn_close(c, "drain timeout");
}

/* ---- request parsing ----------------------------------------------------- */

static bool head_grow(struct conn *c, size_t len)
{
	c->head_bytes += len;
	if (c->head_bytes > c->cfg->max_header_size) {
		c->head_problem = PROBLEM_HEADERS_TOO_LARGE;
		c->head_failed = true;
		return false;
	}
	return true;
}

static int on_message_begin(llhttp_t *p)
{
	struct conn *c = p->data;
	uint64_t ms;
	struct timeval tv;

	conn_set_state(c, CONN_ST_READ_HEAD);
	c->cfg = config_ref(c->w->cfg);
	ms = c->cfg->client_timeout_ms;
	tv.tv_sec = (time_t)(ms / 1000);
	tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
	set_read_timeout(c, 0);
	evtimer_add(c->timer, &tv);
	return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
	struct conn *c = p->data;

	if (!head_grow(c, len))
		return -1;
	if (c->url_len + len + 1 > c->url_cap) {
		size_t cap = c->url_cap ? c->url_cap : 128;
		char *u;

		while (cap < c->url_len + len + 1)
			cap *= 2;
		u = realloc(c->url, cap);
		if (u == NULL)
			return -1;
		c->url = u;
		c->url_cap = cap;
	}
	memcpy(c->url + c->url_len, at, len);
	c->url_len += len;
	c->url[c->url_len] = '\0';
	return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct conn *c = p->data;

	if (!head_grow(c, len) || hdrlist_add_name(&c->req, at, len) < 0)
		return -1;
	return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	struct conn *c = p->data;

	if (!head_grow(c, len) || hdrlist_add_value(&c->req, at, len) < 0)
		return -1;
	return 0;
}

static int on_header_value_complete(llhttp_t *p)
{
	struct conn *c = p->data;

	return hdrlist_end_field(&c->req) < 0 ? -1 : 0;
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
	struct evbuffer *out;

	if (c->state == CONN_ST_BODY) {
		if (evbuffer_get_length(c->body) + len > c->policy->max_body) {
			c->body_too_large = true;
			return -1;
		}
		return evbuffer_add(c->body, at, len) < 0 ? -1 : 0;
	}
	if (c->up == NULL)
		return 0;	/* answered already; swallow the rest */
	out = upstream_output(c->up);
	if (evbuffer_add_printf(out, "%zx\r\n", len) < 0 ||
	    evbuffer_add(out, at, len) < 0 || evbuffer_add(out, "\r\n", 2) < 0)
		return -1;
	return 0;
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

/*
 * Run llhttp over the buffered input until it pauses (end of head, end of a
 * chunked body), fails, or the input runs out. Returns 1 when paused, 0 when
 * more input is needed, -1 after answering a parse error.
 */
static int feed_parser(struct conn *c)
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
			evbuffer_drain(in, v.iov_len);
			continue;
		case HPE_PAUSED:
		case HPE_PAUSED_UPGRADE:
			used = (size_t)(llhttp_get_error_pos(&c->parser) -
					(const char *)v.iov_base);
			evbuffer_drain(in, used);
			return 1;
		default:
			if (c->body_too_large) {
				c->outcome = OUTCOME_TOO_LARGE;
				respond_problem(c, PROBLEM_BODY_TOO_LARGE,
						"the request body is larger than max_body",
						true);
			} else if (c->head_failed) {
				refuse(c, c->head_problem,
				       CLIENT_ERROR_HEADERS_TOO_LARGE,
				       "the request head is larger than max_header_size");
			} else {
				char detail[160];

				snprintf(detail, sizeof(detail), "malformed request: %s",
					 llhttp_get_error_reason(&c->parser));
				refuse(c, PROBLEM_BAD_REQUEST,
				       CLIENT_ERROR_BAD_REQUEST, detail);
			}
			return -1;
		}
	}
	return 0;
}

/* ---- forwarding ---------------------------------------------------------- */

static void write_forwarded_for(struct conn *c, struct evbuffer *out)
{
	const struct hdrlist *h = &c->req;
	bool first = true;

	evbuffer_add(out, "X-Forwarded-For: ", 17);
	for (int i = hdrlist_find(h, "x-forwarded-for", 0); i >= 0;
	     i = hdrlist_find(h, "x-forwarded-for", (uint32_t)i + 1)) {
		if (h->v[i].value_len == 0)
			continue;
		if (!first)
			evbuffer_add(out, ", ", 2);
		evbuffer_add(out, hdr_value(h, (uint32_t)i), h->v[i].value_len);
		first = false;
	}
	evbuffer_add_printf(out, "%s%s\r\n", first ? "" : ", ", c->peer);
}

/* The request-target in origin form, or NULL when it cannot be forwarded.
 * An absolute-form target ("http://host/path") is cut to its path. */
static const char *origin_target(struct conn *c)
{
	const char *t = c->url;

	if (t == NULL)
		return NULL;
	if (t[0] == '/')
		return t;
	if (strcmp(t, "*") == 0 && c->method == HTTP_OPTIONS)
		return t;
	if (strncasecmp(t, "http://", 7) == 0) {
		const char *path = strchr(t + 7, '/');

		return path != NULL ? path : "/";
	}
	return NULL;
}

/*
 * Write the request head for the upstream into out. A keyed request goes
 * with its buffered body: Content-Length body_len, and no Expect (the proxy
 * answered it).
 */
static void write_request_head(struct conn *c, struct evbuffer *out,
			       const char *target, bool keyed, size_t body_len)
{
	const struct hdrlist *h = &c->req;
	int host = hdrlist_find(h, "host", 0);

	evbuffer_add_printf(out, "%s %s%s HTTP/1.1\r\n",
			    llhttp_method_name((llhttp_method_t)c->method),
			    c->cfg->upstream_prefix,
			    strcmp(target, "*") == 0 && c->cfg->upstream_prefix[0] ?
				    "" : target);
	for (uint32_t i = 0; i < h->n; i++) {
		if (httphdr_drop_on_forward(h, i) ||
		    (h->v[i].name_len == 15 &&
		     strcasecmp(hdr_name(h, i), "x-forwarded-for") == 0) ||
		    (keyed && h->v[i].name_len == 6 &&
		     strcasecmp(hdr_name(h, i), "expect") == 0))
			continue;
		evbuffer_add(out, hdr_name(h, i), h->v[i].name_len);
		evbuffer_add(out, ": ", 2);
		evbuffer_add(out, hdr_value(h, i), h->v[i].value_len);
		evbuffer_add(out, "\r\n", 2);
	}
	if (host < 0)
		evbuffer_add_printf(out, "Host: %s:%s\r\n",
				    c->cfg->upstream_hp.host, c->cfg->upstream_hp.port);
	write_forwarded_for(c, out);
	if (hdrlist_find(h, "x-forwarded-proto", 0) < 0)
		evbuffer_add(out, "X-Forwarded-Proto: http\r\n", 25);
	if (host >= 0 && hdrlist_find(h, "x-forwarded-host", 0) < 0)
		evbuffer_add_printf(out, "X-Forwarded-Host: %s\r\n",
				    hdr_value(h, (uint32_t)host));
	if (keyed) {
		if (c->req_body != BODY_NONE)
			evbuffer_add_printf(out, "Content-Length: %zu\r\n", body_len);
		evbuffer_add(out, "\r\n", 2);
		return;
	}
	switch (c->req_body) {
	case BODY_LENGTH:
		/* called before pump_body moved anything: the full length */
		evbuffer_add_printf(out, "Content-Length: %llu\r\n",
				    (unsigned long long)c->req_remaining);
		break;
	case BODY_CHUNKED:
		evbuffer_add(out, "Transfer-Encoding: chunked\r\n", 28);
		break;
	default:
		break;
	}
	evbuffer_add(out, "\r\n", 2);
}

static bool idempotent_method(int method)
{
	return method == HTTP_GET || method == HTTP_HEAD ||
	       method == HTTP_OPTIONS || method == HTTP_TRACE;
}

/* Open the exchange and send the head; the body follows in pump_body. */
static int start_exchange(struct conn *c, bool fresh)
{
	const char *target = origin_target(c);

	c->up = upstream_acquire(c->w->pool, &up_cbs, c,
				 c->cfg->upstream_timeout_ms,
				 c->method == HTTP_HEAD, fresh);
	if (c->up == NULL)
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &c->up_start);
	write_request_head(c, upstream_output(c->up), target, false, 0);
	return 0;
}

/* The whole request has been read and queued for the upstream. */
static void request_complete(struct conn *c)
{
	c->req_done = true;
	set_read_timeout(c, 0);
	if (c->client_paused) {
		c->client_paused = false;
		bufferevent_enable(c->bev, EV_READ);
	}
	if (c->up != NULL)
		upstream_request_sent(c->up);
}

/*
 * Move request body bytes from the client to the upstream, as far as the
 * input and the upstream's buffer allow.
 */
static void pump_body(struct conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);

	if (c->req_done || c->state != CONN_ST_FORWARD || c->up == NULL)
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
		int rc = feed_parser(c);

		if (rc < 0)
			return;
		if (rc == 1) {
			evbuffer_add(upstream_output(c->up), "0\r\n\r\n", 5);
			request_complete(c);
			return;
		}
	}
	if (c->up != NULL && upstream_output_pending(c->up) > CONN_HIGH &&
	    !c->client_paused) {
		c->client_paused = true;
		bufferevent_disable(c->bev, EV_READ);
	}
}

/* Forward the request as it is (DESIGN.md §1 item 1). */
static void conn_forward(struct conn *c)
{
	conn_set_state(c, CONN_ST_FORWARD);
	if (start_exchange(c, false) < 0) {
		metrics_upstream_error(UPSTREAM_ERROR_CONNECT);
		respond_problem(c, PROBLEM_UPSTREAM_UNAVAILABLE,
				"cannot open a connection to the upstream", false);
		return;
	}
	if (c->req_body == BODY_NONE) {
		request_complete(c);
		return;
	}
	set_read_timeout(c, c->cfg->client_timeout_ms);
	if (c->req_body == BODY_CHUNKED)
		llhttp_resume(&c->parser);
	pump_body(c);
}

/* Is the request's Connection field asking for keep-alive? */
static bool request_keep_alive(struct conn *c)
{
	const struct hdrlist *h = &c->req;
	bool keep = c->http_major == 1 && c->http_minor >= 1;

	for (int i = hdrlist_find(h, "connection", 0); i >= 0;
	     i = hdrlist_find(h, "connection", (uint32_t)i + 1)) {
		if (httphdr_list_has(hdr_value(h, (uint32_t)i),
				     h->v[i].value_len, "close"))
			return false;
		if (httphdr_list_has(hdr_value(h, (uint32_t)i),
				     h->v[i].value_len, "keep-alive"))
			keep = true;
	}
	return keep;
}

/*
 * The head is complete and the parser paused. Check what llhttp leaves to
 * us, then decide what to do with the request.
 */
static void head_complete(struct conn *c)
{
	llhttp_t *p = &c->parser;
	int host;

	evtimer_del(c->timer);
	conn_set_state(c, CONN_ST_DECIDE);
	c->method = p->method;
	c->http_major = p->http_major;
	c->http_minor = p->http_minor;
	c->keep_alive = request_keep_alive(c);

	if (httphdr_validate(&c->req) < 0) {
		refuse(c, PROBLEM_BAD_REQUEST, CLIENT_ERROR_BAD_REQUEST,
		       "malformed header field");
		return;
	}
	host = hdrlist_find(&c->req, "host", 0);
	if ((host >= 0 && hdrlist_find(&c->req, "host", (uint32_t)host + 1) >= 0) ||
	    (host < 0 && c->http_minor >= 1)) {
		refuse(c, PROBLEM_BAD_REQUEST, CLIENT_ERROR_BAD_REQUEST,
		       "a request needs exactly one Host field");
		return;
	}
	if (c->method == HTTP_CONNECT) {
		refuse(c, PROBLEM_NOT_IMPLEMENTED, CLIENT_ERROR_BAD_REQUEST,
		       "CONNECT is not supported");
		return;
	}
	if (origin_target(c) == NULL) {
		refuse(c, PROBLEM_BAD_REQUEST, CLIENT_ERROR_BAD_REQUEST,
		       "unsupported request-target form");
		return;
	}
	if (p->flags & F_CHUNKED) {
		c->req_body = BODY_CHUNKED;
	} else if (p->flags & F_CONTENT_LENGTH) {
		c->req_body = BODY_LENGTH;
		c->req_remaining = p->content_length;
	} else {
		c->req_body = BODY_NONE;
	}
	/* From here the parser sees the body only when it is chunked; for the
	 * rest it must start afresh at the next request. */
	if (c->req_body != BODY_CHUNKED) {
		llhttp_init(p, HTTP_REQUEST, &parser_settings);
		p->data = c;
	}
	decide(c);
}

/* Parse what the client sent while no exchange is in progress. */
static void conn_parse(struct conn *c)
{
	while (c->state == CONN_ST_IDLE || c->state == CONN_ST_READ_HEAD) {
		int rc = feed_parser(c);

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

/* ---- upstream callbacks ---------------------------------------------- */

/* Write a response head (interim or final) from the upstream. */
static void client_head(struct conn *c, const struct upstream_resp *r)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);
	const struct hdrlist *h = r->headers;
	bool interim = r->status < 200;
	bool keep_cl = c->method == HTTP_HEAD || r->status == 304;

	if (interim && (c->http_minor == 0 || c->resp_started))
		return;		/* HTTP/1.0 clients get no 1xx */
	if (!interim) {
		if (!c->req_done || !c->keep_alive || c->draining)
			c->close_after = true;
		if (r->body == BODY_CHUNKED || r->body == BODY_EOF) {
			if (c->http_minor >= 1)
				c->resp_chunked = true;
			else
				c->close_after = true;
		}
		c->resp_started = true;
	}
	evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", r->status,
			    http_reason(r->status));
	for (uint32_t i = 0; i < h->n; i++) {
		bool is_cl = h->v[i].name_len == 14 &&
			     strcasecmp(hdr_name(h, i), "content-length") == 0;

		if (httphdr_drop_on_forward(h, i) && !(is_cl && keep_cl))
			continue;
		evbuffer_add(out, hdr_name(h, i), h->v[i].name_len);
		evbuffer_add(out, ": ", 2);
		evbuffer_add(out, hdr_value(h, i), h->v[i].value_len);
		evbuffer_add(out, "\r\n", 2);
	}
	if (!interim) {
		if (r->body == BODY_LENGTH)
			evbuffer_add_printf(out, "Content-Length: %llu\r\n",
					    (unsigned long long)r->content_length);
		else if (c->resp_chunked)
			evbuffer_add(out, "Transfer-Encoding: chunked\r\n", 28);
		if (c->close_after)
			evbuffer_add(out, "Connection: close\r\n", 19);
		else if (c->http_minor == 0)
			evbuffer_add(out, "Connection: keep-alive\r\n", 24);
	}
	evbuffer_add(out, "\r\n", 2);
}

/* Move len body bytes to the client. Returns true when its output is
 * full and the upstream should stop reading. */
static bool client_body(struct conn *c, struct evbuffer *src, size_t len)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);

	if (c->resp_chunked)
		evbuffer_add_printf(out, "%zx\r\n", len);
	evbuffer_remove_buffer(src, out, len);
	if (c->resp_chunked)
		evbuffer_add(out, "\r\n", 2);
	return evbuffer_get_length(out) > CONN_HIGH;
}

static void client_done(struct conn *c)
{
	if (c->resp_chunked)
		evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5);
	c->resp_done = true;
}

static void up_on_head(void *arg, const struct upstream_resp *r)
{
	client_head(arg, r);
}

static void up_on_body(void *arg, struct evbuffer *src, size_t len)
{
	struct conn *c = arg;

	if (client_body(c, src, len))
		upstream_pause_read(c->up, true);
}

static void up_on_done(void *arg)
{
	struct conn *c = arg;

	client_done(c);
	metrics_observe(HISTOGRAM_upstream_seconds, elapsed_since(&c->up_start));
	if (!c->req_done) {
		/* The upstream answered before reading the whole body. The
		 * connection cannot carry another request. */
		upstream_abort(c->up);
		c->up = NULL;
		c->close_after = true;
		end_request(c);
		return;
	}
	upstream_release(c->up);
	c->up = NULL;
	end_request(c);
}

static void up_on_error(void *arg, enum upstream_error err, bool retryable)
{
	struct conn *c = arg;

	c->up = NULL;
	if (retryable && !c->retried && !c->resp_started &&
	    c->req_body == BODY_NONE && idempotent_method(c->method)) {
		/* A pooled connection the upstream had closed: nothing was
		 * executed, and a request without a body can be sent again. */
		c->retried = true;
		if (start_exchange(c, true) == 0) {
			upstream_request_sent(c->up);
			return;
		}
	}
	log_warn("conn %s: upstream %s on %s %s", c->peer,
		 upstream_error_name(err),
		 llhttp_method_name((llhttp_method_t)c->method), c->url);
	answer_upstream_error(c, err);
}

/* 502 or 504 for a failed exchange (or a cut connection mid-response). */
static void answer_upstream_error(struct conn *c, enum upstream_error err)
{
	if (err == UPSTREAM_ERROR_TIMEOUT)
		respond_problem(c, PROBLEM_UPSTREAM_TIMEOUT,
				"the upstream did not answer in time", false);
	else
		respond_problem(c, PROBLEM_UPSTREAM_UNAVAILABLE,
				"the upstream connection failed", false);
}

static void up_on_drain(void *arg)
{
	struct conn *c = arg;

	if (!c->client_paused)
		return;
	c->client_paused = false;
	bufferevent_enable(c->bev, EV_READ);
	pump_body(c);
}

static const struct upstream_cbs up_cbs = {
	.on_head = up_on_head,
	.on_body = up_on_body,
	.on_done = up_on_done,
	.on_error = up_on_error,
	.on_drain = up_on_drain,
};

/* ---- keyed requests: the idempotency engine's client side -------------- */

/* Answer with a problem and count the request's outcome. */
static void answer(struct conn *c, enum problem p, const char *detail,
		   enum outcome o)
{
	c->outcome = o;
	respond_problem(c, p, detail, false);
}

/* evbuffer_add_reference's cleanup: the replay has been written out. */
static void unref_stored(const void *data, size_t len, void *extra)
{
	stored_response_unref(extra);
}

static void sink_replay(void *client, struct stored_response *r)
{
	struct conn *c = client;
	struct evbuffer *out = bufferevent_get_output(c->bev);

	c->idem = NULL;
	c->outcome = OUTCOME_REPLAYED;
	if (!c->keep_alive || c->draining)
		c->close_after = true;
	evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", r->status,
			    http_reason(r->status));
	evbuffer_add(out, r->head, r->head_len);
	if (c->method == HTTP_HEAD || r->status == 204 || r->status == 304 ||
	    r->status < 200)
		evbuffer_add(out, "Idempotent-Replayed: true\r\n", 27);
	else
		evbuffer_add_printf(out, "Content-Length: %zu\r\n"
				    "Idempotent-Replayed: true\r\n", r->body_len);
	if (c->close_after)
		evbuffer_add(out, "Connection: close\r\n", 19);
	else if (c->http_minor == 0)
		evbuffer_add(out, "Connection: keep-alive\r\n", 24);
	evbuffer_add(out, "\r\n", 2);
	/* one stored body, shared by every replay in progress */
	if (r->body_len > 0 && c->method != HTTP_HEAD &&
	    evbuffer_add_reference(out, r->body, r->body_len, unref_stored,
				   stored_response_ref(r)) < 0)
		stored_response_unref(r);
	c->resp_started = true;
	c->resp_done = true;
	conn_set_state(c, CONN_ST_RESPOND);
	end_request(c);
}

static void sink_problem(void *client, enum problem p, const char *detail,
			 enum outcome o)
{
	struct conn *c = client;

	c->idem = NULL;
	answer(c, p, detail, o);
}

static void sink_forwarding(void *client, enum outcome o)
{
	struct conn *c = client;

	c->outcome = o;
	conn_set_state(c, CONN_ST_FORWARD);
}

static void sink_head(void *client, const struct upstream_resp *r)
{
	client_head(client, r);
}

static bool sink_body(void *client, struct evbuffer *src, size_t len)
{
	return client_body(client, src, len);
}

/*
 * The response is complete and queued. A connection that stays open waits
 * (SETTLE) for the engine to record the outcome before it reads the next
 * request: a client that sends the duplicate the moment it has the
 * response, on the same connection, gets the replay and never a spurious
 * 409 for a request that is over. The response itself is not delayed.
 */
static void hold_for_settle(struct conn *c)
{
	if (c->close_after || c->client_eof || c->draining) {
		end_request(c);		/* nothing more will be read */
		return;
	}
	conn_set_state(c, CONN_ST_SETTLE);
}

static void sink_done(void *client)
{
	struct conn *c = client;

	client_done(c);
	hold_for_settle(c);
}

static void sink_failed(void *client, enum upstream_error err)
{
	struct conn *c = client;

	if (write_problem(c, err == UPSTREAM_ERROR_TIMEOUT ?
				  PROBLEM_UPSTREAM_TIMEOUT :
				  PROBLEM_UPSTREAM_UNAVAILABLE,
			  err == UPSTREAM_ERROR_TIMEOUT ?
				  "the upstream did not answer in time" :
				  "the upstream connection failed", false))
		hold_for_settle(c);
}

static void sink_settled(void *client)
{
	struct conn *c = client;

	c->idem = NULL;
	if (c->state == CONN_ST_SETTLE)
		end_request(c);
}

static const struct idem_sink conn_sink = {
	.replay = sink_replay,
	.problem = sink_problem,
	.forwarding = sink_forwarding,
	.head = sink_head,
	.body = sink_body,
	.done = sink_done,
	.failed = sink_failed,
	.settled = sink_settled,
};

/* ---- key issuing (DESIGN.md §4, article §4.3 and §6) -------------------- */

#define ISSUE_PATH "/.well-known/idempotency-key"
/* Issued keys live in the store under this scope, which no hashed scope
 * nor the global one can equal. */
#define ISSUED_SCOPE "!issued"

static bool is_issue_path(const char *url)
{
	size_t n = strcspn(url, "?");

	return n == sizeof(ISSUE_PATH) - 1 && memcmp(url, ISSUE_PATH, n) == 0;
}

/* How long an issued key's marker must live: the longest issued_key_ttl of
 * the global settings and every route. */
static uint64_t issued_marker_ttl(const struct config *cfg)
{
	uint64_t ttl = cfg->issued_key_ttl_ms;

	for (int i = 0; i < cfg->nroutes; i++)
		if (cfg->routes[i].policy.issued_key_ttl_ms > ttl)
			ttl = cfg->routes[i].policy.issued_key_ttl_ms;
	return ttl;
}

/* The issue time a key of ours carries after its last '.', or 0. */
static time_t issued_time(const char *key)
{
	const char *dot = strrchr(key, '.');
	long long t = 0;

	if (dot == NULL || dot[1] == '\0' || strlen(dot + 1) > 12)
		return 0;
	for (const char *p = dot + 1; *p != '\0'; p++) {
		if (*p < '0' || *p > '9')
			return 0;
		t = t * 10 + (*p - '0');
	}
	return (time_t)t;
}

static void on_issued(void *arg, const struct store_result *res)
{
	struct conn *c = arg;
	struct evbuffer *out = bufferevent_get_output(c->bev);

	c->issue_op = NULL;
	if (res->status != STORE_WON) {
		answer(c, PROBLEM_STORE_UNAVAILABLE, "cannot record the issued key",
		       OUTCOME_STORE_UNAVAILABLE);
		return;
	}
	c->outcome = OUTCOME_KEY_ISSUED;
	if (!c->keep_alive || c->draining)
		c->close_after = true;
	evbuffer_add_printf(out, "HTTP/1.1 200 OK\r\n"
			    "Content-Type: application/json\r\n"
			    "Cache-Control: no-store\r\n"
			    "Content-Length: %zu\r\n%s\r\n{\"key\":\"%s\"}",
			    strlen(c->key) + 10,
			    c->close_after ? "Connection: close\r\n" : "", c->key);
	c->resp_started = true;
	c->resp_done = true;
	conn_set_state(c, CONN_ST_RESPOND);
	end_request(c);
}

/*
 * GET /.well-known/idempotency-key: a fresh key for a form to submit with.
 * 128 random bits, URL-safe base64, then "." and the issue time (seconds):
 * routes with require_issued_key accept only keys recorded here, within
 * their issued_key_ttl of the issue time.
 */
static void issue_key(struct conn *c)
{
	unsigned char raw[16], b64[32];
	struct store_claim m = { 0 };
	int n;

	if (RAND_bytes(raw, sizeof(raw)) != 1) {
		answer(c, PROBLEM_STORE_UNAVAILABLE, "no randomness",
		       OUTCOME_STORE_UNAVAILABLE);
		return;
	}
	n = EVP_EncodeBlock(b64, raw, sizeof(raw));
	while (n > 0 && b64[n - 1] == '=')
		n--;
	for (int i = 0; i < n; i++)
		b64[i] = b64[i] == '+' ? '-' : b64[i] == '/' ? '_' : b64[i];
	snprintf(c->key, sizeof(c->key), "%.*s.%lld", n, (char *)b64,
		 (long long)time(NULL));
	snprintf(m.key.scope, sizeof(m.key.scope), "%s", ISSUED_SCOPE);
	snprintf(m.key.key, sizeof(m.key.key), "%s", c->key);
	m.lease_ms = issued_marker_ttl(c->cfg);
	m.ttl_ms = m.lease_ms;
	conn_set_state(c, CONN_ST_CLAIM);
	c->issue_op = store_claim(c->w->store, c->w->base, &m, on_issued, c);
	if (c->issue_op == NULL)
		answer(c, PROBLEM_STORE_UNAVAILABLE, "cannot record the issued key",
		       OUTCOME_STORE_UNAVAILABLE);
}

/*
 * Is the body of this media type? For json, any "+json" suffix type counts
 * (application/problem+json). Parameters (charset) are ignored.
 */
static bool content_type_is(struct conn *c, const char *type)
{
	int i = hdrlist_find(&c->req, "content-type", 0);
	const char *v, *end;
	size_t n, tn = strlen(type);

	if (i < 0)
		return false;
	v = hdr_value(&c->req, (uint32_t)i);
	while (*v == ' ' || *v == '\t')
		v++;
	end = v + strcspn(v, "; \t");
	n = (size_t)(end - v);
	if (n == tn && strncasecmp(v, type, n) == 0)
		return true;
	return strcmp(type, "application/json") == 0 && n > 17 &&
	       strncasecmp(v, "application/", 12) == 0 &&
	       strncasecmp(end - 5, "+json", 5) == 0;
}

/* keys are namespaced by the SHA-256 of the scope header's value */
static void scope_of(struct conn *c, char scope[STORE_SCOPE_LEN + 1])
{
	const struct policy *p = c->policy;
	unsigned char md[32];
	const char *v = "";
	size_t len = 0;
	int i;

	scope[0] = '\0';
	if (p->scope_header == NULL)
		return;
	i = hdrlist_find(&c->req, p->scope_header, 0);
	if (i >= 0) {
		v = hdr_value(&c->req, (uint32_t)i);
		len = c->req.v[i].value_len;
	}
	SHA256((const unsigned char *)v, len, md);
	for (int k = 0; k < 32; k++)
		snprintf(scope + 2 * k, 3, "%02x", md[k]);
}


/* The body is buffered: fingerprint it and hand the request to the engine. */
static void start_claim(struct conn *c)
{
	const struct policy *p = c->policy;
	struct evbuffer_iovec v[64], *iov = v;
	struct idem_request req = { 0 };
	size_t body_len = evbuffer_get_length(c->body);
	const char *body;
	int n, k;

	c->req_done = true;
	set_read_timeout(c, 0);
	conn_set_state(c, CONN_ST_CLAIM);
	n = evbuffer_peek(c->body, -1, NULL, NULL, 0);
	if (n > 64) {
		evbuffer_pullup(c->body, -1);	/* rare: a body in many pieces */
		n = 1;
	}
	n = evbuffer_peek(c->body, -1, NULL, iov, n);
	/* the target is fingerprinted raw, exactly as the client sent it */
	if (fp_compute(llhttp_method_name((llhttp_method_t)c->method), c->url,
		       (const struct iovec *)iov, n, req.claim.fp) < 0)
		goto fail;

	/* a signed callback is checked before anything is claimed */
	if (p->verify != VERIFY_NONE) {
		int s = hdrlist_find(&c->req, p->verify_header, 0);

		body = body_len ? (const char *)evbuffer_pullup(c->body, -1) : "";
		if (s < 0 || !verify_signature(p->verify, p->verify_secret,
					       p->verify_secret_len,
					       hdr_value(&c->req, (uint32_t)s),
					       c->req.v[s].value_len, body,
					       body_len, time(NULL),
					       p->verify_tolerance_ms)) {
			answer(c, PROBLEM_SIGNATURE_INVALID, s < 0 ?
			       "the signature header is missing" :
			       "the signature does not match the body, or its "
			       "timestamp is outside verify_tolerance",
			       OUTCOME_SIGNATURE_INVALID);
			return;
		}
	}
	if (c->key_pending) {
		body = body_len ? (const char *)evbuffer_pullup(c->body, -1) : "";
		switch (p->key_source) {
		case KEY_SRC_FORM:
			k = !content_type_is(c, "application/x-www-form-urlencoded") ?
				KEYSRC_MISSING :
				keysrc_form(body, body_len, p->key_name,
					    p->key_prefix, c->key);
			break;
		case KEY_SRC_JSON:
			k = !content_type_is(c, "application/json") ?
				KEYSRC_MISSING :
				keysrc_json(body, body_len, p->key_name,
					    p->key_prefix, c->key);
			break;
		case KEY_SRC_AUTO: {
			char hex[2 * FP_LEN + 1];

			fp_hex(req.claim.fp, hex);
			k = keysrc_finish(p->key_prefix, hex, strlen(hex), c->key);
			break;
		}
		default:
			k = KEYSRC_INVALID;
			break;
		}
		if (k < 0) {
			if (key_unusable(c, k == KEYSRC_MISSING))
				return;
			req.unprotected = true;	/* pass through, body and all */
		}
	}
	snprintf(req.claim.key.key, sizeof(req.claim.key.key), "%s", c->key);
	scope_of(c, req.claim.key.scope);
	req.claim.lease_ms = p->lease_ms;
	req.claim.ttl_ms = p->ttl_ms;
	req.in_flight = (enum in_flight_mode)p->in_flight;
	req.wait_timeout_ms = p->wait_timeout_ms;
	req.upstream_timeout_ms = c->cfg->upstream_timeout_ms;
	req.max_cached_response = p->max_cached_response;
	req.store_down = (enum store_down_mode)p->store_down;
	req.on_upstream_error = (enum upstream_error_mode)p->on_upstream_error;
	req.head_method = c->method == HTTP_HEAD;
	req.keep_set_cookie = p->scope_header != NULL;
	req.check_issued = p->require_issued_key;
	/* the key as issued: without the route's prefix */
	snprintf(req.issued_key, sizeof(req.issued_key), "%s",
		 c->key + strlen(p->key_prefix));
	req.issued_at = issued_time(req.issued_key);
	req.issued_ttl_ms = p->issued_key_ttl_ms;
	snprintf(req.issued_scope, sizeof(req.issued_scope), "%s", ISSUED_SCOPE);
	req.issued_lease_ms = issued_marker_ttl(c->cfg);
	req.request = evbuffer_new();
	if (req.request == NULL)
		goto fail;
	write_request_head(c, req.request, origin_target(c), true, body_len);
	evbuffer_add_buffer(req.request, c->body);
	c->idem = idem_start(&c->w->idem, &req, &conn_sink, c);
	if (c->idem == NULL)
		goto fail;
	return;
fail:
	if (req.request != NULL)
		evbuffer_free(req.request);
	answer(c, PROBLEM_STORE_UNAVAILABLE, "cannot start the claim",
	       OUTCOME_STORE_UNAVAILABLE);
}

/* Move a keyed request's body into c->body, up to max_body. */
static void buffer_body(struct conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);

	if (c->req_body == BODY_LENGTH) {
		size_t n = evbuffer_get_length(in);

		if (n > c->req_remaining)
			n = (size_t)c->req_remaining;
		if (n > 0)
			evbuffer_remove_buffer(in, c->body, n);
		c->req_remaining -= n;
		if (c->req_remaining == 0)
			start_claim(c);
		return;
	}
	switch (feed_parser(c)) {
	case 1:
		start_claim(c);
		return;
	default:
		return;		/* more to come, or answered (400, 413) */
	}
}

/*
 * A route's key could not be had: missing (the source has none) or
 * unusable (not valid key syntax, a body that does not parse). With
 * require_key that is 400; otherwise the request goes through unprotected.
 * Returns true when the request was answered.
 */
static bool key_unusable(struct conn *c, bool missing)
{
	const struct policy *p = c->policy;
	char detail[320];

	if (!missing) {
		snprintf(detail, sizeof(detail), "the key from %s%s is not 1-255 "
			 "visible ASCII characters (with key_prefix), or the body "
			 "cannot be parsed", route_key_source_name(p->key_source),
			 p->key_name ? p->key_name : "");
		c->outcome = OUTCOME_INVALID_KEY;
		respond_problem(c, PROBLEM_INVALID_KEY, detail, false);
		return true;
	}
	if (!p->require_key)
		return false;
	snprintf(detail, sizeof(detail), "this request needs an idempotency key "
		 "(%s%s)", route_key_source_name(p->key_source),
		 p->key_name ? p->key_name : "");
	c->outcome = OUTCOME_MISSING_KEY;
	respond_problem(c, PROBLEM_MISSING_KEY, detail, false);
	return true;
}

/*
 * DESIGN.md §1 items 1-4 and §4: find the request's policy, then pass it
 * through, refuse it, or buffer its body for the engine.
 */
static void decide(struct conn *c)
{
	const struct config *cfg = c->cfg;
	const struct hdrlist *h = &c->req;
	const struct policy *p;
	char raw[IDEMKEY_MAX + 1];
	int k, e;

	/* a request without a body is complete: an answer keeps the connection */
	c->req_done = c->req_body == BODY_NONE;
	if (c->method == HTTP_GET && is_issue_path(c->url)) {
		issue_key(c);
		return;
	}
	p = route_policy(cfg, c->method, c->url, &c->route);
	if (p == NULL) {
		conn_forward(c);
		return;
	}
	c->policy = p;
	c->key_pending = false;
	switch (p->key_source) {
	case KEY_SRC_HEADER:
		k = hdrlist_find(h, p->key_name, 0);
		if (k < 0) {
			if (!key_unusable(c, true))
				conn_forward(c);	/* drop-in: legacy clients */
			return;
		}
		if (hdrlist_find(h, p->key_name, (uint32_t)k + 1) >= 0 ||
		    idemkey_parse(hdr_value(h, (uint32_t)k), h->v[k].value_len,
				  raw) < 0 ||
		    keysrc_finish(p->key_prefix, raw, strlen(raw), c->key) < 0) {
			c->outcome = OUTCOME_INVALID_KEY;
			respond_problem(c, PROBLEM_INVALID_KEY, "the key must be one "
					"header of 1-255 visible ASCII characters, "
					"optionally as a quoted string", false);
			return;
		}
		break;
	case KEY_SRC_QUERY:
		k = keysrc_query(c->url, p->key_name, p->key_prefix, c->key);
		if (k < 0) {
			if (!key_unusable(c, k == KEYSRC_MISSING))
				conn_forward(c);
			return;
		}
		break;
	case KEY_SRC_FORM:
	case KEY_SRC_JSON:
	case KEY_SRC_AUTO:
		c->key_pending = true;	/* known once the body is here */
		break;
	case KEY_SRC_NONE:
		conn_forward(c);
		return;
	}
	if (c->req_body == BODY_LENGTH && c->req_remaining > p->max_body) {
		c->outcome = OUTCOME_TOO_LARGE;
		respond_problem(c, PROBLEM_BODY_TOO_LARGE,
				"the request body is larger than max_body", true);
		return;
	}
	c->keyed = true;
	c->body = evbuffer_new();
	if (c->body == NULL) {
		conn_close(c, "out of memory");
		return;
	}
	conn_set_state(c, CONN_ST_BODY);
	e = hdrlist_find(h, "expect", 0);
	if (e >= 0 && c->http_minor >= 1 && c->req_body != BODY_NONE &&
	    httphdr_list_has(hdr_value(h, (uint32_t)e), h->v[e].value_len,
			     "100-continue")) {
		/* we need the body before anything goes upstream */
		evbuffer_add(bufferevent_get_output(c->bev),
			     "HTTP/1.1 100 Continue\r\n\r\n", 25);
		c->expect_answered = true;
	}
	if (c->req_body == BODY_NONE) {
		start_claim(c);
		return;
	}
	set_read_timeout(c, cfg->client_timeout_ms);
	if (c->req_body == BODY_CHUNKED)
		llhttp_resume(&c->parser);
	buffer_body(c);
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
	case CONN_ST_FORWARD:
		pump_body(c);	/* pipelined input waits once req_done */
		break;
	case CONN_ST_BODY:
		buffer_body(c);
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
}

static void write_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;

	if (evbuffer_get_length(bufferevent_get_output(bev)) == 0 &&
	    c->state != CONN_ST_CLOSING)
		bufferevent_disable(bev, EV_WRITE);	/* back to flush_cb */
	if (c->state == CONN_ST_CLOSING) {
		if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
			start_linger(c);
		return;
	}
	if (c->state == CONN_ST_FORWARD && c->up != NULL)
		upstream_pause_read(c->up, false);
	else if (c->state == CONN_ST_FORWARD && c->idem != NULL)
		idem_resume(c->idem);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct conn *c = arg;

	if (c->state == CONN_ST_LINGER) {
		conn_close(c, "linger done");
		return;
	}
	if (what & BEV_EVENT_TIMEOUT) {
		if ((what & BEV_EVENT_READING) &&
		    (c->state == CONN_ST_FORWARD || c->state == CONN_ST_BODY) &&
		    !c->req_done && !c->resp_started) {
			refuse(c, PROBLEM_REQUEST_TIMEOUT,
			       CLIENT_ERROR_REQUEST_TIMEOUT,
			       "the request body stopped arriving");
			return;
		}
		conn_close(c, (what & BEV_EVENT_READING) ? "idle timeout" :
							  "write timeout");
		return;
	}
	if ((what & BEV_EVENT_EOF) && c->state == CONN_ST_SETTLE) {
		/* nothing more will come: the response is out */
		end_request(c);
		return;
	}
	if ((what & BEV_EVENT_EOF) && c->req_done &&
	    (c->state == CONN_ST_FORWARD || c->state == CONN_ST_CLAIM)) {
		/* Half-close after a complete request: answer, then close. */
		c->client_eof = true;
		c->close_after = true;
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
	if (c->state == CONN_ST_READ_HEAD)
		refuse(c, PROBLEM_REQUEST_TIMEOUT, CLIENT_ERROR_REQUEST_TIMEOUT,
		       "the request head did not arrive in time");
}

/* Pipelined input left after a response: see end_request(). */
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

	if (c->state == CONN_ST_CLOSED || evbuffer_get_length(out) == 0 ||
	    (bufferevent_get_enabled(c->bev) & EV_WRITE))
		return;
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

/* Bytes were queued for the client: flush them at the end of this turn. */
static void output_added(struct evbuffer *buf, const struct evbuffer_cb_info *info,
			 void *arg)
{
	struct conn *c = arg;

	if (info->n_added > 0 && !(bufferevent_get_enabled(c->bev) & EV_WRITE))
		event_active(c->flush, EV_WRITE, 1);
}

struct conn *conn_new(struct worker *w, evutil_socket_t fd,
		      const struct sockaddr *peer, socklen_t peerlen)
{
	struct conn *c = calloc(1, sizeof(*c));
	int one = 1;

	if (c == NULL)
		goto fail;
	c->w = w;
	c->method = -1;
	c->bev = bufferevent_socket_new(w->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (c->bev == NULL)
		goto fail;
	fd = -1;	/* the bufferevent owns it now */
	c->timer = evtimer_new(w->base, timer_cb, c);
	c->kick = event_new(w->base, -1, 0, kick_cb, c);
	c->flush = event_new(w->base, -1, 0, flush_cb, c);
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
	hdrlist_init(&c->req);
	llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings);
	c->parser.data = c;
	c->state = CONN_ST_IDLE;
	bufferevent_setcb(c->bev, read_cb, write_cb, event_cb, c);
	bufferevent_setwatermark(c->bev, EV_READ, 0, CONN_READ_HIGH);
	bufferevent_setwatermark(c->bev, EV_WRITE, CONN_LOW, 0);
	set_read_timeout(c, w->cfg->idle_timeout_ms);
	bufferevent_enable(c->bev, EV_READ);	/* writes: flush_cb */
	TAILQ_INSERT_TAIL(&w->conns, c, link);
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
		free(c);
	}
	if (fd >= 0)
		evutil_closesocket(fd);
	return NULL;
}
