/*
 * fuzz_response.c - what an upstream answers, through the real
 * proxy/upstream.c: its llhttp HTTP_RESPONSE parser feeding h1_head,
 * httphdr_validate, interim heads, the body kinds (Content-Length, chunked,
 * close-delimited, none for HEAD/204/304), keep-alive and the connection
 * pool; then what the client gets (reply_relay_head and the re-chunking of
 * conn.c's conn_client_head/body/done, repeated here) and what a duplicate
 * gets (the stored head of idem.c's stored_field, repeated here, and
 * reply_replay).
 *
 * upstream.c is socket-bound and has no hook for bytes, so the harness is
 * its upstream: the pool connects to a Unix socket of ours (upstream_target
 * takes any address), the input is written to the accepted end, and the
 * event loop runs until the exchange is done or failed. A connection the
 * pool kept (a complete keep-alive response) is reused by the next input,
 * unless that input asks for a fresh one.
 *
 * Input: one flag byte (F_* below), then the upstream's bytes.
 * Invariants: when the exchange completes, what the client gets is a
 * well-formed HTTP/1.1 response stream (interim heads, then the final one)
 * with the final status and exactly the body bytes the upstream sent; the
 * replay built from the stored head and body is well-formed too, with the
 * same status and body. A 101 switches only a request that asked for an
 * upgrade (F_ASKS_UPGRADE); its relayed head carries Upgrade and Connection:
 * upgrade, and the connection upstream_detach() hands over holds what the
 * upstream sent after the head, unread (conn_pass.c, conn_tunnel.c).
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <llhttp.h>

#include "fuzz.h"
#include "h1.h"
#include "log.h"
#include "reply.h"
#include "store.h"
#include "upstream.h"

enum {
	F_HEAD = 1,		/* the request was HEAD */
	F_HTTP10 = 2,		/* the client speaks HTTP/1.0 */
	F_PAUSE = 4,		/* the client's output is full after each body piece */
	F_FRESH = 8,		/* a new connection, not a pooled one */
	F_CLOSE = 16,		/* the client did not ask for keep-alive */
	F_SCOPED = 32,		/* the route scopes keys: Set-Cookie is stored */
	F_ASKS_UPGRADE = 64,		/* the request asks to switch protocols */
};

static struct event_base *base;
static struct upstream_pool *pool;
static int lfd = -1;		/* our listening socket */
static int pooled_fd = -1;	/* our end of the connection the pool may keep */

struct exchange {
	struct upstream *u;
	unsigned flags;
	bool done, failed, paused;
	bool switched;			/* a 101: the connection was detached */
	struct evbuffer *tunnel;	/* ... and what its input held */
	bool resp_started, resp_chunked, close_after;
	int status;			/* the final one */
	struct evbuffer *out;		/* to the client */
	struct evbuffer *sent;		/* the body bytes the upstream sent */
	struct evbuffer *cap_head;	/* the stored head */
};

/* conn.c conn_client_head(). */
static void on_head(void *arg, const struct upstream_resp *r)
{
	struct exchange *x = arg;
	bool interim = r->status < 200;
	bool http10 = x->flags & F_HTTP10;
	struct reply_conn rc = { .close = false };	/* no request id */

	FUZZ_REQUIRE(!x->resp_started);
	/* three digits, or a protocol error (a status below 100 was taken as
	 * final here and as interim by conn.c and idem.c: fixed in 61e2b2a) */
	FUZZ_REQUIRE(r->status >= 100 && r->status <= 999);
	if (r->status == 101) {		/* conn_pass.c up_on_head() */
		struct bufferevent *bev;
		struct evbuffer_ptr at;

		FUZZ_REQUIRE(x->flags & F_ASKS_UPGRADE);
		FUZZ_REQUIRE(hdrlist_find(r->headers, "upgrade", 0) >= 0);
		reply_relay_head(x->out, r, false, false, rc);
		at = evbuffer_search(x->out, "\r\nConnection: upgrade\r\n", 23, NULL);
		FUZZ_REQUIRE(at.pos >= 0);
		at = evbuffer_search(x->out, "\r\nUpgrade: ", 11, NULL);
		FUZZ_REQUIRE(at.pos >= 0);
		bev = upstream_detach(x->u);
		x->u = NULL;
		evbuffer_add_buffer(x->tunnel, bufferevent_get_input(bev));
		/* and what the socket still holds (it was read in pieces) */
		while (evbuffer_read(x->tunnel, bufferevent_getfd(bev), 65536) > 0)
			;
		bufferevent_free(bev);
		x->switched = true;
		return;
	}
	if (interim && (http10 || x->resp_started))
		return;
	if (!interim) {
		if (x->flags & F_CLOSE)
			x->close_after = true;
		if (r->body == BODY_CHUNKED || r->body == BODY_EOF) {
			if (!http10)
				x->resp_chunked = true;
			else
				x->close_after = true;
		}
		x->resp_started = true;
		x->status = r->status;
	}
	rc.close = x->close_after;
	rc.http10 = http10;
	reply_relay_head(x->out, r, (x->flags & F_HEAD) || r->status == 304,
			 x->resp_chunked, rc);
	if (!interim) {
		/* idem.c capture_head() with stored_field() */
		for (uint32_t i = 0; i < r->headers->n; i++) {
			const struct hdrlist *h = r->headers;
			bool is_cl = h->v[i].name_len == 14 &&
				     strcasecmp(hdr_name(h, i), "content-length") == 0;
			bool keep;

			if (is_cl && ((x->flags & F_HEAD) || r->status == 304))
				keep = true;
			else if (httphdr_drop_on_forward(h, i))
				keep = false;
			else
				keep = (x->flags & F_SCOPED) || h->v[i].name_len != 10 ||
				       strcasecmp(hdr_name(h, i), "set-cookie") != 0;
			if (!keep)
				continue;
			evbuffer_add(x->cap_head, hdr_name(h, i), h->v[i].name_len);
			evbuffer_add(x->cap_head, ": ", 2);
			evbuffer_add(x->cap_head, hdr_value(h, i), h->v[i].value_len);
			evbuffer_add(x->cap_head, "\r\n", 2);
		}
	}
}

/* conn.c up_on_body() and conn_client_body(). */
static void on_body(void *arg, struct evbuffer *src, size_t len)
{
	struct exchange *x = arg;
	char *copy = malloc(len);

	FUZZ_REQUIRE(x->resp_started && len <= evbuffer_get_length(src));
	if (copy == NULL || evbuffer_copyout(src, copy, len) != (ssize_t)len)
		abort();
	evbuffer_add(x->sent, copy, len);
	free(copy);
	if (x->resp_chunked)
		h1_chunk_move(x->out, src, len);
	else
		evbuffer_remove_buffer(src, x->out, len);
	if (x->flags & F_PAUSE) {
		x->paused = true;
		upstream_pause_read(x->u, true);
	}
}

/* conn.c up_on_done(), the request having been sent in full. */
static void on_done(void *arg)
{
	struct exchange *x = arg;

	if (x->resp_chunked)
		h1_last_chunk(x->out);
	x->done = true;
	upstream_release(x->u);
	x->u = NULL;
}

static void on_error(void *arg, enum upstream_error err, unsigned how)
{
	struct exchange *x = arg;

	x->failed = true;
	x->u = NULL;
}

static void on_drain(void *arg)
{
}

static const struct upstream_cbs cbs = {
	.on_head = on_head,
	.on_body = on_body,
	.on_done = on_done,
	.on_error = on_error,
	.on_drain = on_drain,
};

/* ---- a client's parser over what it got ---------------------------- */

struct seen {
	bool head;		/* the request was HEAD */
	int messages, status;
	bool complete;		/* the last message is complete */
	struct evbuffer *body;	/* of the last message */
};

static int v_begin(llhttp_t *p)
{
	struct seen *s = p->data;

	s->complete = false;
	evbuffer_drain(s->body, evbuffer_get_length(s->body));
	return 0;
}

static int v_headers_complete(llhttp_t *p)
{
	struct seen *s = p->data;

	/* what a client knows: no body in a response to HEAD, nor in 1xx,
	 * 204 and 304, whatever Content-Length says */
	return s->head || p->status_code < 200 || p->status_code == 204 ||
	       p->status_code == 304 ? 1 : 0;
}

static int v_body(llhttp_t *p, const char *at, size_t len)
{
	return evbuffer_add(((struct seen *)p->data)->body, at, len);
}

static int v_complete(llhttp_t *p)
{
	struct seen *s = p->data;

	s->messages++;
	s->status = p->status_code;
	s->complete = true;
	return 0;
}

static const llhttp_settings_t v_settings = {
	.on_message_begin = v_begin,
	.on_headers_complete = v_headers_complete,
	.on_body = v_body,
	.on_message_complete = v_complete,
};

/* out is a well-formed response stream ending with the final response of
 * status `status` and body `body` (none for HEAD, 204, 304). */
static void check_stream(struct evbuffer *out, bool head, int status,
			 struct evbuffer *body)
{
	struct seen s = { .head = head, .body = evbuffer_new() };
	size_t len = evbuffer_get_length(out);
	const char *data = (const char *)evbuffer_pullup(out, -1);
	llhttp_t p;
	enum llhttp_errno err;

	if (s.body == NULL)
		abort();
	llhttp_init(&p, HTTP_RESPONSE, &v_settings);
	p.data = &s;
	err = llhttp_execute(&p, len ? data : "", len);
	if (err == HPE_OK && !s.complete)
		err = llhttp_finish(&p);	/* close-delimited */
	if (err != HPE_OK || !s.complete || s.status != status) {
		fprintf(stderr, "client stream: %s (%s), complete %d, status %d "
			"(want %d):\n%.*s\n", llhttp_errno_name(err),
			p.reason ? p.reason : "", s.complete, s.status, status,
			(int)(len < 2048 ? len : 2048), data);
		FUZZ_REQUIRE(!"a well-formed response");
	}
	if (!head && status != 204 && status != 304) {
		size_t n = evbuffer_get_length(body);

		FUZZ_REQUIRE(evbuffer_get_length(s.body) == n);
		FUZZ_REQUIRE(n == 0 || memcmp(evbuffer_pullup(s.body, -1),
					      evbuffer_pullup(body, -1), n) == 0);
	}
	evbuffer_free(s.body);
}

/* What a duplicate of this request would get (idem.c, reply_replay). */
static void check_replay(const struct exchange *x)
{
	size_t hlen = evbuffer_get_length(x->cap_head);
	size_t blen = evbuffer_get_length(x->sent);
	struct stored_response *r = stored_response_new(x->status,
		hlen ? (const char *)evbuffer_pullup(x->cap_head, -1) : "", hlen,
		blen ? (const char *)evbuffer_pullup(x->sent, -1) : "", blen, true);
	struct evbuffer *out = evbuffer_new();
	struct reply_conn rc = { .close = x->close_after, .http10 = x->flags & F_HTTP10 };

	if (r == NULL || out == NULL)
		abort();
	reply_replay(out, r, x->flags & F_HEAD, rc);
	check_stream(out, x->flags & F_HEAD, x->status, x->sent);
	evbuffer_free(out);
	stored_response_unref(r);
}

/* Our end of the connection upstream_acquire() handed out: a new one
 * waiting on the listening socket, or the pooled one. */
static int server_end(void)
{
	int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd >= 0) {
		if (pooled_fd >= 0)
			close(pooled_fd);	/* the pool let it go */
		pooled_fd = -1;
		return fd;
	}
	FUZZ_REQUIRE(errno == EAGAIN && pooled_fd >= 0);
	fd = pooled_fd;
	pooled_fd = -1;
	return fd;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct upstream_target t = { .host = "127.0.0.1", .port = "9" };
	struct sockaddr_un *sun = (struct sockaddr_un *)&t.addrs.ss[0];

	log_setup(LOG_ERROR, LOG_FORMAT_TEXT);
	base = event_base_new();
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (base == NULL || lfd < 0)
		abort();
	/* an abstract name: nothing on the file system */
	sun->sun_family = AF_UNIX;
	snprintf(sun->sun_path + 1, sizeof(sun->sun_path) - 1,
		 "idemproxy-fuzz-response-%d", (int)getpid());
	t.addrs.n = 1;
	t.addrs.len[0] = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
				     strlen(sun->sun_path + 1));
	if (bind(lfd, (struct sockaddr *)sun, t.addrs.len[0]) < 0 ||
	    listen(lfd, 64) < 0)
		abort();
	pool = upstream_pool_new(base, &t);
	if (pool == NULL)
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct exchange x = { 0 };
	bool shut = false;
	int fd, idle = 0;

	if (size < 1)
		return 0;
	x.flags = data[0];
	x.out = evbuffer_new();
	x.sent = evbuffer_new();
	x.cap_head = evbuffer_new();
	x.tunnel = evbuffer_new();
	x.u = upstream_acquire(pool, &cbs, &x, 2000, x.flags & F_HEAD,
			       ((x.flags & F_FRESH) ? UPSTREAM_FRESH : 0) |
			       ((x.flags & F_ASKS_UPGRADE) ? UPSTREAM_UPGRADE : 0));
	if (x.u == NULL || x.out == NULL || x.sent == NULL ||
	    x.cap_head == NULL || x.tunnel == NULL)
		abort();
	upstream_request_sent(x.u);
	fd = server_end();
	if (size > 1 && write(fd, data + 1, size - 1) != (ssize_t)(size - 1))
		abort();
	/* Run the loop until the exchange ends. When it waits for more, the
	 * upstream closes: what it sent is all there is. */
	while (!x.done && !x.failed && !x.switched) {
		if (x.paused && x.u != NULL) {
			x.paused = false;
			upstream_pause_read(x.u, false);	/* drained */
			continue;
		}
		if (!shut && idle >= 3) {
			shutdown(fd, SHUT_WR);
			shut = true;
		}
		event_base_loop(base, shut ? EVLOOP_ONCE : EVLOOP_NONBLOCK);
		idle++;
	}
	if (x.done) {
		check_stream(x.out, x.flags & F_HEAD, x.status, x.sent);
		check_replay(&x);
	}
	if (x.switched) {
		/* the tunnel's first bytes: the end of what the upstream sent */
		size_t n = evbuffer_get_length(x.tunnel);

		FUZZ_REQUIRE(n <= size - 1);
		FUZZ_REQUIRE(n == 0 || memcmp(evbuffer_pullup(x.tunnel, -1),
					      data + size - n, n) == 0);
	}
	if (x.done && !shut && !x.switched)
		pooled_fd = fd;		/* the pool may have kept it */
	else
		close(fd);
	/* let the pool see what happened to its idle connection */
	event_base_loop(base, EVLOOP_NONBLOCK);
	evbuffer_free(x.out);
	evbuffer_free(x.sent);
	evbuffer_free(x.cap_head);
	evbuffer_free(x.tunnel);
	return 0;
}
