/*
 * conn_keyed.c - a connection's keyed requests: deciding what a request's
 * policy asks for, buffering its body, handing it to the engine, and the
 * engine's client side (the sink); and issuing keys.
 *
 *   DECIDE ──no policy, or PASS──▶ conn_pass_forward() (pass-through)
 *     │ ANSWER: 400/413
 *     ▼ BUFFER
 *   BODY ──body complete──▶ CLAIM: keyed_prepare() ──▶ idem_start()
 *                              │ ANSWER: 401/400        │ sink: replay,
 *                              ▼                        ▼ problem, or the
 *                           RESPOND                  FORWARD winner's response
 *                                                       │ done: SETTLE until
 *                                                       ▼ the outcome is written
 */
#include "conn_keyed.h"
#include "conn_priv.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "clock.h"
#include "config.h"
#include "conn_pass.h"
#include "idem.h"
#include "issue.h"
#include "log.h"
#include "reqhead.h"
#include "route.h"
#include "store.h"
#include "upstream.h"
#include "loop.h"

/* ---- keyed requests: the idempotency engine's client side -------------- */

/* The engine is done with the client (a final answer): it may still record
 * the outcome on its own, but never calls us again. */
static void engine_let_go(struct conn *c)
{
	c->idem = NULL;
}

static void sink_replay(void *client, struct stored_response *r)
{
	struct conn *c = client;

	engine_let_go(c);
	c->outcome = OUTCOME_REPLAYED;
	c->rl.status = r->status;
	if (!reply_stored_id(r, c->rl.original_id, sizeof(c->rl.original_id)))
		c->rl.original_id[0] = '\0';
	if (!cf_has(c, CF(KEEP_ALIVE)) || c->draining)
		cf_set(c, CF(CLOSE_AFTER));
	reply_replay(bufferevent_get_output(c->bev), r, c->method == HTTP_HEAD,
		     c->ops->reply_conn(c));
	cf_set(c, CF(RESP_STARTED));
	c->ops->set_state(c, CONN_ST_RESPOND);
	c->ops->end_request(c);
}

static void sink_problem(void *client, enum problem p, const char *detail,
			 enum outcome o)
{
	struct conn *c = client;

	engine_let_go(c);
	c->ops->answer(c, p, detail, o, false);
}

static void sink_forwarding(void *client, enum outcome o)
{
	struct conn *c = client;

	c->outcome = o;
	c->ops->set_state(c, CONN_ST_FORWARD);
}

static void sink_head(void *client, const struct upstream_resp *r)
{
	struct conn *c = client;

	c->ops->client_head(c, r);
}

static bool sink_body(void *client, struct evbuffer *src, size_t len)
{
	struct conn *c = client;

	return c->ops->client_body(c, src, len);
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
	if (cf_has(c, CF(CLOSE_AFTER)) || cf_has(c, CF(CLIENT_EOF)) || c->draining) {
		c->ops->end_request(c);		/* nothing more will be read */
		return;
	}
	c->ops->set_state(c, CONN_ST_SETTLE);
}

static void sink_done(void *client)
{
	struct conn *c = client;

	c->ops->client_done(c);
	hold_for_settle(c);
}

static void sink_failed(void *client, enum problem p, const char *detail)
{
	struct conn *c = client;

	if (c->ops->exchange_problem(c, p, detail))
		hold_for_settle(c);
}

static void sink_settled(void *client)
{
	struct conn *c = client;

	engine_let_go(c);
	if (c->state == CONN_ST_SETTLE)
		c->ops->end_request(c);
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

/* ---- key issuing ---------------------------------------------------------- */

static void on_issued(void *arg, const struct store_result *res)
{
	struct conn *c = arg;

	c->issue_op = NULL;
	c->mode = CONN_MODE_NONE;
	if (res->status != STORE_WON) {
		c->ops->answer(c, PROBLEM_STORE_UNAVAILABLE, "cannot record the issued key",
		       OUTCOME_STORE_UNAVAILABLE, false);
		return;
	}
	c->outcome = OUTCOME_KEY_ISSUED;
	c->rl.status = 200;
	/* a GET with a body we did not read: its bytes must never be
	 * parsed as the next request (fuzz_request finding) */
	if (!cf_has(c, CF(KEEP_ALIVE)) || !cf_has(c, CF(REQ_DONE)) ||
	    c->draining)
		cf_set(c, CF(CLOSE_AFTER));
	reply_issued_key(bufferevent_get_output(c->bev), c->key.key,
			 c->ops->reply_conn(c));
	cf_set(c, CF(RESP_STARTED));
	c->ops->set_state(c, CONN_ST_RESPOND);
	c->ops->end_request(c);
}

/* GET /.well-known/idempotency-key: mint a key and record its marker. */
static void issue_key(struct conn *c)
{
	struct store_claim m;

	if (issue_mint(c->key.key, time(NULL)) < 0) {
		c->ops->answer(c, PROBLEM_STORE_UNAVAILABLE, "no randomness",
		       OUTCOME_STORE_UNAVAILABLE, false);
		return;
	}
	issue_marker(c->key.key, issue_marker_ttl(c->cfg), &m);
	c->ops->set_state(c, CONN_ST_CLAIM);
	c->issue_op = store_claim(c->loop->store, c->loop->base, &m, on_issued, c);
	if (c->issue_op == NULL) {
		c->ops->answer(c, PROBLEM_STORE_UNAVAILABLE, "cannot record the issued key",
		       OUTCOME_STORE_UNAVAILABLE, false);
		return;
	}
	c->mode = CONN_MODE_ISSUE;
}

/* ---- keyed requests ---------------------------------------------------- */

static struct keyed_head keyed_head(const struct conn *c)
{
	struct keyed_head h = {
		.policy = c->policy, .cfg = c->cfg, .method = c->method,
		.target = c->head.target, .fwd_target = c->fwd,
		.route = c->route, .fields = &c->head.fields,
		.body = c->req_body, .length = c->req_length, .peer = c->peer,
		.tls = c->ssl != NULL,
		.tls_subject = c->tls_subject, .tls_san = c->tls_san,
		.request_id = reqlog_upstream_id(&c->rl, c->cfg, c->policy),
		.traceparent = reqlog_traceparent(&c->rl),
	};

	return h;
}

/* The body is buffered: prepare the request and hand it to the engine. */
static void start_claim(struct conn *c)
{
	struct keyed_head h = keyed_head(c);
	struct idem_request req;
	struct keyed_answer a;

	cf_set(c, CF(REQ_DONE));
	c->ops->read_timeout(c, 0);
	evtimer_del(c->timer);		/* the body's deadline */
	c->ops->set_state(c, CONN_ST_CLAIM);
	if (keyed_prepare(&h, &c->key, &c->body, &req, &a) == KEYED_ANSWER) {
		c->ops->answer(c, a.problem, a.detail, a.outcome, a.close);
		return;
	}
	memcpy(c->rl.scope, req.claim.key.scope, sizeof(c->rl.scope) - 1);
	c->rl.scope[sizeof(c->rl.scope) - 1] = '\0';
	req.rl = &c->rl;
	c->idem = idem_start(&c->loop->idem, &req, &conn_sink, c);
	if (c->idem == NULL) {
		c->ops->answer(c, PROBLEM_STORE_UNAVAILABLE, "cannot start the claim",
		       OUTCOME_STORE_UNAVAILABLE, false);
		return;
	}
	c->mode = CONN_MODE_KEYED;
}

/*
 * A keyed body has an end, besides the gap between reads: the client's
 * timeout plus its length at BODY_MIN_RATE (a chunked body: max_body's).
 * A body trickled a byte at a time holds its connection no longer (and,
 * charged as it arrives, only the bytes it sent of the budget).
 */
#define BODY_MIN_RATE (8 * 1024)	/* bytes per second */

static void body_deadline(struct conn *c)
{
	uint64_t len = c->req_body == BODY_LENGTH ? c->req_length :
						     c->policy->max_body;
	struct timeval tv = clock_tv(c->cfg->client_timeout_ms +
				     len * 1000 / BODY_MIN_RATE);

	evtimer_add(c->timer, &tv);
}

void conn_keyed_refused(struct conn *c, enum body_err e)
{
	if (e == BODY_BUSY)
		c->ops->answer(c, PROBLEM_SERVER_BUSY, "too many request bodies are "
			    "being buffered; retry", OUTCOME_BUSY, true);
	else
		c->ops->close(c, "out of memory");
}

/* Move a keyed request's body into c->body, up to max_body. */
void conn_keyed_body(struct conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);

	if (c->req_body == BODY_LENGTH) {
		size_t n = evbuffer_get_length(in);
		enum body_err e;

		if (n > c->req_remaining)
			n = (size_t)c->req_remaining;
		e = body_add_from(&c->body, in, n, c->cfg->max_buffered);
		if (e != BODY_OK) {
			conn_keyed_refused(c, e);
			return;
		}
		c->req_remaining -= n;
		if (c->req_remaining == 0)
			start_claim(c);
		return;
	}
	if (c->ops->feed_parser(c) == 1)
		start_claim(c);	/* else more to come, or answered (400, 413) */
}

int conn_keyed_chunk(struct conn *c, const char *at, size_t len)
{
	enum body_err e;

	if (c->body.len + len > c->policy->max_body) {
		cf_set(c, CF(BODY_TOO_LARGE));
		return -1;
	}
	e = body_add(&c->body, at, len, c->cfg->max_buffered);
	if (e == BODY_BUSY)
		cf_set(c, CF(BODY_BUSY));
	return e == BODY_OK ? 0 : -1;
}

/* Expect: 100-continue on a keyed request: we need the body before
 * anything goes upstream, so we answer it ourselves. */
static void continue_if_expected(struct conn *c)
{
	const struct hdrlist *f = &c->head.fields;
	int e = hdrlist_find(f, "expect", 0);

	if (e >= 0 && c->http_minor >= 1 && c->req_body != BODY_NONE &&
	    httphdr_list_has(hdr_value(f, (uint32_t)e), f->v[e].value_len,
			     "100-continue"))
		evbuffer_add(bufferevent_get_output(c->bev),
			     "HTTP/1.1 100 Continue\r\n\r\n", 25);
}

/*
 * GET /.well-known/idempotency-key is served only where a route asks for
 * issued keys (else it is an ordinary request, passed on), and at most
 * ISSUE_RATE keys per second per worker (burst as much): each writes a
 * record, so anonymous clients must not be able to fill the store.
 */
#define ISSUE_RATE 50

static bool issue_allowed(void)
{
	static _Thread_local uint64_t last_ms;
	static _Thread_local double tokens = ISSUE_RATE;
	uint64_t now = clock_ms();

	tokens += (double)(now - last_ms) * ISSUE_RATE / 1000.0;
	if (tokens > ISSUE_RATE)
		tokens = ISSUE_RATE;
	last_ms = now;
	if (tokens < 1.0)
		return false;
	tokens -= 1.0;
	return true;
}

/* Not protected: forwarded with its target as the client sent it (in
 * origin form), not normalised (DESIGN §1.1: proxied as is). */
static void pass_as_is(struct conn *c)
{
	strcpy(c->fwd, reqhead_origin_target(c->head.target, c->method));
	conn_pass_forward(c);
}

/*
 * DESIGN.md §1 items 1-4 and §4: find the request's policy, then pass it
 * through, refuse it, or buffer its body for the engine.
 */
void conn_keyed_decide(struct conn *c)
{
	struct keyed_head h;
	struct keyed_answer a;
	/* a request without a body is complete: an answer keeps the connection */
	if (c->req_body == BODY_NONE)
		cf_set(c, CF(REQ_DONE));
	if (c->match == NULL) {
		/* a path that does not normalise (dot segments, an encoded
		 * separator): never forwarded where a route or protection
		 * could apply (an upstream may read it as a protected path),
		 * else passed on as it came (DESIGN §1.1) */
		if (routes_consider(&c->cfg->routing, c->method)) {
			c->ops->answer(c, PROBLEM_BAD_REQUEST, "the path has dot "
				    "segments or an encoded separator",
				    OUTCOME_PASSTHROUGH, false);
			return;
		}
		pass_as_is(c);
		return;
	}
	if (c->method == HTTP_GET && routes_issue_keys(&c->cfg->routing) &&
	    issue_is_path(c->match)) {
		if (!issue_allowed()) {
			c->ops->answer(c, PROBLEM_TOO_MANY_REQUESTS, "keys are issued "
				    "at a bounded rate; retry", OUTCOME_BUSY, false);
			return;
		}
		issue_key(c);
		return;
	}
	c->policy = route_policy(&c->cfg->routing, c->method, c->match,
				 &c->route);
	if (c->policy == NULL) {
		pass_as_is(c);
		return;
	}
	h = keyed_head(c);
	switch (keyed_start(&h, &c->key, &a)) {
	case KEYED_PASS:
		conn_pass_forward(c);	/* drop-in: legacy clients */
		return;
	case KEYED_ANSWER:
		c->ops->answer(c, a.problem, a.detail, a.outcome, a.close);
		return;
	case KEYED_BUFFER:
	case KEYED_ENGINE:
		break;
	}
	if (cf_has(c, CF(UPGRADE))) {
		/* a tunnel cannot be stored or replayed: never executed
		 * under a key, nor forwarded as if it had none */
		c->ops->answer(c, PROBLEM_INVALID_KEY, "a request that asks to "
			       "switch protocols (Upgrade) cannot carry an "
			       "idempotency key", OUTCOME_INVALID_KEY, true);
		return;
	}
	body_start(&c->body, c->req_body == BODY_LENGTH ? c->req_length : 0);
	c->ops->set_state(c, CONN_ST_BODY);
	body_deadline(c);
	continue_if_expected(c);
	if (c->req_body == BODY_NONE) {
		start_claim(c);
		return;
	}
	c->ops->read_timeout(c, c->cfg->client_timeout_ms);
	if (c->req_body == BODY_CHUNKED)
		llhttp_resume(&c->parser);
	conn_keyed_body(c);
}
