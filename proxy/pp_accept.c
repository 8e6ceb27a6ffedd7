/*
 * pp_accept.c - the PROXY protocol header (haproxy's, v1 or v2) that a load
 * balancer in front (AWS NLB, haproxy send-proxy, most cloud TCP balancers)
 * sends first on each connection, naming the client it accepted.
 *
 * From the sources --proxy-protocol lists the header is required; from
 * anyone else one is refused (conn.c asks pp_accept_looks_like_header on
 * the first bytes). It is read here, before the connection becomes one
 * (conn_new): over the TLS listener the header comes before the TLS
 * ClientHello, so not one byte past it may be taken from the socket. The
 * bytes are peeked, parsed (common/proxyproto.c), and consumed only as far
 * as they are the header's: all of them while the header is incomplete,
 * exactly its length once it is whole. The connection then goes on with
 * the client's address as its peer - in logs, X-Forwarded-For, the access
 * log and traces.
 *
 * A header that is malformed, truncated (the balancer closed), or not
 * whole within --client-timeout closes the socket with a log line, counted
 * as client_errors_total{reason="proxy_protocol"}.
 */
#include "pp_accept.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/event.h>

#include "addrs.h"
#include "cidr.h"
#include "clock.h"
#include "config.h"
#include "log.h"
#include "loop.h"
#include "metrics.h"
#include "proxyproto.h"

struct pp_wait {
	TAILQ_ENTRY(pp_wait) link;
	struct conn_loop *loop;
	evutil_socket_t fd;
	struct sockaddr_storage peer;	/* the balancer */
	socklen_t peerlen;
	char peer_str[ADDRS_STRLEN];
	struct event *ev;		/* readable, or the deadline */
	uint64_t deadline_ms;
	pp_accept_done done;
	void *arg;
	size_t len;			/* header bytes consumed so far */
	uint8_t buf[PP_MAX];
};

static const uint8_t v2_sig[12] = "\r\n\r\n\0\r\nQUIT\n";

/* The address of sa in cidr.h's 16-byte form; false: not IP. */
static bool addr16(const struct sockaddr *sa, uint8_t out[16])
{
	if (sa->sa_family == AF_INET) {
		memset(out, 0, 10);
		out[10] = out[11] = 0xff;
		memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		return true;
	}
	if (sa->sa_family == AF_INET6) {
		memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
		return true;
	}
	return false;
}

bool pp_accept_expected(const struct conn_loop *l, const struct sockaddr *peer)
{
	uint8_t a[16];

	return l->cfg->proxy_protocol != NULL && addr16(peer, a) &&
	       cidr_contains_bytes(&l->cfg->pp_from, a);
}

bool pp_accept_looks_like_header(const char *buf, size_t len)
{
	if (len >= 6 && memcmp(buf, "PROXY ", 6) == 0)
		return true;
	return len >= sizeof(v2_sig) && memcmp(buf, v2_sig, sizeof(v2_sig)) == 0;
}

static void pp_free(struct pp_wait *w, bool close_fd)
{
	TAILQ_REMOVE(&w->loop->pp_waits, w, link);
	event_free(w->ev);
	if (close_fd)
		evutil_closesocket(w->fd);
	free(w);
}

static void pp_refuse(struct pp_wait *w, const char *why)
{
	metrics_client_error(CLIENT_ERROR_PROXY_PROTOCOL);
	log_warn("conn %s: PROXY protocol: %s; closed", w->peer_str, why);
	pp_free(w, true);
}

/* The client the header names, as a socket address (the balancer's own
 * for a header that names none). */
static socklen_t client_addr(const struct pp_wait *w, const struct pp_header *h,
			     struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (h->local) {
		memcpy(ss, &w->peer, w->peerlen);
		return w->peerlen;
	}
	if (h->family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;

		in->sin_family = AF_INET;
		in->sin_port = htons(h->src_port);
		memcpy(&in->sin_addr, h->src + 12, 4);
		return sizeof(*in);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;

		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(h->src_port);
		memcpy(&in6->sin6_addr, h->src, 16);
		return sizeof(*in6);
	}
}

/* The header is read: the connection goes on as the client's. */
static void finish(struct pp_wait *w, socklen_t len,
		   const struct sockaddr_storage *client)
{
	pp_accept_done done = w->done;
	void *arg = w->arg;
	evutil_socket_t fd = w->fd;

	pp_free(w, false);
	done(arg, fd, (const struct sockaddr *)client, len);
}

static void wait_more(struct pp_wait *w)
{
	uint64_t now = clock_ms();
	struct timeval tv = clock_tv(w->deadline_ms > now ? w->deadline_ms - now : 1);

	event_add(w->ev, &tv);
}

static void readable_cb(evutil_socket_t fd, short what, void *arg)
{
	struct pp_wait *w = arg;
	struct sockaddr_storage ss;
	struct pp_header h;
	const char *why = NULL;
	size_t used = 0;
	ssize_t n;

	if (what & EV_TIMEOUT) {
		pp_refuse(w, w->len ? "the header did not arrive in time" :
				      "no header within --client-timeout");
		return;
	}
	n = recv(fd, w->buf + w->len, sizeof(w->buf) - w->len, MSG_PEEK);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
		wait_more(w);
		return;
	}
	if (n <= 0) {
		pp_refuse(w, n == 0 ? "closed before the header was whole" :
				      strerror(errno));
		return;
	}
	switch (proxyproto_parse(w->buf, w->len + (size_t)n, &h, &used, &why)) {
	case PP_MORE:
		/* all of it is the header's: take it off the socket */
		if (recv(fd, w->buf + w->len, (size_t)n, 0) != n) {
			pp_refuse(w, "the socket lost peeked bytes");
			return;
		}
		w->len += (size_t)n;
		wait_more(w);
		return;
	case PP_BAD:
		pp_refuse(w, why);
		return;
	case PP_OK:
		break;
	}
	/* the rest of the header, and not a byte more */
	if (used > w->len &&
	    recv(fd, w->buf + w->len, used - w->len, 0) != (ssize_t)(used - w->len)) {
		pp_refuse(w, "the socket lost peeked bytes");
		return;
	}
	log_debug("conn %s: PROXY protocol v%d: client %s", w->peer_str,
		  h.version, h.local ? "(not named)" : h.src_str);
	finish(w, client_addr(w, &h, &ss), &ss);
}

void pp_accept_start(struct conn_loop *l, evutil_socket_t fd,
		     const struct sockaddr *peer, socklen_t len,
		     pp_accept_done done, void *arg)
{
	struct pp_wait *w = calloc(1, sizeof(*w));

	if (w == NULL || len > sizeof(w->peer) ||
	    (w->ev = event_new(l->base, fd, EV_READ, readable_cb, w)) == NULL) {
		log_warn("conn: cannot wait for a PROXY protocol header: out of memory");
		free(w);
		evutil_closesocket(fd);
		return;
	}
	w->loop = l;
	w->fd = fd;
	memcpy(&w->peer, peer, len);
	w->peerlen = len;
	addrs_str(peer, len, w->peer_str, sizeof(w->peer_str));
	w->done = done;
	w->arg = arg;
	w->deadline_ms = clock_ms() + l->cfg->client_timeout_ms;
	TAILQ_INSERT_TAIL(&l->pp_waits, w, link);
	wait_more(w);
}

void pp_accept_close_all(struct conn_loop *l)
{
	struct pp_wait *w;

	while ((w = TAILQ_FIRST(&l->pp_waits)) != NULL)
		pp_free(w, true);
}
