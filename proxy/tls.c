/*
 * tls.c - OpenSSL contexts for both sides (see tls.h).
 *
 * Why bufferevent_openssl rather than memory BIOs of our own: both sides
 * already read and write through bufferevents, whose watermarks, timeouts
 * and enable/disable carry the proxy's back-pressure. libevent's OpenSSL
 * bufferevent keeps that interface and drives SSL_read/SSL_write, the
 * handshake and its WANT_READ/WANT_WRITE turns on the same socket; memory
 * BIOs would have us write that pump by hand in two places. What the
 * socket-level shortcuts of conn.c and upstream.c do (a writev at the end
 * of the loop turn, shutdown(SHUT_WR)) is replaced there by the
 * bufferevent's own write and by close_notify when a connection has an SSL.
 *
 * Listener: TLS 1.2 and 1.3, OpenSSL's default ciphers (or --tls-ciphers
 * for 1.2), ALPN http/1.1, session tickets (OpenSSL's, keys carried over
 * reloads), no renegotiation, buffers released while a connection idles.
 * Upstream: the peer verified (system store or --upstream-ca), its host
 * name or address checked, SNI for names, ALPN http/1.1, sessions cached
 * per worker by the caller (tls_upstream_ssl).
 */
#include "tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/bufferevent_struct.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "config.h"
#include "log.h"

/* The most plaintext one TLS record carries. */
#define TLS_RECORD 16384

/* ALPN: the one protocol spoken, in wire format. */
static const unsigned char alpn_http11[] = "\x08http/1.1";

/*
 * OpenSSL frees many NULL pointers: ERR_clear_error(), which libevent runs
 * before every SSL_read and SSL_write, clears 16 error slots with two
 * OPENSSL_free()s each. With jemalloc as malloc (the release build) a
 * free(NULL) takes about 50 instructions, against about 9 in glibc: 1,300
 * instructions per ERR_clear_error(), 3 % of a TLS request (callgrind,
 * docs/benchmarks.md "OpenSSL's frees").
 */
static void *ossl_malloc(size_t n, const char *file, int line)
{
	(void)file;
	(void)line;
	return malloc(n);
}

static void *ossl_realloc(void *p, size_t n, const char *file, int line)
{
	(void)file;
	(void)line;
	return realloc(p, n);
}

static void ossl_free(void *p, const char *file, int line)
{
	(void)file;
	(void)line;
	if (p != NULL)
		free(p);
}

bool tls_alloc_init(void)
{
	return CRYPTO_set_mem_functions(ossl_malloc, ossl_realloc, ossl_free);
}

struct tls_listener {
	pthread_mutex_t lock;
	SSL_CTX *ctx;		/* the current certificate; under lock */
};

struct tls_upstream {
	SSL_CTX *ctx;
	char *host;
	bool ip;		/* host is an address: no SNI, the IP is checked */
};

/* SSL ex_data slot of tls_upstream_ssl()'s session pointer. */
static int session_slot = -1;	/* SSL -> the pool's SSL_SESSION * slot */
static int asked_slot = -1;	/* SSL -> non-NULL: a certificate was asked
				   for and we had none to send */
static pthread_once_t session_slot_once = PTHREAD_ONCE_INIT;

/* The reason of an OpenSSL error, without its "error:...:lib::" prefix. */
static void err_reason(unsigned long e, char *buf, size_t len)
{
	const char *r = ERR_reason_error_string(e);

	if (ERR_SYSTEM_ERROR(e))
		snprintf(buf, len, "%s", strerror(ERR_GET_REASON(e)));
	else if (r != NULL)
		snprintf(buf, len, "%s", r);
	else
		ERR_error_string_n(e, buf, len);
}

/* The first error queued on this thread (the cause; later ones are what
 * each caller up the stack added), and clear the queue. */
static void first_error(char *buf, size_t len)
{
	unsigned long e = ERR_peek_error();

	if (e != 0)
		err_reason(e, buf, len);
	else
		snprintf(buf, len, "unknown error");
	ERR_clear_error();
}

/* An encrypted key would make OpenSSL ask on the terminal: refuse. */
static int no_password(char *buf, int size, int rwflag, void *arg)
{
	(void)buf, (void)size, (void)rwflag, (void)arg;
	return 0;
}

/* Load a certificate chain and its key into ctx; the option names are for
 * the message. */
static int load_pair(SSL_CTX *ctx, const char *cert_opt, const char *cert,
		     const char *key_opt, const char *key, char *err,
		     size_t errlen)
{
	char why[160];

	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		first_error(why, sizeof(why));
		snprintf(err, errlen, "%s %s: %s", cert_opt, cert, why);
		return -1;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
		if (ERR_GET_REASON(ERR_peek_last_error()) ==
		    X509_R_KEY_VALUES_MISMATCH)
			goto mismatch;
		first_error(why, sizeof(why));
		snprintf(err, errlen, "%s %s: %s (an unencrypted PEM key is "
			 "needed)", key_opt, key, why);
		return -1;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
mismatch:
		ERR_clear_error();
		snprintf(err, errlen, "%s %s is not the key of %s %s", key_opt,
			 key, cert_opt, cert);
		return -1;
	}
	return 0;
}

/* "CN=example, valid until Dec  3 12:00:00 2027 GMT" for the log. */
static void describe_cert(SSL_CTX *ctx, char *buf, size_t len, bool *expired)
{
	X509 *x = SSL_CTX_get0_certificate(ctx);
	char subject[256] = "?", until[64] = "?";
	BIO *b = BIO_new(BIO_s_mem());
	int n;

	*expired = false;
	if (x == NULL || b == NULL) {
		snprintf(buf, len, "a certificate");
		BIO_free(b);
		return;
	}
	X509_NAME_oneline(X509_get_subject_name(x), subject, sizeof(subject));
	if (ASN1_TIME_print(b, X509_get0_notAfter(x)) == 1) {
		n = BIO_read(b, until, sizeof(until) - 1);
		until[n > 0 ? n : 0] = '\0';
	}
	BIO_free(b);
	*expired = X509_cmp_current_time(X509_get0_notAfter(x)) < 0;
	snprintf(buf, len, "%s, valid until %s", subject, until);
}

/* Offer http/1.1 when the client lists it; else go on without ALPN (a
 * client that wants h2 only gets HTTP/1.1 errors, as from nginx). */
static int alpn_select(SSL *ssl, const unsigned char **out,
		       unsigned char *outlen, const unsigned char *in,
		       unsigned int inlen, void *arg)
{
	unsigned char *sel = NULL;

	(void)ssl, (void)arg;
	if (SSL_select_next_proto(&sel, outlen, alpn_http11,
				  sizeof(alpn_http11) - 1, in, inlen) ==
	    OPENSSL_NPN_NEGOTIATED) {
		*out = sel;
		return SSL_TLSEXT_ERR_OK;
	}
	return SSL_TLSEXT_ERR_NOACK;
}

/* Ask clients for a certificate and verify it against cfg->tls_client_ca
 * (whose subjects are the CA names the handshake offers). */
static int client_verify(SSL_CTX *ctx, const struct config *cfg, char *err,
			 size_t errlen)
{
	STACK_OF(X509_NAME) *names;
	char why[160];
	int mode = SSL_VERIFY_PEER;

	if (SSL_CTX_load_verify_locations(ctx, cfg->tls_client_ca, NULL) != 1 ||
	    (names = SSL_load_client_CA_file(cfg->tls_client_ca)) == NULL) {
		first_error(why, sizeof(why));
		snprintf(err, errlen, "--tls-client-ca %s: %s (PEM CA "
			 "certificates are needed)", cfg->tls_client_ca, why);
		return -1;
	}
	SSL_CTX_set_client_CA_list(ctx, names);
	if (cfg->tls_client_cert == TLS_CLIENT_CERT_REQUIRED)
		mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
	/* a certificate shown is verified or the handshake fails: what a
	 * connection has is a verified one, or none */
	SSL_CTX_set_verify(ctx, mode, NULL);
	SSL_CTX_set_verify_depth(ctx, 8);
	return 0;
}

/* s[0..n) if it is printable ASCII, as a new string; else NULL. */
static char *printable(const unsigned char *s, int n)
{
	char *out;

	if (n <= 0 || n > 1024)
		return NULL;
	for (int i = 0; i < n; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return NULL;
	out = malloc((size_t)n + 1);
	if (out != NULL) {
		memcpy(out, s, (size_t)n);
		out[n] = '\0';
	}
	return out;
}

/* The first DNS, URI, email or IP name of x, as "DNS:name". */
static char *first_san(X509 *x)
{
	GENERAL_NAMES *names = X509_get_ext_d2i(x, NID_subject_alt_name, NULL,
						NULL);
	char *out = NULL, ip[INET6_ADDRSTRLEN], *v;

	for (int i = 0; out == NULL && i < sk_GENERAL_NAME_num(names); i++) {
		const GENERAL_NAME *g = sk_GENERAL_NAME_value(names, i);
		const char *type = NULL;
		ASN1_IA5STRING *a = NULL;

		switch (g->type) {
		case GEN_DNS: type = "DNS:"; a = g->d.dNSName; break;
		case GEN_URI: type = "URI:"; a = g->d.uniformResourceIdentifier; break;
		case GEN_EMAIL: type = "email:"; a = g->d.rfc822Name; break;
		case GEN_IPADD:
			/* the length first: an 8-byte "address" is no IPv6 */
			if ((g->d.iPAddress->length != 4 &&
			     g->d.iPAddress->length != 16) ||
			    inet_ntop(g->d.iPAddress->length == 4 ? AF_INET :
				      AF_INET6, g->d.iPAddress->data, ip,
				      sizeof(ip)) == NULL)
				continue;
			type = "IP:";
			v = ip;
			goto have;
		default:
			continue;
		}
		v = printable(a->data, a->length);
		if (v == NULL)
			continue;
have:
		out = malloc(strlen(type) + strlen(v) + 1);
		if (out != NULL)
			sprintf(out, "%s%s", type, v);
		if (v != ip)
			free(v);
	}
	GENERAL_NAMES_free(names);
	return out;
}

int tls_peer_identity(SSL *ssl, char **subject, char **san)
{
	X509 *x = SSL_get0_peer_certificate(ssl);
	BIO *b;
	char *data;
	long n;

	*subject = *san = NULL;
	if (x == NULL || SSL_get_verify_result(ssl) != X509_V_OK)
		return 0;
	b = BIO_new(BIO_s_mem());
	if (b == NULL)
		return -1;
	/* RFC 2253, controls and non-ASCII escaped: one printable line */
	if (X509_NAME_print_ex(b, X509_get_subject_name(x), 0,
			       XN_FLAG_RFC2253 | ASN1_STRFLGS_ESC_MSB) >= 0) {
		n = BIO_get_mem_data(b, &data);
		*subject = printable((const unsigned char *)data, (int)n);
	}
	BIO_free(b);
	*san = first_san(x);
	return 0;
}

static SSL_CTX *listener_ctx(const struct config *cfg, char *err,
			     size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	static const unsigned char sid_ctx[] = "idemproxy";

	if (ctx == NULL) {
		ERR_clear_error();
		snprintf(err, errlen, "--tls-cert: cannot make a TLS context");
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION |
			    SSL_OP_CIPHER_SERVER_PREFERENCE);
	SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
	/* one read(2) for all the records waiting, not two per record; what
	 * it takes beyond the record being read, conn_tls.c pulls */
	SSL_CTX_set_read_ahead(ctx, 1);
	SSL_CTX_set_default_passwd_cb(ctx, no_password);
	SSL_CTX_set_session_id_context(ctx, sid_ctx, sizeof(sid_ctx) - 1);
	SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
	if (load_pair(ctx, "--tls-cert", cfg->tls_cert, "--tls-key",
		      cfg->tls_key, err, errlen) < 0)
		goto fail;
	if (cfg->tls_ciphers != NULL &&
	    SSL_CTX_set_cipher_list(ctx, cfg->tls_ciphers) != 1) {
		ERR_clear_error();
		snprintf(err, errlen, "--tls-ciphers \"%s\": no cipher OpenSSL "
			 "knows", cfg->tls_ciphers);
		goto fail;
	}
	if (cfg->tls_client_ca != NULL &&
	    client_verify(ctx, cfg, err, errlen) < 0)
		goto fail;
	return ctx;
fail:
	SSL_CTX_free(ctx);
	return NULL;
}

static void log_serving(SSL_CTX *ctx, const char *how)
{
	char what[400];
	bool expired;

	describe_cert(ctx, what, sizeof(what), &expired);
	if (expired)
		log_warn("tls: %s an EXPIRED certificate: %s", how, what);
	else
		log_info("tls: %s %s", how, what);
}

struct tls_listener *tls_listener_new(const struct config *cfg, char *err,
				      size_t errlen)
{
	struct tls_listener *t = calloc(1, sizeof(*t));

	if (t == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	t->ctx = listener_ctx(cfg, err, errlen);
	if (t->ctx == NULL) {
		free(t);
		return NULL;
	}
	pthread_mutex_init(&t->lock, NULL);
	log_serving(t->ctx, "serving");
	return t;
}

int tls_listener_reload(struct tls_listener *t, const struct config *cfg,
			char *err, size_t errlen)
{
	SSL_CTX *ctx, *old;
	unsigned char keys[80];	/* name, HMAC and AES keys of the tickets */

	if (cfg->tls_cert == NULL) {
		snprintf(err, errlen, "tls_cert and tls_key cannot be removed "
			 "by a reload (a restart can)");
		return -1;
	}
	ctx = listener_ctx(cfg, err, errlen);
	if (ctx == NULL)
		return -1;
	pthread_mutex_lock(&t->lock);
	old = t->ctx;
	if (SSL_CTX_get_tlsext_ticket_keys(old, keys, sizeof(keys)) == 1)
		(void)SSL_CTX_set_tlsext_ticket_keys(ctx, keys, sizeof(keys));
	t->ctx = ctx;
	pthread_mutex_unlock(&t->lock);
	OPENSSL_cleanse(keys, sizeof(keys));
	SSL_CTX_free(old);	/* open connections hold references */
	log_serving(ctx, "SIGHUP: now serving");
	return 0;
}

SSL *tls_listener_ssl(struct tls_listener *t)
{
	SSL *ssl;

	pthread_mutex_lock(&t->lock);
	ssl = SSL_new(t->ctx);
	pthread_mutex_unlock(&t->lock);
	return ssl;
}

void tls_listener_free(struct tls_listener *t)
{
	if (t == NULL)
		return;
	SSL_CTX_free(t->ctx);
	pthread_mutex_destroy(&t->lock);
	free(t);
}

/* Is e OpenSSL saying that the bytes were plain HTTP, not TLS? */
static bool plain_http(unsigned long e)
{
	return ERR_GET_LIB(e) == ERR_LIB_SSL &&
	       (ERR_GET_REASON(e) == SSL_R_HTTP_REQUEST ||
		ERR_GET_REASON(e) == SSL_R_HTTPS_PROXY_REQUEST);
}

/*
 * Take the errors libevent queued on bev. It queues SSL_get_error()'s code
 * (SSL_ERROR_SSL, SSL_ERROR_SYSCALL: small numbers, no library) before
 * OpenSSL's own error codes; printed as an OpenSSL error the former reads
 * "error:00000005:lib(0)::reason(5)". Returns the first OpenSSL error (0
 * when none) and sets *syscall when the failure was the socket's.
 */
static unsigned long take_errors(struct bufferevent *bev, bool *syscall)
{
	unsigned long e, first = 0;

	*syscall = false;
	while ((e = bufferevent_get_openssl_error(bev)) != 0) {
		if (ERR_GET_LIB(e) == 0 && !ERR_SYSTEM_ERROR(e)) {
			if (e == SSL_ERROR_SYSCALL)
				*syscall = true;
		} else if (first == 0) {
			first = e;
		}
	}
	ERR_clear_error();
	return first;
}

/* A failure of the socket under TLS: errno's text, or a close. */
static void socket_reason(int sys, const char *closed, char *why, size_t len)
{
	if (sys != 0 && sys != EAGAIN && sys != EWOULDBLOCK)
		snprintf(why, len, "%s", strerror(sys));
	else
		snprintf(why, len, "%s", closed);
}

enum tls_error tls_handshake_error(struct bufferevent *bev, short what,
				   char *why, size_t len)
{
	int sys = EVUTIL_SOCKET_ERROR();
	bool syscall;
	unsigned long first = take_errors(bev, &syscall);

	if (what & BEV_EVENT_TIMEOUT) {
		snprintf(why, len, "timed out");
		return TLS_ERROR_TIMEOUT;
	}
	if (first != 0) {
		err_reason(first, why, len);
		return plain_http(first) ? TLS_ERROR_PLAIN_HTTP :
					   TLS_ERROR_PROTOCOL;
	}
	socket_reason((what & BEV_EVENT_EOF) ? 0 : sys, "closed by the client",
		      why, len);
	return TLS_ERROR_EOF;
}

/* ---- the upstream ----------------------------------------------------- */

static void make_session_slot(void)
{
	session_slot = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
	asked_slot = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

/* The upstream asks for a client certificate and none is configured: send
 * none, and remember it. A TLS 1.3 server that requires one refuses only
 * after our handshake is done, with an alert that a reset can overtake. */
static int cert_asked(SSL *ssl, X509 **x509, EVP_PKEY **pkey)
{
	(void)x509;
	(void)pkey;
	(void)SSL_set_ex_data(ssl, asked_slot, ssl);
	return 0;
}

/* A session to resume later arrived: it replaces the worker's. */
static int new_session(SSL *ssl, SSL_SESSION *sess)
{
	SSL_SESSION **slot = SSL_get_ex_data(ssl, session_slot);

	if (slot == NULL)
		return 0;
	SSL_SESSION_free(*slot);
	*slot = sess;
	return 1;	/* we keep the reference */
}

struct tls_upstream *tls_upstream_new(const struct config *cfg, char *err,
				      size_t errlen)
{
	struct tls_upstream *t = calloc(1, sizeof(*t));
	unsigned char buf[16];
	char why[160];

	pthread_once(&session_slot_once, make_session_slot);
	if (t == NULL || session_slot < 0 || asked_slot < 0 ||
	    (t->host = strdup(cfg->upstream_hp.host)) == NULL ||
	    (t->ctx = SSL_CTX_new(TLS_client_method())) == NULL) {
		ERR_clear_error();
		snprintf(err, errlen, "--upstream: cannot make a TLS context");
		goto fail;
	}
	t->ip = inet_pton(AF_INET, t->host, buf) == 1 ||
		inet_pton(AF_INET6, t->host, buf) == 1;
	SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(t->ctx, SSL_OP_NO_RENEGOTIATION);
	SSL_CTX_set_mode(t->ctx, SSL_MODE_RELEASE_BUFFERS);
	SSL_CTX_set_default_passwd_cb(t->ctx, no_password);
	SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER, NULL);
	if (cfg->upstream_ca != NULL) {
		if (SSL_CTX_load_verify_locations(t->ctx, cfg->upstream_ca,
						  NULL) != 1) {
			first_error(why, sizeof(why));
			snprintf(err, errlen, "--upstream-ca %s: %s",
				 cfg->upstream_ca, why);
			goto fail;
		}
	} else if (SSL_CTX_set_default_verify_paths(t->ctx) != 1) {
		first_error(why, sizeof(why));
		snprintf(err, errlen, "--upstream: cannot load the system's CA "
			 "certificates: %s", why);
		goto fail;
	}
	if (cfg->upstream_client_cert != NULL &&
	    load_pair(t->ctx, "--upstream-client-cert",
		      cfg->upstream_client_cert, "--upstream-client-key",
		      cfg->upstream_client_key, err, errlen) < 0)
		goto fail;
	if (cfg->upstream_client_cert == NULL)
		SSL_CTX_set_client_cert_cb(t->ctx, cert_asked);
	if (SSL_CTX_set_alpn_protos(t->ctx, alpn_http11,
				    sizeof(alpn_http11) - 1) != 0) {
		snprintf(err, errlen, "--upstream: cannot set ALPN");
		goto fail;
	}
	SSL_CTX_set_session_cache_mode(t->ctx, SSL_SESS_CACHE_CLIENT |
				       SSL_SESS_CACHE_NO_INTERNAL_STORE);
	SSL_CTX_sess_set_new_cb(t->ctx, new_session);
	ERR_clear_error();
	return t;
fail:
	tls_upstream_free(t);
	return NULL;
}

SSL *tls_upstream_ssl(struct tls_upstream *t, SSL_SESSION **session)
{
	SSL *ssl = SSL_new(t->ctx);

	if (ssl == NULL)
		goto fail;
	if (t->ip) {
		if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl),
						  t->host) != 1)
			goto fail;
	} else {
		SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
		if (SSL_set_tlsext_host_name(ssl, t->host) != 1 ||
		    SSL_set1_host(ssl, t->host) != 1)
			goto fail;
	}
	if (SSL_set_ex_data(ssl, session_slot, session) != 1)
		goto fail;
	return ssl;
fail:
	ERR_clear_error();
	SSL_free(ssl);
	return NULL;
}

void tls_upstream_resume(struct bufferevent *bev, SSL_SESSION *session)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);

	if (ssl != NULL && session != NULL && SSL_set_session(ssl, session) != 1)
		ERR_clear_error();
}

void tls_upstream_closing(struct bufferevent *bev, bool clean)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);

	if (ssl == NULL)
		return;
	if (clean)
		tls_close_notify(ssl);
	else
		SSL_set_shutdown(ssl, SSL_get_shutdown(ssl) | SSL_SENT_SHUTDOWN);
}

void tls_upstream_free(struct tls_upstream *t)
{
	if (t == NULL)
		return;
	SSL_CTX_free(t->ctx);
	free(t->host);
	free(t);
}

bool tls_upstream_failed(struct bufferevent *bev, bool fresh, bool handshake,
			 int sys, char *why, size_t len)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);
	bool asked, syscall;
	unsigned long first = take_errors(bev, &syscall);
	long v;

	if (ssl == NULL)
		return false;
	v = SSL_get_verify_result(ssl);
	if (v != X509_V_OK) {
		snprintf(why, len, "certificate verify failed: %s",
			 X509_verify_cert_error_string(v));
		return true;
	}
	asked = fresh && SSL_get_ex_data(ssl, asked_slot) != NULL;
	if (first == 0 && !asked && !handshake)
		return false;
	if (first != 0)
		err_reason(first, why, len);
	else if (handshake)
		socket_reason(syscall ? sys : 0,
			      "connection closed during the handshake", why, len);
	else
		snprintf(why, len, "closed by the upstream");
	if (asked) {
		size_t n = strlen(why);

		snprintf(why + n, len - n, " (it asked for a client certificate; "
			 "none is configured: --upstream-client-cert)");
	}
	return true;
}

/* ---- both ------------------------------------------------------------- */

void tls_flush(struct bufferevent *bev)
{
	struct evbuffer *out = bufferevent_get_output(bev);
	size_t n = evbuffer_get_length(out);

	/* libevent makes one SSL_write, so one record and one write(2), of
	 * each buffer chain: a head and a body would be two. One contiguous
	 * front of up to a record's payload makes them one. */
	(void)evbuffer_pullup(out, (ev_ssize_t)(n < TLS_RECORD ? n : TLS_RECORD));
	bufferevent_enable(bev, EV_WRITE);
	event_active(&bev->ev_write, EV_WRITE, 1);
}

void tls_close_notify(SSL *ssl)
{
	if (ssl == NULL || !SSL_is_init_finished(ssl) ||
	    (SSL_get_shutdown(ssl) & SSL_SENT_SHUTDOWN))
		return;
	(void)SSL_shutdown(ssl);
	ERR_clear_error();
}
