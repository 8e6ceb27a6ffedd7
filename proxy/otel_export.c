/*
 * otel_export.c - the span exporter's thread (see otel_export.h).
 *
 *   workers                         exporter thread
 *   -------                         ---------------
 *   otel_export_spans(buf)  ──┐     wait: max_batch spans queued, or
 *     lock, append, unlock    │           schedule_delay_ms, or stop
 *     (full: drop, count)     └──▶  take up to max_batch spans
 *     wake the thread only if       body = otel_encode_request(...)
 *     it sleeps and a batch         POST it on the kept connection
 *     is ready                        2xx: exported
 *                                     429/502/503/504, connect, reset,
 *                                     timeout: back off, same batch again
 *                                     other status: dropped
 *
 * The thread uses plain blocking-style I/O on a non-blocking socket: every
 * connect, TLS step, write and read waits in poll() for at most what is left
 * of the attempt's timeout_ms, and the same poll watches an eventfd that
 * otel_export_stop() writes, so that stopping cuts a wait short to the flush
 * bound instead of waiting out a 10 s timeout. Only getaddrinfo() cannot be
 * interrupted; a resolver that hangs past the bound leaves the thread behind
 * (it owns everything it uses; a later start is refused), and stop returns.
 *
 * The queue is a list under one mutex: a worker's hand-over is a lock, an
 * append and an unlock, and the condition variable is signalled only when
 * the thread sleeps and a full batch waits, so a busy proxy makes no futex
 * call per request. Everything the thread reads besides the queue is
 * written before the thread starts and freed after it is joined.
 */
#include "otel_export.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <llhttp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "clock.h"
#include "hostport.h"
#include "log.h"
#include "metrics.h"

#define BACKOFF_FIRST_MS 500
#define BACKOFF_MAX_MS 5000
#define RESPONSE_MAX (1024 * 1024)	/* bytes of one response read at most */
#define JOIN_GRACE_MS 1000		/* stop waits this long past flush_ms for
					 * a thread stuck in getaddrinfo() */

/* One request's spans as a worker handed them over. */
struct item {
	struct item *next;
	char *buf;		/* spans joined by ',' */
	size_t len, nspans;
};

/* What the thread has taken from the queue to send. */
struct batch {
	struct item *items;
	size_t nitems, nspans;
};

/* The exporter's life. */
enum ex_state {
	EX_IDLE,	/* never started, or stopped and freed */
	EX_RUNNING,	/* taking spans */
	EX_STOPPING,	/* stop called: sending what is queued, taking none */
	EX_STUCK,	/* the thread outlived stop's bound; it keeps what it
			 * holds, and no exporter can start again */
};

/* What one POST came to. */
enum post_result {
	POST_OK,	/* 2xx */
	POST_RETRY,	/* may pass: 429, 502-504, no connection, reset, timeout */
	POST_REFUSED,	/* any other status: sending it again will not help */
};

/* The connection to the collector, kept between batches (thread only). */
struct link {
	int fd;			/* -1: none */
	SSL *ssl;		/* https:// */
	bool reused;		/* it carried a request before */
};

static struct {
	pthread_mutex_t mu;
	/* under mu */
	enum ex_state state;
	struct item *head, **tail;
	size_t queued;		/* spans in the queue */
	bool sleeping;		/* the thread waits on cond */
	bool signalled;		/* and has been woken, not yet run */
	pthread_cond_t cond;	/* CLOCK_MONOTONIC */
	pthread_t thread;
	/* stop's bound, read by the thread's waits */
	atomic_bool stopping;
	_Atomic uint64_t flush_deadline;	/* clock_ms() */
	int wake_fd;		/* eventfd: stop cuts a poll() short */
	/* set before the thread starts, read-only while it runs */
	struct otel_settings s;
	struct hostport hp;
	char *target;		/* the request-target: the URL's path */
	bool tls;
	SSL_CTX *ctx;
	char *version;
	char *req_head;		/* the request head up to Content-Length's value */
	size_t req_head_len;
} ex = {
	.mu = PTHREAD_MUTEX_INITIALIZER,
	.state = EX_IDLE,
	.wake_fd = -1,
};

/* ---- settings copied for the thread ---------------------------------- */

static int pairs_copy(struct otel_pair **dst, size_t *ndst,
		      const struct otel_pair *src, size_t n)
{
	*ndst = 0;
	*dst = n ? calloc(n, sizeof(**dst)) : NULL;
	if (n > 0 && *dst == NULL)
		return -1;
	for (size_t i = 0; i < n; i++) {
		(*dst)[i].name = strdup(src[i].name);
		(*dst)[i].value = strdup(src[i].value);
		(*ndst)++;
		if ((*dst)[i].name == NULL || (*dst)[i].value == NULL)
			return -1;
	}
	return 0;
}

static char *strdup_null(const char *s, bool *oom)
{
	char *d = s ? strdup(s) : NULL;

	if (s != NULL && d == NULL)
		*oom = true;
	return d;
}

/* A deep copy of s into d; -1 when out of memory (d still freeable). */
static int settings_copy(struct otel_settings *d, const struct otel_settings *s)
{
	bool oom = false;

	*d = *s;
	d->endpoint = strdup_null(s->endpoint, &oom);
	d->service_name = strdup_null(s->service_name, &oom);
	d->ca_file = strdup_null(s->ca_file, &oom);
	d->headers = NULL;
	d->resource = NULL;
	if (pairs_copy(&d->headers, &d->nheaders, s->headers, s->nheaders) < 0 ||
	    pairs_copy(&d->resource, &d->nresource, s->resource, s->nresource) < 0)
		oom = true;
	return oom ? -1 : 0;
}

/* ---- waiting ----------------------------------------------------------- */

/* The earlier of deadline and, once stop was called, the flush bound. */
static uint64_t bounded(uint64_t deadline)
{
	uint64_t flush;

	if (!atomic_load(&ex.stopping))
		return deadline;
	flush = atomic_load(&ex.flush_deadline);
	return flush < deadline ? flush : deadline;
}

/*
 * Wait until fd has events or *deadline passes (shortened to the flush
 * bound once stop is called). 0 when ready, -1 when the time is up.
 */
static int wait_fd(int fd, short events, uint64_t *deadline)
{
	for (;;) {
		struct pollfd p[2] = {
			{ .fd = fd, .events = events },
			{ .fd = ex.wake_fd, .events = POLLIN },
		};
		bool stopping = atomic_load(&ex.stopping);
		uint64_t now = clock_ms(), left;
		int n;

		*deadline = bounded(*deadline);
		if (now >= *deadline)
			return -1;
		left = *deadline - now;
		/* the eventfd stays readable once written: watched until then */
		n = poll(p, stopping ? 1 : 2, left > INT_MAX ? INT_MAX : (int)left);
		if (n < 0 && errno != EINTR)
			return -1;
		if (n > 0 && p[0].revents != 0)
			return 0;
	}
}

/* Sleep on the condition variable until at (clock_ms()) or stop, and
 * when for_queue until a full batch waits too (a back-off is not cut
 * short by spans: they queue meanwhile). With ex.mu held. */
static void cond_wait_until(uint64_t at, bool for_queue)
{
	struct timespec ts = { (time_t)(at / 1000), (long)(at % 1000) * 1000000 };

	ex.sleeping = for_queue;
	pthread_cond_timedwait(&ex.cond, &ex.mu, &ts);
	ex.sleeping = false;
	ex.signalled = false;
}

/*
 * The back-off between two tries of a batch: false at once when waiting
 * until at would outlast limit or the flush bound (the batch is to be
 * dropped), else true after the wait. Stop cuts the wait short and the
 * batch is tried once more if the flush bound still allows it.
 */
static bool pause_until(uint64_t at, uint64_t limit)
{
	bool go = true;

	pthread_mutex_lock(&ex.mu);
	while (go && clock_ms() < at) {
		if (at > bounded(limit))
			go = false;
		else if (ex.state == EX_STOPPING)
			break;	/* stopping: one more try now, in the bound */
		else
			cond_wait_until(at, false);
	}
	pthread_mutex_unlock(&ex.mu);
	return go;
}

/* Is the exporter stopping (otel_export_stop called)? */
static bool stopping(void)
{
	bool st;

	pthread_mutex_lock(&ex.mu);
	st = ex.state == EX_STOPPING;
	pthread_mutex_unlock(&ex.mu);
	return st;
}

/* ---- the connection ------------------------------------------------------ */

static void link_close(struct link *l)
{
	if (l->ssl != NULL) {
		SSL_free(l->ssl);	/* no close_notify: the socket may be dead */
		l->ssl = NULL;
	}
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
	l->reused = false;
	ERR_clear_error();
}

/* The first queued OpenSSL error as text, or what errno says. */
static void tls_why(const char *step, char *why, size_t len)
{
	unsigned long e = ERR_get_error();
	char buf[160];

	if (e != 0)
		ERR_error_string_n(e, buf, sizeof(buf));
	else
		snprintf(buf, sizeof(buf), "%s", errno ? strerror(errno) :
			 "connection closed");
	snprintf(why, len, "TLS %s: %.120s", step, buf);	/* cut, never split */
	ERR_clear_error();
}

/* Drive one OpenSSL call that wants the socket: 1 to call again after the
 * wait, 0 when it failed (why set). */
static int tls_again(struct link *l, int rc, uint64_t *deadline,
		     const char *step, char *why, size_t len)
{
	switch (SSL_get_error(l->ssl, rc)) {
	case SSL_ERROR_WANT_READ:
		if (wait_fd(l->fd, POLLIN, deadline) == 0)
			return 1;
		snprintf(why, len, "TLS %s: timed out", step);
		return 0;
	case SSL_ERROR_WANT_WRITE:
		if (wait_fd(l->fd, POLLOUT, deadline) == 0)
			return 1;
		snprintf(why, len, "TLS %s: timed out", step);
		return 0;
	default:
		tls_why(step, why, len);
		return 0;
	}
}

static int tls_open(struct link *l, uint64_t *deadline, char *why, size_t len)
{
	unsigned char addr[16];
	const char *host = ex.hp.host;
	int rc;

	l->ssl = SSL_new(ex.ctx);
	if (l->ssl == NULL || SSL_set_fd(l->ssl, l->fd) != 1)
		goto nomem;
	if (inet_pton(AF_INET, host, addr) == 1 ||
	    inet_pton(AF_INET6, host, addr) == 1) {
		if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(l->ssl), host) != 1)
			goto nomem;
	} else {
		SSL_set_hostflags(l->ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
		if (SSL_set_tlsext_host_name(l->ssl, host) != 1 ||
		    SSL_set1_host(l->ssl, host) != 1)
			goto nomem;
	}
	while ((rc = SSL_connect(l->ssl)) != 1)
		if (!tls_again(l, rc, deadline, "handshake", why, len))
			return -1;
	return 0;
nomem:
	snprintf(why, len, "TLS: out of memory");
	ERR_clear_error();
	return -1;
}

/* One address: a non-blocking connect, waited for. */
static int connect_one(const struct addrinfo *ai, uint64_t *deadline, char *why,
		       size_t len)
{
	int fd, e = 0, one = 1;
	socklen_t elen = sizeof(e);

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    ai->ai_protocol);
	if (fd < 0) {
		snprintf(why, len, "socket: %s", strerror(errno));
		return -1;
	}
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS) {
			e = errno;
		} else if (wait_fd(fd, POLLOUT, deadline) < 0) {
			e = ETIMEDOUT;
		} else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) < 0) {
			e = errno;
		}
	}
	if (e != 0) {
		snprintf(why, len, "connect: %s", strerror(e));
		close(fd);
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* A new connection to the collector: every address in turn, then TLS. */
static int link_open(struct link *l, uint64_t *deadline, char *why, size_t len)
{
	struct addrinfo hints = {
		.ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
		.ai_flags = AI_NUMERICSERV,
	}, *res = NULL;
	int rc;

	rc = getaddrinfo(ex.hp.host, ex.hp.port, &hints, &res);
	if (rc != 0) {
		snprintf(why, len, "cannot resolve %s: %s", ex.hp.host,
			 gai_strerror(rc));
		return -1;
	}
	for (struct addrinfo *ai = res; ai != NULL && l->fd < 0; ai = ai->ai_next)
		l->fd = connect_one(ai, deadline, why, len);
	freeaddrinfo(res);
	if (l->fd < 0)
		return -1;
	if (ex.tls && tls_open(l, deadline, why, len) < 0) {
		link_close(l);
		return -1;
	}
	return 0;
}

/*
 * Whether a kept connection still looks open: nothing to read while idle
 * (a collector's FIN, or bytes it should not have sent, end it). Over TLS
 * a TLS 1.3 session ticket is readable too, and SSL_read takes it.
 */
static bool link_idle_ok(struct link *l)
{
	struct pollfd p = { .fd = l->fd, .events = POLLIN };
	char c;
	int rc;

	if (poll(&p, 1, 0) == 0)
		return true;
	if (l->ssl == NULL)
		return false;
	rc = SSL_read(l->ssl, &c, 1);
	if (rc <= 0 && SSL_get_error(l->ssl, rc) == SSL_ERROR_WANT_READ)
		return true;
	ERR_clear_error();
	return false;
}

static int link_write(struct link *l, const char *p, size_t n,
		      uint64_t *deadline, char *why, size_t len)
{
	while (n > 0) {
		ssize_t w;

		if (l->ssl != NULL) {
			int rc = SSL_write(l->ssl, p, n > INT_MAX ? INT_MAX : (int)n);

			if (rc <= 0) {
				if (!tls_again(l, rc, deadline, "write", why, len))
					return -1;
				continue;
			}
			w = rc;
		} else {
			w = send(l->fd, p, n, MSG_NOSIGNAL);
			if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
				if (wait_fd(l->fd, POLLOUT, deadline) < 0) {
					snprintf(why, len, "write: timed out");
					return -1;
				}
				continue;
			}
			if (w < 0) {
				snprintf(why, len, "write: %s", strerror(errno));
				return -1;
			}
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Read what is there (waiting for it): bytes read, 0 at the end, -1 on an
 * error or when the time is up (why set). */
static ssize_t link_read(struct link *l, char *buf, size_t cap,
			 uint64_t *deadline, char *why, size_t len)
{
	for (;;) {
		ssize_t r;

		if (l->ssl != NULL) {
			int rc = SSL_read(l->ssl, buf, cap > INT_MAX ? INT_MAX : (int)cap);

			if (rc > 0)
				return rc;
			if (SSL_get_error(l->ssl, rc) == SSL_ERROR_ZERO_RETURN)
				return 0;
			if (!tls_again(l, rc, deadline, "read", why, len))
				return -1;
			continue;
		}
		r = recv(l->fd, buf, cap, 0);
		if (r >= 0)
			return r;
		if (errno != EAGAIN && errno != EINTR) {
			snprintf(why, len, "read: %s", strerror(errno));
			return -1;
		}
		if (wait_fd(l->fd, POLLIN, deadline) < 0) {
			snprintf(why, len, "no response within the timeout");
			return -1;
		}
	}
}

/* ---- the response ---------------------------------------------------------- */

/* What the response reader keeps of a response: its status, whether the
 * connection may carry the next one, and Retry-After. */
struct resp {
	llhttp_t parser;
	int status;
	bool done;		/* a final (non-1xx) response is complete */
	bool keep_alive;
	uint64_t retry_after_s;	/* 0: none */
	char field[16], value[16];
	size_t flen, vlen;	/* past the buffer: too long to be ours */
};

static void put_bounded(char *dst, size_t cap, size_t *n, const char *at,
			size_t len)
{
	if (*n < cap && len <= cap - *n)
		memcpy(dst + *n, at, len);
	*n += len;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct resp *r = p->data;

	put_bounded(r->field, sizeof(r->field), &r->flen, at, len);
	return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	struct resp *r = p->data;

	put_bounded(r->value, sizeof(r->value) - 1, &r->vlen, at, len);
	return 0;
}

/* Retry-After in seconds (RFC 9110 §10.2.3); an HTTP date is ignored and
 * the back-off applies. */
static int on_header_value_complete(llhttp_t *p)
{
	struct resp *r = p->data;
	uint64_t v = 0;
	size_t i;

	if (r->flen == 11 && strncasecmp(r->field, "retry-after", 11) == 0 &&
	    r->vlen > 0 && r->vlen < sizeof(r->value)) {
		for (i = 0; i < r->vlen && r->value[i] >= '0' && r->value[i] <= '9'; i++)
			v = v * 10 + (uint64_t)(r->value[i] - '0');
		if (i == r->vlen)
			r->retry_after_s = v;
	}
	r->flen = 0;
	r->vlen = 0;
	return 0;
}

static int on_message_complete(llhttp_t *p)
{
	struct resp *r = p->data;

	if (p->status_code < 200)
		return 0;	/* 100 Continue and such: the answer follows */
	r->status = p->status_code;
	r->keep_alive = llhttp_should_keep_alive(p);
	r->done = true;
	return HPE_PAUSED;
}

static const llhttp_settings_t resp_settings = {
	.on_header_field = on_header_field,
	.on_header_value = on_header_value,
	.on_header_value_complete = on_header_value_complete,
	.on_message_complete = on_message_complete,
};

/*
 * Read one response: its head and its body (Content-Length, chunked or up
 * to the end, skipped). 0 with r filled in, or -1 (why set; *got says
 * whether any byte came).
 */
static int read_response(struct link *l, struct resp *r, uint64_t *deadline,
			 bool *got, char *why, size_t len)
{
	char buf[4096];
	size_t total = 0;

	memset(r, 0, sizeof(*r));
	llhttp_init(&r->parser, HTTP_RESPONSE, &resp_settings);
	r->parser.data = r;
	*got = false;
	while (!r->done) {
		ssize_t n = link_read(l, buf, sizeof(buf), deadline, why, len);
		enum llhttp_errno err;

		if (n < 0)
			return -1;
		if (n == 0) {
			if (*got && llhttp_finish(&r->parser) == HPE_OK && r->done)
				break;	/* a body that ends with the connection */
			snprintf(why, len, "%s", *got ? "the response was cut short" :
				 "the connection closed before a response");
			return -1;
		}
		*got = true;
		total += (size_t)n;
		err = llhttp_execute(&r->parser, buf, (size_t)n);
		if (err == HPE_PAUSED) {
			/* anything after the response is nothing we asked for */
			if (llhttp_get_error_pos(&r->parser) != buf + n)
				r->keep_alive = false;
			break;
		}
		if (err != HPE_OK) {
			snprintf(why, len, "a response that is no HTTP (%s)",
				 llhttp_errno_name(err));
			return -1;
		}
		if (total > RESPONSE_MAX) {
			snprintf(why, len, "a response of more than %d bytes",
				 RESPONSE_MAX);
			return -1;
		}
	}
	return 0;
}

/* ---- one export -------------------------------------------------------- */

/*
 * POST body on the kept connection (or a new one) and read the answer,
 * within deadline. A kept connection the collector closed while it idled
 * (nothing at all came back) is given one more try on a new connection:
 * that race is no failure of the collector's.
 */
static enum post_result post(struct link *l, const char *body, size_t n,
			     uint64_t deadline, uint64_t *retry_after_s,
			     char *why, size_t len)
{
	char cl[32];
	struct resp r;
	int cl_len;

	*retry_after_s = 0;
	cl_len = snprintf(cl, sizeof(cl), "%zu\r\n\r\n", n);
	for (int tries = 0; tries < 2; tries++) {
		bool reused, got = false;

		if (l->fd >= 0 && !link_idle_ok(l))
			link_close(l);
		if (l->fd < 0 && link_open(l, &deadline, why, len) < 0)
			return POST_RETRY;
		reused = l->reused;
		if (link_write(l, ex.req_head, ex.req_head_len, &deadline, why, len) < 0 ||
		    link_write(l, cl, (size_t)cl_len, &deadline, why, len) < 0 ||
		    link_write(l, body, n, &deadline, why, len) < 0 ||
		    read_response(l, &r, &deadline, &got, why, len) < 0) {
			link_close(l);
			if (reused && !got && clock_ms() < deadline)
				continue;
			return POST_RETRY;
		}
		l->reused = true;
		if (!r.keep_alive)
			link_close(l);
		if (r.status >= 200 && r.status <= 299)
			return POST_OK;
		snprintf(why, len, "HTTP %d", r.status);
		*retry_after_s = r.retry_after_s;
		if (r.status == 429 || r.status == 502 || r.status == 503 ||
		    r.status == 504)
			return POST_RETRY;
		return POST_REFUSED;
	}
	return POST_RETRY;
}

static void batch_free(struct batch *b)
{
	while (b->items != NULL) {
		struct item *it = b->items;

		b->items = it->next;
		free(it->buf);
		free(it);
	}
	b->nitems = 0;
	b->nspans = 0;
}

/* The request body of a batch; NULL when out of memory. */
static char *batch_body(const struct batch *b, size_t *len)
{
	const char **spans = calloc(b->nitems, sizeof(*spans));
	size_t *lens = calloc(b->nitems, sizeof(*lens)), i = 0;
	char *body = NULL;

	if (spans != NULL && lens != NULL) {
		for (struct item *it = b->items; it != NULL; it = it->next, i++) {
			spans[i] = it->buf;
			lens[i] = it->len;
		}
		body = otel_encode_request(&ex.s, ex.version,
					   spans, lens, b->nitems, len);
	}
	free(spans);
	free(lens);
	return body;
}

/* Log the first failure of an episode (failing goes true), and the first
 * success after it. */
static void note(bool *failing, enum post_result res, const char *why)
{
	if (res == POST_OK) {
		if (*failing)
			log_info("otel: exporting spans to %s works again",
				 ex.s.endpoint);
		*failing = false;
		return;
	}
	if (*failing)
		return;
	*failing = true;
	if (res == POST_RETRY)
		log_warn("otel: cannot export spans to %s: %s (retried for up "
			 "to %d s, then dropped; logged again when it works)",
			 ex.s.endpoint, why, OTEL_EXPORT_RETRY_MS / 1000);
	else
		log_warn("otel: the collector at %s refused spans: %s (the batch "
			 "is dropped; logged again when it works)", ex.s.endpoint,
			 why);
}

/* Send one batch: tried again with a doubling back-off (or what
 * Retry-After asks) while it is younger than OTEL_EXPORT_RETRY_MS and
 * stop's bound allows; then exported or dropped, and counted. */
static void export_batch(struct link *l, struct batch *b, bool *failing)
{
	uint64_t born = clock_ms(), backoff = BACKOFF_FIRST_MS;
	size_t len = 0;
	char *body = batch_body(b, &len);
	char why[256];
	bool tried_in_stop = false;

	while (body != NULL) {
		uint64_t now = clock_ms(), deadline = bounded(now + ex.s.timeout_ms),
			 retry_after_s, wait;
		enum post_result res;

		if (now >= deadline)
			break;	/* stopping, and the bound has passed */
		res = post(l, body, len, deadline, &retry_after_s, why, sizeof(why));
		note(failing, res, why);
		if (res == POST_OK) {
			metrics_count_n(COUNTER_trace_spans_exported_total, b->nspans);
			b->nspans = 0;
			break;
		}
		metrics_count(COUNTER_trace_export_failures_total);
		if (res == POST_REFUSED)
			break;
		wait = retry_after_s ? retry_after_s * 1000 : backoff;
		backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
		/* stopping cuts a back-off short once, not every time: a
		 * collector that keeps saying Retry-After must not be hammered
		 * for the rest of the flush bound */
		if (stopping()) {
			if (tried_in_stop)
				break;
			tried_in_stop = true;
		}
		if (!pause_until(clock_ms() + wait, born + OTEL_EXPORT_RETRY_MS))
			break;
	}
	if (b->nspans > 0)
		metrics_count_n(COUNTER_trace_spans_dropped_total, b->nspans);
	free(body);
	batch_free(b);
}

/* Up to max_batch spans off the queue (at least one item, however many
 * spans it holds); with ex.mu held. */
static void take(struct batch *b)
{
	struct item **tail = &b->items;

	while (ex.head != NULL && (b->nitems == 0 ||
	       b->nspans + ex.head->nspans <= ex.s.max_batch)) {
		struct item *it = ex.head;

		ex.head = it->next;
		it->next = NULL;
		*tail = it;
		tail = &it->next;
		b->nitems++;
		b->nspans += it->nspans;
		ex.queued -= it->nspans;
	}
	if (ex.head == NULL)
		ex.tail = &ex.head;
}

static void *export_main(void *arg)
{
	struct link l = { .fd = -1 };
	uint64_t next = clock_ms() + ex.s.schedule_delay_ms;
	bool failing = false;

	(void)arg;
	pthread_mutex_lock(&ex.mu);
	for (;;) {
		struct batch b = { 0 };

		while (ex.state == EX_RUNNING && ex.queued < ex.s.max_batch &&
		       clock_ms() < next)
			cond_wait_until(next, true);
		if (ex.head == NULL) {
			if (ex.state != EX_RUNNING)
				break;
			next = clock_ms() + ex.s.schedule_delay_ms;
			continue;
		}
		take(&b);
		pthread_mutex_unlock(&ex.mu);
		export_batch(&l, &b, &failing);
		pthread_mutex_lock(&ex.mu);
		next = clock_ms() + ex.s.schedule_delay_ms;
	}
	pthread_mutex_unlock(&ex.mu);
	link_close(&l);
	return NULL;
}

/* ---- start, hand-over, stop ----------------------------------------------- */

/* Everything start made; with the thread joined (or never started). */
static void ex_free(void)
{
	struct batch b = { ex.head, 0, 0 };

	batch_free(&b);
	ex.head = NULL;
	ex.tail = &ex.head;
	ex.queued = 0;
	otel_settings_free(&ex.s);
	hostport_clear(&ex.hp);
	free(ex.target);
	ex.target = NULL;
	free(ex.version);
	ex.version = NULL;
	free(ex.req_head);
	ex.req_head = NULL;
	SSL_CTX_free(ex.ctx);
	ex.ctx = NULL;
	if (ex.wake_fd >= 0)
		close(ex.wake_fd);
	ex.wake_fd = -1;
}

/* The request head up to Content-Length's value: the same for every
 * batch. A User-Agent among the configured headers replaces ours. */
static int make_head(const char *version)
{
	bool v6 = strchr(ex.hp.host, ':') != NULL, ua = false;
	bool default_port = strcmp(ex.hp.port, ex.tls ? "443" : "80") == 0;
	size_t len = 0;
	FILE *f;

	f = open_memstream(&ex.req_head, &len);
	if (f == NULL)
		return -1;
	fprintf(f, "POST %s HTTP/1.1\r\nHost: %s%s%s%s%s\r\n"
		"Content-Type: application/json\r\n", ex.target, v6 ? "[" : "",
		ex.hp.host, v6 ? "]" : "", default_port ? "" : ":",
		default_port ? "" : ex.hp.port);
	for (size_t i = 0; i < ex.s.nheaders; i++) {
		fprintf(f, "%s: %s\r\n", ex.s.headers[i].name,
			ex.s.headers[i].value);
		ua = ua || strcasecmp(ex.s.headers[i].name, "user-agent") == 0;
	}
	if (!ua)
		fprintf(f, "User-Agent: idemproxy/%s\r\n", version);
	fprintf(f, "Connection: keep-alive\r\nContent-Length: ");
	if (fclose(f) != 0)
		return -1;
	ex.req_head_len = len;
	return 0;
}

/* The client context for https://: the peer verified against ca_file or
 * the system's store, TLS 1.2 at least. */
static int make_tls(char *err, size_t errlen)
{
	char why[160];

	ex.ctx = SSL_CTX_new(TLS_client_method());
	if (ex.ctx == NULL) {
		snprintf(err, errlen, "otel: cannot make a TLS context");
		goto fail;
	}
	SSL_CTX_set_min_proto_version(ex.ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(ex.ctx, SSL_OP_NO_RENEGOTIATION);
	SSL_CTX_set_verify(ex.ctx, SSL_VERIFY_PEER, NULL);
	if (ex.s.ca_file != NULL) {
		if (SSL_CTX_load_verify_locations(ex.ctx, ex.s.ca_file, NULL) != 1) {
			tls_why("CA file", why, sizeof(why));
			snprintf(err, errlen, "OTEL_EXPORTER_OTLP_CERTIFICATE %s: %s",
				 ex.s.ca_file, why);
			goto fail;
		}
	} else if (SSL_CTX_set_default_verify_paths(ex.ctx) != 1) {
		tls_why("CA store", why, sizeof(why));
		snprintf(err, errlen, "otel: cannot load the system's CA "
			 "certificates: %s", why);
		goto fail;
	}
	ERR_clear_error();
	return 0;
fail:
	ERR_clear_error();
	return -1;
}

/* The endpoint split into what a connection needs; the request-target is
 * the URL's path as written ("/" when it has none). */
static int parse_endpoint(char *err, size_t errlen)
{
	char *prefix = NULL, why[160];
	const char *path;

	if (ex.s.endpoint == NULL ||
	    hostport_parse_http_url(ex.s.endpoint, &ex.hp, &prefix, &ex.tls, why,
				    sizeof(why)) < 0) {
		snprintf(err, errlen, "otel: endpoint: %s",
			 ex.s.endpoint ? why : "none set");
		free(prefix);
		return -1;
	}
	free(prefix);
	path = strchr(ex.s.endpoint + (ex.tls ? 8 : 7), '/');
	ex.target = strdup(path ? path : "/");
	if (ex.target == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

/* The thread, with every signal blocked: the process's signals go to the
 * threads that handle them, and a write to a closed TLS socket makes
 * EPIPE instead of SIGPIPE. */
static int start_thread(char *err, size_t errlen)
{
	pthread_condattr_t ca;
	sigset_t all, old;
	int rc;

	if (pthread_condattr_init(&ca) != 0) {
		snprintf(err, errlen, "otel: cannot make a condition variable");
		return -1;
	}
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	rc = pthread_cond_init(&ex.cond, &ca);
	pthread_condattr_destroy(&ca);
	if (rc != 0) {
		snprintf(err, errlen, "otel: cannot make a condition variable");
		return -1;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&ex.thread, NULL, export_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		pthread_cond_destroy(&ex.cond);
		snprintf(err, errlen, "otel: cannot start the exporter thread: %s",
			 strerror(rc));
		return -1;
	}
	return 0;
}

int otel_export_start(const struct otel_settings *s, const char *version,
		      char *err, size_t errlen)
{
	int ret = -1;

	pthread_mutex_lock(&ex.mu);
	if (ex.state != EX_IDLE) {
		snprintf(err, errlen, "otel: %s", ex.state == EX_STUCK ?
			 "the previous exporter thread has not finished" :
			 "the exporter is already running");
		pthread_mutex_unlock(&ex.mu);
		return -1;
	}
	ex.head = NULL;
	ex.tail = &ex.head;
	ex.queued = 0;
	if (settings_copy(&ex.s, s) < 0 ||
	    (ex.version = strdup(version ? version : "")) == NULL) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (parse_endpoint(err, errlen) < 0 ||
	    (ex.tls && make_tls(err, errlen) < 0))
		goto fail;
	if (make_head(ex.version) < 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	ex.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ex.wake_fd < 0) {
		snprintf(err, errlen, "otel: eventfd: %s", strerror(errno));
		goto fail;
	}
	atomic_store(&ex.stopping, false);
	if (start_thread(err, errlen) < 0)
		goto fail;
	ex.state = EX_RUNNING;
	ret = 0;
fail:
	if (ret < 0)
		ex_free();
	pthread_mutex_unlock(&ex.mu);
	return ret;
}

void otel_export_spans(char *buf, size_t len, size_t nspans)
{
	struct item *it = malloc(sizeof(*it));

	pthread_mutex_lock(&ex.mu);
	if (it == NULL || ex.state != EX_RUNNING ||
	    ex.queued + nspans > ex.s.max_queue) {
		pthread_mutex_unlock(&ex.mu);
		free(it);
		free(buf);
		metrics_count_n(COUNTER_trace_spans_dropped_total, nspans);
		return;
	}
	*it = (struct item){ NULL, buf, len, nspans };
	*ex.tail = it;
	ex.tail = &it->next;
	ex.queued += nspans;
	/* a full batch wakes the thread if it sleeps; once */
	if (ex.sleeping && !ex.signalled && ex.queued >= ex.s.max_batch) {
		ex.signalled = true;
		pthread_cond_signal(&ex.cond);
	}
	pthread_mutex_unlock(&ex.mu);
}

void otel_export_stop(uint64_t flush_ms)
{
	uint64_t one = 1, wait_ms;
	struct timespec ts;

	pthread_mutex_lock(&ex.mu);
	if (ex.state != EX_RUNNING) {
		pthread_mutex_unlock(&ex.mu);
		return;
	}
	ex.state = EX_STOPPING;
	atomic_store(&ex.flush_deadline, clock_ms() + flush_ms);
	atomic_store(&ex.stopping, true);
	pthread_cond_signal(&ex.cond);
	pthread_mutex_unlock(&ex.mu);
	if (write(ex.wake_fd, &one, sizeof(one)) < 0)
		log_debug("otel: eventfd: %s", strerror(errno));

	/* pthread_timedjoin_np (CLOCK_REALTIME) rather than clockjoin: the
	 * sanitizers know it, and see the join */
	clock_gettime(CLOCK_REALTIME, &ts);
	wait_ms = flush_ms + JOIN_GRACE_MS;
	ts.tv_sec += (time_t)(wait_ms / 1000);
	ts.tv_nsec += (long)(wait_ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	if (pthread_timedjoin_np(ex.thread, NULL, &ts) != 0) {
		log_warn("otel: the exporter thread did not stop within %llu ms "
			 "(resolving %s?); it is left to finish on its own",
			 (unsigned long long)(flush_ms + JOIN_GRACE_MS), ex.hp.host);
		pthread_mutex_lock(&ex.mu);
		ex.state = EX_STUCK;
		pthread_mutex_unlock(&ex.mu);
		return;
	}
	pthread_mutex_lock(&ex.mu);
	pthread_cond_destroy(&ex.cond);
	ex_free();
	ex.state = EX_IDLE;
	pthread_mutex_unlock(&ex.mu);
}
