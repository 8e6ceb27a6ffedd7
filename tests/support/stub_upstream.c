/*
 * stub_upstream.c - a fast, single-threaded HTTP/1.1 test upstream.
 *
 * Used by the integration tests (it echoes what it received, so tests can
 * assert what reached the upstream), by the benchmarks (GET / is a fast
 * path) and by the idempotency tests (it counts executions per
 * Idempotency-Key, see GET /__stats).
 *
 *   stub_upstream [--listen ADDR:PORT] [--key-header NAME]
 *
 * Once listening it prints exactly one line, "listening ADDR:PORT", to
 * stdout. SIGTERM or SIGINT stop it (exit 0, everything freed).
 *
 * Requests:
 *   GET  /__stats  {"requests":N,"keys":{"<key>":count,...}}   (not counted)
 *   POST /__reset  zero the counters                            (not counted)
 *   GET  /         200 "ok\n"                                   (counted)
 *   anything else  200 application/json echo of the request:
 *     {"n":N,"method":"POST","target":"/x?y=1","version":"1.1",
 *      "headers":[["Name","value"],...],"body_len":N,"body_sha256":"hex",
 *      "body":"<first 64 KiB>"}
 *   Bytes outside printable ASCII in strings are escaped as \u00XX, so a
 *   client decodes the body as Latin-1 to get the original bytes back.
 *
 * Query parameters (combinable):
 *   status=N          response status (204, 304, 1xx: no body)
 *   delay_ms=N        wait before the response head (request fully read)
 *   body_delay_ms=N   send half the body, wait, send the rest
 *   header=Name:Value add a response header (repeatable)
 *   chunked=1         Transfer-Encoding: chunked
 *   noclen=1          neither Content-Length nor chunked: close-delimited
 *   close=1           Connection: close, and close after the response
 *   bytes=N           body: N bytes of "abcdefghijklmnopqrstuvwxyz..."
 *                     streamed under back-pressure
 *   drop=1            close without responding once the request is read
 *   expect=ignore     do not answer Expect: 100-continue
 *
 * Connections are served strictly in order: after each request the parser
 * is paused (HPE_PAUSED from on_message_complete) until its response is
 * queued, which answers pipelined requests in order and stops reading while
 * a response is pending. Request bodies are hashed incrementally; only the
 * first 64 KiB are kept.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <openssl/evp.h>

#include <llhttp.h>

#define BODY_KEEP	(64 * 1024)	/* request body bytes echoed back */
#define HEAD_MAX	(1024 * 1024)	/* request line + headers, else 431 */
#define OUT_HIGH	(256 * 1024)	/* fill the output buffer up to this */
#define OUT_LOW		(64 * 1024)	/* refill when it drains below this */
#define IN_HIGH		(1024 * 1024)	/* stop reading beyond this */
#define PIECE		(64 * 1024)	/* largest body piece queued at once */

static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz";
static char pattern[PIECE + 26];	/* the alphabet, repeated */

/* A growable byte string. */
struct sbuf {
	char *p;
	size_t len, cap;
};

static void sbuf_add(struct sbuf *s, const char *d, size_t n)
{
	if (s->len + n + 1 > s->cap) {
		size_t cap = s->cap ? s->cap : 64;
		while (cap < s->len + n + 1)
			cap *= 2;
		char *p = realloc(s->p, cap);
		if (!p)
			abort();
		s->p = p;
		s->cap = cap;
	}
	memcpy(s->p + s->len, d, n);
	s->len += n;
	s->p[s->len] = '\0';
}

static void sbuf_free(struct sbuf *s)
{
	free(s->p);
	s->p = NULL;
	s->len = s->cap = 0;
}

struct header {
	struct sbuf name, value;
};

/* Per-request options, from the query string. */
struct opts {
	int status;
	uint64_t delay_ms;
	uint64_t body_delay_ms;
	bool has_body_delay;
	bool chunked, noclen, close, drop, expect_ignore;
	bool has_bytes;
	uint64_t bytes;
	struct sbuf extra;		/* "Name: Value\r\n" lines */
};

/* Key -> execution count, open addressing over an insertion-ordered array. */
struct keyent {
	char *key;
	size_t len;
	uint64_t count;
};

struct server {
	struct event_base *base;
	struct evconnlistener *listener;
	struct event *sigterm, *sigint;
	struct conn *conns;		/* all live connections */
	const char *key_header;
	uint64_t requests;
	struct keyent *keys;
	size_t nkeys, keys_cap;
	size_t *slots;			/* index + 1 into keys; 0 = empty */
	size_t nslots;
};

enum resp_state {
	RS_READ,	/* parsing requests */
	RS_DELAY,	/* delay_ms timer before the head */
	RS_BODY,	/* queueing the body as the output drains */
	RS_BODY_PAUSE,	/* body_delay_ms timer in the middle of the body */
	RS_CLOSE,	/* response queued; close once it is written */
};

struct conn {
	struct server *srv;
	struct conn *prev, *next;
	struct bufferevent *bev;
	llhttp_t parser;
	struct event *timer;
	enum resp_state state;
	bool peer_eof;			/* client shut down its side */

	/* the request being parsed */
	struct sbuf url;
	struct header *hdrs;
	size_t nhdrs, hdrs_cap;
	bool in_value;			/* last data callback was a value */
	size_t head_bytes;
	bool head_too_large;
	EVP_MD_CTX *sha;
	uint64_t body_len;
	struct sbuf body;		/* first BODY_KEEP bytes */
	bool msg_done;			/* on_message_complete ran */
	bool keep_alive;
	bool upgrade;
	struct opts o;

	/* the response being sent */
	const char *ctype;		/* Content-Type */
	bool chunked_out;
	bool close_after;
	struct evbuffer *fixed;		/* rest of a fixed body, or NULL */
	uint64_t pat_left;		/* rest of a pattern body */
	uint64_t pat_off;
	uint64_t half_left;		/* bytes before the body pause; UINT64_MAX: none */
};

static int conn_process(struct conn *c);

/* ---- small helpers ---- */

static const char *reason(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 101: return "Switching Protocols";
	case 200: return "OK";
	case 201: return "Created";
	case 202: return "Accepted";
	case 204: return "No Content";
	case 206: return "Partial Content";
	case 301: return "Moved Permanently";
	case 302: return "Found";
	case 304: return "Not Modified";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 408: return "Request Timeout";
	case 409: return "Conflict";
	case 413: return "Content Too Large";
	case 422: return "Unprocessable Content";
	case 425: return "Too Early";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	default: return "Status";
	}
}

/* Append s as a JSON string literal (quotes included). */
static void json_str(struct evbuffer *out, const char *s, size_t n)
{
	size_t run = 0;

	evbuffer_add(out, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		const char *esc = NULL;
		char tmp[8];

		if (ch == '"')
			esc = "\\\"";
		else if (ch == '\\')
			esc = "\\\\";
		else if (ch == '\n')
			esc = "\\n";
		else if (ch == '\r')
			esc = "\\r";
		else if (ch == '\t')
			esc = "\\t";
		else if (ch < 0x20 || ch >= 0x7f) {
			snprintf(tmp, sizeof(tmp), "\\u%04x", ch);
			esc = tmp;
		}
		if (!esc)
			continue;
		if (i > run)
			evbuffer_add(out, s + run, i - run);
		evbuffer_add(out, esc, strlen(esc));
		run = i + 1;
	}
	if (n > run)
		evbuffer_add(out, s + run, n - run);
	evbuffer_add(out, "\"", 1);
}

static int hexval(int ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/* Percent-decode (and '+' -> ' ') s[0..n) into a fresh sbuf. */
static void url_decode(struct sbuf *out, const char *s, size_t n)
{
	sbuf_add(out, "", 0);
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (ch == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 &&
		    hexval(s[i + 2]) >= 0) {
			ch = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
			i += 2;
		} else if (ch == '+') {
			ch = ' ';
		}
		sbuf_add(out, &ch, 1);
	}
}

static bool parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (*s < '0' || *s > '9')
		return false;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end)
		return false;
	*out = v;
	return true;
}

static bool is_true(const char *s)
{
	return strcmp(s, "1") == 0 || strcasecmp(s, "true") == 0 ||
	       strcasecmp(s, "yes") == 0;
}

/* Fill c->o from the query string of c->url. */
static void parse_opts(struct conn *c)
{
	struct opts *o = &c->o;
	const char *q = c->url.p ? strchr(c->url.p, '?') : NULL;

	if (!q)
		return;
	q++;
	while (*q) {
		size_t len = strcspn(q, "&");
		const char *eq = memchr(q, '=', len);
		struct sbuf name = { 0 }, value = { 0 };
		uint64_t v;

		url_decode(&name, q, eq ? (size_t)(eq - q) : len);
		if (eq)
			url_decode(&value, eq + 1, len - (size_t)(eq + 1 - q));
		else
			sbuf_add(&value, "", 0);

		if (strcmp(name.p, "status") == 0) {
			if (parse_u64(value.p, &v) && v >= 100 && v <= 999)
				o->status = (int)v;
		} else if (strcmp(name.p, "delay_ms") == 0) {
			if (parse_u64(value.p, &v))
				o->delay_ms = v;
		} else if (strcmp(name.p, "body_delay_ms") == 0) {
			if (parse_u64(value.p, &v)) {
				o->body_delay_ms = v;
				o->has_body_delay = true;
			}
		} else if (strcmp(name.p, "header") == 0) {
			const char *colon = strchr(value.p, ':');
			if (colon && colon != value.p &&
			    !strpbrk(value.p, "\r\n")) {
				const char *val = colon + 1;
				while (*val == ' ' || *val == '\t')
					val++;
				sbuf_add(&o->extra, value.p,
					 (size_t)(colon - value.p));
				sbuf_add(&o->extra, ": ", 2);
				sbuf_add(&o->extra, val, strlen(val));
				sbuf_add(&o->extra, "\r\n", 2);
			}
		} else if (strcmp(name.p, "chunked") == 0) {
			o->chunked = is_true(value.p);
		} else if (strcmp(name.p, "noclen") == 0) {
			o->noclen = is_true(value.p);
		} else if (strcmp(name.p, "close") == 0) {
			o->close = is_true(value.p);
		} else if (strcmp(name.p, "drop") == 0) {
			o->drop = is_true(value.p);
		} else if (strcmp(name.p, "expect") == 0) {
			o->expect_ignore = strcmp(value.p, "ignore") == 0;
		} else if (strcmp(name.p, "bytes") == 0) {
			if (parse_u64(value.p, &v)) {
				o->bytes = v;
				o->has_bytes = true;
			}
		}
		sbuf_free(&name);
		sbuf_free(&value);
		q += len;
		if (*q == '&')
			q++;
	}
}

/* ---- execution counters ---- */

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ULL;
	}
	return h;
}

static void keys_rehash(struct server *srv, size_t nslots)
{
	size_t *slots = calloc(nslots, sizeof(*slots));

	if (!slots)
		abort();
	for (size_t i = 0; i < srv->nkeys; i++) {
		size_t j = hash_bytes(srv->keys[i].key, srv->keys[i].len) &
			   (nslots - 1);
		while (slots[j])
			j = (j + 1) & (nslots - 1);
		slots[j] = i + 1;
	}
	free(srv->slots);
	srv->slots = slots;
	srv->nslots = nslots;
}

static void keys_count(struct server *srv, const char *key, size_t len)
{
	size_t j;

	if (srv->nslots == 0 || (srv->nkeys + 1) * 2 > srv->nslots)
		keys_rehash(srv, srv->nslots ? srv->nslots * 2 : 64);
	j = hash_bytes(key, len) & (srv->nslots - 1);
	while (srv->slots[j]) {
		struct keyent *e = &srv->keys[srv->slots[j] - 1];
		if (e->len == len && memcmp(e->key, key, len) == 0) {
			e->count++;
			return;
		}
		j = (j + 1) & (srv->nslots - 1);
	}
	if (srv->nkeys == srv->keys_cap) {
		size_t cap = srv->keys_cap ? srv->keys_cap * 2 : 64;
		struct keyent *k = realloc(srv->keys, cap * sizeof(*k));
		if (!k)
			abort();
		srv->keys = k;
		srv->keys_cap = cap;
	}
	struct keyent *e = &srv->keys[srv->nkeys];
	e->key = malloc(len + 1);
	if (!e->key)
		abort();
	memcpy(e->key, key, len);
	e->key[len] = '\0';
	e->len = len;
	e->count = 1;
	srv->slots[j] = ++srv->nkeys;
}

static void keys_reset(struct server *srv)
{
	for (size_t i = 0; i < srv->nkeys; i++)
		free(srv->keys[i].key);
	free(srv->keys);
	free(srv->slots);
	srv->keys = NULL;
	srv->slots = NULL;
	srv->nkeys = srv->keys_cap = srv->nslots = 0;
	srv->requests = 0;
}

/* ---- request parsing (llhttp callbacks) ---- */

static void req_reset(struct conn *c)
{
	sbuf_free(&c->url);
	for (size_t i = 0; i < c->nhdrs; i++) {
		sbuf_free(&c->hdrs[i].name);
		sbuf_free(&c->hdrs[i].value);
	}
	c->nhdrs = 0;
	c->in_value = false;
	c->head_bytes = 0;
	c->head_too_large = false;
	c->body_len = 0;
	sbuf_free(&c->body);
	c->msg_done = false;
	c->keep_alive = false;
	c->upgrade = false;
	sbuf_free(&c->o.extra);
	memset(&c->o, 0, sizeof(c->o));
	if (c->fixed) {
		evbuffer_free(c->fixed);
		c->fixed = NULL;
	}
	c->pat_left = c->pat_off = 0;
	c->chunked_out = false;
	c->half_left = UINT64_MAX;
}

static struct conn *pconn(llhttp_t *p)
{
	return p->data;
}

static int head_account(struct conn *c, size_t n)
{
	c->head_bytes += n;
	if (c->head_bytes > HEAD_MAX) {
		c->head_too_large = true;
		return HPE_USER;
	}
	return HPE_OK;
}

static int on_message_begin(llhttp_t *p)
{
	struct conn *c = pconn(p);

	req_reset(c);
	if (EVP_DigestInit_ex(c->sha, EVP_sha256(), NULL) != 1)
		abort();
	return HPE_OK;
}

static int on_url(llhttp_t *p, const char *at, size_t n)
{
	struct conn *c = pconn(p);

	sbuf_add(&c->url, at, n);
	return head_account(c, n);
}

static int on_header_field(llhttp_t *p, const char *at, size_t n)
{
	struct conn *c = pconn(p);

	if (c->nhdrs == 0 || c->in_value) {
		if (c->nhdrs == c->hdrs_cap) {
			size_t cap = c->hdrs_cap ? c->hdrs_cap * 2 : 16;
			struct header *h = realloc(c->hdrs, cap * sizeof(*h));
			if (!h)
				abort();
			c->hdrs = h;
			c->hdrs_cap = cap;
		}
		memset(&c->hdrs[c->nhdrs], 0, sizeof(c->hdrs[0]));
		c->nhdrs++;
		c->in_value = false;
	}
	sbuf_add(&c->hdrs[c->nhdrs - 1].name, at, n);
	return head_account(c, n + 4);
}

static int on_header_value(llhttp_t *p, const char *at, size_t n)
{
	struct conn *c = pconn(p);

	c->in_value = true;
	sbuf_add(&c->hdrs[c->nhdrs - 1].value, at, n);
	return head_account(c, n);
}

static int on_header_value_complete(llhttp_t *p)
{
	struct conn *c = pconn(p);

	/* an empty value gets no on_header_value call */
	c->in_value = true;
	sbuf_add(&c->hdrs[c->nhdrs - 1].value, "", 0);
	return HPE_OK;
}

static const struct header *find_header(const struct conn *c, const char *name)
{
	for (size_t i = 0; i < c->nhdrs; i++)
		if (c->hdrs[i].name.p && strcasecmp(c->hdrs[i].name.p, name) == 0)
			return &c->hdrs[i];
	return NULL;
}

static int on_headers_complete(llhttp_t *p)
{
	struct conn *c = pconn(p);
	const struct header *h;

	sbuf_add(&c->url, "", 0);
	parse_opts(c);
	h = find_header(c, "Expect");
	if (h && strcasecmp(h->value.p, "100-continue") == 0 &&
	    !c->o.expect_ignore) {
		static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
		evbuffer_add(bufferevent_get_output(c->bev), cont,
			     sizeof(cont) - 1);
	}
	return HPE_OK;
}

static int on_body(llhttp_t *p, const char *at, size_t n)
{
	struct conn *c = pconn(p);

	if (EVP_DigestUpdate(c->sha, at, n) != 1)
		abort();
	if (c->body.len < BODY_KEEP) {
		size_t keep = BODY_KEEP - c->body.len;
		sbuf_add(&c->body, at, n < keep ? n : keep);
	}
	c->body_len += n;
	return HPE_OK;
}

static int on_message_complete(llhttp_t *p)
{
	struct conn *c = pconn(p);

	c->msg_done = true;
	c->keep_alive = llhttp_should_keep_alive(p);
	c->upgrade = p->upgrade;
	return HPE_PAUSED;	/* one request at a time, see conn_process */
}

static llhttp_settings_t settings;

/* ---- connections ---- */

static void conn_free(struct conn *c)
{
	struct server *srv = c->srv;

	if (c->prev)
		c->prev->next = c->next;
	else
		srv->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	req_reset(c);
	free(c->hdrs);
	if (c->timer)
		event_free(c->timer);
	EVP_MD_CTX_free(c->sha);
	bufferevent_free(c->bev);
	free(c);
}

/*
 * The response is fully queued. Returns -1 when the connection was freed,
 * otherwise 0 with the state set to RS_READ or RS_CLOSE; the caller
 * continues parsing when it is RS_READ.
 */
static int resp_done(struct conn *c)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);

	if (c->close_after) {
		c->state = RS_CLOSE;
		bufferevent_disable(c->bev, EV_READ);
		bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
		if (evbuffer_get_length(out) == 0) {
			conn_free(c);
			return -1;
		}
		return 0;
	}
	c->state = RS_READ;
	llhttp_resume(&c->parser);
	req_reset(c);
	return 0;
}

static void timer_arm(struct conn *c, uint64_t ms);

/*
 * Queue body pieces until the output buffer holds OUT_HIGH bytes, the body
 * ends, or the body_delay_ms midpoint is reached. Returns -1 when the
 * connection was freed.
 */
static int resp_fill(struct conn *c)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);

	while (evbuffer_get_length(out) < OUT_HIGH) {
		uint64_t left = c->fixed ? evbuffer_get_length(c->fixed)
					 : c->pat_left;
		size_t n;
		char line[32];

		if (left == 0) {
			if (c->chunked_out)
				evbuffer_add(out, "0\r\n\r\n", 5);
			return resp_done(c);
		}
		if (c->half_left == 0) {
			c->half_left = UINT64_MAX;
			c->state = RS_BODY_PAUSE;
			timer_arm(c, c->o.body_delay_ms);
			return 0;
		}
		n = (size_t)(left < PIECE ? left : PIECE);
		if (c->half_left < n)
			n = (size_t)c->half_left;
		if (c->chunked_out) {
			int len = snprintf(line, sizeof(line), "%zx\r\n", n);
			evbuffer_add(out, line, (size_t)len);
		}
		if (c->fixed) {
			evbuffer_remove_buffer(c->fixed, out, n);
		} else {
			evbuffer_add_reference(out, pattern + c->pat_off, n,
					       NULL, NULL);
			c->pat_off = (c->pat_off + n) % 26;
			c->pat_left -= n;
		}
		if (c->chunked_out)
			evbuffer_add(out, "\r\n", 2);
		if (c->half_left != UINT64_MAX)
			c->half_left -= n;
	}
	return 0;
}

/* Queue the status line and headers, then the body. -1: freed. */
static int resp_head(struct conn *c)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);
	int status = c->o.status ? c->o.status : 200;
	bool head = c->parser.method == HTTP_HEAD;
	bool no_body = status < 200 || status == 204 || status == 304;
	uint64_t len = c->fixed ? evbuffer_get_length(c->fixed) : c->pat_left;

	evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", status, reason(status));
	if (!no_body) {
		evbuffer_add_printf(out, "Content-Type: %s\r\n", c->ctype);
		if (c->o.chunked)
			evbuffer_add_printf(out, "Transfer-Encoding: chunked\r\n");
		else if (c->o.noclen)
			c->close_after = true;
		else
			evbuffer_add_printf(out, "Content-Length: %" PRIu64 "\r\n",
					    len);
	}
	if (c->o.close || !c->keep_alive || c->upgrade) {
		c->close_after = true;
		evbuffer_add_printf(out, "Connection: close\r\n");
	} else if (c->parser.http_major == 1 && c->parser.http_minor == 0) {
		evbuffer_add_printf(out, "Connection: keep-alive\r\n");
	}
	if (c->o.extra.len)
		evbuffer_add(out, c->o.extra.p, c->o.extra.len);
	evbuffer_add(out, "\r\n", 2);

	if (no_body || head) {
		if (c->fixed) {
			evbuffer_free(c->fixed);
			c->fixed = NULL;
		}
		c->pat_left = 0;
		c->chunked_out = false;
		return resp_done(c);
	}
	c->chunked_out = c->o.chunked;
	c->half_left = c->o.has_body_delay ? len / 2 : UINT64_MAX;
	c->state = RS_BODY;
	return resp_fill(c);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	int rc;

	if (c->state == RS_DELAY) {
		rc = resp_head(c);
	} else if (c->state == RS_BODY_PAUSE) {
		c->state = RS_BODY;
		rc = resp_fill(c);
	} else {
		return;
	}
	if (rc == 0 && c->state == RS_READ)
		conn_process(c);
}

static void timer_arm(struct conn *c, uint64_t ms)
{
	struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000 };

	if (!c->timer) {
		c->timer = evtimer_new(c->srv->base, timer_cb, c);
		if (!c->timer)
			abort();
	}
	evtimer_add(c->timer, &tv);
}

static void echo_body(struct conn *c, uint64_t n)
{
	struct evbuffer *b = c->fixed;
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	char hex[2 * EVP_MAX_MD_SIZE + 1];
	const char *m = llhttp_method_name((llhttp_method_t)c->parser.method);

	if (EVP_DigestFinal_ex(c->sha, md, &mdlen) != 1)
		abort();
	for (unsigned int i = 0; i < mdlen; i++)
		snprintf(hex + 2 * i, 3, "%02x", md[i]);
	hex[2 * mdlen] = '\0';

	evbuffer_add_printf(b, "{\"n\":%" PRIu64 ",\"method\":", n);
	json_str(b, m, strlen(m));
	evbuffer_add_printf(b, ",\"target\":");
	json_str(b, c->url.p, c->url.len);
	evbuffer_add_printf(b, ",\"version\":\"%d.%d\",\"headers\":[",
			    c->parser.http_major, c->parser.http_minor);
	for (size_t i = 0; i < c->nhdrs; i++) {
		evbuffer_add_printf(b, "%s[", i ? "," : "");
		json_str(b, c->hdrs[i].name.p, c->hdrs[i].name.len);
		evbuffer_add(b, ",", 1);
		json_str(b, c->hdrs[i].value.p ? c->hdrs[i].value.p : "",
			 c->hdrs[i].value.len);
		evbuffer_add(b, "]", 1);
	}
	evbuffer_add_printf(b, "],\"body_len\":%" PRIu64
			    ",\"body_sha256\":\"%s\",\"body\":",
			    c->body_len, hex);
	json_str(b, c->body.p ? c->body.p : "", c->body.len);
	evbuffer_add(b, "}", 1);
}

static void stats_body(struct server *srv, struct evbuffer *b)
{
	evbuffer_add_printf(b, "{\"requests\":%" PRIu64 ",\"keys\":{",
			    srv->requests);
	for (size_t i = 0; i < srv->nkeys; i++) {
		if (i)
			evbuffer_add(b, ",", 1);
		json_str(b, srv->keys[i].key, srv->keys[i].len);
		evbuffer_add_printf(b, ":%" PRIu64, srv->keys[i].count);
	}
	evbuffer_add(b, "}}", 2);
}

/* A request is complete: answer it. -1: the connection was freed. */
static int conn_respond(struct conn *c)
{
	struct server *srv = c->srv;
	const char *path = c->url.p ? c->url.p : "";
	int method = c->parser.method;

	c->close_after = false;
	c->ctype = "application/json";
	c->fixed = evbuffer_new();
	if (!c->fixed)
		abort();

	if (strncmp(path, "/__", 3) == 0) {
		/* control endpoints ignore every option */
		sbuf_free(&c->o.extra);
		memset(&c->o, 0, sizeof(c->o));
		if (strcmp(path, "/__stats") == 0 && method == HTTP_GET) {
			stats_body(srv, c->fixed);
		} else if (strcmp(path, "/__reset") == 0 && method == HTTP_POST) {
			keys_reset(srv);
			stats_body(srv, c->fixed);
		} else {
			c->o.status = 404;
			evbuffer_add_printf(c->fixed, "{\"error\":\"not found\"}");
		}
		return resp_head(c);
	}

	srv->requests++;
	{
		const struct header *k = find_header(c, srv->key_header);
		if (k)
			keys_count(srv, k->value.p ? k->value.p : "",
				   k->value.len);
	}
	if (c->o.drop) {
		conn_free(c);
		return -1;
	}
	if (strcmp(path, "/") == 0 && method == HTTP_GET) {
		/* the fast path for benchmarks: a 3-byte text body */
		evbuffer_add_reference(c->fixed, "ok\n", 3, NULL, NULL);
		c->ctype = "text/plain";
	} else if (c->o.has_bytes) {
		evbuffer_free(c->fixed);
		c->fixed = NULL;
		c->ctype = "application/octet-stream";
		c->pat_left = c->o.bytes;
		c->pat_off = 0;
	} else {
		echo_body(c, srv->requests);
	}
	if (c->o.delay_ms) {
		c->state = RS_DELAY;
		timer_arm(c, c->o.delay_ms);
		return 0;
	}
	return resp_head(c);
}

static void respond_error(struct conn *c, int status)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);

	evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\n"
			    "Connection: close\r\n\r\n", status, reason(status));
	c->state = RS_CLOSE;
	bufferevent_disable(c->bev, EV_READ);
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
}

/*
 * Parse buffered input while the connection is in RS_READ and the output
 * is not backed up; answer each complete request. Returns -1 when the
 * connection was freed.
 */
static int conn_process(struct conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);
	struct evbuffer *out = bufferevent_get_output(c->bev);

	while (c->state == RS_READ) {
		struct evbuffer_iovec v;
		llhttp_errno_t err;
		size_t used;

		if (evbuffer_get_length(out) >= OUT_HIGH)
			return 0;	/* wait for the write callback */
		if (evbuffer_peek(in, -1, NULL, &v, 1) < 1 || v.iov_len == 0) {
			if (c->peer_eof) {
				conn_free(c);
				return -1;
			}
			return 0;
		}
		err = llhttp_execute(&c->parser, v.iov_base, v.iov_len);
		if (err == HPE_OK) {
			evbuffer_drain(in, v.iov_len);
			continue;
		}
		if (err == HPE_PAUSED || err == HPE_PAUSED_UPGRADE) {
			used = (size_t)(llhttp_get_error_pos(&c->parser) -
					(const char *)v.iov_base);
			evbuffer_drain(in, used);
			if (err == HPE_PAUSED_UPGRADE)
				c->upgrade = true;
			if (!c->msg_done) {
				respond_error(c, 400);
				break;
			}
			if (conn_respond(c) < 0)
				return -1;
			continue;
		}
		respond_error(c, c->head_too_large ? 431 : 400);
	}
	if (c->state == RS_CLOSE &&
	    evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
		conn_free(c);
		return -1;
	}
	return 0;
}

static void read_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;

	if (c->state == RS_READ)
		conn_process(c);
}

static void write_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;

	switch (c->state) {
	case RS_READ:
		conn_process(c);
		break;
	case RS_BODY:
		if (resp_fill(c) == 0 && c->state == RS_READ)
			conn_process(c);
		break;
	case RS_CLOSE:
		if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
			conn_free(c);
		break;
	case RS_DELAY:
	case RS_BODY_PAUSE:
		break;
	}
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct conn *c = arg;

	if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) &&
	    (what & BEV_EVENT_READING)) {
		c->peer_eof = true;
		if (c->state == RS_READ)
			conn_process(c);	/* answers what is buffered, then closes */
		return;
	}
	conn_free(c);
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd,
		      struct sockaddr *sa, int salen, void *arg)
{
	struct server *srv = arg;
	struct conn *c = calloc(1, sizeof(*c));
	int one = 1;

	if (!c)
		abort();
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->srv = srv;
	c->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
	c->sha = EVP_MD_CTX_new();
	if (!c->bev || !c->sha)
		abort();
	llhttp_init(&c->parser, HTTP_REQUEST, &settings);
	c->parser.data = c;
	c->half_left = UINT64_MAX;
	c->next = srv->conns;
	if (srv->conns)
		srv->conns->prev = c;
	srv->conns = c;
	bufferevent_setcb(c->bev, read_cb, write_cb, event_cb, c);
	bufferevent_setwatermark(c->bev, EV_READ, 0, IN_HIGH);
	bufferevent_setwatermark(c->bev, EV_WRITE, OUT_LOW, 0);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
}

static void accept_error_cb(struct evconnlistener *l, void *arg)
{
	int err = EVUTIL_SOCKET_ERROR();

	fprintf(stderr, "stub_upstream: accept: %s\n",
		evutil_socket_error_to_string(err));
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
	struct server *srv = arg;

	event_base_loopbreak(srv->base);
}

/*
 * "A.B.C.D:PORT" or "[v6]:PORT", PORT 0 meaning any
 * (evutil_parse_sockaddr_port refuses port 0).
 */
static int parse_listen(const char *s, struct sockaddr_storage *ss, int *len)
{
	char host[INET6_ADDRSTRLEN + 2];
	const char *colon = strrchr(s, ':');
	uint64_t port;
	size_t hlen;

	if (!colon || !parse_u64(colon + 1, &port) || port > 65535)
		return -1;
	hlen = (size_t)(colon - s);
	if (hlen >= 2 && s[0] == '[' && s[hlen - 1] == ']') {
		s++;
		hlen -= 2;
	}
	if (hlen == 0 || hlen >= sizeof(host))
		return -1;
	memcpy(host, s, hlen);
	host[hlen] = '\0';
	memset(ss, 0, sizeof(*ss));
	if (strchr(host, ':')) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		if (evutil_inet_pton(AF_INET6, host, &s6->sin6_addr) != 1)
			return -1;
		*len = (int)sizeof(*s6);
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		if (evutil_inet_pton(AF_INET, host, &s4->sin_addr) != 1)
			return -1;
		*len = (int)sizeof(*s4);
	}
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: stub_upstream [--listen ADDR:PORT] [--key-header NAME]\n"
		"  --listen ADDR:PORT   address to listen on (default 127.0.0.1:0)\n"
		"  --key-header NAME    header counted by /__stats (default Idempotency-Key)\n");
}

int main(int argc, char **argv)
{
	struct server srv = { .key_header = "Idempotency-Key" };
	const char *listen_addr = "127.0.0.1:0";
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	int sslen_i = (int)sizeof(ss);
	char host[INET6_ADDRSTRLEN];
	int port;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
			listen_addr = argv[++i];
		} else if (strcmp(argv[i], "--key-header") == 0 && i + 1 < argc) {
			srv.key_header = argv[++i];
		} else if (strcmp(argv[i], "--help") == 0) {
			usage(stdout);
			return 0;
		} else {
			fprintf(stderr, "stub_upstream: bad argument: %s\n", argv[i]);
			usage(stderr);
			return 2;
		}
	}
	for (size_t i = 0; i < sizeof(pattern); i++)
		pattern[i] = alphabet[i % 26];
	signal(SIGPIPE, SIG_IGN);

	if (parse_listen(listen_addr, &ss, &sslen_i) < 0) {
		fprintf(stderr, "stub_upstream: bad --listen address: %s\n",
			listen_addr);
		return 2;
	}

	llhttp_settings_init(&settings);
	settings.on_message_begin = on_message_begin;
	settings.on_url = on_url;
	settings.on_header_field = on_header_field;
	settings.on_header_value = on_header_value;
	settings.on_header_value_complete = on_header_value_complete;
	settings.on_headers_complete = on_headers_complete;
	settings.on_body = on_body;
	settings.on_message_complete = on_message_complete;

	srv.base = event_base_new();
	if (!srv.base)
		abort();
	srv.listener = evconnlistener_new_bind(srv.base, accept_cb, &srv,
		LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE, 4096,
		(struct sockaddr *)&ss, sslen_i);
	if (!srv.listener) {
		fprintf(stderr, "stub_upstream: cannot listen on %s: %s\n",
			listen_addr, strerror(errno));
		event_base_free(srv.base);
		return 1;
	}
	evconnlistener_set_error_cb(srv.listener, accept_error_cb);
	srv.sigterm = evsignal_new(srv.base, SIGTERM, signal_cb, &srv);
	srv.sigint = evsignal_new(srv.base, SIGINT, signal_cb, &srv);
	if (!srv.sigterm || !srv.sigint)
		abort();
	evsignal_add(srv.sigterm, NULL);
	evsignal_add(srv.sigint, NULL);

	if (getsockname(evconnlistener_get_fd(srv.listener),
			(struct sockaddr *)&ss, &sslen) < 0)
		abort();
	if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
		evutil_inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		port = ntohs(s6->sin6_port);
		printf("listening [%s]:%d\n", host, port);
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
		evutil_inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		port = ntohs(s4->sin_port);
		printf("listening %s:%d\n", host, port);
	}
	fflush(stdout);

	event_base_dispatch(srv.base);

	while (srv.conns)
		conn_free(srv.conns);
	keys_reset(&srv);
	event_free(srv.sigterm);
	event_free(srv.sigint);
	evconnlistener_free(srv.listener);
	event_base_free(srv.base);
	libevent_global_shutdown();
	return 0;
}
