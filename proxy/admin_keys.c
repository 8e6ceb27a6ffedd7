/*
 * admin_keys.c - GET and DELETE /keys/{key} (see admin_keys.h).
 *
 *   request ──auth──▶ keys_address ──▶ store_inspect / store_purge
 *                                           │ (pending: struct call;
 *                                           │  the connection closing
 *                                           │  cancels it)
 *                                           ▼
 *                                 200 JSON / 404 / 503 problem, audit line
 */
#include "admin_keys.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/stat.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "config.h"
#include "keys.h"
#include "log.h"
#include "store.h"

#define TOKEN_MAX 4096

/* A store call awaiting its answer. */
struct call {
	struct admin_keys *ak;
	struct evhttp_request *req;
	struct evhttp_connection *evcon;
	struct store_op *op;
	bool purge;
	struct keys_query q;
	char *key, *route, *scope;	/* q's strings */
	struct store_key k;
	char who[128];			/* for the audit line */
	LIST_ENTRY(call) link;
};

struct admin_keys {
	struct event_base *base;
	struct store *store;
	struct config *cfg;		/* a reference; NULL until set */
	bool token_set;
	unsigned char token_md[32];	/* SHA-256 of the token */
	LIST_HEAD(, call) calls;
};

struct admin_keys *admin_keys_new(struct event_base *base, struct store *store)
{
	struct admin_keys *ak = calloc(1, sizeof(*ak));

	if (ak == NULL)
		return NULL;
	ak->base = base;
	ak->store = store;
	LIST_INIT(&ak->calls);
	return ak;
}

static void sha256(const void *p, size_t len, unsigned char md[32])
{
	unsigned int n = 32;

	if (EVP_Digest(p, len, md, &n, EVP_sha256(), NULL) != 1)
		abort();	/* no SHA-256: nothing can be compared */
}

int admin_token_read(const char *path, unsigned char md[32], char *err,
		     size_t errlen)
{
	char buf[TOKEN_MAX + 2];
	FILE *f = fopen(path, "r");
	struct stat st;
	size_t b = 0, e;

	if (f == NULL) {
		snprintf(err, errlen, "--admin-token-file %s: cannot read it", path);
		return -1;
	}
	if (fgets(buf, sizeof(buf), f) == NULL)
		buf[0] = '\0';
	if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077) != 0)
		log_warn("--admin-token-file %s: readable by group or others "
			 "(chmod 600)", path);
	fclose(f);
	e = strcspn(buf, "\r\n");
	while (b < e && (buf[b] == ' ' || buf[b] == '\t'))
		b++;
	while (e > b && (buf[e - 1] == ' ' || buf[e - 1] == '\t'))
		e--;
	if (e == b || e - b > TOKEN_MAX) {
		snprintf(err, errlen, "--admin-token-file %s: %s", path,
			 e == b ? "empty (the token is its first line)" :
				  "token longer than 4096 bytes");
		return -1;
	}
	sha256(buf + b, e - b, md);
	OPENSSL_cleanse(buf, sizeof(buf));
	return 0;
}

int admin_keys_set_config(struct admin_keys *ak, struct config *cfg, char *err,
			  size_t errlen)
{
	unsigned char md[32];

	if (cfg->admin_token_file != NULL &&
	    admin_token_read(cfg->admin_token_file, md, err, errlen) < 0)
		return -1;
	ak->token_set = cfg->admin_token_file != NULL;
	if (ak->token_set)
		memcpy(ak->token_md, md, sizeof(md));
	if (ak->cfg != NULL)
		config_unref(ak->cfg);
	ak->cfg = config_ref(cfg);
	return 0;
}

/* ---- replies ------------------------------------------------------------- */

static void reply(struct evhttp_request *req, int code, const char *reason,
		  const char *type, struct evbuffer *body)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);

	evhttp_add_header(h, "Content-Type", type);
	evhttp_add_header(h, "Cache-Control", "no-store");
	evhttp_send_reply(req, code, reason, body);
}

/* An RFC 9457 problem, as the proxy's (common/problem.c) but for the
 * admin listener's own cases. */
static void problem(struct evhttp_request *req, int code, const char *reason,
		    const char *slug, const char *detail)
{
	struct evbuffer *out = evbuffer_new();
	char esc[512];
	size_t j = 0;

	if (out == NULL) {
		evhttp_send_error(req, 500, NULL);
		return;
	}
	for (const char *p = detail; *p != '\0' && j + 7 < sizeof(esc); p++) {
		if (*p == '"' || *p == '\\') {
			esc[j++] = '\\';
			esc[j++] = *p;
		} else if ((unsigned char)*p < 0x20) {
			j += (size_t)snprintf(esc + j, 7, "\\u%04x", *p);
		} else {
			esc[j++] = *p;
		}
	}
	esc[j] = '\0';
	/* with the error member SDKs read, as every problem of the proxy's */
	evbuffer_add_printf(out, "{\"type\":\"urn:idemproxy:problem:%s\","
			    "\"title\":\"%s\",\"status\":%d,\"detail\":\"%s\","
			    "\"error\":{\"type\":\"%s\",\"code\":\"%s\","
			    "\"message\":\"%s\"}}\n", slug, reason, code, esc,
			    code == 401 || code == 403 ? "authentication_error" :
			    code >= 500 ? "api_error" : "invalid_request_error",
			    slug, esc);
	reply(req, code, reason, "application/problem+json", out);
	evbuffer_free(out);
}

/* ---- calls --------------------------------------------------------------- */

static void call_free(struct call *c)
{
	LIST_REMOVE(c, link);
	if (c->evcon != NULL)
		evhttp_connection_set_closecb(c->evcon, NULL, NULL);
	free(c->key);
	free(c->route);
	free(c->scope);
	free(c);
}

/* The admin client went away first: withdraw the store call. */
static void call_closed(struct evhttp_connection *evcon, void *arg)
{
	struct call *c = arg;

	(void)evcon;
	c->evcon = NULL;
	if (c->op != NULL)
		store_cancel(c->op);
	if (c->purge)
		log_warn("audit: DELETE /keys/%s by %s: the client left before "
			 "the answer; the purge may or may not have happened",
			 c->k.key, c->who);
	call_free(c);
}

static const char *places(unsigned bits, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s%s%s",
		 bits & STORE_IN_POSTGRES ? " postgres" : "",
		 bits & STORE_IN_REDIS ? " redis" : "",
		 bits & STORE_IN_MEMORY ? " memory" : "",
		 bits == 0 ? " nowhere" : "");
	return buf + 1;
}

static void call_done(void *arg, const struct store_result *res)
{
	struct call *c = arg;
	struct evbuffer *out;
	char *text = NULL, found[40], unreached[40];
	size_t len = 0;
	FILE *f;

	c->op = NULL;
	if (c->purge)
		log_info("audit: DELETE /keys/%s scope \"%s\" by %s: %s%s%s "
			 "(found in %s%s%s)", c->k.key, c->k.scope, c->who,
			 store_status_name(res->status),
			 res->status == STORE_OK ? ", was " : "",
			 res->status != STORE_OK ? "" : res->rec.unknown ?
			 "of unknown outcome" : res->rec.completed ?
			 "completed" : "in flight, its owner fenced",
			 places(res->status == STORE_OK ? res->rec.found : 0,
				found, sizeof(found)),
			 res->rec.unreached ? "; could not reach " : "",
			 res->rec.unreached ? places(res->rec.unreached,
						     unreached,
						     sizeof(unreached)) : "");
	if (res->status == STORE_ERROR) {
		problem(c->req, 503, "Service Unavailable", "store-unavailable",
			"the idempotency store could not be reached");
		goto out;
	}
	if (res->status == STORE_ABSENT && res->rec.unreached == 0) {
		problem(c->req, 404, "Not Found", "key-not-found",
			"no live record for this key (and scope)");
		goto out;
	}
	f = open_memstream(&text, &len);
	out = evbuffer_new();
	if (f == NULL || out == NULL) {
		if (f != NULL)
			fclose(f);
		evbuffer_free(out);
		evhttp_send_error(c->req, 500, NULL);
		goto out;
	}
	keys_render(f, &c->q, &c->k, c->purge, res);
	fclose(f);
	evbuffer_add(out, text, len);
	/* absent where it could be asked, a copy maybe where it could not */
	if (res->status == STORE_OK)
		reply(c->req, 200, "OK", "application/json", out);
	else
		reply(c->req, 404, "Not Found", "application/json", out);
	evbuffer_free(out);
	free(text);
out:
	call_free(c);
}

/* ---- the request --------------------------------------------------------- */

static bool authorized(const struct admin_keys *ak, struct evhttp_request *req)
{
	const char *h = evhttp_find_header(evhttp_request_get_input_headers(req),
					   "Authorization");
	unsigned char md[32];

	if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0)
		return false;
	h += 7;
	while (*h == ' ')
		h++;
	sha256(h, strlen(h), md);
	/* equal-length digests: the comparison's time says nothing */
	return CRYPTO_memcmp(md, ak->token_md, sizeof(md)) == 0;
}

static bool flag_on(const char *v)
{
	return v != NULL && (strcmp(v, "1") == 0 || strcmp(v, "true") == 0);
}

static char *dup_or_null(const char *s)
{
	return s != NULL ? strdup(s) : NULL;
}

/* A DELETE, or a GET with the body, needs the bearer token: false when
 * the call was refused (answered 403 or 401; the refusal is audited). */
static bool call_allowed(struct admin_keys *ak, const struct call *c,
			 struct evhttp_request *req, bool body)
{
	if (!c->purge && !body)
		return true;
	if (!ak->token_set) {
		problem(req, 403, "Forbidden", "admin-token-required",
			c->purge ? "DELETE /keys is off: start idemproxy with "
				   "--admin-token-file" :
				   "body=1 is off: start idemproxy with "
				   "--admin-token-file");
		return false;
	}
	if (!authorized(ak, req)) {
		log_warn("audit: %s /keys/%s by %s: refused (no or wrong bearer "
			 "token)", c->purge ? "DELETE" : "GET body of",
			 c->key, c->who);
		evhttp_add_header(evhttp_request_get_output_headers(req),
				  "WWW-Authenticate", "Bearer realm=\"idemproxy\"");
		problem(req, 401, "Unauthorized", "admin-token-required",
			"Authorization: Bearer <the --admin-token-file token> "
			"required");
		return false;
	}
	return true;
}

void admin_keys_handle(struct admin_keys *ak, struct evhttp_request *req,
		       const char *rest)
{
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	const char *query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
	struct evkeyvalq params;
	struct call *c = NULL;
	char err[256], *host = NULL;
	ev_uint16_t port = 0;
	size_t klen = 0;
	bool body;

	TAILQ_INIT(&params);
	if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_DELETE) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
				  "GET, DELETE");
		problem(req, 405, "Method Not Allowed", "method-not-allowed",
			"/keys/{key} answers GET and DELETE");
		return;
	}
	if (query != NULL && evhttp_parse_query_str(query, &params) < 0) {
		problem(req, 400, "Bad Request", "bad-request",
			"malformed query string");
		return;
	}
	body = flag_on(evhttp_find_header(&params, "body"));
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		goto oom;
	c->ak = ak;
	c->req = req;
	c->purge = cmd == EVHTTP_REQ_DELETE;
	c->evcon = evhttp_request_get_connection(req);
	LIST_INSERT_HEAD(&ak->calls, c, link);
	evhttp_connection_get_peer(c->evcon, &host, &port);
	snprintf(c->who, sizeof(c->who), "%s:%u", host != NULL ? host : "?",
		 (unsigned)port);
	c->key = evhttp_uridecode(rest, 0, &klen);
	c->route = dup_or_null(evhttp_find_header(&params, "route"));
	c->scope = dup_or_null(evhttp_find_header(&params, "scope"));
	evhttp_clear_headers(&params);
	if (c->key == NULL)
		goto oom;
	c->q = (struct keys_query){ .key = c->key, .route = c->route,
				    .scope = c->scope, .body = body };
	if (!call_allowed(ak, c, req, body))
		goto done;
	if (strlen(c->key) != klen ||
	    keys_address(ak->cfg, &c->q, &c->k, err, sizeof(err)) < 0) {
		problem(req, 400, "Bad Request", "bad-request",
			strlen(c->key) != klen ? "not a valid key" : err);
		goto done;
	}
	c->op = c->purge ? store_purge(ak->store, ak->base, &c->k, call_done, c) :
			   store_inspect(ak->store, ak->base, &c->k, body,
					 call_done, c);
	if (c->op == NULL)
		goto oom;
	evhttp_connection_set_closecb(c->evcon, call_closed, c);
	return;
oom:
	evhttp_clear_headers(&params);
	evhttp_send_error(req, 500, NULL);
done:
	if (c != NULL)
		call_free(c);
}

void admin_keys_free(struct admin_keys *ak)
{
	struct call *c;

	if (ak == NULL)
		return;
	while ((c = LIST_FIRST(&ak->calls)) != NULL) {
		if (c->op != NULL)
			store_cancel(c->op);
		call_free(c);
	}
	if (ak->cfg != NULL)
		config_unref(ak->cfg);
	free(ak);
}
