/*
 * upstream.c - the upstream side of the proxy (see upstream.h).
 *
 *   acquire ──▶ UP_ST_CONNECTING ──connected──▶ UP_ST_BUSY ──on_done──▶ release
 *      │                                          ▲    │                  │
 *      └──── idle connection from the pool ───────┘    │   keep-alive ◀───┘
 *                                                      ▼        (UP_ST_IDLE)
 *                                        error / abort: closed, freed
 *
 * Connecting: the upstream's name may have several addresses (Debian's
 * "localhost" is ::1 then 127.0.0.1). A new connection starts at the one
 * that answered last; when its TCP connect is refused, unreachable or not
 * answered within UP_ADDR_CONNECT_MS, the next one is tried with the same
 * queued request bytes (none of which can have left: there was no
 * connection). Only the last address gets the whole timeout.
 *
 * Response parsing: llhttp reads the status line and headers and pauses in
 * on_headers_complete. Content-Length and close-delimited bodies are then
 * moved out of the input buffer without llhttp (and without copying);
 * chunked bodies go through llhttp, which de-chunks them.
 */
#include "upstream.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/util.h>
#include <llhttp.h>
#include <openssl/ssl.h>

#include "addrs.h"
#include "clock.h"
#include "h1.h"
#include "log.h"
#include "tls.h"

/* Keep-alive connections idle longer than this are closed: shorter than the
 * keep-alive timeout of most servers, so that we rarely reuse one the
 * upstream is closing at the same moment. */
#define UP_IDLE_TIMEOUT_S 4
/* At most this many idle connections per worker. */
#define UP_MAX_IDLE 256
/* Send more request bytes once the output fell below this. */
#define UP_WRITE_LOW (64 * 1024)
/* The response head must fit in this; larger is a protocol error. */
#define UP_MAX_HEAD (64 * 1024)
/* A TCP connect to one of several addresses gets this long before the next
 * address is tried: a SYN and a retransmission across a data centre. */
#define UP_ADDR_CONNECT_MS 2000

enum up_state {
	UP_ST_CONNECTING,	/* connect() under way, request may be queued */
	UP_ST_BUSY,		/* one exchange in progress */
	UP_ST_IDLE,		/* in the pool, owner-less */
};

enum up_phase {
	UP_PH_HEAD,		/* reading a response head */
	UP_PH_BODY,		/* reading the body of the final response */
	UP_PH_DONE,		/* response complete */
};

struct upstream {
	struct upstream_pool *pool;
	struct bufferevent *bev;
	enum up_state state;
	enum up_phase phase;
	TAILQ_ENTRY(upstream) idle_link;

	const struct upstream_cbs *cbs;
	void *arg;
	struct timeval timeout;
	bool head_request;
	bool upgrade;		/* the request asks for one: 101 switches */
	bool reused;		/* came from the pool */
	bool got_bytes;		/* any response byte in this exchange */
	bool keep_alive;	/* the upstream allows reuse */
	bool read_paused;
	bool sent;		/* upstream_request_sent() was called */
	bool slow;		/* the head is late and the owner waits on */
	bool dead;		/* closed; free when the callback unwinds */
	int depth;		/* callbacks of ours on the stack */

	struct event *flush;		/* write the output at the end of the turn */
	bool flush_armed;		/* ... already active this turn */
	struct event *next_addr;	/* UP_ADDR_CONNECT_MS of this address */
	int addr;		/* index in the pool's addresses: connecting to */
	int tried;		/* addresses tried for this connection */

	llhttp_t parser;
	struct h1_head head;	/* the response head being read */
	enum body_kind body;
	uint64_t remaining;	/* BODY_LENGTH */
	struct evbuffer *chunk;	/* de-chunked bytes on their way out */
};

TAILQ_HEAD(upstream_list, upstream);

struct upstream_pool {
	struct event_base *base;
	struct evdns_base *dns;
	struct evdns_getaddrinfo_request *resolving;
	struct upstream_target target;
	bool literal;		/* host is an IP address: never re-resolve */
	int cur;		/* the address that connected last: tried first */
	struct upstream_list idle;
	int nidle;
	int nbusy;
	SSL_SESSION *session;	/* https: the one to resume (tls.h) */
};

static void set_timeouts(struct upstream *u);
static void read_cb(struct bufferevent *bev, void *arg);
static void write_cb(struct bufferevent *bev, void *arg);
static void event_cb(struct bufferevent *bev, short what, void *arg);
static void output_added(struct evbuffer *buf,
			 const struct evbuffer_cb_info *info, void *arg);
static bool up_try_next(struct upstream *u, const char *why);
static int on_header_field(llhttp_t *p, const char *at, size_t len);
static int on_header_value(llhttp_t *p, const char *at, size_t len);
static int on_header_value_complete(llhttp_t *p);
static int on_headers_complete(llhttp_t *p);
static int on_body(llhttp_t *p, const char *at, size_t len);
static int on_message_complete(llhttp_t *p);

static llhttp_settings_t parser_settings = {
	.on_header_field = on_header_field,
	.on_header_value = on_header_value,
	.on_header_value_complete = on_header_value_complete,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

int upstream_resolve(struct upstream_target *t, char *err, size_t errlen)
{
	return addrs_resolve(&t->addrs, t->host, t->port, 0, "--upstream",
			     err, errlen);
}

static void parser_reset(struct upstream *u)
{
	llhttp_init(&u->parser, HTTP_RESPONSE, &parser_settings);
	u->parser.data = u;
	h1_head_reset(&u->head, UP_MAX_HEAD);
	u->phase = UP_PH_HEAD;
}

static void up_free(struct upstream *u)
{
	h1_head_free(&u->head);
	evbuffer_free(u->chunk);
	event_free(u->flush);
	event_free(u->next_addr);
	free(u);
}

/* Close the connection now; free the struct once no callback of ours is on
 * the stack. */
static void up_close(struct upstream *u)
{
	struct upstream_pool *p = u->pool;

	if (u->dead)
		return;
	u->dead = true;
	if (u->state == UP_ST_IDLE) {
		TAILQ_REMOVE(&p->idle, u, idle_link);
		p->nidle--;
	} else {
		p->nbusy--;
	}
	if (u->bev != NULL) {		/* NULL: upstream_detach() took it */
		if (p->target.tls != NULL)
			tls_upstream_closing(u->bev, u->state == UP_ST_IDLE ||
					     u->phase == UP_PH_DONE);
		bufferevent_free(u->bev);	/* and its SSL */
		u->bev = NULL;
	}
	u->cbs = NULL;
	event_del(u->flush);
	u->flush_armed = false;
	event_del(u->next_addr);
	metrics_gauge_add(GAUGE_upstream_connections, -1);
	if (u->depth == 0)
		up_free(u);
}

/* Leave a callback section; free u if it was closed meanwhile. Returns
 * true when u is gone. */
static bool up_leave(struct upstream *u)
{
	if (--u->depth == 0 && u->dead) {
		up_free(u);
		return true;
	}
	return u->dead;
}

static void dns_done(int result, struct evutil_addrinfo *res, void *arg)
{
	struct upstream_pool *p = arg;
	struct addrs addrs;

	p->resolving = NULL;
	if (result != 0) {
		if (result != EVUTIL_EAI_CANCEL)
			log_warn("upstream %s: re-resolving failed: %s",
				 p->target.host, evutil_gai_strerror(result));
		return;
	}
	if (addrs_from_addrinfo(&addrs, res) > 0) {
		p->target.addrs = addrs;
		p->cur = 0;
		log_info("upstream %s re-resolved: %d address%s", p->target.host,
			 addrs.n, addrs.n == 1 ? "" : "es");
	}
	evutil_freeaddrinfo(res);
}

/* A connect failed: the address may have moved (a restarted container).
 * Look the name up again in the background for the next connection. */
static void re_resolve(struct upstream_pool *p)
{
	struct evutil_addrinfo hints = { .ai_family = AF_UNSPEC,
					 .ai_socktype = SOCK_STREAM };

	if (p->literal || p->resolving != NULL)
		return;
	if (p->dns == NULL) {
		p->dns = evdns_base_new(p->base,
					EVDNS_BASE_INITIALIZE_NAMESERVERS);
		if (p->dns == NULL)
			return;
	}
	p->resolving = evdns_getaddrinfo(p->dns, p->target.host,
					 p->target.port, &hints, dns_done, p);
}

/* Report a failed exchange to the owner, then close. */
static void up_fail(struct upstream *u, enum upstream_error err)
{
	const struct upstream_cbs *cbs = u->cbs;
	unsigned how = 0;

	/* the state is CONNECTING until the TCP connect and any TLS handshake
	 * are over, and nothing of the request is written before */
	if (u->state != UP_ST_CONNECTING)
		how |= UPSTREAM_SENT;
	if (u->reused && !u->got_bytes && err == UPSTREAM_ERROR_RESET)
		how |= UPSTREAM_RETRYABLE;
	metrics_upstream_error(err);
	if (err == UPSTREAM_ERROR_CONNECT)
		re_resolve(u->pool);
	if (cbs != NULL) {
		u->cbs = NULL;
		u->depth++;
		cbs->on_error(u->arg, err, how);
		if (up_leave(u))
			return;
	}
	up_close(u);
}

/* The final response is complete: tell the owner, who releases or aborts. */
static void up_done(struct upstream *u)
{
	u->phase = UP_PH_DONE;
	if (u->cbs != NULL)
		u->cbs->on_done(u->arg);
}

/* Hand len body bytes at the front of src to the owner. */
static void up_body(struct upstream *u, struct evbuffer *src, size_t len)
{
	if (len > 0 && u->cbs != NULL)
		u->cbs->on_body(u->arg, src, len);
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	return h1_head_name(&((struct upstream *)p->data)->head, at, len);
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	return h1_head_value(&((struct upstream *)p->data)->head, at, len);
}

static int on_header_value_complete(llhttp_t *p)
{
	return h1_head_end_field(&((struct upstream *)p->data)->head);
}

static int on_headers_complete(llhttp_t *p)
{
	return HPE_PAUSED;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
	struct upstream *u = p->data;

	return evbuffer_add(u->chunk, at, len) < 0 ? -1 : 0;
}

static int on_message_complete(llhttp_t *p)
{
	return HPE_PAUSED;
}

/*
 * 101 Switching Protocols: the end of HTTP on this connection. Only to a
 * request that asked for an upgrade and was queued whole, and naming the
 * protocol (RFC 9110 §15.2.2); anything else is a protocol error (-1). The
 * owner takes the connection in on_head (upstream_detach) or aborts it;
 * bytes after the head stay in the input, the new protocol's first.
 */
static int switched(struct upstream *u, struct upstream_resp *resp)
{
	if (!u->upgrade || !u->sent || hdrlist_find(&u->head.fields, "upgrade", 0) < 0)
		return -1;
	resp->body = BODY_NONE;
	u->keep_alive = false;
	u->phase = UP_PH_DONE;
	if (u->cbs != NULL)
		u->cbs->on_head(u->arg, resp);
	return 0;
}

/*
 * A head is parsed (llhttp paused in on_headers_complete). Work out the body,
 * tell the owner, and set up for the body or for the next head after a 1xx.
 * Returns -1 on a protocol error.
 */
static int handle_head(struct upstream *u)
{
	llhttp_t *p = &u->parser;
	struct upstream_resp resp = {
		.status = p->status_code,
		.http_major = p->http_major,
		.http_minor = p->http_minor,
		.headers = &u->head.fields,
	};

	if (httphdr_validate(&u->head.fields) < 0)
		return -1;
	if (resp.status < 100 || resp.status > 999)
		return -1;	/* not three digits: nothing a client can read */
	if (resp.status >= 100 && resp.status < 200) {
		if (resp.status == 101)
			return switched(u, &resp);
		resp.body = BODY_NONE;
		if (u->cbs != NULL)
			u->cbs->on_head(u->arg, &resp);
		parser_reset(u);
		return 0;
	}
	/* an upgrade refused: the upstream may speak the protocol anyway */
	u->keep_alive = !u->upgrade && h1_keep_alive(&u->head.fields,
						     p->http_major, p->http_minor);
	if (u->head_request || resp.status == 204 || resp.status == 304) {
		resp.body = BODY_NONE;
	} else if (p->flags & F_CHUNKED) {
		resp.body = BODY_CHUNKED;
	} else if (p->flags & F_CONTENT_LENGTH) {
		resp.body = BODY_LENGTH;
		resp.content_length = p->content_length;
	} else if (p->flags & F_TRANSFER_ENCODING) {
		return -1;	/* a coding we cannot delimit */
	} else {
		resp.body = BODY_EOF;
		u->keep_alive = false;
	}
	u->body = resp.body;
	u->remaining = resp.content_length;
	u->phase = UP_PH_BODY;
	if (u->slow) {
		u->slow = false;
		set_timeouts(u);	/* each gap in the body is timed again */
	}
	if (u->cbs != NULL)
		u->cbs->on_head(u->arg, &resp);
	if (resp.body == BODY_CHUNKED)
		llhttp_resume(p);
	return 0;
}

/* Feed input to llhttp until it pauses or runs dry. Returns -1 on error. */
static int parse_some(struct upstream *u, struct evbuffer *in, bool *paused)
{
	*paused = false;
	while (evbuffer_get_length(in) > 0) {
		struct evbuffer_iovec v;
		enum llhttp_errno err;
		size_t used;

		if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
			break;
		err = llhttp_execute(&u->parser, v.iov_base, v.iov_len);
		if (err == HPE_OK) {
			used = v.iov_len;
		} else if (err == HPE_PAUSED) {
			used = (size_t)(llhttp_get_error_pos(&u->parser) -
					(const char *)v.iov_base);
			*paused = true;
		} else {
			log_debug("upstream: bad response: %s (%s)",
				  llhttp_errno_name(err),
				  llhttp_get_error_reason(&u->parser));
			return -1;
		}
		evbuffer_drain(in, used);
		if (*paused)
			return 0;
	}
	return 0;
}

/* Pass de-chunked bytes on, then report completion if llhttp paused at the
 * end of the message. */
static void flush_chunk(struct upstream *u)
{
	up_body(u, u->chunk, evbuffer_get_length(u->chunk));
}

/*
 * Process whatever response bytes are buffered. Loops over interim heads,
 * the body and its end. Runs with u->depth raised; the caller checks dead.
 */
static void process_input(struct upstream *u)
{
	struct evbuffer *in = bufferevent_get_input(u->bev);
	bool paused;

	while (!u->dead && !u->read_paused && u->state == UP_ST_BUSY) {
		switch (u->phase) {
		case UP_PH_HEAD:
			if (evbuffer_get_length(in) == 0)
				return;
			if (parse_some(u, in, &paused) < 0) {
				up_fail(u, UPSTREAM_ERROR_PROTOCOL);
				return;
			}
			if (!paused)
				return;		/* head incomplete */
			if (handle_head(u) < 0) {
				up_fail(u, UPSTREAM_ERROR_PROTOCOL);
				return;
			}
			if (!u->dead && u->phase == UP_PH_BODY &&
			    u->body == BODY_NONE)
				up_done(u);
			break;
		case UP_PH_BODY:
			switch (u->body) {
			case BODY_LENGTH: {
				size_t n = evbuffer_get_length(in);

				if (n > u->remaining)
					n = (size_t)u->remaining;
				u->remaining -= n;
				up_body(u, in, n);
				if (u->dead)
					return;
				if (u->remaining == 0) {
					up_done(u);
					break;
				}
				return;
			}
			case BODY_EOF:
				up_body(u, in, evbuffer_get_length(in));
				return;
			case BODY_CHUNKED:
				if (evbuffer_get_length(in) == 0)
					return;
				if (parse_some(u, in, &paused) < 0) {
					up_fail(u, UPSTREAM_ERROR_PROTOCOL);
					return;
				}
				flush_chunk(u);
				if (u->dead)
					return;
				if (paused) {
					up_done(u);
					break;
				}
				return;
			case BODY_NONE:
				up_done(u);
				break;
			}
			break;
		case UP_PH_DONE:
			return;
		}
	}
}

static void read_cb(struct bufferevent *bev, void *arg)
{
	struct upstream *u = arg;

	if (u->state == UP_ST_IDLE) {
		/* Bytes on an idle connection: the upstream is confused or
		 * closing. Either way the connection cannot be reused. */
		up_close(u);
		return;
	}
	u->got_bytes = true;
	u->depth++;
	process_input(u);
	up_leave(u);
}

static void write_cb(struct bufferevent *bev, void *arg)
{
	struct upstream *u = arg;

	if (evbuffer_get_length(bufferevent_get_output(bev)) == 0 &&
	    u->state != UP_ST_CONNECTING &&
	    (bufferevent_get_enabled(bev) & EV_WRITE))
		bufferevent_disable(bev, EV_WRITE);	/* back to flush_cb */

	if (u->state != UP_ST_BUSY || u->cbs == NULL || u->cbs->on_drain == NULL)
		return;
	u->depth++;
	u->cbs->on_drain(u->arg);
	up_leave(u);
}

/*
 * As on the client side (conn.c flush_cb): queued request bytes are written
 * straight to the socket at the end of the turn; the write event is armed
 * only while connecting or when the socket does not take everything.
 */
static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
	struct upstream *u = arg;
	struct evbuffer *out;

	u->flush_armed = false;
	if (u->dead || u->state != UP_ST_BUSY)
		return;
	out = bufferevent_get_output(u->bev);
	if (evbuffer_get_length(out) == 0 ||
	    (bufferevent_get_enabled(u->bev) & EV_WRITE))
		return;
	if (u->pool->target.tls != NULL) {
		tls_flush(u->bev);
		return;
	}
	evbuffer_unfreeze(out, 1);
	(void)evbuffer_write(out, bufferevent_getfd(u->bev));
	evbuffer_freeze(out, 1);
	if (evbuffer_get_length(out) > 0) {
		bufferevent_enable(u->bev, EV_WRITE);
		return;
	}
	write_cb(u->bev, u);
}

static void output_added(struct evbuffer *buf, const struct evbuffer_cb_info *info,
			 void *arg)
{
	struct upstream *u = arg;

	if (info->n_added > 0 && !u->dead && !u->flush_armed &&
	    !(bufferevent_get_enabled(u->bev) & EV_WRITE)) {
		u->flush_armed = true;
		event_active(u->flush, EV_WRITE, 1);
	}
}

/* An error or a close on an https connection that TLS explains (a
 * certificate that does not verify, an alert, a refused client
 * certificate): log why once, and fail the exchange. */
static bool tls_fail(struct upstream *u, struct bufferevent *bev, int sys)
{
	char why[256];

	if (u->pool->target.tls == NULL ||
	    !tls_upstream_failed(bev, !u->reused && !u->got_bytes,
				 u->state == UP_ST_CONNECTING, sys, why,
				 sizeof(why)))
		return false;
	log_warn("upstream %s:%s: TLS: %s", u->pool->target.host,
		 u->pool->target.port, why);
	up_fail(u, UPSTREAM_ERROR_TLS);
	return true;
}

/* The address u is connecting to, numeric, for the log. */
static const char *up_addr_str(const struct upstream *u, char *buf, size_t len)
{
	const struct addrs *a = &u->pool->target.addrs;

	if (u->addr >= a->n)
		return "?";
	return addrs_str((const struct sockaddr *)&a->ss[u->addr],
			 a->len[u->addr], buf, len);
}

/* Is u's TCP connection established (as opposed to still, or never)? */
static bool tcp_connected(const struct upstream *u)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	return getpeername(bufferevent_getfd(u->bev), (struct sockaddr *)&ss,
			   &len) == 0;
}

/* errno values that only a TCP connect gives: the request cannot have
 * reached anyone. */
static bool connect_errno(int e)
{
	return e == ECONNREFUSED || e == ENETUNREACH || e == EHOSTUNREACH ||
	       e == EADDRNOTAVAIL || e == ENETDOWN || e == EHOSTDOWN ||
	       e == EAFNOSUPPORT || e == EACCES || e == EPERM;
}

/*
 * An event while connecting: did the TCP connect itself fail (no
 * connection, so nothing was sent)? Over plain TCP every failure before
 * BEV_EVENT_CONNECTED is; over TLS, CONNECTED comes after the handshake,
 * so a failure is the connect's only when errno says so, or when a timeout
 * finds no connection.
 */
static bool connect_failed(const struct upstream *u, short what, int sys)
{
	if (what & BEV_EVENT_TIMEOUT)
		return !tcp_connected(u);
	if (u->pool->target.tls == NULL)
		return true;
	return connect_errno(sys);
}

/* The TCP connect failed: try the next address, or fail the exchange. */
static void up_connect_failed(struct upstream *u, short what, int sys)
{
	char why[128], addr[ADDRS_STRLEN];
	bool timeout = (what & BEV_EVENT_TIMEOUT) != 0;

	if (timeout)
		snprintf(why, sizeof(why), "timed out");
	else
		snprintf(why, sizeof(why), "%s",
			 sys != 0 ? strerror(sys) : "connection failed");
	if (up_try_next(u, why))
		return;
	log_warn("upstream %s:%s: connect to %s failed: %s",
		 u->pool->target.host, u->pool->target.port,
		 up_addr_str(u, addr, sizeof(addr)), why);
	up_fail(u, timeout ? UPSTREAM_ERROR_TIMEOUT : UPSTREAM_ERROR_CONNECT);
}

/*
 * The read timeout fired while the final head is awaited after the whole
 * request was sent: may the owner wait on (on_slow)? Then reading goes on
 * with no read timeout until the head comes (writes stay timed). Returns
 * true when the exchange goes on, or u died in the callback.
 */
static bool head_is_late(struct upstream *u)
{
	bool wait;

	if (u->phase != UP_PH_HEAD || !u->sent || u->cbs == NULL ||
	    u->cbs->on_slow == NULL)
		return false;
	u->depth++;
	wait = u->cbs->on_slow(u->arg);
	if (up_leave(u))
		return true;
	if (!wait || u->cbs == NULL)
		return false;
	u->slow = true;
	bufferevent_set_timeouts(u->bev, NULL, &u->timeout);
	bufferevent_enable(u->bev, EV_READ);
	return true;
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct upstream *u = arg;
	int sys = EVUTIL_SOCKET_ERROR();	/* before any call changes it */

	if (what & BEV_EVENT_CONNECTED) {
		evutil_socket_t fd = bufferevent_getfd(bev);
		SSL *ssl = bufferevent_openssl_get_ssl(bev);
		int one = 1;

		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		u->state = UP_ST_BUSY;
		u->pool->cur = u->addr;	/* the next connection starts here */
		event_del(u->next_addr);
		if (ssl != NULL) {
			set_timeouts(u);	/* the handshake's read timeout off */
			metrics_count(COUNTER_upstream_tls_handshakes_total);
			if (SSL_session_reused(ssl))
				metrics_count(COUNTER_upstream_tls_resumed_total);
		}
		return;
	}
	if (u->state == UP_ST_IDLE) {
		up_close(u);	/* idle timeout or the upstream closed it */
		return;
	}
	if (u->state == UP_ST_CONNECTING && connect_failed(u, what, sys)) {
		up_connect_failed(u, what, sys);
		return;
	}
	if (((what & BEV_EVENT_ERROR) ||
	     ((what & BEV_EVENT_EOF) && !u->reused && !u->got_bytes)) &&
	    u->phase != UP_PH_DONE && tls_fail(u, bev, sys))
		return;
	if (u->state == UP_ST_CONNECTING) {
		/* a TLS handshake that timed out or was cut short */
		up_fail(u, (what & BEV_EVENT_TIMEOUT) ? UPSTREAM_ERROR_TIMEOUT :
							UPSTREAM_ERROR_RESET);
		return;
	}
	if (what & BEV_EVENT_TIMEOUT) {
		if ((what & BEV_EVENT_READING) &&
		    h1_socket_readable(bufferevent_getfd(bev))) {
			/* the loop was late (a stalled process), not the
			 * upstream: what it sent is waiting, read it */
			bufferevent_enable(bev, EV_READ);
			return;
		}
		if ((what & BEV_EVENT_READING) && head_is_late(u))
			return;
		up_fail(u, UPSTREAM_ERROR_TIMEOUT);
		return;
	}
	/* EOF or error. A close-delimited body ends here; everything else
	 * was cut short. Whatever is still buffered is processed first. */
	u->depth++;
	if (evbuffer_get_length(bufferevent_get_input(bev)) > 0 && !u->read_paused) {
		u->got_bytes = true;
		process_input(u);
	}
	if (up_leave(u))
		return;
	if (u->phase == UP_PH_BODY && u->body == BODY_EOF && (what & BEV_EVENT_EOF)) {
		u->keep_alive = false;
		u->depth++;
		up_done(u);
		if (up_leave(u))
			return;
		return;
	}
	if (u->phase == UP_PH_DONE)
		return;		/* owner has yet to release; it will close */
	up_fail(u, UPSTREAM_ERROR_RESET);
}

struct upstream_pool *upstream_pool_new(struct event_base *base,
					const struct upstream_target *t)
{
	struct upstream_pool *p = calloc(1, sizeof(*p));
	unsigned char buf[sizeof(struct in6_addr)];

	if (p == NULL)
		return NULL;
	p->base = base;
	p->target = *t;
	p->literal = evutil_inet_pton(AF_INET, t->host, buf) == 1 ||
		     evutil_inet_pton(AF_INET6, t->host, buf) == 1;
	TAILQ_INIT(&p->idle);
	return p;
}

void upstream_pool_close_idle(struct upstream_pool *p)
{
	while (!TAILQ_EMPTY(&p->idle))
		up_close(TAILQ_FIRST(&p->idle));
}

void upstream_pool_free(struct upstream_pool *p)
{
	if (p == NULL)
		return;
	upstream_pool_close_idle(p);
	SSL_SESSION_free(p->session);
	if (p->resolving != NULL)
		evdns_getaddrinfo_cancel(p->resolving);
	if (p->dns != NULL)
		evdns_base_free(p->dns, 1);
	free(p);
}

/* Reading on. Enabling what is on re-adds the event: an idle connection
 * reads already, and set_timeouts() has just re-added it. */
static void read_on(struct upstream *u)
{
	if (!(bufferevent_get_enabled(u->bev) & EV_READ))
		bufferevent_enable(u->bev, EV_READ);
}

/* Reading is timed once the request is out, and during a TLS handshake
 * (which waits for the upstream's answers before the request is out). */
static void set_timeouts(struct upstream *u)
{
	bool reading = (u->sent && !u->slow) || (u->state == UP_ST_CONNECTING &&
				   u->pool->target.tls != NULL);

	bufferevent_set_timeouts(u->bev, reading ? &u->timeout : NULL,
				 &u->timeout);
}

/* A bufferevent that will run a TLS handshake once connected. */
static struct bufferevent *tls_bev(struct upstream_pool *p)
{
	SSL *ssl = tls_upstream_ssl(p->target.tls, &p->session);
	struct bufferevent *bev;

	if (ssl == NULL)
		return NULL;
	bev = bufferevent_openssl_socket_new(p->base, -1, ssl,
					     BUFFEREVENT_SSL_CONNECTING,
					     BEV_OPT_CLOSE_ON_FREE);
	if (bev == NULL) {
		SSL_free(ssl);
		return NULL;
	}
	/* Many servers close without close_notify; a close-delimited body
	 * is then taken as whole, as over plain TCP. */
	bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
	return bev;
}

/* A new bufferevent for u, TLS when the target is https, its callbacks
 * set. Returns NULL when none could be made. */
static struct bufferevent *up_new_bev(struct upstream *u)
{
	struct upstream_pool *p = u->pool;
	struct bufferevent *bev;

	if (p->target.tls != NULL)
		bev = tls_bev(p);
	else
		bev = bufferevent_socket_new(p->base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (bev == NULL)
		return NULL;
	if (evbuffer_add_cb(bufferevent_get_output(bev), output_added, u) == NULL) {
		bufferevent_free(bev);
		return NULL;
	}
	bufferevent_setcb(bev, read_cb, write_cb, event_cb, u);
	bufferevent_setwatermark(bev, EV_WRITE, UP_WRITE_LOW, 0);
	return bev;
}

/*
 * Start connecting u->bev to address u->addr (and, for https, the
 * handshake). When more addresses remain, this one gets at most
 * UP_ADDR_CONNECT_MS. Returns -1 when no socket could be made.
 */
static int up_dial(struct upstream *u)
{
	struct upstream_pool *p = u->pool;
	const struct addrs *a = &p->target.addrs;
	uint64_t ms = (uint64_t)u->timeout.tv_sec * 1000 +
		      (uint64_t)u->timeout.tv_usec / 1000;

	u->tried++;
	if (bufferevent_socket_connect(u->bev,
			(const struct sockaddr *)&a->ss[u->addr],
			(int)a->len[u->addr]) < 0) {
		/* Refused is reported through event_cb on the next loop turn;
		 * this is no socket (fd exhaustion) or an address this host
		 * cannot reach at all (no route, no IPv6). The bufferevent
		 * keeps no socket: it can be connected again. */
		char addr[ADDRS_STRLEN];

		log_warn("upstream %s:%s: cannot connect to %s: %s",
			 p->target.host, p->target.port,
			 up_addr_str(u, addr, sizeof(addr)), strerror(errno));
		return -1;
	}
	if (p->target.tls != NULL)
		tls_upstream_resume(u->bev, p->session);
	if (u->tried < a->n) {
		struct timeval tv = clock_tv(ms < UP_ADDR_CONNECT_MS ?
					     ms : UP_ADDR_CONNECT_MS);

		event_add(u->next_addr, &tv);
	}
	set_timeouts(u);
	/* EV_WRITE: the connect */
	bufferevent_enable(u->bev, u->read_paused ? EV_WRITE : EV_READ | EV_WRITE);
	return 0;
}

/*
 * The TCP connect of u failed (why): carry the request bytes queued so far
 * over to a connection to the next address. Returns false when every
 * address was tried or no socket could be made; u is unchanged then and
 * the caller fails the exchange.
 */
static bool up_try_next(struct upstream *u, const char *why)
{
	struct upstream_pool *p = u->pool;
	struct bufferevent *old = u->bev;
	struct evbuffer *out = bufferevent_get_output(old);
	char was[ADDRS_STRLEN], next[ADDRS_STRLEN];
	int old_addr = u->addr;

	if (u->tried >= p->target.addrs.n)
		return false;
	u->bev = up_new_bev(u);
	if (u->bev == NULL) {
		u->bev = old;
		return false;
	}
	up_addr_str(u, was, sizeof(was));
	event_del(u->next_addr);
	do {
		if (u->tried >= p->target.addrs.n) {
			bufferevent_free(u->bev);
			u->bev = old;
			u->addr = old_addr;
			return false;
		}
		u->addr = (u->addr + 1) % p->target.addrs.n;
	} while (up_dial(u) < 0);
	log_warn("upstream %s:%s: connect to %s failed: %s; trying %s",
		 p->target.host, p->target.port, was, why,
		 up_addr_str(u, next, sizeof(next)));
	evbuffer_unfreeze(out, 1);
	evbuffer_add_buffer(bufferevent_get_output(u->bev), out);
	if (p->target.tls != NULL)
		tls_upstream_closing(old, false);
	bufferevent_free(old);
	return true;
}

static void next_addr_cb(evutil_socket_t fd, short what, void *arg)
{
	struct upstream *u = arg;
	char why[64];

	if (u->dead || u->state != UP_ST_CONNECTING || tcp_connected(u) ||
	    u->tried >= u->pool->target.addrs.n)
		return;		/* connected (a TLS handshake, timed as one), or
				 * the last address: its own timeout */
	snprintf(why, sizeof(why), "no answer within %d ms", UP_ADDR_CONNECT_MS);
	if (!up_try_next(u, why))
		up_fail(u, UPSTREAM_ERROR_CONNECT);
}

/* A new connection to the address that answered last. */
static struct upstream *up_connect(struct upstream_pool *p, uint64_t timeout_ms)
{
	struct upstream *u = calloc(1, sizeof(*u));

	if (u == NULL)
		return NULL;
	u->pool = p;
	u->timeout = clock_tv(timeout_ms);
	u->addr = p->cur < p->target.addrs.n ? p->cur : 0;
	u->state = UP_ST_CONNECTING;
	u->chunk = evbuffer_new();
	u->flush = event_new(p->base, -1, 0, flush_cb, u);
	u->next_addr = evtimer_new(p->base, next_addr_cb, u);
	if (u->chunk == NULL || u->flush == NULL || u->next_addr == NULL)
		goto fail;
	u->bev = up_new_bev(u);
	if (u->bev == NULL)
		goto fail;
	h1_head_init(&u->head, UP_MAX_HEAD);
	while (up_dial(u) < 0) {
		if (u->tried >= p->target.addrs.n) {
			bufferevent_free(u->bev);
			up_free(u);
			re_resolve(p);
			return NULL;
		}
		u->addr = (u->addr + 1) % p->target.addrs.n;
	}
	return u;
fail:
	if (u->chunk != NULL)
		evbuffer_free(u->chunk);
	if (u->flush != NULL)
		event_free(u->flush);
	if (u->next_addr != NULL)
		event_free(u->next_addr);
	free(u);
	return NULL;
}

/*
 * Is an idle pooled connection still open? A peek sees the upstream's FIN
 * (or reset) that arrived while it sat in the pool, so that a request is
 * not sent on a connection already closed - the one case in which the
 * proxy could not tell whether the request was read.
 */
static bool idle_alive(struct upstream *u)
{
	char b;
	ssize_t n = recv(bufferevent_getfd(u->bev), &b, 1,
			 MSG_PEEK | MSG_DONTWAIT);

	return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

struct upstream *upstream_acquire(struct upstream_pool *p,
				  const struct upstream_cbs *cbs, void *arg,
				  uint64_t timeout_ms, bool head, unsigned how)
{
	struct upstream *u = (how & UPSTREAM_FRESH) ? NULL : TAILQ_FIRST(&p->idle);

	while (u != NULL && (how & UPSTREAM_CHECK) && !idle_alive(u)) {
		up_close(u);	/* closed (or talking) while idle */
		u = TAILQ_FIRST(&p->idle);
	}
	if (u != NULL) {
		TAILQ_REMOVE(&p->idle, u, idle_link);
		p->nidle--;
		u->state = UP_ST_BUSY;
		u->reused = true;
	} else {
		u = up_connect(p, timeout_ms);
		if (u == NULL)
			return NULL;
		u->reused = false;
		metrics_gauge_add(GAUGE_upstream_connections, 1);
	}
	p->nbusy++;
	u->cbs = cbs;
	u->arg = arg;
	u->head_request = head;
	u->upgrade = (how & UPSTREAM_UPGRADE) != 0;
	u->got_bytes = false;
	u->keep_alive = false;
	u->read_paused = false;
	u->timeout = clock_tv(timeout_ms);
	parser_reset(u);
	u->sent = false;
	u->slow = false;
	set_timeouts(u);
	if (u->state == UP_ST_CONNECTING)
		bufferevent_enable(u->bev, EV_READ | EV_WRITE);	/* the connect */
	else
		read_on(u);	/* writes: flush_cb */
	return u;
}

struct evbuffer *upstream_output(struct upstream *u)
{
	return bufferevent_get_output(u->bev);
}

size_t upstream_output_pending(struct upstream *u)
{
	return evbuffer_get_length(bufferevent_get_output(u->bev));
}

void upstream_request_sent(struct upstream *u)
{
	u->sent = true;
	set_timeouts(u);
}

void upstream_pause_read(struct upstream *u, bool paused)
{
	if (u->read_paused == paused)
		return;
	u->read_paused = paused;
	if (paused) {
		bufferevent_disable(u->bev, EV_READ);
		return;
	}
	bufferevent_enable(u->bev, EV_READ);
	/* bytes may have arrived before the pause took effect */
	if (evbuffer_get_length(bufferevent_get_input(u->bev)) > 0) {
		u->depth++;
		process_input(u);
		up_leave(u);
	}
}

void upstream_release(struct upstream *u)
{
	struct upstream_pool *p = u->pool;
	struct timeval idle = { UP_IDLE_TIMEOUT_S, 0 };

	u->cbs = NULL;
	u->arg = NULL;
	if (u->dead)
		return;
	if (u->phase != UP_PH_DONE || !u->keep_alive || u->read_paused ||
	    evbuffer_get_length(bufferevent_get_input(u->bev)) > 0 ||
	    evbuffer_get_length(bufferevent_get_output(u->bev)) > 0 ||
	    p->nidle >= UP_MAX_IDLE) {
		up_close(u);
		return;
	}
	p->nbusy--;
	u->state = UP_ST_IDLE;
	TAILQ_INSERT_HEAD(&p->idle, u, idle_link);
	p->nidle++;
	h1_head_reset(&u->head, UP_MAX_HEAD);
	bufferevent_set_timeouts(u->bev, &idle, NULL);
	read_on(u);	/* an idle connection reads: a close, or stray bytes */
}

struct bufferevent *upstream_detach(struct upstream *u)
{
	struct bufferevent *bev = u->bev;

	evbuffer_remove_cb(bufferevent_get_output(bev), output_added, u);
	bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
	bufferevent_set_timeouts(bev, NULL, NULL);
	bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
	bufferevent_disable(bev, EV_READ | EV_WRITE);
	u->bev = NULL;
	u->cbs = NULL;
	u->arg = NULL;
	up_close(u);
	return bev;
}

void upstream_abort(struct upstream *u)
{
	u->cbs = NULL;
	u->arg = NULL;
	up_close(u);
}
