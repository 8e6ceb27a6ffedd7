/*
 * conn_priv.h - what conn.c (the connection) and its helpers conn_keyed.c
 * (keyed requests and issued keys), conn_pass.c (pass-through) and
 * conn_tls.c (TLS) share: struct conn, its states, mode and flags, and
 * the table of conn.c's machinery the helpers call (struct conn_ops).
 * Each helper's functions are in its own header. Nothing else includes it.
 */
#ifndef IDEMPROXY_CONN_PRIV_H
#define IDEMPROXY_CONN_PRIV_H

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include <llhttp.h>

#include "body.h"
#include "h1.h"
#include "httphdr.h"
#include "keyed.h"
#include "metrics.h"
#include "problem.h"
#include "reply.h"
#include "reqlog.h"

struct bufferevent;
struct config;
struct ssl_st;
struct event;
struct evbuffer;
struct idem;
struct policy;
struct store_op;
struct tunnel;
struct upstream;
struct upstream_resp;
struct conn_loop;

/* Output above this pauses the side that fills it. */
#define CONN_HIGH (256 * 1024)
/* ... and below this resumes it. */
#define CONN_LOW (64 * 1024)
/* Pipelined bytes buffered while a request is in progress. */
#define CONN_READ_HIGH (64 * 1024)
/* After a close with unread input: how long to swallow it (lingering
 * close, so that the client reads our response instead of a reset). */
#define CONN_LINGER_MS 2000

/* conn.read_timeout_ms before conn_read_timeout() set one, or after
 * another setting replaced it */
#define RT_UNSET UINT64_MAX

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
	CONN_ST_TUNNEL,		/* after a 101: a byte tunnel (conn_tunnel.c) */
	CONN_ST_CLOSING,	/* flushing the output, then closing */
	CONN_ST_LINGER,		/* write side shut, swallowing input briefly */
	CONN_ST_CLOSED,		/* on the reap list */
};

/* TLS on the connection (conn.c; tls.h). */
enum conn_tls {
	CONN_TLS_OFF,		/* plain HTTP */
	CONN_TLS_HANDSHAKE,	/* handshake under way, c->timer bounds it */
	CONN_TLS_FIRST,		/* done; the first request's head is due by
				 * the same deadline (--client-timeout) */
	CONN_TLS_OPEN,		/* past the first request head */
};

/* Who serves the request in progress (the handle that goes with it). */
enum conn_mode {
	CONN_MODE_NONE,		/* nobody yet, or answered by the proxy */
	CONN_MODE_PASS,		/* a pass-through exchange: c->up */
	CONN_MODE_KEYED,	/* the engine: c->idem (NULL once it let go) */
	CONN_MODE_ISSUE,	/* issuing a key: c->issue_op */
	CONN_MODE_TUNNEL,	/* switched protocols: c->tun */
};

/* The request's flags, one word (conn_flags_str() for logs). */
#define CONN_FLAG_LIST(X) \
	X(KEEP_ALIVE,    "keep_alive")    /* the client allows another request */ \
	X(REQ_DONE,      "req_done")      /* the whole request is read */ \
	X(CLIENT_PAUSED, "client_paused") /* reading stopped: upstream full */ \
	X(CLIENT_EOF,    "client_eof")    /* half-closed after sending */ \
	X(RETRIED,       "retried")       /* sent again after a stale conn */ \
	X(RESP_STARTED,  "resp_started")  /* final response head queued */ \
	X(RESP_CHUNKED,  "resp_chunked")  /* we chunk the body for the client */ \
	X(CLOSE_AFTER,   "close_after")   /* close once this response is out */ \
	X(BODY_TOO_LARGE, "body_too_large") \
	X(BODY_BUSY,     "body_busy")     /* the body budget is spent */ \
	X(UPGRADE,       "upgrade")       /* asks to switch protocols */

enum {
#define X(name, label) CONN_BIT_##name,
	CONN_FLAG_LIST(X)
#undef X
};

#define CF(name) (1u << CONN_BIT_##name)

struct conn_ops;

struct conn {
	const struct conn_ops *ops;	/* conn.c's, for its helpers */
	struct conn_loop *loop;
	TAILQ_ENTRY(conn) link;
	struct bufferevent *bev;
	struct ssl_st *ssl;		/* the bufferevent's; NULL: plain */
	enum conn_tls tls;
	struct event *timer;		/* handshake and head timeout, then
					 * linger timeout */
	struct event *kick;		/* parse pipelined input next turn */
	struct event *flush;		/* write the output at the end of the turn */
	bool flush_armed;		/* ... already active this turn */
	uint64_t read_timeout_ms;	/* conn_read_timeout()'s; RT_UNSET: not ours */
	struct event *tls_pump;		/* TLS: pull what OpenSSL holds (conn_tls.c) */
	enum conn_state state;
	bool draining;			/* SIGTERM: this is the last request */
	char peer[INET6_ADDRSTRLEN];
	char *tls_subject;		/* the verified client certificate's */
	char *tls_san;			/* (tls_peer_identity); NULL: none */
	llhttp_t parser;

	/* the request in progress; reset by reset_request() */
	unsigned flags;			/* CF(...) */
	enum conn_mode mode;
	struct config *cfg;		/* a ref held for the request */
	struct h1_head head;
	char *fwd;			/* the normalised target (reqhead_normalise) */
	char *match;			/* ... and the path routes match; NULL:
					 * the path does not normalise */
	char *paths;			/* where both live, kept across requests */
	size_t paths_cap;
	int method;			/* -1: no request to count */
	unsigned short http_major, http_minor;
	enum body_kind req_body;
	uint64_t req_length;		/* BODY_LENGTH: as declared */
	uint64_t req_remaining;		/* BODY_LENGTH: still to come */
	enum outcome outcome;
	int refused;			/* enum client_error of a request that
					 * never became one; -1: none */
	const char *rl_method;		/* its method's name; NULL: not known */
	bool rl_head;			/* its head is in (http_major/minor) */
	struct reqlog rl;		/* what it did: access log, spans */

	/* keyed requests (DESIGN.md §1 items 2-10, §4) */
	const struct policy *policy;	/* the route's, or the global one */
	const char *route;		/* the route's name (in cfg); NULL: global */
	struct keyed_key key;
	struct body body;		/* the buffered body while BODY */
	struct idem *idem;
	struct store_op *issue_op;

	/* pass-through */
	struct upstream *up;
	uint64_t up_start_ms;

	/* after 101 Switching Protocols */
	struct tunnel *tun;
};

static inline bool cf_has(const struct conn *c, unsigned f)
{
	return (c->flags & f) != 0;
}

static inline void cf_set(struct conn *c, unsigned f)
{
	c->flags |= f;
}

static inline void cf_clr(struct conn *c, unsigned f)
{
	c->flags &= ~f;
}

/*
 * What the connection (conn.c) offers its helpers - conn_keyed.c,
 * conn_pass.c, conn_tls.c, which it calls - as a table in c->ops: they
 * reach conn.c's machinery only through it, never by its names, so that
 * no helper depends on the module that calls it.
 */
struct conn_ops {
	void (*set_state)(struct conn *c, enum conn_state next);
	void (*read_timeout)(struct conn *c, uint64_t ms);
	struct reply_conn (*reply_conn)(const struct conn *c);
	/* Answer with a problem, count the outcome, end the request. */
	void (*answer)(struct conn *c, enum problem p, const char *detail,
		       enum outcome o, bool close);
	/* Queue 502/504 for a failed exchange; false when the connection
	 * was cut. */
	bool (*upstream_error)(struct conn *c, enum upstream_error err);
	bool (*exchange_problem)(struct conn *c, enum problem p,
				 const char *detail);
	void (*end_request)(struct conn *c);
	void (*close)(struct conn *c, const char *reason);
	/* The request's access-log line and spans, once (error: why it was
	 * cut short; NULL: it ended well). */
	void (*log_request)(struct conn *c, const char *error);
	int (*feed_parser)(struct conn *c);
	void (*read_on)(struct conn *c);
	void (*client_head)(struct conn *c, const struct upstream_resp *r);
	bool (*client_body)(struct conn *c, struct evbuffer *src, size_t len);
	void (*client_done)(struct conn *c);
};

#endif
