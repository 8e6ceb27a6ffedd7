/*
 * conn_tls.c - the TLS side of a client connection (conn.c's, on a
 * listener with --tls-cert): the handshake phase before the first request,
 * what a failed one is counted as, and pulling what OpenSSL holds back.
 * The OpenSSL contexts are tls.c's; docs/architecture.md "TLS".
 */
#include "conn_tls.h"
#include "conn_priv.h"

#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/bufferevent_struct.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "log.h"
#include "metrics.h"
#include "problem.h"
#include "reply.h"
#include "tls.h"
#include "loop.h"

/*
 * Bytes OpenSSL holds that the socket will not announce again. The
 * listener's contexts read ahead (tls.c): one read(2) takes every record
 * the socket has, not a record's header and then its body. libevent's
 * OpenSSL bufferevent reads on only while SSL_pending() counts decrypted
 * bytes, which leaves whole records read ahead but not yet decrypted
 * behind: a pipelined request, a request that came with the handshake's
 * last flight. It also stops at the read high watermark (CONN_READ_HIGH)
 * and, when the watermark lifts, waits for the socket - which stays quiet
 * when the client has sent everything and waits for answers. So whenever
 * reading may go on, what OpenSSL holds is pulled by running the
 * bufferevent's read event once, on the next loop turn. A partial record
 * ends that (OpenSSL asks the socket for the rest; nothing is delivered, so
 * nothing asks again) until the socket is readable.
 */
static void tls_pump_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;

	if (c->state != CONN_ST_CLOSED &&
	    (bufferevent_get_enabled(c->bev) & EV_READ) &&
	    evbuffer_get_length(bufferevent_get_input(c->bev)) < CONN_READ_HIGH &&
	    SSL_has_pending(c->ssl))
		event_active(&c->bev->ev_read, EV_READ, 1);
}

void conn_tls_pump_later(struct conn *c)
{
	if (c->ssl != NULL && c->state != CONN_ST_CLOSED &&
	    SSL_has_pending(c->ssl))
		event_active(c->tls_pump, EV_TIMEOUT, 1);
}

/* Input was consumed: the watermark may have lifted. */
static void input_changed(struct evbuffer *buf,
			  const struct evbuffer_cb_info *info, void *arg)
{
	if (info->n_deleted > 0)
		conn_tls_pump_later(arg);
}

/* A TLS listener's connection: the bufferevent runs the handshake. */
int conn_tls_accept(struct conn *c, evutil_socket_t fd)
{
	struct conn_loop *l = c->loop;
	SSL *ssl = tls_listener_ssl(l->tls);

	if (ssl == NULL)
		return -1;
	c->bev = bufferevent_openssl_socket_new(l->base, fd, ssl,
						BUFFEREVENT_SSL_ACCEPTING,
						BEV_OPT_CLOSE_ON_FREE);
	if (c->bev == NULL) {
		SSL_free(ssl);
		return -1;
	}
	c->tls_pump = event_new(l->base, -1, 0, tls_pump_cb, c);
	if (c->tls_pump == NULL ||
	    evbuffer_add_cb(bufferevent_get_input(c->bev), input_changed,
			    c) == NULL)
		return -1;	/* conn_new frees both */
	/* a client that closes without close_notify has closed, not
	 * failed: keep-alive clients do it all the time */
	bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
	c->ssl = ssl;
	c->tls = CONN_TLS_HANDSHAKE;
	return 0;
}

void conn_tls_established(struct conn *c)
{
	c->tls = CONN_TLS_FIRST;
	if (tls_peer_identity(c->ssl, &c->tls_subject, &c->tls_san) < 0)
		log_warn("conn %s: out of memory reading its client "
			 "certificate: scoped routes answer it 401", c->peer);
	metrics_count(COUNTER_tls_handshakes_total);
	if (SSL_session_reused(c->ssl))
		metrics_count(COUNTER_tls_resumed_total);
	conn_tls_pump_later(c);	/* a request read with the last flight */
}

/*
 * Plain HTTP on the TLS port: tell the client in plain HTTP, as nginx
 * does, then close. What it sent after the bytes OpenSSL looked at is read
 * and dropped first, so that the close does not reset the answer away.
 */
static void answer_plain_http(struct conn *c)
{
	evutil_socket_t fd = bufferevent_getfd(c->bev);
	struct reply_conn rc = { .close = true };
	struct evbuffer *out = evbuffer_new();
	char sink[4096];
	int n = 16;

	if (out == NULL)
		return;
	while (n-- > 0 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
		;
	reply_problem(out, PROBLEM_BAD_REQUEST, "this port speaks HTTPS", rc);
	(void)evbuffer_write(out, fd);
	evbuffer_free(out);
}

void conn_tls_failed(struct conn *c, short what)
{
	char why[160];
	enum tls_error e = tls_handshake_error(c->bev, what, why, sizeof(why));

	metrics_tls_error(e);
	log_debug("conn %s: TLS handshake failed: %s", c->peer, why);
	if (e == TLS_ERROR_PLAIN_HTTP)
		answer_plain_http(c);
	c->ops->close(c, "tls handshake failed");
}
