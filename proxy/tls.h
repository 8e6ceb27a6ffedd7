/*
 * tls.h - TLS on both sides: the listener's certificate (HTTPS to clients)
 * and the upstream's verification (HTTPS to the backend).
 *
 * OpenSSL is driven by libevent's bufferevent_openssl on the sockets the
 * proxy already has: conn.c and upstream.c keep their bufferevents, only
 * the constructor differs, and back-pressure, watermarks and timeouts work
 * as over plain TCP. This module owns the SSL_CTXs and knows OpenSSL's
 * error codes; the connections own their SSL objects (through their
 * bufferevent, which frees them).
 *
 * Threads: the contexts are made on the main thread before the workers
 * start and shared by every worker (SSL_new() is thread-safe). SIGHUP may
 * replace the listener's context while workers take new SSLs from it: the
 * swap is under a mutex, and an SSL keeps its own reference to the context
 * it was made from, so connections already open are not disturbed.
 */
#ifndef IDEMPROXY_TLS_H
#define IDEMPROXY_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <openssl/ssl.h>

#include "compiler.h"
#include "metrics.h"

struct bufferevent;
struct config;

/*
 * Route OpenSSL's allocations through functions that return at once for
 * free(NULL). Call first in main(), before anything uses OpenSSL; false if
 * OpenSSL had already allocated (then its defaults stay, which only costs
 * time).
 */
bool tls_alloc_init(void);

/* ---- the listener --------------------------------------------------- */

struct tls_listener;

/*
 * Load cfg->tls_cert and cfg->tls_key (PEM; the certificate file may hold
 * the chain). NULL with a one-line reason in err when they cannot be read,
 * do not match, or cfg->tls_ciphers is not a cipher list OpenSSL knows.
 */
struct tls_listener *tls_listener_new(const struct config *cfg, char *err,
				      size_t errlen);
/* SIGHUP: load them again (the paths cfg names now). On failure the
 * running certificate stays and err says why. Session ticket keys are
 * kept, so that clients resume across a rotation. */
int tls_listener_reload(struct tls_listener *t, const struct config *cfg,
			char *err, size_t errlen) MUSTCHECK;
/* A server SSL for one accepted connection; NULL when out of memory. */
SSL *tls_listener_ssl(struct tls_listener *t);
void tls_listener_free(struct tls_listener *t);

/*
 * A client's handshake failed (the event libevent reported, what = its
 * BEV_EVENT_* bits): the reason counted in
 * idemproxy_tls_handshake_errors_total, with a line for the debug log in
 * why. Takes the bufferevent's queued OpenSSL errors.
 */
enum tls_error tls_handshake_error(struct bufferevent *bev, short what,
				   char *why, size_t len);

/*
 * The verified client certificate of an established connection (with
 * --tls-client-ca): its subject as RFC 2253 writes it ("CN=alice,O=Acme")
 * and its first DNS, URI, email or IP subject alternative name ("DNS:a.b",
 * "email:alice@acme.example"), each a new string or NULL (no certificate,
 * no such name, or a name that is not printable ASCII). 0, or -1 when out
 * of memory.
 */
int tls_peer_identity(SSL *ssl, char **subject, char **san) MUSTCHECK;

/* ---- the upstream ----------------------------------------------------- */

struct tls_upstream;

/*
 * The context for cfg->upstream (https://): the peer is verified against
 * cfg->upstream_ca or the system store, and its name (or IP address)
 * checked against cfg->upstream_hp.host; cfg->upstream_client_cert/key
 * are shown when the upstream asks (mutual TLS). NULL with err when a file
 * cannot be loaded.
 */
struct tls_upstream *tls_upstream_new(const struct config *cfg, char *err,
				      size_t errlen);
/*
 * A client SSL for one connection: SNI and the name check set, resuming
 * *session when there is one. New sessions the upstream hands out (TLS 1.3
 * sends them after the handshake) replace *session, which the caller owns
 * (one per worker: SSL_SESSION_free() it at the end) and must keep alive
 * while the SSL lives. NULL when out of memory.
 */
SSL *tls_upstream_ssl(struct tls_upstream *t, SSL_SESSION **session);
/* Offer session (may be NULL) in the handshake on bev: call it once the
 * socket is set (bufferevent_socket_connect: libevent's SSL_clear() there
 * would drop it), before the loop runs the handshake. */
void tls_upstream_resume(struct bufferevent *bev, SSL_SESSION *session);
/*
 * The connection on bev is about to be freed: clean (idle, or between
 * exchanges) sends close_notify. Either way the session stays resumable
 * (OpenSSL drops the session of an SSL freed without a shutdown, and that
 * is the session the worker resumes with).
 */
void tls_upstream_closing(struct bufferevent *bev, bool clean);
void tls_upstream_free(struct tls_upstream *t);

/*
 * Did the exchange on bev fail because of TLS (a certificate that does not
 * verify, a handshake or record error, an alert from the upstream)? Then
 * true, with the reason for the log in why. Takes the bufferevent's queued
 * OpenSSL errors. fresh: the connection is new and no response byte came;
 * then a close or reset after the upstream asked for a client certificate
 * we do not have is TLS too (the refusal's alert may be lost to the reset).
 * handshake: it was under way, so any close or socket error (errno sys)
 * is the handshake's failure, reported as such.
 */
bool tls_upstream_failed(struct bufferevent *bev, bool fresh, bool handshake,
			 int sys, char *why, size_t len);

/* ---- both ------------------------------------------------------------- */

/*
 * Write what is queued on an OpenSSL bufferevent now, in this loop turn,
 * its first 16 KiB as one record: records are OpenSSL's to write, so the
 * bufferevent writes them (its write
 * event is enabled and run at once, instead of waiting a turn for the
 * socket to report writable; what the socket does not take waits for it
 * as usual). The caller's write callback disables EV_WRITE once drained.
 */
void tls_flush(struct bufferevent *bev);

/* Send close_notify on an established connection, once; never blocks (the
 * alert goes to the socket, or is lost with the connection). */
void tls_close_notify(SSL *ssl);

#endif
