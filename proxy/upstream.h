/*
 * upstream.h - connections to the upstream: a keep-alive pool per worker and
 * one request/response exchange at a time on each connection.
 *
 * The owner (a client connection, or the idempotency engine) writes
 * the request into upstream_output() and gets the parsed response through
 * struct upstream_cbs. The body is handed over as bytes at the front of an
 * evbuffer so that it can be moved on with evbuffer_remove_buffer, never
 * copied for Content-Length and close-delimited bodies.
 *
 * Ownership: the pool owns every struct upstream. The owner's handle is valid
 * from upstream_acquire() until it calls upstream_release() or
 * upstream_abort(), or until on_error() was called (the pool closes the
 * connection after on_error returns). Callbacks never run inside
 * upstream_acquire(), and no callback runs after upstream_abort().
 */
#ifndef IDEMPROXY_UPSTREAM_H
#define IDEMPROXY_UPSTREAM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "addrs.h"
#include "compiler.h"
#include "httphdr.h"
#include "metrics.h"

struct bufferevent;
struct event_base;
struct evbuffer;
struct tls_upstream;
struct upstream;
struct upstream_pool;

struct upstream_resp {
	int status;
	unsigned short http_major, http_minor;
	const struct hdrlist *headers;	/* as received; valid during on_head */
	enum body_kind body;
	uint64_t content_length;	/* BODY_LENGTH only */
};

struct upstream_cbs {
	/* A response head arrived; 1xx interim heads come before the final. */
	void (*on_head)(void *arg, const struct upstream_resp *resp);
	/* len body bytes (de-chunked) are at the front of src: move them out. */
	void (*on_body)(void *arg, struct evbuffer *src, size_t len);
	/* The response is complete; release or abort the handle. */
	void (*on_done)(void *arg);
	/* The exchange failed; the handle is dead when this returns. `how`
	 * says what may have happened to the request (UPSTREAM_SENT and
	 * UPSTREAM_RETRYABLE bits). */
	void (*on_error)(void *arg, enum upstream_error err, unsigned how);
	/* The final response head is later than the timeout after the request
	 * was sent. Return true to go on waiting with no head timeout (the
	 * owner bounds the exchange itself, e.g. with upstream_abort());
	 * false, or no callback: the exchange fails with a timeout. */
	bool (*on_slow)(void *arg);
	/* The request output fell below the low watermark: send more. */
	void (*on_drain)(void *arg);
};

/* What a failed exchange's request may have done (on_error's `how`). */
#define UPSTREAM_SENT	   0x01	/* the connection was up: request bytes
				 * may have reached the upstream (else none
				 * left: a connect or TLS handshake failed) */
#define UPSTREAM_RETRYABLE 0x02	/* a reused keep-alive connection failed
				 * before a single response byte arrived
				 * (the upstream had closed it) */

/* Where to connect and how to re-resolve a name after failures. */
struct upstream_target {
	const char *host;
	const char *port;
	struct addrs addrs;		/* every address of host, resolved at
					 * start, again after connects fail */
	struct tls_upstream *tls;	/* https: shared, outlives the pools;
					 * NULL: plain HTTP */
};

/* Resolve target->host:port into every address it has (blocking: call
 * before any loop runs). */
int upstream_resolve(struct upstream_target *t, char *err, size_t errlen) MUSTCHECK;

struct upstream_pool *upstream_pool_new(struct event_base *base,
					const struct upstream_target *t);
/* Close every idle connection; busy ones are the owners' to end. */
void upstream_pool_close_idle(struct upstream_pool *p);
/* Free the pool; every handle must have been released or aborted. */
void upstream_pool_free(struct upstream_pool *p);

/* How upstream_acquire() picks a connection. */
#define UPSTREAM_FRESH	0x01	/* a new connection, never a pooled one */
#define UPSTREAM_CHECK	0x02	/* peek a pooled one first: a request that
				 * must not be sent on a connection the
				 * upstream already closed (one syscall) */
#define UPSTREAM_UPGRADE 0x04	/* the request asks for an upgrade: a 101
				 * answer switches protocols (on_head with
				 * status 101, then upstream_detach); the
				 * connection is never pooled again */

/*
 * Get a connection for one exchange: an idle pooled one unless
 * UPSTREAM_FRESH, else a new one (connect completes in the background;
 * bytes written meanwhile are sent once connected). `timeout_ms` bounds
 * connect, each write stall, and - once upstream_request_sent() is called -
 * the wait for each response read. `head` says the request is HEAD (the
 * response has no body). Returns NULL when no socket could be made.
 */
struct upstream *upstream_acquire(struct upstream_pool *p,
				  const struct upstream_cbs *cbs, void *arg,
				  uint64_t timeout_ms, bool head, unsigned how);

struct evbuffer *upstream_output(struct upstream *u);
size_t upstream_output_pending(struct upstream *u);
/* The whole request is in the output: start the response timeout. */
void upstream_request_sent(struct upstream *u);
/* Stop or restart reading the response (client back-pressure). */
void upstream_pause_read(struct upstream *u, bool paused);
/* After on_done: return the connection to the pool if it can be reused. */
void upstream_release(struct upstream *u);
/* In on_head of a 101 (UPSTREAM_UPGRADE): take the connection out of the
 * pool, the handle ends. The bufferevent comes with no callbacks, timeouts
 * or events, what the upstream sent after the 101 head in its input; an
 * https one keeps its SSL. The caller frees it. */
struct bufferevent *upstream_detach(struct upstream *u);
/* Give the handle up mid-exchange; the connection is closed. */
void upstream_abort(struct upstream *u);

#endif
