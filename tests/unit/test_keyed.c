/*
 * test_keyed.c - the socket-less pieces of a keyed request, linked from
 * the proxy's private library: keyed-request preparation (keyed.c), issued
 * keys (issue.c), the settlement decision (policy_status_releases), the
 * keep-alive rule both sides share (h1.c) and the problem documents the
 * proxy writes (reply.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <llhttp.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "config.h"
#include "h1.h"
#include "idem.h"
#include "issue.h"
#include "keyed.h"
#include "probe.h"
#include "reply.h"
#include "reqhead.h"
#include "route.h"
#include "tap.h"

static char tmpdir[] = "/tmp/idemproxy-test-keyed-XXXXXX";
static char ini_path[256];

static const char ini[] =
	"[route json]\n"
	"match = POST /pay/json\n"
	"key = json:/data/id\n"
	"key_prefix = pay:\n"
	"require_key = yes\n"
	"[route form]\n"
	"match = POST /pay/form\n"
	"key = form:out_trade_no\n"
	"[route auto]\n"
	"match = POST /legacy*\n"
	"key = auto\n"
	"ttl = 10s\n"
	"[route query]\n"
	"match = POST /q\n"
	"key = query:k\n"
	"[route scoped]\n"
	"match = POST /mine\n"
	"scope = header:Authorization\n"
	"[route hook]\n"
	"match = POST /hooks/github\n"
	"key = header:X-GitHub-Delivery\n"
	"verify = hmac-sha256\n"
	"verify_secret_env = HOOK_SECRET\n"
	"[route none]\n"
	"match = POST /free\n"
	"key = none\n";

static struct config *load(void)
{
	char *argv[] = { "idemproxy", "--upstream", "http://127.0.0.1:9",
			 "--max-body", "64", "--config", ini_path, NULL };
	char *env[] = { "HOOK_SECRET=s3cret", NULL };
	struct config *c = NULL;
	enum config_action a;
	char err[512];
	FILE *f;

	if (mkdtemp(tmpdir) == NULL)
		exit(99);
	snprintf(ini_path, sizeof(ini_path), "%s/k.ini", tmpdir);
	f = fopen(ini_path, "w");
	if (f == NULL || fputs(ini, f) < 0 || fclose(f) != 0)
		exit(99);
	if (config_parse(7, argv, env, &c, &a, err, sizeof(err)) < 0) {
		printf("# config: %s\n", err);
		exit(99);
	}
	return c;
}

/* A head for target with the given "Name: value" fields. */
struct req {
	struct hdrlist f;
	struct keyed_head h;
	struct keyed_key k;
	struct keyed_answer a;
	struct idem_request ir;
	struct body body;
	char fwd[512], match[512];
};

static void req_init(struct req *r, struct config *cfg, const char *target,
		     const char *const *fields, const char *body)
{
	const char *route;

	memset(r, 0, sizeof(*r));
	hdrlist_init(&r->f);
	for (int i = 0; fields != NULL && fields[i] != NULL; i += 2)
		if (hdrlist_add(&r->f, fields[i], fields[i + 1]) < 0)
			exit(99);
	body_start(&r->body, body != NULL ? strlen(body) : 0);
	if (body != NULL &&
	    body_add(&r->body, body, strlen(body), UINT64_MAX) != BODY_OK)
		exit(99);
	if (reqhead_normalise(target, HTTP_POST, r->fwd, r->match) < 0)
		exit(99);
	r->h.policy = route_policy(&cfg->routing, HTTP_POST, r->match, &route);
	r->h.route = route;
	r->h.cfg = cfg;
	r->h.method = HTTP_POST;
	r->h.target = target;
	r->h.fwd_target = r->fwd;
	r->h.fields = &r->f;
	r->h.body = body != NULL ? BODY_LENGTH : BODY_NONE;
	r->h.length = body != NULL ? strlen(body) : 0;
	r->h.peer = "192.0.2.1";
}

static void req_free(struct req *r)
{
	hdrlist_free(&r->f);
	body_clear(&r->body);
	if (r->ir.request != NULL)
		evbuffer_free(r->ir.request);
}

/* keyed_start then (when it says BUFFER) keyed_prepare. */
static enum keyed_verdict run(struct req *r)
{
	enum keyed_verdict v = keyed_start(&r->h, &r->k, &r->a);

	if (v != KEYED_BUFFER)
		return v;
	return keyed_prepare(&r->h, &r->k, &r->body, &r->ir, &r->a);
}

static bool request_has(const struct req *r, const char *s)
{
	struct evbuffer_ptr p = evbuffer_search(r->ir.request, s, strlen(s), NULL);

	return p.pos >= 0;
}

static void test_header_key(struct config *cfg)
{
	static const char *const one[] = { "Idempotency-Key", "\"abc\"",
					   "Expect", "100-continue", NULL };
	static const char *const two[] = { "Idempotency-Key", "a",
					   "Idempotency-Key", "b", NULL };
	struct req r;

	req_init(&r, cfg, "/orders", one, "{\"x\":1}");
	is_int(run(&r), KEYED_ENGINE, "header key: to the engine");
	is_str(r.ir.claim.key.key, "abc", "quoted key unquoted");
	is_str(r.ir.claim.key.scope, "", "global scope");
	ok(r.ir.policy == &cfg->routing.global, "global policy");
	ok(request_has(&r, "POST /orders HTTP/1.1\r\n"), "request line");
	ok(request_has(&r, "Content-Length: 7\r\n"), "our framing");
	ok(!request_has(&r, "Expect"), "Expect answered by us, not forwarded");
	ok(request_has(&r, "X-Forwarded-For: 192.0.2.1\r\n"), "X-Forwarded-For");
	ok(request_has(&r, "\r\n\r\n{\"x\":1}"), "body behind the head");
	req_free(&r);

	req_init(&r, cfg, "/orders", two, "{}");
	is_int(run(&r), KEYED_ANSWER, "two key headers: answered");
	is_int(r.a.problem, PROBLEM_INVALID_KEY, "... 400 invalid key");
	req_free(&r);

	req_init(&r, cfg, "/orders", NULL, "{}");
	is_int(run(&r), KEYED_PASS, "no key, not required: passes (drop-in)");
	req_free(&r);

	req_init(&r, cfg, "/orders", one, "0123456789012345678901234567890123456789"
		 "0123456789012345678901234567890123456789");
	is_int(run(&r), KEYED_ANSWER, "declared body over max_body");
	is_int(r.a.problem, PROBLEM_BODY_TOO_LARGE, "... 413");
	ok(r.a.close, "... and the connection closes");
	req_free(&r);
}

static void test_body_keys(struct config *cfg)
{
	static const char *const json[] = { "Content-Type",
					    "application/json; charset=utf-8", NULL };
	static const char *const pjson[] = { "Content-Type",
					     "application/problem+json", NULL };
	static const char *const form[] = { "Content-Type",
		"application/x-www-form-urlencoded", NULL };
	struct req r;

	req_init(&r, cfg, "/pay/json", json, "{\"data\":{\"id\":\"n-42\"}}");
	is_int(run(&r), KEYED_ENGINE, "json key");
	is_str(r.ir.claim.key.key, "pay:n-42", "json key with key_prefix");
	is_str(r.ir.issued_key, "n-42", "the key as issued: without prefix");
	req_free(&r);

	req_init(&r, cfg, "/pay/json", pjson, "{\"data\":{\"id\":7}}");
	is_int(run(&r), KEYED_ENGINE, "+json media type, integer id");
	is_str(r.ir.claim.key.key, "pay:7", "integer key");
	req_free(&r);

	req_init(&r, cfg, "/pay/json", json, "{\"data\":{}}");
	is_int(run(&r), KEYED_ANSWER, "json key missing, required");
	is_int(r.a.problem, PROBLEM_MISSING_KEY, "... 400 missing key");
	is_int(r.a.outcome, OUTCOME_MISSING_KEY, "... counted as missing_key");
	req_free(&r);

	req_init(&r, cfg, "/pay/json", json, "{not json");
	is_int(run(&r), KEYED_ANSWER, "unparsable json body: no key to be had");
	is_int(r.a.problem, PROBLEM_MISSING_KEY, "... 400 missing key (required)");
	req_free(&r);

	req_init(&r, cfg, "/pay/form", form, "a=1&out_trade_no=T%2D99");
	is_int(run(&r), KEYED_ENGINE, "form key");
	is_str(r.ir.claim.key.key, "T-99", "form key percent-decoded");
	req_free(&r);

	req_init(&r, cfg, "/pay/form", json, "out_trade_no=T1");
	is_int(run(&r), KEYED_ENGINE, "form route, other media type");
	ok(r.ir.unprotected, "... no key: forwarded unprotected");
	req_free(&r);

	req_init(&r, cfg, "/legacy/save", form, "name=x");
	is_int(run(&r), KEYED_ENGINE, "auto key");
	is_int(strlen(r.ir.claim.key.key), 64, "auto key: the fingerprint in hex");
	is_int(r.ir.policy->ttl_ms, 10000, "the route's ttl in the policy");
	is_int(r.ir.claim.ttl_ms, 10000, "... and in the claim");
	req_free(&r);
}

static void test_query_scope_none(struct config *cfg)
{
	static const char *const auth_a[] = { "Idempotency-Key", "k1",
		"Authorization", "Bearer a", NULL };
	static const char *const auth_b[] = { "Idempotency-Key", "k1",
		"Authorization", "Bearer b", NULL };
	char scope_a[STORE_SCOPE_LEN + 1];
	struct req r;

	req_init(&r, cfg, "/q?x=1&k=q%2D7", NULL, NULL);
	is_int(run(&r), KEYED_ENGINE, "query key, no body");
	is_str(r.ir.claim.key.key, "q-7", "query key decoded");
	ok(!request_has(&r, "Content-Length"), "no body: no Content-Length");
	req_free(&r);

	req_init(&r, cfg, "/mine", auth_a, "{}");
	is_int(run(&r), KEYED_ENGINE, "scoped");
	is_int(strlen(r.ir.claim.key.scope), 64, "scope: SHA-256 hex");
	memcpy(scope_a, r.ir.claim.key.scope, sizeof(scope_a));
	req_free(&r);
	req_init(&r, cfg, "/mine", auth_b, "{}");
	is_int(run(&r), KEYED_ENGINE, "scoped, another caller");
	ok(strcmp(scope_a, r.ir.claim.key.scope) != 0,
	   "another caller, another scope");
	req_free(&r);

	req_init(&r, cfg, "/free", auth_a, "{}");
	ok(r.h.policy == NULL, "key = none: no policy, passed through");
	req_free(&r);
}

/* Keys of different routes (and of the global policy) never meet. */
static void test_namespaces(struct config *cfg)
{
	static const char *const plain[] = { "Idempotency-Key", "pay:n-42", NULL };
	static const char *const json[] = { "Content-Type", "application/json",
					     NULL };
	char global_scope[STORE_SCOPE_LEN + 1];
	struct req r;

	req_init(&r, cfg, "/orders", plain, "{}");
	is_int(run(&r), KEYED_ENGINE, "a client's plain key pay:n-42");
	memcpy(global_scope, r.ir.claim.key.scope, sizeof(global_scope));
	req_free(&r);
	req_init(&r, cfg, "/pay/json", json, "{\"data\":{\"id\":\"n-42\"}}");
	is_int(run(&r), KEYED_ENGINE, "the callback route's pay:n-42");
	is_str(r.ir.claim.key.key, "pay:n-42", "the key keeps its documented form");
	ok(strcmp(global_scope, r.ir.claim.key.scope) != 0,
	   "... in the route's own namespace");
	is_int(strlen(r.ir.claim.key.scope), 64, "route scope: SHA-256 hex");
	req_free(&r);
}

/* A namespace is stored with every key: the same route and caller must
 * name the same one in every release, or keys claimed before an upgrade
 * are not found after it. SHA-256 of the bytes, from Python's hashlib. */
static void test_scope_values(void)
{
	char scope[STORE_SCOPE_LEN + 1];

	keyed_scope("orders", NULL, NULL, 0, scope);
	is_str(scope, "5ea1e92a7c45bb8992676c9ed1e57a319c8d80eb94f1454797a7ac98"
		      "36ffac2e", "scope of route orders: sha256(\"route\\norders\\n\")");
	keyed_scope("orders", NULL, "tenant-1", 8, scope);
	is_str(scope, "48a0c125299ab75aa504841e0c9321d972902d106b218c501677fa2e"
		      "909d065e", "... and of its caller tenant-1");
	keyed_scope(NULL, NULL, "tenant-1", 8, scope);
	is_str(scope, "e93ec4395530f639d66816dc455bd44c4b38101a602b8cd0fd1800bd"
		      "ffffb3cd", "the global policy's caller tenant-1");
	keyed_scope(NULL, NULL, NULL, 0, scope);
	is_str(scope, "", "the global policy without a caller: \"\"");
}

static void test_normalise(void)
{
	static const struct { const char *in, *fwd, *match; } ok_cases[] = {
		{ "/hooks/github", "/hooks/github", "/hooks/github" },
		{ "http://h/hooks/github?x=1", "/hooks/github?x=1", "/hooks/github" },
		{ "HTTP://h:80/a", "/a", "/a" },
		{ "http://h", "/", "/" },
		{ "//hooks///github", "/hooks/github", "/hooks/github" },
		{ "/%68ooks/git%68ub", "/hooks/github", "/hooks/github" },
		{ "/hooks/github/", "/hooks/github/", "/hooks/github" },
		{ "/hooks;v=1/github;x", "/hooks;v=1/github;x", "/hooks/github" },
		{ "/a%20b?q=%2e%2e", "/a%20b?q=%2e%2e", "/a%20b" },
		{ "/..a/b.", "/..a/b.", "/..a/b." },
		{ "/", "/", "/" },
	};
	static const char *const refused[] = {
		"/hooks/../hooks/github", "/./hooks/github", "/hooks/github/..",
		"/hooks/%2e%2e/x", "/hooks/%2E/x", "/hooks%2fgithub",
		"/hooks%5cgithub", "/hooks\\github", "/a%00", "/a%zz",
		"https://h/hooks/github", "hooks/github", "*",
	};
	char fwd[128], match[128];

	for (size_t i = 0; i < sizeof(ok_cases) / sizeof(ok_cases[0]); i++) {
		int rc = reqhead_normalise(ok_cases[i].in, HTTP_POST, fwd, match);

		is_int(rc, 0, "normalise %s", ok_cases[i].in);
		if (rc == 0) {
			is_str(fwd, ok_cases[i].fwd, "... forwarded as");
			is_str(match, ok_cases[i].match, "... routed by");
		}
	}
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
		is_int(reqhead_normalise(refused[i], HTTP_POST, fwd, match), -1,
		       "refused: %s", refused[i]);
	is_int(reqhead_normalise("*", HTTP_OPTIONS, fwd, match), 0, "OPTIONS *");
}

static void test_signature(struct config *cfg)
{
	const char *body = "{\"action\":\"paid\"}";
	unsigned char mac[32];
	unsigned int maclen = 0;
	char sig[80];
	const char *good[] = { "X-GitHub-Delivery", "d-1",
			       "X-Hub-Signature-256", sig, NULL };
	static const char *const bad[] = { "X-GitHub-Delivery", "d-1",
		"X-Hub-Signature-256", "sha256=00", NULL };
	static const char *const none[] = { "X-GitHub-Delivery", "d-1", NULL };
	struct req r;
	int n;

	HMAC(EVP_sha256(), "s3cret", 6, (const unsigned char *)body,
	     strlen(body), mac, &maclen);
	n = snprintf(sig, sizeof(sig), "sha256=");
	for (unsigned i = 0; i < maclen; i++)
		n += snprintf(sig + n, sizeof(sig) - (size_t)n, "%02x", mac[i]);

	req_init(&r, cfg, "/hooks/github", good, body);
	is_int(run(&r), KEYED_ENGINE, "good signature");
	is_str(r.ir.claim.key.key, "d-1", "delivery id as key");
	req_free(&r);
	req_init(&r, cfg, "/hooks/github", bad, body);
	is_int(run(&r), KEYED_ANSWER, "bad signature");
	is_int(r.a.problem, PROBLEM_SIGNATURE_INVALID, "... 401");
	req_free(&r);
	req_init(&r, cfg, "/hooks/github", none, body);
	is_int(run(&r), KEYED_ANSWER, "missing signature");
	is_int(r.a.outcome, OUTCOME_SIGNATURE_INVALID, "... signature_invalid");
	req_free(&r);
}

static void test_issue(struct config *cfg)
{
	char key[IDEMKEY_MAX + 1];
	struct store_claim m;

	ok(issue_mint(key, 1700000000) == 0, "mint");
	is_int(strlen(key), 22 + 1 + 10, "128 bits base64url, '.', seconds");
	ok(strchr(key, '+') == NULL && strchr(key, '/') == NULL, "URL-safe");
	is_int(issue_time(key), 1700000000, "issue time read back");
	is_int(issue_time("abc"), 0, "no time: not ours");
	is_int(issue_time("abc.12x"), 0, "bad time: not ours");
	ok(issue_fresh(1000, 1000 + 599, 600000), "fresh within ttl");
	ok(!issue_fresh(1000, 1000 + 601, 600000), "stale after ttl");
	ok(issue_fresh(1030, 1000, 600000), "a little from the future (skew)");
	ok(!issue_fresh(1100, 1000, 600000), "far from the future");
	ok(!issue_fresh(0, 1000, 600000), "not one of ours");
	ok(issue_is_path("/.well-known/idempotency-key?x=1"), "issue path");
	ok(!issue_is_path("/.well-known/idempotency-keys"), "not the path");
	issue_marker(key, 5000, &m);
	is_str(m.key.scope, ISSUE_SCOPE, "marker scope");
	is_str(m.key.key, key, "marker key");
	is_int(m.lease_ms, 5000, "marker lives its ttl");
	is_int(issue_marker_ttl(cfg), cfg->issued_key_ttl_ms,
	       "marker ttl: the longest issued_key_ttl");
}

static void test_settlement(const struct config *cfg)
{
	/* the default list: the app said it did not or could not act */
	static const int released[] = { 401, 408, 425, 429, 500, 503 };
	/* every other status, a gateway's 502 and 504 included */
	static const int stored[] = { 200, 201, 204, 400, 404, 409, 422, 501,
				      502, 504, 599 };
	const struct policy *g = &cfg->routing.global;
	struct policy p = *g;
	struct status_set custom;
	char err[256], buf[128];

	for (size_t i = 0; i < sizeof(released) / sizeof(released[0]); i++)
		ok(policy_status_releases(g, released[i]),
		   "%d releases the key", released[i]);
	for (size_t i = 0; i < sizeof(stored) / sizeof(stored[0]); i++)
		ok(!policy_status_releases(g, stored[i]), "%d is stored", stored[i]);
	p.on_upstream_error = UPSTREAM_ERROR_KEEP;
	ok(!policy_status_releases(&p, 500), "keep: 500 stored");
	ok(!policy_status_releases(&p, 503), "keep: 503 stored");
	ok(policy_status_releases(&p, 429), "keep: 429 released");
	ok(setting_parse(&(struct setting_syntax)SYNTAX_STATUSES, "502, 409",
			 &custom, err, sizeof(err)) == 0, "a list parses");
	p.on_upstream_error = UPSTREAM_ERROR_RELEASE;
	p.release_statuses = custom;
	ok(policy_status_releases(&p, 502) && policy_status_releases(&p, 409) &&
	   !policy_status_releases(&p, 500), "a route's own list");
	status_set_format(&custom, buf, sizeof(buf));
	is_str(buf, "409,502", "printed in order");
	ok(setting_parse(&(struct setting_syntax)SYNTAX_STATUSES, "none",
			 &custom, err, sizeof(err)) == 0 &&
	   !status_set_has(&custom, 500), "none: nothing releases");
	ok(setting_parse(&(struct setting_syntax)SYNTAX_STATUSES, "50",
			 &custom, err, sizeof(err)) < 0, "a two-digit status: error");
	ok(setting_parse(&(struct setting_syntax)SYNTAX_STATUSES, "500,500",
			 &custom, err, sizeof(err)) < 0, "twice: error");
	ok(setting_parse(&(struct setting_syntax)SYNTAX_STATUSES, "600",
			 &custom, err, sizeof(err)) < 0, "600: error");
}

/* The outcome probe's target: the key percent-encoded where {key} is. */
static void test_probe_target(void)
{
	char out[64];

	is_int(probe_target("/orders/by-key/{key}", "o-42_x.y~z", out,
			    sizeof(out)), 25, "unreserved bytes as they are");
	is_str(out, "/orders/by-key/o-42_x.y~z", "the key in the path");
	probe_target("/p/{key}?q={key}", "a b/c?d&%", out, sizeof(out));
	is_str(out, "/p/a%20b%2Fc%3Fd%26%25?q=a%20b%2Fc%3Fd%26%25",
	       "every other byte encoded, each {key} replaced");
	is_int(probe_target("/p/{key}", "0123456789", out, 12), 0,
	       "too long for the buffer: 0");
	is_int(probe_target("/p/{key", "k", out, sizeof(out)), 7,
	       "a brace that is no {key} stays");
}

static void test_keep_alive_and_replies(void)
{
	struct hdrlist h;
	struct evbuffer *out = evbuffer_new();
	struct reply_conn close = { .close = true }, keep10 = { .http10 = true };
	char buf[2048];
	size_t n;

	hdrlist_init(&h);
	ok(h1_keep_alive(&h, 1, 1), "1.1: keep-alive by default");
	ok(!h1_keep_alive(&h, 1, 0), "1.0: close by default");
	if (hdrlist_add(&h, "Connection", "close") < 0 ||
	    hdrlist_add(&h, "Connection", "keep-alive") < 0)
		exit(99);
	ok(!h1_keep_alive(&h, 1, 1), "close wins over a later keep-alive");
	hdrlist_reset(&h);
	if (hdrlist_add(&h, "Connection", "Keep-Alive") < 0)
		exit(99);
	ok(h1_keep_alive(&h, 1, 0), "1.0 with keep-alive");
	hdrlist_free(&h);

	reply_problem(out, PROBLEM_STORE_UNAVAILABLE, "down", close);
	n = evbuffer_copyout(out, buf, sizeof(buf) - 1);
	buf[n] = '\0';
	ok(strstr(buf, "HTTP/1.1 503 ") == buf, "503 status line");
	ok(strstr(buf, "Retry-After: 1\r\n") != NULL, "503 has Retry-After");
	ok(strstr(buf, "Connection: close\r\n") != NULL, "close trailer");
	evbuffer_drain(out, evbuffer_get_length(out));
	reply_problem(out, PROBLEM_RESPONSE_NOT_STORED, NULL, keep10);
	n = evbuffer_copyout(out, buf, sizeof(buf) - 1);
	buf[n] = '\0';
	ok(strstr(buf, "Retry-After") == NULL, "409 not-stored: no Retry-After");
	ok(strstr(buf, "Connection: keep-alive\r\n") != NULL,
	   "HTTP/1.0 client kept alive: says so");
	evbuffer_free(out);
}

int main(void)
{
	struct config *cfg = load();

	test_header_key(cfg);
	test_body_keys(cfg);
	test_query_scope_none(cfg);
	test_signature(cfg);
	test_namespaces(cfg);
	test_scope_values();
	test_normalise();
	test_issue(cfg);
	test_settlement(cfg);
	test_probe_target();
	test_keep_alive_and_replies();
	config_unref(cfg);
	unlink(ini_path);
	rmdir(tmpdir);
	return tap_done();
}
