/*
 * admin.c - health, readiness, Prometheus metrics and keys over HTTP.
 */
#include "admin.h"

#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "addrs.h"
#include "admin_conn.h"
#include "admin_keys.h"
#include "log.h"
#include "metrics.h"
#include "store.h"

#define ADMIN_MAX_HEAD (16 * 1024)	/* a 4 KiB token and a key, with room */
#define ADMIN_MAX_BODY 4096

struct admin {
	struct evhttp *http;
	struct admin_conns *conns;
	struct store *store;
	struct admin_keys *keys;
	bool draining;
};

static void reply_text(struct evhttp_request *req, int code, const char *reason,
		       const char *type, const char *body, size_t len)
{
	struct evbuffer *out = evbuffer_new();

	if (out == NULL) {
		evhttp_send_error(req, 500, NULL);
		return;
	}
	evbuffer_add(out, body, len);
	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "Content-Type", type);
	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "Cache-Control", "no-store");
	evhttp_send_reply(req, code, reason, out);
	evbuffer_free(out);
}

/* What orchestrators and scrapers poll: answered on a connection of the
 * reserve too (admin_conn.h), whatever other clients hold. */
static bool probe_path(const char *path)
{
	return strcmp(path, "/healthz") == 0 || strcmp(path, "/readyz") == 0 ||
	       strcmp(path, "/metrics") == 0;
}

/* A connection past the caps asks something else: 503, and it closes. */
static void reply_busy(struct evhttp_request *req)
{
	static const char body[] = "too many admin connections: this one is "
				   "answered for /healthz, /readyz and /metrics "
				   "only\n";

	evhttp_add_header(evhttp_request_get_output_headers(req),
			  "Retry-After", "1");
	reply_text(req, 503, "Service Unavailable", "text/plain", body,
		   sizeof(body) - 1);
}

static void handle(struct evhttp_request *req, void *arg)
{
	struct admin *a = arg;
	const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
	char *text = NULL, why[512], line[600];
	size_t len = 0;
	FILE *f;
	enum admin_room room = admin_conns_request_read(a->conns, req);

	if (path == NULL)
		path = "/";
	if (room == ADMIN_ROOM_PROBE) {
		/* one request, and its place is free for the next probe */
		evhttp_add_header(evhttp_request_get_output_headers(req),
				  "Connection", "close");
		if (!probe_path(path)) {
			reply_busy(req);
			return;
		}
	}
	if (strncmp(path, "/keys/", 6) == 0) {
		admin_keys_handle(a->keys, req, path + 6);
		return;
	}
	if (evhttp_request_get_command(req) != EVHTTP_REQ_GET &&
	    evhttp_request_get_command(req) != EVHTTP_REQ_HEAD) {
		reply_text(req, 405, "Method Not Allowed", "text/plain",
			   "method not allowed\n", 19);
		return;
	}
	if (strcmp(path, "/healthz") == 0) {
		reply_text(req, 200, "OK", "text/plain", "ok\n", 3);
	} else if (strcmp(path, "/readyz") == 0) {
		if (a->draining) {
			reply_text(req, 503, "Service Unavailable", "text/plain",
				   "draining\n", 9);
		} else if (!store_ready(a->store)) {
			reply_text(req, 503, "Service Unavailable", "text/plain",
				   "store unavailable\n", 18);
		} else if (store_degraded(a->store, why, sizeof(why)) > 0) {
			/* serving, without part of the store (docs/scale.md
			 * "Failures"): still ready, and it says so */
			int n = snprintf(line, sizeof(line), "ready, degraded: "
					 "%s\n", why);

			reply_text(req, 200, "OK", "text/plain", line,
				   n < 0 ? 0 : (size_t)n >= sizeof(line) ?
				   sizeof(line) - 1 : (size_t)n);
		} else {
			reply_text(req, 200, "OK", "text/plain", "ready\n", 6);
		}
	} else if (strcmp(path, "/metrics") == 0) {
		metrics_gauge_set(GAUGE_store_up, store_ready(a->store) ? 1 : 0);
		f = open_memstream(&text, &len);
		if (f == NULL) {
			evhttp_send_error(req, 500, NULL);
			return;
		}
		metrics_render(f);
		fclose(f);
		reply_text(req, 200, "OK", "text/plain; version=0.0.4", text, len);
		free(text);
	} else {
		reply_text(req, 404, "Not Found", "text/plain", "not found\n", 10);
	}
}

/*
 * Listen on every address of host:port (Debian's "localhost" is ::1 and
 * 127.0.0.1; a probe may use either). With port "0" the others take the
 * port the kernel gave the first.
 */
static int bind_all(struct admin *ad, const char *host, const char *port,
		    char *err, size_t errlen)
{
	struct addrs a;
	char h[NI_MAXHOST], p[NI_MAXSERV];
	int bound = 0;

	snprintf(p, sizeof(p), "%s", port);
	if (addrs_resolve(&a, host, port, 1, "--admin-listen", err,
			  errlen) < 0)
		return -1;
	for (int i = 0; i < a.n; i++) {
		struct evhttp_bound_socket *b;
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);

		addrs_host((struct sockaddr *)&a.ss[i], a.len[i], h, sizeof(h));
		b = evhttp_bind_socket_with_handle(ad->http, h,
						   (ev_uint16_t)atoi(p));
		if (b == NULL && a.n > 1 &&
		    (errno == EADDRNOTAVAIL || errno == EAFNOSUPPORT)) {
			/* an address this host cannot have: IPv6 off */
			log_warn("--admin-listen %s: %s; not listening there", h,
				 strerror(errno));
			continue;
		}
		if (b == NULL) {
			snprintf(err, errlen, "--admin-listen %s:%s: cannot "
				 "listen on %s: %s", host, p, h, strerror(errno));
			return -1;
		}
		admin_conns_listen(ad->conns, b);
		bound++;
		if (strcmp(p, "0") == 0 &&
		    getsockname(evhttp_bound_socket_get_fd(b),
				(struct sockaddr *)&ss, &len) == 0)
			getnameinfo((struct sockaddr *)&ss, len, NULL, 0, p,
				    sizeof(p), NI_NUMERICSERV);
	}
	if (bound == 0) {
		snprintf(err, errlen, "--admin-listen %s:%s: no address of it "
			 "can be bound here", host, p);
		return -1;
	}
	return 0;
}

struct admin *admin_new(struct event_base *base, const char *host,
			const char *port, struct store *store, char *err,
			size_t errlen)
{
	struct admin *a = calloc(1, sizeof(*a));

	if (a == NULL)
		goto fail;
	a->store = store;
	a->keys = admin_keys_new(base, store);
	a->http = evhttp_new(base);
	if (a->keys == NULL || a->http == NULL)
		goto fail;
	a->conns = admin_conns_new(base, a->http);
	if (a->conns == NULL)
		goto fail;

	evhttp_set_gencb(a->http, handle, a);
	/* bounds like the client listener's: no endpoint takes a body, the
	 * longest head is a key in the path and a bearer token; an idle
	 * connection has 10 s, and so has a request to arrive whole
	 * (admin_conn.c, which also caps the connections) */
	evhttp_set_max_headers_size(a->http, ADMIN_MAX_HEAD);
	evhttp_set_max_body_size(a->http, ADMIN_MAX_BODY);
	evhttp_set_timeout(a->http, 10);
	if (bind_all(a, host, port, err, errlen) < 0)
		goto fail;
	return a;
fail:
	if (a != NULL && a->http != NULL)
		evhttp_free(a->http);
	if (a != NULL) {
		admin_conns_free(a->conns);
		admin_keys_free(a->keys);
	}
	free(a);
	return NULL;
}

int admin_set_config(struct admin *a, struct config *cfg, char *err,
		     size_t errlen)
{
	return admin_keys_set_config(a->keys, cfg, err, errlen);
}

void admin_set_draining(struct admin *a, bool draining)
{
	a->draining = draining;
}

void admin_free(struct admin *a)
{
	if (a == NULL)
		return;
	evhttp_free(a->http);	/* first: its connections' close callbacks */
	admin_conns_free(a->conns);
	admin_keys_free(a->keys);
	free(a);
}
