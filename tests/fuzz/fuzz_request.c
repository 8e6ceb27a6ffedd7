/*
 * fuzz_request.c - what a client sends, from its bytes to what goes
 * upstream: the request head path of proxy/conn.c (llhttp callbacks into
 * h1_head, httphdr_validate, the Host and Transfer-Encoding rules,
 * reqhead_origin_target and reqhead_normalise, h1_keep_alive), the decision
 * of conn_keyed.c (route_policy, keyed_start), the body (Content-Length or
 * chunked, with trailers), keyed_prepare and reqhead_write; then the next
 * request on the same connection (pipelining).
 *
 * conn.c and conn_keyed.c are socket-bound, so this file repeats their
 * sequence of calls around the same public functions (h1.h, httphdr.h,
 * reqhead.h, keyed.h, route.h, reply.h): a change there must be mirrored
 * here. Left out: timers, back-pressure, the --max-buffered budget, the
 * store (issued keys are only recognised) and the engine. At the end of the
 * input a body is cut short as if the client had declared what it sent.
 *
 * Input: the bytes a client sends on one connection.
 * The config: routes of every key source, scope, both signature formats,
 * issued keys, an unprotected route, an upstream path prefix.
 * Invariants: the input gives the same requests, answers and upstream bytes
 * (a re-chunked body's bytes, since its chunks follow the reads; for input
 * llhttp refuses, that it was refused) however the reads split it (two
 * passes: whole, and in pieces of 1-13 bytes); reqhead_normalise() is
 * idempotent and never lengthens; a connection goes on to parse a next
 * request only after the body of this one was read (else body bytes would
 * be read as a request: a desync with a front proxy).
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <llhttp.h>

#include "config.h"
#include "fuzz.h"
#include "h1.h"
#include "httphdr.h"
#include "idem.h"
#include "issue.h"
#include "keyed.h"
#include "log.h"
#include "reply.h"
#include "reqhead.h"
#include "route.h"

static const char ini[] =
	"[idemproxy]\n"
	"max_body = 4KiB\n"
	"max_header_size = 4KiB\n"
	"[route json]\n"
	"match = POST /pay/json*\n"
	"key = json:/data/id\n"
	"key_prefix = pay:\n"
	"require_key = yes\n"
	"[route form]\n"
	"match = POST /pay/form\n"
	"key = form:out_trade_no\n"
	"[route auto]\n"
	"match = POST,PUT /legacy*\n"
	"key = auto\n"
	"max_body = 64\n"
	"[route query]\n"
	"match = POST /q*\n"
	"key = query:k\n"
	"[route scoped]\n"
	"match = POST,PATCH /mine/*\n"
	"scope = header:Authorization\n"
	"[route github]\n"
	"match = POST /hooks/github\n"
	"key = header:X-GitHub-Delivery\n"
	"verify = hmac-sha256\n"
	"verify_secret_env = HOOK_SECRET\n"
	"[route stripe]\n"
	"match = POST /hooks/stripe\n"
	"key = json:/id\n"
	"verify = hmac-sha256\n"
	"verify_format = stripe\n"
	"verify_secret_env = STRIPE_SECRET\n"
	"[route issued]\n"
	"match = POST /orders*\n"
	"require_issued_key = yes\n"
	"[route free]\n"
	"match = * /free*\n"
	"key = none\n";

static struct config *cfg;

/* One client connection, as far as parsing goes (conn.c's struct conn). */
struct client {
	llhttp_t parser;
	struct h1_head head;
	bool in_head;		/* conn.c's CONN_ST_READ_HEAD */
	bool buffering;		/* a keyed body is being buffered */
	struct body body;
	uint64_t max_body;
	bool too_large;		/* the keyed body went over max_body */
	struct evbuffer *out;	/* upstream bytes and our answers, in order */
	struct evbuffer *chunks;	/* re-chunked bodies, dropped */
	size_t piece;		/* at most this many bytes per llhttp_execute */
	const char *p;		/* the input not read yet */
	size_t left;
};

static int on_message_begin(llhttp_t *p)
{
	struct client *c = p->data;

	c->in_head = true;
	c->head.max = cfg->max_header_size;
	return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
	return h1_head_target(&((struct client *)p->data)->head, at, len);
}

/* Fields after the head are trailers: counted against the cap, not kept. */
static bool is_trailer(struct client *c, size_t len)
{
	if (c->in_head)
		return false;
	c->head.bytes += len;
	return true;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct client *c = p->data;

	if (is_trailer(c, len))
		return c->head.bytes > c->head.max ? -1 : 0;
	return h1_head_name(&c->head, at, len);
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	struct client *c = p->data;

	if (is_trailer(c, len))
		return c->head.bytes > c->head.max ? -1 : 0;
	return h1_head_value(&c->head, at, len);
}

static int on_header_value_complete(llhttp_t *p)
{
	struct client *c = p->data;

	if (is_trailer(c, 0))
		return 0;
	return h1_head_end_field(&c->head);
}

static int on_headers_complete(llhttp_t *p)
{
	return HPE_PAUSED;
}

/* Chunked bodies: buffered when keyed, else re-chunked for the upstream. */
static int on_body(llhttp_t *p, const char *at, size_t len)
{
	struct client *c = p->data;

	if (c->buffering) {
		if (c->body.len + len > c->max_body) {
			c->too_large = true;
			return -1;
		}
		return body_add(&c->body, at, len, UINT64_MAX) == BODY_OK ? 0 : -1;
	}
	/* the chunks follow the reads: the transcript gets the bytes */
	h1_chunk(c->chunks, at, len);
	evbuffer_drain(c->chunks, evbuffer_get_length(c->chunks));
	evbuffer_add(c->out, at, len);
	return 0;
}

static int on_message_complete(llhttp_t *p)
{
	return HPE_PAUSED;
}

static const llhttp_settings_t settings = {
	.on_message_begin = on_message_begin,
	.on_url = on_url,
	.on_header_field = on_header_field,
	.on_header_value = on_header_value,
	.on_header_value_complete = on_header_value_complete,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

static void parser_init(struct client *c)
{
	llhttp_init(&c->parser, HTTP_REQUEST, &settings);
	c->parser.data = c;
}

/* conn_feed_parser(): 1 paused, 0 the input ran out, -1 refused. The
 * input goes to llhttp in pieces of at most c->piece bytes, as reads may
 * split it. */
static int feed(struct client *c)
{
	while (c->left > 0) {
		size_t n = c->left < c->piece ? c->left : c->piece;
		enum llhttp_errno err = llhttp_execute(&c->parser, c->p, n);
		size_t used;

		switch (err) {
		case HPE_OK:
			c->p += n;
			c->left -= n;
			continue;
		case HPE_PAUSED:
		case HPE_PAUSED_UPGRADE:
			used = (size_t)(llhttp_get_error_pos(&c->parser) - c->p);
			FUZZ_REQUIRE(used <= n);
			c->p += used;
			c->left -= used;
			return 1;
		default:
			return -1;
		}
	}
	return 0;
}

/* A problem response of ours (conn_answer, refuse). */
static void answer(struct client *c, enum problem p, const char *detail,
		   bool close, int minor)
{
	struct reply_conn rc = { .close = close, .http10 = minor == 0 };

	evbuffer_add_printf(c->out, "<< answer\n");
	reply_problem(c->out, p, detail, rc);
}

/*
 * llhttp refused the input (conn.c parse_failed): 400, 413 or 431, and the
 * connection closes. Which of them depends on where reads split the input
 * (a span that outgrows the cap is seen at a piece's end, a bad byte when
 * it is parsed), so the transcript says only that it was refused.
 */
static void refused(struct client *c, enum problem p, const char *detail)
{
	struct reply_conn rc = { .close = true };

	evbuffer_add_printf(c->out, "<< refused, closed\n");
	reply_problem(c->chunks, p, detail, rc);
	evbuffer_drain(c->chunks, evbuffer_get_length(c->chunks));
}

/* head_unacceptable(): NULL, or why the request is refused. fwd and match
 * are allocated; *match is NULL when the path does not normalise. */
static const char *unacceptable(struct client *c, int method, int minor,
				char **fwd, char **match)
{
	const struct hdrlist *f = &c->head.fields;
	const char *t = c->head.target;
	int host = hdrlist_find(f, "host", 0);
	char *fwd2, *match2;

	if (httphdr_validate(f) < 0)
		return "malformed header field";
	if ((host >= 0 && hdrlist_find(f, "host", (uint32_t)host + 1) >= 0) ||
	    (host < 0 && minor >= 1))
		return "a request needs exactly one Host field";
	if (method == HTTP_CONNECT)
		return "CONNECT is not supported";
	if (hdrlist_find(f, "transfer-encoding", 0) >= 0) {
		if (!h1_only_chunked(f))
			return "unsupported Transfer-Encoding (only chunked)";
		if (hdrlist_find(f, "content-length", 0) >= 0)
			return "both Content-Length and Transfer-Encoding";
	}
	if (reqhead_origin_target(t, method) == NULL)
		return "unsupported request-target form";
	*fwd = malloc(c->head.target_len + 1);
	*match = malloc(c->head.target_len + 1);
	if (*fwd == NULL || *match == NULL)
		abort();
	if (reqhead_normalise(t, method, *fwd, *match) < 0) {
		free(*match);
		*match = NULL;
		return NULL;
	}
	/* the forwarded target normalises to itself: what the upstream gets
	 * is what the routes were matched against */
	FUZZ_REQUIRE(strlen(*fwd) <= c->head.target_len &&
		     strlen(*match) <= strlen(*fwd));
	fwd2 = malloc(strlen(*fwd) + 1);
	match2 = malloc(strlen(*fwd) + 1);
	if (fwd2 == NULL || match2 == NULL)
		abort();
	FUZZ_REQUIRE(reqhead_normalise(*fwd, method, fwd2, match2) == 0);
	FUZZ_REQUIRE(strcmp(fwd2, *fwd) == 0 && strcmp(match2, *match) == 0);
	free(fwd2);
	free(match2);
	return NULL;
}

/* conn_forward(): the head upstream, then the body. false when the body
 * could not be read in full (refused, or the input ran out). */
static bool forward(struct client *c, const struct reqhead *rh)
{
	int rc;

	evbuffer_add_printf(c->out, ">> forward\n");
	reqhead_write(c->out, rh);
	if (rh->body == BODY_LENGTH) {
		size_t n = c->left < rh->length ? c->left : (size_t)rh->length;

		evbuffer_add(c->out, c->p, n);
		c->p += n;
		c->left -= n;
		return n == rh->length;
	}
	if (rh->body != BODY_CHUNKED)
		return true;
	llhttp_resume(&c->parser);
	rc = feed(c);
	if (rc == 1)
		evbuffer_add_printf(c->out, "\n>> last chunk\n");
	else if (rc < 0)
		refused(c, PROBLEM_BAD_REQUEST, "malformed request");
	return rc == 1;
}

/* conn_keyed_decide() from KEYED_BUFFER on: the body, then keyed_prepare().
 * Returns whether the connection goes on. */
static bool keyed(struct client *c, struct keyed_head *h, struct keyed_key *k,
		  bool keep, int minor)
{
	struct idem_request req;
	struct keyed_answer a;
	enum keyed_verdict v;
	bool go_on = keep;
	int rc;

	c->buffering = true;
	body_start(&c->body, h->body == BODY_LENGTH ? h->length : 0);
	c->max_body = h->policy->max_body;
	c->too_large = false;
	if (h->body == BODY_LENGTH) {
		size_t n = c->left < h->length ? c->left : (size_t)h->length;

		FUZZ_REQUIRE(body_add(&c->body, c->p, n, UINT64_MAX) == BODY_OK);
		c->p += n;
		c->left -= n;
	} else if (h->body == BODY_CHUNKED) {
		llhttp_resume(&c->parser);
		rc = feed(c);
		if (rc < 0) {
			refused(c, c->too_large ? PROBLEM_BODY_TOO_LARGE :
				PROBLEM_BAD_REQUEST, "body");
			go_on = false;
			goto out;
		}
		if (rc == 0)
			go_on = false;	/* cut short: the last request */
	}
	v = keyed_prepare(h, k, &c->body, &req, &a);
	if (v == KEYED_ANSWER) {
		answer(c, a.problem, a.detail, a.close, minor);
		go_on = go_on && !a.close;
		goto out;
	}
	FUZZ_REQUIRE(v == KEYED_ENGINE && req.request != NULL);
	FUZZ_REQUIRE(strlen(req.claim.key.key) <= IDEMKEY_MAX);
	evbuffer_add_printf(c->out, ">> engine key=%s scope=%s unprotected=%d "
			    "issued_at=%lld\n", req.claim.key.key,
			    req.claim.key.scope, req.unprotected,
			    (long long)req.issued_at);
	evbuffer_add_buffer(c->out, req.request);
	evbuffer_free(req.request);
out:
	body_clear(&c->body);
	c->buffering = false;
	return go_on;
}

/*
 * head_complete() and conn_keyed_decide(): the head is parsed and the parser
 * paused. Returns whether the connection goes on to a next request.
 */
static bool request(struct client *c)
{
	llhttp_t *ps = &c->parser;
	int method = ps->method, minor = ps->http_minor;
	bool keep = h1_keep_alive(&c->head.fields, ps->http_major, minor);
	bool go_on = false, req_done;
	char *fwd = NULL, *match = NULL;
	const char *why;
	struct reqhead rh = { .method = method, .fields = &c->head.fields,
			      .peer = "192.0.2.1", .cfg = cfg };
	struct keyed_head h;
	struct keyed_key k;
	struct keyed_answer a;

	evbuffer_add_printf(c->out, "<< %s %s HTTP/%d.%d keep=%d\n",
			    llhttp_method_name((llhttp_method_t)method),
			    c->head.target ? c->head.target : "(none)",
			    ps->http_major, minor, keep);
	why = unacceptable(c, method, minor, &fwd, &match);
	if (why != NULL) {
		answer(c, PROBLEM_BAD_REQUEST, why, true, minor);
		goto out;
	}
	if (ps->flags & F_CHUNKED) {
		rh.body = BODY_CHUNKED;
		if (minor == 0)
			keep = false;	/* RFC 9112 §6.1 */
	} else if (ps->flags & F_CONTENT_LENGTH) {
		rh.body = BODY_LENGTH;
		rh.length = ps->content_length;
	}
	/* only a chunked body goes through the parser */
	if (rh.body != BODY_CHUNKED)
		parser_init(c);
	req_done = rh.body == BODY_NONE;

	if (match == NULL) {
		if (routes_consider(&cfg->routing, method)) {
			answer(c, PROBLEM_BAD_REQUEST, "dot segments", false, minor);
			go_on = keep && req_done;
			goto out;
		}
		goto as_is;
	}
	if (method == HTTP_GET && routes_issue_keys(&cfg->routing) &&
	    issue_is_path(match)) {
		/* conn_keyed.c on_issued(): answered after the store
		 * recorded the key; closed without keep-alive, or when a
		 * body was not read */
		evbuffer_add_printf(c->out, "<< issue\n");
		go_on = keep && req_done;
		goto out;
	}
	h = (struct keyed_head){
		.cfg = cfg, .method = method, .target = c->head.target,
		.fwd_target = fwd, .fields = &c->head.fields, .body = rh.body,
		.length = rh.length, .peer = rh.peer,
	};
	h.policy = route_policy(&cfg->routing, method, match, &h.route);
	if (h.policy == NULL)
		goto as_is;
	switch (keyed_start(&h, &k, &a)) {
	case KEYED_PASS:
		rh.target = fwd;
		req_done = forward(c, &rh);
		go_on = keep && req_done;
		goto out;
	case KEYED_ANSWER:
		answer(c, a.problem, a.detail, a.close, minor);
		go_on = keep && req_done && !a.close;
		goto out;
	case KEYED_BUFFER:
	case KEYED_ENGINE:
		break;
	}
	go_on = keyed(c, &h, &k, keep, minor);
	req_done = true;
	goto out;
as_is:
	strcpy(fwd, reqhead_origin_target(c->head.target, method));
	rh.target = fwd;
	req_done = forward(c, &rh);
	go_on = keep && req_done;
out:
	free(fwd);
	free(match);
	/* the next bytes are read as a request: this one must be over */
	FUZZ_REQUIRE(!go_on || req_done);
	return go_on;
}

/* One connection's input, read in pieces of at most `piece` bytes. */
static void connection(const uint8_t *data, size_t size, size_t piece,
		       struct evbuffer *out)
{
	struct client c = { .out = out, .piece = piece,
			    .p = (const char *)data, .left = size,
			    .chunks = evbuffer_new() };
	int rc;

	if (c.chunks == NULL)
		abort();
	h1_head_init(&c.head, cfg->max_header_size);
	do {
		h1_head_reset(&c.head, cfg->max_header_size);
		c.in_head = false;
		parser_init(&c);
		rc = feed(&c);
		if (rc < 0) {
			refused(&c, c.head.too_large ? PROBLEM_HEADERS_TOO_LARGE :
				PROBLEM_BAD_REQUEST, llhttp_errno_name(
					llhttp_get_errno(&c.parser)));
			break;
		}
		if (rc == 0)
			break;		/* a head cut short: the client's turn */
		/* conn_parse(): a pause is the end of a head, nothing else */
		FUZZ_REQUIRE(c.in_head);
		c.in_head = false;
	} while (request(&c) && c.left > 0);
	h1_head_free(&c.head);
	evbuffer_free(c.chunks);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char path[] = "/tmp/fuzz-request-XXXXXX";
	char *args[] = { "idemproxy", "--upstream", "http://127.0.0.1:9/base",
			 "--config", path, NULL };
	char *env[] = { "HOOK_SECRET=s3cret", "STRIPE_SECRET=whsec_fuzz", NULL };
	enum config_action action;
	char err[512];
	int fd = mkstemp(path);

	log_setup(LOG_ERROR, LOG_FORMAT_TEXT);
	if (fd < 0 || write(fd, ini, sizeof(ini) - 1) != (ssize_t)sizeof(ini) - 1)
		abort();
	close(fd);
	if (config_parse(5, args, env, &cfg, &action, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz_request: config: %s\n", err);
		abort();
	}
	unlink(path);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct evbuffer *whole = evbuffer_new(), *pieces = evbuffer_new();
	size_t a, b;

	if (whole == NULL || pieces == NULL)
		abort();
	connection(data, size, SIZE_MAX, whole);
	connection(data, size, 1 + size % 13, pieces);
	a = evbuffer_get_length(whole);
	b = evbuffer_get_length(pieces);
	if (a != b || (a > 0 && memcmp(evbuffer_pullup(whole, -1),
				       evbuffer_pullup(pieces, -1), a) != 0))
		fprintf(stderr, "read whole:\n%.*s\n-- read in pieces of %zu:\n"
			"%.*s\n--\n", (int)(a < 4096 ? a : 4096),
			(const char *)evbuffer_pullup(whole, -1), 1 + size % 13,
			(int)(b < 4096 ? b : 4096),
			(const char *)evbuffer_pullup(pieces, -1));
	FUZZ_REQUIRE(a == b && (a == 0 || memcmp(evbuffer_pullup(whole, -1),
						 evbuffer_pullup(pieces, -1),
						 a) == 0));
	evbuffer_free(whole);
	evbuffer_free(pieces);
	return 0;
}
