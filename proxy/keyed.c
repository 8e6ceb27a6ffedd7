/*
 * keyed.c - preparing a protected request for the engine (see keyed.h).
 */
#include "keyed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <event2/buffer.h>
#include <llhttp.h>
#include <openssl/evp.h>

#include "config.h"
#include "fingerprint.h"
#include "fpshape.h"
#include "hex.h"
#include "issue.h"
#include "jwt.h"
#include "keysrc.h"
#include "reqhead.h"
#include "route.h"
#include "verify.h"

/* snprintf(dst, size, "%s", src) without the formatting: the key's copies
 * are on every keyed request's path, where two snprintf calls cost 1,300
 * instructions. */
static void copy_str(char *dst, size_t size, const char *src)
{
	size_t n = strnlen(src, size - 1);

	memcpy(dst, src, n);
	dst[n] = '\0';
}

static enum keyed_verdict answer(struct keyed_answer *a, enum problem p,
				 enum outcome o, bool close, const char *detail)
{
	a->problem = p;
	a->outcome = o;
	a->close = close;
	copy_str(a->detail, sizeof(a->detail), detail);
	return KEYED_ANSWER;
}

/*
 * A route's key could not be had: missing (the source has none) or
 * unusable (not valid key syntax, a body that does not parse). Unusable is
 * 400; missing is 400 with require_key, else the request passes.
 */
static enum keyed_verdict key_unusable(const struct policy *p, bool missing,
				       struct keyed_answer *a)
{
	char detail[320];

	if (!missing) {
		snprintf(detail, sizeof(detail), "the key from %s%s is not 1-255 "
			 "visible ASCII characters (with key_prefix), or the body "
			 "cannot be parsed", route_key_source_name(p->key_source),
			 p->key_name ? p->key_name : "");
		return answer(a, PROBLEM_INVALID_KEY, OUTCOME_INVALID_KEY, false,
			      detail);
	}
	if (!p->require_key)
		return KEYED_PASS;
	snprintf(detail, sizeof(detail), "this request needs an idempotency key "
		 "(%s%s)", route_key_source_name(p->key_source),
		 p->key_name ? p->key_name : "");
	return answer(a, PROBLEM_MISSING_KEY, OUTCOME_MISSING_KEY, false, detail);
}

/* The key from a header field: exactly one, valid syntax (DESIGN §1.3). */
static enum keyed_verdict header_key(const struct keyed_head *h,
				     struct keyed_key *k, struct keyed_answer *a)
{
	const struct policy *p = h->policy;
	const struct hdrlist *f = h->fields;
	char raw[IDEMKEY_MAX + 1];
	const char *why = NULL;
	int i = hdrlist_find(f, p->key_name, 0);

	if (i < 0)
		return key_unusable(p, true, a);	/* drop-in: legacy clients */
	if (hdrlist_find(f, p->key_name, (uint32_t)i + 1) >= 0)
		why = "send the key in one field";
	else if (idemkey_parse(hdr_value(f, (uint32_t)i), f->v[i].value_len,
			       raw, &why) >= 0 &&
		 keysrc_finish_quoted(p->key_prefix, raw, strlen(raw), k->key) < 0)
		why = "the key is longer than 255 characters with the route's "
		      "key_prefix";
	if (why != NULL) {
		char detail[sizeof(a->detail)];

		snprintf(detail, sizeof(detail), "%s (a key is an RFC 8941 "
			 "sf-string, \"...\" with optional ;parameters, or 1-255 "
			 "visible ASCII characters)", why);
		return answer(a, PROBLEM_INVALID_KEY, OUTCOME_INVALID_KEY, false,
			      detail);
	}
	return KEYED_BUFFER;
}

static enum keyed_verdict identity(const struct keyed_head *h,
				   struct keyed_key *k, struct keyed_answer *a);

enum keyed_verdict keyed_start(const struct keyed_head *h, struct keyed_key *k,
			       struct keyed_answer *a)
{
	const struct policy *p = h->policy;
	enum keyed_verdict v = KEYED_BUFFER;
	int r;

	k->key[0] = '\0';
	k->pending = false;
	switch (p->key_source) {
	case KEY_SRC_HEADER:
		v = header_key(h, k, a);
		break;
	case KEY_SRC_QUERY:
		r = keysrc_query(h->target, p->key_name, p->key_prefix, k->key);
		if (r < 0)
			v = key_unusable(p, r == KEYSRC_MISSING, a);
		break;
	case KEY_SRC_FORM:
	case KEY_SRC_JSON:
	case KEY_SRC_AUTO:
		k->pending = true;	/* known once the body is here */
		break;
	case KEY_SRC_NONE:
		return KEYED_PASS;
	}
	if (v == KEYED_BUFFER && !k->pending)
		v = identity(h, k, a);
	if (v == KEYED_BUFFER && h->body == BODY_LENGTH && h->length > p->max_body)
		return answer(a, PROBLEM_BODY_TOO_LARGE, OUTCOME_TOO_LARGE, true,
			      "the request body is larger than max_body");
	return v;
}

/*
 * The request's Content-Type value for its fingerprint: NULL when it has
 * none, or more than one (which the upstream may read either way: the
 * body is then fingerprinted by its bytes).
 */
static const char *content_type(const struct hdrlist *f)
{
	int i = hdrlist_find(f, "content-type", 0);

	if (i < 0 || hdrlist_find(f, "content-type", (uint32_t)i + 1) >= 0)
		return NULL;
	return hdr_value(f, (uint32_t)i);
}

/* Is the body of a form: or json: key source's media type (its first
 * Content-Type field, fpshape_media())? */
static bool content_type_is(const struct hdrlist *f, enum fp_body type)
{
	int i = hdrlist_find(f, "content-type", 0);

	return i >= 0 && fpshape_media(type, hdr_value(f, (uint32_t)i));
}

/*
 * The namespace of the request's key (DESIGN §7): every route has its own,
 * so that keys of different routes - and of the global policy, whose
 * scope is "" - never meet; a scoped route has one per caller. The hex
 * SHA-256 of "route\n<name>\n" and, scoped, "<caller>\n", where a header's
 * value is the caller as it is (as earlier versions hashed it) and a
 * verified identity is prefixed with what verified it ("jwt:sub=", ...),
 * so that no header value names the same namespace as a token's claim.
 * The key itself keeps its documented form.
 */
void keyed_scope(const char *route, const struct policy *p, const char *value,
		 size_t len, char scope[STORE_SCOPE_LEN + 1])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	EVP_MD_CTX *ctx;

	scope[0] = '\0';
	if (route == NULL && value == NULL)
		return;
	ctx = EVP_MD_CTX_new();
	if (ctx == NULL || EVP_DigestInit_ex(ctx, fp_sha256(), NULL) != 1)
		abort();	/* no SHA-256: nothing can be namespaced */
	if (route != NULL) {
		EVP_DigestUpdate(ctx, "route\n", 6);
		EVP_DigestUpdate(ctx, route, strlen(route));
		EVP_DigestUpdate(ctx, "\n", 1);
	}
	if (value != NULL && p != NULL && p->scope == SCOPE_JWT) {
		EVP_DigestUpdate(ctx, "jwt:", 4);
		EVP_DigestUpdate(ctx, p->scope_name, strlen(p->scope_name));
		EVP_DigestUpdate(ctx, "=", 1);
	} else if (value != NULL && p != NULL && p->scope == SCOPE_TLS_SUBJECT) {
		EVP_DigestUpdate(ctx, "tls:subject=", 12);
	} else if (value != NULL && p != NULL && p->scope == SCOPE_TLS_SAN) {
		EVP_DigestUpdate(ctx, "tls:san=", 8);
	}
	if (value != NULL) {
		EVP_DigestUpdate(ctx, value, len);
		EVP_DigestUpdate(ctx, "\n", 1);
	}
	EVP_DigestFinal_ex(ctx, md, &mdlen);
	EVP_MD_CTX_free(ctx);
	if (mdlen > STORE_SCOPE_LEN / 2)
		mdlen = STORE_SCOPE_LEN / 2;
	hex_encode(md, mdlen, scope);
}

static void scope_of(const struct keyed_head *h, const struct keyed_key *k,
		     char scope[STORE_SCOPE_LEN + 1])
{
	const struct policy *p = h->policy;
	const char *value = NULL;
	size_t len = 0;
	int i;

	switch (p->scope) {
	case SCOPE_NONE:
		break;
	case SCOPE_HEADER:
		value = "";	/* scoped: an absent header is a value too */
		i = hdrlist_find(h->fields, p->scope_name, 0);
		if (i >= 0) {
			value = hdr_value(h->fields, (uint32_t)i);
			len = h->fields->v[i].value_len;
		}
		break;
	case SCOPE_JWT:
	case SCOPE_TLS_SUBJECT:
	case SCOPE_TLS_SAN:
		value = k->caller;	/* identity() verified it */
		len = strlen(k->caller);
		break;
	}
	keyed_scope(h->route, p, value, len, scope);
}

/* The token of an "Authorization: Bearer <token>" field (RFC 6750 §2.1),
 * exactly one such field; NULL otherwise. */
static const char *bearer(const struct hdrlist *f, size_t *len)
{
	int i = hdrlist_find(f, "authorization", 0);
	const char *v, *end;

	if (i < 0 || hdrlist_find(f, "authorization", (uint32_t)i + 1) >= 0)
		return NULL;
	v = hdr_value(f, (uint32_t)i);
	end = v + f->v[i].value_len;
	if (end - v < 7 || strncasecmp(v, "Bearer ", 7) != 0)
		return NULL;
	for (v += 7; v < end && *v == ' '; v++)
		;
	while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	*len = (size_t)(end - v);
	return *len > 0 ? v : NULL;
}

/*
 * Who is asking, on a route scoped by a verified identity: the token's
 * claim or the certificate's subject or SAN into k->caller, or 401. Run
 * once the request is known to carry a key: nothing is claimed or
 * forwarded for a caller that is not verified.
 */
static enum keyed_verdict identity(const struct keyed_head *h,
				   struct keyed_key *k, struct keyed_answer *a)
{
	const struct policy *p = h->policy;
	const char *token, *who;
	char why[256], detail[320];
	size_t len = 0;
	enum jwt_error e;

	switch (p->scope) {
	case SCOPE_JWT: {
		struct jwt_check c = {
			.keys = p->jwt_keys, .algs = p->jwt_algs,
			.issuer = p->jwt_issuer, .audience = p->jwt_audience,
			.leeway_s = p->jwt_leeway_ms / 1000,
			.now = (int64_t)time(NULL),
		};
		char claim[JWT_CLAIM_MAX + 1];

		token = bearer(h->fields, &len);
		if (token == NULL)
			return answer(a, PROBLEM_TOKEN_INVALID,
				      OUTCOME_IDENTITY_INVALID, false,
				      "this route scopes keys by a verified "
				      "token: send one Authorization: Bearer "
				      "<JWT>");
		e = jwt_verify(&c, token, len, p->scope_name, claim, why,
			       sizeof(why));
		if (e != JWT_OK) {
			snprintf(detail, sizeof(detail), "the bearer token is "
				 "not accepted (%s): %s", jwt_error_name(e), why);
			return answer(a, PROBLEM_TOKEN_INVALID,
				      OUTCOME_IDENTITY_INVALID, false, detail);
		}
		copy_str(k->caller, sizeof(k->caller), claim);
		return KEYED_BUFFER;
	}
	case SCOPE_TLS_SUBJECT:
	case SCOPE_TLS_SAN:
		who = p->scope == SCOPE_TLS_SAN ? h->tls_san : h->tls_subject;
		if (who == NULL || who[0] == '\0' ||
		    strlen(who) > KEYED_CALLER_MAX)
			return answer(a, PROBLEM_CERT_REQUIRED,
				      OUTCOME_IDENTITY_INVALID, false,
				      p->scope == SCOPE_TLS_SAN ?
				      "this route scopes keys by the client "
				      "certificate's first DNS, URI, email or IP "
				      "name: connect with a verified certificate "
				      "that has one" :
				      "this route scopes keys by the client "
				      "certificate: connect with one the proxy "
				      "verifies");
		copy_str(k->caller, sizeof(k->caller), who);
		return KEYED_BUFFER;
	default:
		return KEYED_BUFFER;
	}
}

/* A signed callback is checked before anything is claimed. */
static bool signature_ok(const struct keyed_head *h, const char *body,
			 size_t len, struct keyed_answer *a)
{
	const struct policy *p = h->policy;
	int s;

	if (p->verify == VERIFY_NONE)
		return true;
	s = hdrlist_find(h->fields, p->verify_header, 0);
	if (s >= 0 && verify_signature(p->verify, p->verify_secret,
				       p->verify_secret_len,
				       hdr_value(h->fields, (uint32_t)s),
				       h->fields->v[s].value_len, body, len,
				       time(NULL), p->verify_tolerance_ms))
		return true;
	answer(a, PROBLEM_SIGNATURE_INVALID, OUTCOME_SIGNATURE_INVALID, false,
	       s < 0 ? "the signature header is missing" :
		       "the signature does not match the body, or its "
		       "timestamp is outside verify_tolerance");
	return false;
}

/* The key a form, JSON or auto route takes from the body: >= 0, or
 * KEYSRC_MISSING / KEYSRC_INVALID. */
static int body_key(const struct keyed_head *h, const char *body, size_t len,
		    const uint8_t fp[FP_LEN], char key[IDEMKEY_MAX + 1])
{
	const struct policy *p = h->policy;
	char hex[2 * FP_LEN + 1];

	switch (p->key_source) {
	case KEY_SRC_FORM:
		if (!content_type_is(h->fields, FP_BODY_FORM))
			return KEYSRC_MISSING;
		return keysrc_form(body, len, p->key_name, p->key_prefix, key);
	case KEY_SRC_JSON:
		if (!content_type_is(h->fields, FP_BODY_JSON))
			return KEYSRC_MISSING;
		return keysrc_json(body, len, p->key_name, p->key_prefix, key);
	case KEY_SRC_AUTO:
		fp_hex(fp, hex);
		return keysrc_finish(p->key_prefix, hex, strlen(hex), key);
	default:
		return KEYSRC_INVALID;
	}
}

/* The key, its scope, and the settings the engine works under. */
static void fill_request(const struct keyed_head *h, const struct keyed_key *k,
			 struct idem_request *req)
{
	const struct policy *p = h->policy;

	copy_str(req->claim.key.key, sizeof(req->claim.key.key), k->key);
	scope_of(h, k, req->claim.key.scope);
	req->claim.lease_ms = p->lease_ms;
	req->claim.ttl_ms = p->ttl_ms;
	req->claim.wait = p->in_flight == IN_FLIGHT_WAIT && p->wait_timeout_ms > 0;
	req->cfg = h->cfg;		/* idem_start takes a reference */
	req->policy = p;
	req->head_method = h->method == HTTP_HEAD;
	/* the key as issued: without the route's prefix */
	copy_str(req->issued_key, sizeof(req->issued_key),
		 k->key + strlen(p->key_prefix));
	req->issued_at = issue_time(req->issued_key);
}

/* The fingerprint of method, target and body (DESIGN §1.5), as the
 * route shapes it (fpshape.h): a json or form route shapes only a body
 * whose Content-Type says it is one. */
static int fingerprint(const struct keyed_head *h, const char *body,
		       size_t len, uint8_t fp[FP_LEN])
{
	const struct policy *p = h->policy;
	const char *ctype = content_type(h->fields);
	bool fallback;

	if (fpshape_compute(p, llhttp_method_name((llhttp_method_t)h->method),
			    h->target, ctype, body, len, fp, &fallback) < 0)
		return -1;
	if (fallback) {
		bool json = p->fp_body == FP_BODY_JSON;

		metrics_count(COUNTER_fingerprint_fallbacks_total);
		log_debug("fingerprint = %s: the body of %s is not %s; its raw "
			  "bytes are fingerprinted",
			  setting_word(policy_fp_body_words, (int)p->fp_body),
			  h->target, !fpshape_media(p->fp_body, ctype) ?
			  (json ? "said to be JSON (one Content-Type: "
				  "application/json or a +json type)" :
				  "said to be a form (one Content-Type: "
				  "application/x-www-form-urlencoded)") :
			  json ? "JSON (RFC 8259, UTF-8, no name twice, numbers "
				 "a double can hold)" : "an urlencoded form");
	}
	return 0;
}

enum keyed_verdict keyed_prepare(const struct keyed_head *h, struct keyed_key *k,
				 struct body *body, struct idem_request *req,
				 struct keyed_answer *a)
{
	size_t len = body->len;
	const char *flat = body_data(body);
	struct reqhead rh = {
		.method = h->method,
		.target = h->fwd_target,
		.fields = h->fields, .peer = h->peer, .tls = h->tls,
		.cfg = h->cfg, .body = h->body == BODY_NONE ? BODY_NONE : BODY_LENGTH,
		.length = len, .drop_expect = true,
		.client_subject = h->tls_subject, .client_san = h->tls_san,
		.request_id = h->request_id, .traceparent = h->traceparent,
	};

	memset(req, 0, sizeof(*req));
	if (fingerprint(h, flat, len, req->claim.fp) < 0)
		goto fail;
	if (!signature_ok(h, flat, len, a))
		return KEYED_ANSWER;
	if (k->pending) {
		int r = body_key(h, flat, len, req->claim.fp, k->key);

		if (r < 0) {
			if (key_unusable(h->policy, r == KEYSRC_MISSING, a) ==
			    KEYED_ANSWER)
				return KEYED_ANSWER;
			req->unprotected = true;  /* pass through, body and all */
		} else if (identity(h, k, a) == KEYED_ANSWER) {
			return KEYED_ANSWER;
		}
	}
	fill_request(h, k, req);
	req->request = evbuffer_new();
	if (req->request == NULL)
		goto fail;
	reqhead_write(req->request, &rh);
	if (body_hand_over(body, req->request) < 0) {
		evbuffer_free(req->request);
		req->request = NULL;
		goto fail;
	}
	return KEYED_ENGINE;
fail:
	return answer(a, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_UNAVAILABLE,
		      false, "cannot start the claim");
}
