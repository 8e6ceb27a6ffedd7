/*
 * test_route.c - routes (DESIGN.md §3 config file, §4; issue 5):
 *
 *   - route_glob_match(): '*' runs across '/', literals, leading/trailing
 *     stars, the empty glob;
 *   - route_policy(): first match wins, methods, the query string ignored,
 *     key = none, the global policy for unmatched protected methods, NULL
 *     for unprotected ones;
 *   - [route NAME] sections through config_parse() with INI files in a
 *     mkdtemp directory: inheritance of the global settings, every error
 *     names file:line, the route and the key;
 *   - a route key that is also an [idemproxy] option takes exactly the
 *     option's values and bounds, and is refused with the same reason
 *     (issue 10: ttl = 999999999h was refused globally, taken in a route);
 *   - --check-config output (config_print() with the route blocks);
 *   - key sources (keysrc.h): query, form, JSON pointer, prefix, 255 limit;
 *   - HMAC-SHA256 verification (verify.h): GitHub's documented test vector,
 *     a Stripe-style vector computed independently (Python's hmac module),
 *     several v1 values, timestamps out of tolerance, malformed headers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llhttp.h>

#include "config.h"
#include "keysrc.h"
#include "route.h"
#include "tap.h"
#include "verify.h"

static char tmpdir[] = "/tmp/idemproxy-test-route-XXXXXX";
static char files[64][256];
static int nfiles;

/* Write a file into the temp dir; returns its path (lives until exit). */
static char *write_file(const char *name, const char *text)
{
	char *path = files[nfiles++];
	FILE *f;

	snprintf(path, sizeof(files[0]), "%s/%s", tmpdir, name);
	f = fopen(path, "w");
	if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
		perror(path);
		exit(99);
	}
	return path;
}

static void cleanup(void)
{
	for (int i = 0; i < nfiles; i++)
		unlink(files[i]);
	rmdir(tmpdir);
}

static int count(char **v)
{
	int n = 0;

	while (v[n] != NULL)
		n++;
	return n;
}

#define ARGS(...) ((char *[]){ "idemproxy", __VA_ARGS__, NULL })
#define ENV(...) ((char *[]){ __VA_ARGS__, NULL })
#define NOENV ((char *[]){ NULL })

static char err[1024];

static struct config *parse(char **argv, char **env)
{
	struct config *c = NULL;
	enum config_action a;

	err[0] = '\0';
	if (config_parse(count(argv), argv, env, &c, &a, err, sizeof(err)) < 0) {
		if (c != NULL)
			printf("# BUG: config returned on error\n");
		return NULL;
	}
	return c;
}

/* Parse an INI text (upstream given as a flag); NULL and err on error. */
static struct config *parse_ini(const char *name, const char *text, char **env,
				const char **path_out)
{
	char *p = write_file(name, text);

	if (path_out != NULL)
		*path_out = p;
	return parse(ARGS("--upstream", "http://127.0.0.1:9", "--config", p), env);
}

/* ---- glob --------------------------------------------------------------- */

static int gm(const char *glob, const char *s)
{
	return route_glob_match(glob, s, strlen(s));
}

static void test_glob(void)
{
	/* trailing star: prefix match, '/' included */
	ok(gm("/orders*", "/orders"), "glob: trailing * matches nothing");
	ok(gm("/orders*", "/orders/1"), "glob: trailing * across one '/'");
	ok(gm("/orders*", "/orders/1/items/2"), "glob: trailing * across many '/'");
	ok(gm("/orders*", "/orders-archive"), "glob: trailing * any char");
	ok(!gm("/orders*", "/order"), "glob: shorter path does not match");
	ok(!gm("/orders*", "/api/orders"), "glob: anchored at the start");
	ok(!gm("/orders*", "/Orders"), "glob: case-sensitive");

	/* literal */
	ok(gm("/pay/notify", "/pay/notify"), "glob: literal matches itself");
	ok(!gm("/pay/notify", "/pay/notify/"), "glob: literal, trailing slash");
	ok(!gm("/pay/notify", "/pay/notif"), "glob: literal, shorter");
	ok(!gm("/pay/notify", "/pay/notifyx"), "glob: literal, anchored at end");
	ok(!gm("/pay/notify", ""), "glob: literal vs empty path");
	ok(gm("/a.b", "/a.b") && !gm("/a.b", "/axb"), "glob: '.' is literal");
	ok(gm("/a?b", "/a?b") && !gm("/a?b", "/axb"), "glob: '?' is literal");
	ok(gm("/a[1]", "/a[1]") && !gm("/a[1]", "/a1"), "glob: '[' is literal");

	/* leading star */
	ok(gm("*/callback", "/alipay/v2/callback"), "glob: leading * across '/'");
	ok(gm("*/callback", "/callback"), "glob: leading * matches nothing");
	ok(!gm("*/callback", "/callback/x"), "glob: leading *, anchored at end");
	ok(gm("*/callback", "/callback/callback"), "glob: leading *, backtracking");

	/* middle star crosses '/' */
	ok(gm("/a/*/c", "/a/b/c"), "glob: middle * one segment");
	ok(gm("/a/*/c", "/a/b/x/c"), "glob: middle * across '/'");
	ok(gm("/a/*/c", "/a//c"), "glob: middle * empty run");
	ok(!gm("/a/*/c", "/a/c"), "glob: middle * still needs the slashes");
	ok(gm("/a*b*c", "/aXXbYYbZZc"), "glob: two stars with backtracking");
	ok(!gm("/a*b*c", "/aXXbYYbZZ"), "glob: two stars, missing tail");
	ok(gm("/x**", "/x/y"), "glob: double star is a star");

	/* whole-path and empty */
	ok(gm("*", "") && gm("*", "/") && gm("*", "/any/thing"), "glob: * matches all");
	ok(gm("", ""), "glob: empty glob matches the empty path");
	ok(!gm("", "/"), "glob: empty glob matches nothing else");
	ok(gm("**", ""), "glob: ** matches empty");

	/* the length bounds the path (the query string is cut off before) */
	ok(route_glob_match("/x", "/x?y=1", 2), "glob: len stops at the query");
	ok(!route_glob_match("/x*1", "/x?y=1", 2), "glob: nothing past len");
}

/* ---- route_policy ------------------------------------------------------- */

static void test_policy(void)
{
	const char *name;
	const struct policy *p;
	struct config *c = parse_ini("policy.ini",
		"[idemproxy]\n"
		"ttl = 1h\n"
		"[route special]\n"
		"match = POST /orders/special*\n"
		"key = none\n"
		"[route orders]\n"
		"match = POST,PUT /orders*\n"
		"key = form:order_id\n"
		"[route shadowed]\n"
		"match = POST /orders/1\n"
		"key = query:id\n"
		"[route any]\n"
		"match = * /any/*\n"
		"key = auto\n"
		"ttl = 10s\n", NOENV, NULL);

	ok(c != NULL, "policy: config parses (%s)", err);
	if (c == NULL)
		return;
	is_int(c->routing.nroutes, 4, "policy: four routes in file order");

	p = route_policy(&c->routing, HTTP_POST, "/orders/1?x=y", &name);
	ok(p != NULL && p->key_source == KEY_SRC_FORM &&
	   strcmp(p->key_name, "order_id") == 0, "policy: POST /orders/1 -> orders");
	is_str(name, "orders", "policy: first match wins over a later exact route");

	p = route_policy(&c->routing, HTTP_PUT, "/orders", &name);
	ok(p != NULL && p->key_source == KEY_SRC_FORM,
	   "policy: PUT covered by the route though not a global method");
	is_str(name, "orders", "policy: PUT route name");

	p = route_policy(&c->routing, HTTP_POST, "/orders/special/9", &name);
	ok(p == NULL, "policy: key = none -> not protected");
	is_str(name, "special", "policy: key = none still names its route");

	p = route_policy(&c->routing, HTTP_DELETE, "/orders/1", &name);
	ok(p == NULL && name == NULL,
	   "policy: method not in the route nor global -> not protected");

	p = route_policy(&c->routing, HTTP_PATCH, "/orders/1", &name);
	ok(p == &c->routing.global && name == NULL,
	   "policy: PATCH not in the route -> the global policy");
	ok(p != NULL && p->key_source == KEY_SRC_HEADER &&
	   strcmp(p->key_name, "Idempotency-Key") == 0,
	   "policy: the global policy keys on Idempotency-Key");

	p = route_policy(&c->routing, HTTP_POST, "/pay?next=/orders/1", &name);
	ok(p == &c->routing.global && name == NULL,
	   "policy: the query string is not part of the matched path");

	p = route_policy(&c->routing, HTTP_GET, "/elsewhere", &name);
	ok(p == NULL && name == NULL, "policy: GET unmatched -> not protected");

	p = route_policy(&c->routing, HTTP_GET, "/any/x", &name);
	ok(p != NULL && p->key_source == KEY_SRC_AUTO, "policy: * matches GET");
	is_str(name, "any", "policy: * route name");
	ok(p != NULL && p->ttl_ms == 10000, "policy: route ttl override");
	p = route_policy(&c->routing, HTTP_DELETE, "/any/x/y", &name);
	ok(p != NULL && p->key_source == KEY_SRC_AUTO, "policy: * matches DELETE");

	p = route_policy(&c->routing, HTTP_POST, "/orders", &name);
	ok(p != NULL && p->ttl_ms == 3600000,
	   "policy: a route inherits the global ttl");
	config_unref(c);

	/* no routes at all */
	c = parse(ARGS("--upstream", "http://127.0.0.1:9", "--methods", "PUT"), NOENV);
	ok(c != NULL && c->routing.nroutes == 0, "policy: no routes");
	if (c != NULL) {
		ok(route_policy(&c->routing, HTTP_PUT, "/x", &name) ==
		   &c->routing.global,
		   "policy: no routes, protected method -> global");
		ok(route_policy(&c->routing, HTTP_POST, "/x", &name) == NULL,
		   "policy: no routes, unprotected method -> NULL");
		config_unref(c);
	}
}

/* ---- config: values and inheritance ------------------------------------- */

static void test_config_values(void)
{
	const char *name;
	const struct policy *p;
	const struct route *r;
	struct config *c = parse_ini("values.ini",
		"[idemproxy]\n"
		"ttl = 2h\n"
		"require_key = yes\n"
		"key_header = X-Request-Id\n"
		"issued_key_ttl = 5m\n"
		"[route json]\n"
		"match = PATCH,POST /api/*\n"
		"key = json:/data/id\n"
		"key_prefix = evt:\n"
		"scope = header:Authorization\n"
		"require_key = no\n"
		"in_flight = reject\n"
		"wait_timeout = 3s\n"
		"lease = 45s\n"
		"max_body = 64KiB\n"
		"max_cached_response = 1MiB\n"
		"on_upstream_error = keep\n"
		"store_down = fail-open\n"
		"release_statuses = 503, 409\n"
		"upstream_deadline = 90s\n"
		"unknown_outcome = release\n"
		"outcome_probe = GET /api/things/{key}?by=key\n"
		"[route stripe]\n"
		"match = POST /hooks/stripe\n"
		"verify_format = stripe    ; before verify: order does not matter\n"
		"verify = hmac-sha256\n"
		"verify_secret_env = WH_SECRET\n"
		"verify_tolerance = 10m\n"
		"key = json:/id\n"
		"[route gh]\n"
		"match = POST /hooks/github\n"
		"key = header:X-GitHub-Delivery\n"
		"verify = hmac-sha256\n"
		"verify_secret_env = GH_SECRET\n"
		"[route form]\n"
		"match = POST /checkout\n"
		"key = header:X-Form-Key\n"
		"require_issued_key = yes\n"
		"issued_key_ttl = 1s\n",
		ENV("WH_SECRET=whsec_abc", "GH_SECRET=It's a Secret to Everybody"),
		NULL);

	ok(c != NULL, "values: config parses (%s)", err);
	if (c == NULL)
		return;
	p = route_policy(&c->routing, HTTP_POST, "/api/v1/things", &name);
	ok(p != NULL, "values: json route");
	if (p != NULL) {
		is_int(p->key_source, KEY_SRC_JSON, "values: json source");
		is_str(p->key_name, "/data/id", "values: json pointer");
		is_str(p->key_prefix, "evt:", "values: key_prefix");
		is_int(p->scope, SCOPE_HEADER, "values: scope header");
		is_str(p->scope_name, "Authorization", "values: scope header name");
		ok(!p->require_key, "values: require_key overridden to no");
		is_int(p->in_flight, IN_FLIGHT_REJECT, "values: in_flight");
		is_int(p->wait_timeout_ms, 3000, "values: wait_timeout");
		is_int(p->ttl_ms, 2 * 3600000, "values: ttl inherited");
		is_int(p->lease_ms, 45000, "values: lease");
		is_int(p->max_body, 65536, "values: max_body");
		is_int(p->max_cached_response, 1048576, "values: max_cached_response");
		is_int(p->on_upstream_error, UPSTREAM_ERROR_KEEP, "values: on_upstream_error");
		is_int(p->store_down, STORE_DOWN_FAIL_OPEN, "values: store_down");
		is_int(p->verify, VERIFY_NONE, "values: no verify by default");
		ok(status_set_has(&p->release_statuses, 409) &&
		   status_set_has(&p->release_statuses, 503) &&
		   !status_set_has(&p->release_statuses, 500),
		   "values: release_statuses");
		is_int(p->upstream_deadline_ms, 90000, "values: upstream_deadline");
		is_int(p->unknown_outcome, UNKNOWN_RELEASE, "values: unknown_outcome");
		is_str(p->probe_method, "GET", "values: outcome_probe method");
		is_str(p->probe_target, "/api/things/{key}?by=key",
		       "values: outcome_probe target");
	}
	p = route_policy(&c->routing, HTTP_POST, "/hooks/stripe", &name);
	ok(p != NULL && p->verify == VERIFY_STRIPE,
	   "values: verify_format = stripe stays stripe whatever the line order");
	if (p != NULL) {
		is_str(p->verify_header, "Stripe-Signature", "values: stripe default header");
		ok(p->verify_secret != NULL && p->verify_secret_len == 9 &&
		   memcmp(p->verify_secret, "whsec_abc", 9) == 0,
		   "values: secret read from envp");
		is_int(p->verify_tolerance_ms, 600000, "values: verify_tolerance");
		ok(p->require_key, "values: require_key inherited (yes)");
		is_str(p->key_prefix, "", "values: no prefix");
		ok(p->scope == SCOPE_NONE && p->scope_name == NULL,
		   "values: global scope by default");
	}
	p = route_policy(&c->routing, HTTP_POST, "/hooks/github", &name);
	ok(p != NULL && p->verify == VERIFY_GITHUB, "values: github is the default format");
	if (p != NULL) {
		is_str(p->verify_header, "X-Hub-Signature-256", "values: github default header");
		is_int(p->verify_tolerance_ms, 300000, "values: default tolerance 5m");
		is_str(p->key_name, "X-GitHub-Delivery", "values: header source name");
	}
	p = route_policy(&c->routing, HTTP_POST, "/checkout", &name);
	ok(p != NULL && p->require_issued_key && p->issued_key_ttl_ms == 1000,
	   "values: require_issued_key and route issued_key_ttl");
	p = route_policy(&c->routing, HTTP_PATCH, "/x", &name);
	ok(p == &c->routing.global && p->issued_key_ttl_ms == 5 * 60000 &&
	   p->require_key && strcmp(p->key_name, "X-Request-Id") == 0,
	   "values: the global policy from [idemproxy]");
	p = route_policy(&c->routing, HTTP_POST, "/hooks/github", &name);
	ok(p != NULL && p->issued_key_ttl_ms == 5 * 60000 && !p->require_issued_key,
	   "values: issued_key_ttl inherited");

	/* routes in file order */
	r = &c->routing.routes[0];
	ok(c->routing.nroutes == 4 && strcmp(r->name, "json") == 0 &&
	   strcmp(c->routing.routes[3].name, "form") == 0,
	   "values: file order");
	config_unref(c);

	/* a flag overrides the file, and routes inherit the flag */
	{
		char *p2 = write_file("flag.ini",
			"[idemproxy]\nttl = 2h\n[route a]\nmatch = POST /a\n");

		c = parse(ARGS("--upstream", "http://127.0.0.1:9", "--config", p2,
			       "--ttl", "7m"), NOENV);
		ok(c != NULL && c->routing.routes[0].policy.ttl_ms == 7 * 60000,
		   "values: a route starts from the effective global (flag)");
		config_unref(c);
		c = parse(ARGS("--upstream", "http://127.0.0.1:9", "--config", p2),
			  ENV("IDEMPROXY_TTL=9m"));
		ok(c != NULL && c->routing.routes[0].policy.ttl_ms == 9 * 60000,
		   "values: a route starts from the effective global (env)");
		config_unref(c);
	}

	/* case-insensitive source words, scope none, verify none */
	c = parse_ini("words.ini",
		"[idemproxy]\n[route a]\nmatch = POST /a\nkey = AUTO\n"
		"scope = none\nverify = none\n", NOENV, NULL);
	ok(c != NULL &&
	   c->routing.routes[0].policy.key_source == KEY_SRC_AUTO &&
	   c->routing.routes[0].policy.verify == VERIFY_NONE &&
	   c->routing.routes[0].policy.scope == SCOPE_NONE,
	   "values: auto, scope none, verify none (%s)", err);
	ok(c != NULL &&
	   route_policy(&c->routing, HTTP_POST, "/a", &name) != NULL,
	   "values: key = AUTO is case-insensitive");
	config_unref(c);
}

/* ---- config errors ------------------------------------------------------ */

static void fails_ini(const char *fname, const char *text, char **env, int line,
		      const char *msg)
{
	const char *path;
	char want[600];
	struct config *c = parse_ini(fname, text, env, &path);

	snprintf(want, sizeof(want), "%s:%d: %s", path, line, msg);
	ok(c == NULL && strstr(err, want) != NULL, "error %s: %s", fname, err);
	if (c != NULL)
		config_unref(c);
	else if (strstr(err, want) == NULL)
		printf("#   want \"%s\"\n", want);
	ok(strchr(err, '\n') == NULL, "error %s: one line", fname);
}

static void test_config_errors(void)
{
	fails_ini("match-nomethod.ini",
		  "[idemproxy]\n[route o]\nmatch = /orders\n", NOENV, 3,
		  "route o: match: expected \"METHODS PATH-GLOB\"");
	fails_ini("match-noslash.ini",
		  "[idemproxy]\n[route o]\nkey = auto\nmatch = POST orders\n", NOENV, 4,
		  "route o: match: the path glob must start with '/'");
	fails_ini("match-lower.ini",
		  "[idemproxy]\n[route o]\nmatch = post /orders\n", NOENV, 3,
		  "route o: match: unknown HTTP method \"post\"");
	fails_ini("match-method.ini",
		  "[idemproxy]\n[route o]\nmatch = FETCH /orders\n", NOENV, 3,
		  "route o: match: ");
	fails_ini("unknown-key.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\ncolour = red\n", NOENV, 4,
		  "route o: colour: unknown key");
	fails_ini("bad-source.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nkey = cookie:sid\n", NOENV, 4,
		  "route o: key: expected header:NAME");
	fails_ini("bad-header-name.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nkey = header:\n", NOENV, 4,
		  "route o: key: missing or invalid name");
	fails_ini("empty-form.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nkey = form:\n", NOENV, 4,
		  "route o: key: missing or invalid name");
	fails_ini("json-noslash.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\n\nkey = json:data.id\n",
		  NOENV, 5, "route o: key: a JSON pointer starts with '/'");
	fails_ini("verify-nosecret.ini",
		  "[idemproxy]\n[route gh]\nmatch = POST /gh\nverify = hmac-sha256\n",
		  NOENV, 4, "route gh: verify needs verify_secret_env");
	fails_ini("verify-unset.ini",
		  "[idemproxy]\n[route gh]\nmatch = POST /gh\nverify = hmac-sha256\n"
		  "verify_secret_env = IDEMPROXY_TEST_SURELY_UNSET_42\n",
		  NOENV, 5, "route gh: verify_secret_env: environment variable "
		  "IDEMPROXY_TEST_SURELY_UNSET_42 is not set");
	fails_ini("verify-empty.ini",
		  "[idemproxy]\n[route gh]\nmatch = POST /gh\nverify = hmac-sha256\n"
		  "verify_secret_env = EMPTY_SECRET\n",
		  ENV("EMPTY_SECRET="), 5, "route gh: verify_secret_env: ");
	fails_ini("verify-bad.ini",
		  "[idemproxy]\n[route gh]\nmatch = POST /gh\nverify = md5\n", NOENV, 4,
		  "route gh: verify: invalid value \"md5\" (use hmac-sha256 or none)");
	fails_ini("verify-format.ini",
		  "[idemproxy]\n[route gh]\nmatch = POST /gh\nverify_format = paypal\n",
		  NOENV, 4, "route gh: verify_format: invalid value \"paypal\" (use "
		  "github or stripe)");
	fails_ini("dup-route.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\n[route o]\nkey = auto\n",
		  NOENV, 4, "[route o] defined twice (first on line 2)");
	fails_ini("dup-key.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nttl = 1s\nttl = 2s\n",
		  NOENV, 5, "route o: ttl set twice (first on line 4)");
	fails_ini("no-match.ini",
		  "[idemproxy]\nttl = 1h\n[route o]\nkey = auto\n", NOENV, 3,
		  "route o: match is required");
	fails_ini("lease-short.ini",
		  "[idemproxy]\nupstream_timeout = 20s\n[route o]\nmatch = POST /o\n"
		  "lease = 10s\n", NOENV, 3,
		  "route o: lease must be longer than upstream_timeout");
	fails_ini("lease-equal.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nlease = 20s\n", NOENV, 2,
		  "route o: lease must be longer than upstream_timeout");
	fails_ini("bad-ttl.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nttl = soon\n", NOENV, 4,
		  "route o: ttl: invalid duration");
	fails_ini("zero-ttl.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nttl = 0s\n", NOENV, 4,
		  "route o: ttl: ");
	fails_ini("bad-bool.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nrequire_key = maybe\n", NOENV,
		  4, "route o: require_key: invalid boolean");
	fails_ini("bad-inflight.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nin_flight = queue\n", NOENV,
		  4, "route o: in_flight: invalid value \"queue\" (use wait or reject)");
	fails_ini("bad-scope.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nscope = cookie:sid\n", NOENV,
		  4, "route o: scope: expected header:NAME, jwt:CLAIM");
	fails_ini("bad-prefix.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nkey_prefix = a\x01 b\n", NOENV,
		  4, "route o: key_prefix: only visible ASCII");
	fails_ini("bad-size.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nmax_body = lots\n", NOENV,
		  4, "route o: max_body: invalid size");
	fails_ini("no-name.ini", "[idemproxy]\n[route]\nmatch = POST /o\n", NOENV, 2,
		  "[route] needs a name");
	fails_ini("probe-post.ini", "[idemproxy]\n[route o]\nmatch = POST /o\n"
		  "outcome_probe = POST /o/{key}\n", NOENV, 4,
		  "route o: outcome_probe: use GET /path/{key}");
	fails_ini("probe-nokey.ini", "[idemproxy]\n[route o]\nmatch = POST /o\n"
		  "outcome_probe = GET /o/key\n", NOENV, 4,
		  "route o: outcome_probe: the target must start with / and hold {key}");
	fails_ini("probe-blank.ini", "[idemproxy]\n[route o]\nmatch = POST /o\n"
		  "outcome_probe = GET /o/{key} x\n", NOENV, 4,
		  "route o: outcome_probe: the target has a blank");
	fails_ini("deadline.ini", "[idemproxy]\nupstream_timeout = 20s\n"
		  "[route o]\nmatch = POST /o\nupstream_deadline = 5s\n", NOENV, 3,
		  "route o: upstream_deadline must not be shorter than "
		  "upstream_timeout");
	/* the first bad route is the one reported, with its own line */
	fails_ini("second-route.ini",
		  "[idemproxy]\n[route a]\nmatch = POST /a\n[route b]\n"
		  "match = POST /b\nin_flight = later\n", NOENV, 6,
		  "route b: in_flight: ");
}

/* ---- a route key holds the value syntax of its [idemproxy] option -------- */

/* struct policy's modes are their enums, not ints (policy.h). */
#define IS_TYPE(expr, type) _Generic((expr), type: 1, default: 0)
_Static_assert(IS_TYPE(((struct policy *)0)->in_flight, enum in_flight_mode) &&
	       IS_TYPE(((struct policy *)0)->store_down, enum store_down_mode) &&
	       IS_TYPE(((struct policy *)0)->on_upstream_error,
		       enum upstream_error_mode),
	       "struct policy: typed modes");

static void test_route_bounds(void)
{
	/* refused in [idemproxy], and now in a route too (the other keys
	 * and values: test_same_as_global) */
	fails_ini("huge-ttl.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nttl = 999999999h\n",
		  NOENV, 4, "route o: ttl: 999999999h is too long (at most "
		  "2147483647s)");
	fails_ini("huge-tolerance.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\n"
		  "verify_tolerance = 999999999h\n", NOENV, 4,
		  "route o: verify_tolerance: 999999999h is too long");
	fails_ini("zero-cached.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\n"
		  "max_cached_response = 0\n", NOENV, 4,
		  "route o: max_cached_response: size 0 out of range (1B-512MiB)");
	fails_ini("huge-body.ini",
		  "[idemproxy]\n[route o]\nmatch = POST /o\nmax_body = 2GiB\n",
		  NOENV, 4, "route o: max_body: size 2GiB out of range (1B-1GiB)");
}

static char *same_path;

/* Parse `key = value` in [idemproxy] (line 2) or in a route (line 4); the
 * reason of the error after "key: ", or "" when it parses. */
static void reason(const char *key, const char *value, int route, char *out,
		   size_t len)
{
	char text[256], prefix[512];
	struct config *c;
	FILE *f;

	snprintf(text, sizeof(text), route ? "[idemproxy]\n[route o]\n"
		 "match = POST /o\n%s = %s\n" : "[idemproxy]\n%s = %s\n", key, value);
	f = fopen(same_path, "w");
	if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
		perror(same_path);
		exit(99);
	}
	c = parse(ARGS("--upstream", "http://127.0.0.1:9", "--config", same_path),
		  NOENV);
	config_unref(c);
	snprintf(prefix, sizeof(prefix), "%s:%d: %s%s: ", same_path,
		 route ? 4 : 2, route ? "route o: " : "", key);
	if (c != NULL)
		snprintf(out, len, "%s", "");
	else if (strncmp(err, prefix, strlen(prefix)) == 0)
		snprintf(out, len, "%s", err + strlen(prefix));
	else
		snprintf(out, len, "(unexpected error) %.900s", err);
}

static void test_same_as_global(void)
{
	static const char *const durations[] = {
		"soon", "", "0s", "0ms", "10 s", "1.5s", "1d", "10", "1h",
		"2147483647s", "2147483648s", "999999999h",
		"99999999999999999999s",
	};
	static const char *const sizes[] = {
		"lots", "", "0", "1", "1KB", "64KiB", "512MiB", "513MiB", "1GiB",
		"2GiB", "99999999999999999999",
	};
	static const char *const statuses[] = {
		"", "500", "500,503", " 429 , 500 ", "none", "50", "600", "500,500",
		"5xx",
	};
	static const char *const words[] = {
		"", "maybe", "2", "YES", "off", "1", "queue", "REJECT", "wait",
		"open", "fail-open", "x", "keep", "Release",
	};
	static const struct {
		const char *key;
		const char *const *values;
		size_t n;
	} keys[] = {
		{ "wait_timeout", durations, 13 }, { "ttl", durations, 13 },
		{ "lease", durations + 9, 4 }, { "issued_key_ttl", durations, 13 },
		{ "max_body", sizes, 11 }, { "max_cached_response", sizes, 11 },
		{ "require_key", words, 14 }, { "in_flight", words, 14 },
		{ "store_down", words, 14 }, { "on_upstream_error", words, 14 },
		{ "unknown_outcome", words, 14 },
		{ "upstream_deadline", durations, 13 },
		{ "release_statuses", statuses, 9 },
	};
	char g[1024], r[1024];

	same_path = write_file("same.ini", "");
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		for (size_t j = 0; j < keys[i].n; j++) {
			const char *v = keys[i].values[j];

			reason(keys[i].key, v, 0, g, sizeof(g));
			reason(keys[i].key, v, 1, r, sizeof(r));
			if (!ok(strcmp(g, r) == 0, "same syntax: %s = \"%s\" %s",
				keys[i].key, v, g[0] ? "refused alike" :
				"accepted alike"))
				printf("#   [idemproxy]: \"%s\"\n#   route: \"%s\"\n",
				       g, r);
		}
	}
}

/* ---- --check-config ----------------------------------------------------- */

static char *printed(const struct config *c)
{
	/* static: GCC 12 takes open_memstream's hold on locals for a
	 * dangling pointer at -O2 (-Wdangling-pointer false positive) */
	static char *buf;
	static size_t len;
	FILE *f;

	buf = NULL;
	len = 0;
	f = open_memstream(&buf, &len);
	config_print(c, f);
	fclose(f);
	return buf;
}

static int has(const char *out, const char *want)
{
	if (strstr(out, want) != NULL)
		return 1;
	printf("#   missing: \"%s\"\n", want);
	return 0;
}

static void test_print(void)
{
	struct config *c = parse_ini("print.ini",
		"[idemproxy]\nttl = 1h\n"
		"[route alipay]\n"
		"match = POST /pay/notify\n"
		"key = form:out_trade_no\n"
		"key_prefix = pay:\n"
		"require_key = yes\n"
		"[route stripe]\n"
		"match = POST /hooks/stripe\n"
		"key = json:/id\n"
		"verify = hmac-sha256\n"
		"verify_format = stripe\n"
		"verify_secret_env = WH_SECRET\n"
		"[route api]\n"
		"match = PATCH,POST /api/*\n"
		"scope = header:Authorization\n"
		"ttl = 10s\n"
		"[route form]\n"
		"match = POST /checkout\n"
		"require_issued_key = yes\n"
		"issued_key_ttl = 2m\n",
		ENV("WH_SECRET=whsec_do_not_print_me"), NULL);
	char *out;

	ok(c != NULL, "print: parses (%s)", err);
	if (c == NULL)
		return;
	out = printed(c);
	ok(has(out, "\nttl = 1h\n"), "print: the global settings first");
	ok(has(out, "\n[route alipay]\nmatch = POST /pay/notify\n"
		    "key = form:out_trade_no\nkey_prefix = pay:\nrequire_key = yes\n"),
	   "print: alipay block");
	ok(has(out, "[route alipay]\nmatch = POST /pay/notify\nkey = form:out_trade_no\n"
		    "key_prefix = pay:\nrequire_key = yes\nin_flight = wait\n"
		    "wait_timeout = 10s\nttl = 1h\n"),
	   "print: effective (inherited) values");
	ok(has(out, "\n[route stripe]\nmatch = POST /hooks/stripe\nkey = json:/id\n"),
	   "print: stripe block");
	ok(has(out, "verify = hmac-sha256\nverify_format = stripe\n"
		    "verify_header = Stripe-Signature\n"
		    "verify_secret = (21 bytes, from the environment)\n"
		    "verify_tolerance = 5m\n"), "print: verify settings, secret hidden");
	ok(strstr(out, "whsec_do_not_print_me") == NULL, "print: never the secret");
	ok(has(out, "\n[route api]\nmatch = POST,PATCH /api/*\n"
		    "key = header:Idempotency-Key\n"), "print: api block, methods");
	ok(has(out, "ttl = 10s\n"), "print: route ttl");
	ok(has(out, "scope = header:Authorization\n"), "print: scope");
	ok(has(out, "\n[route form]\n") &&
	   has(out, "require_issued_key = yes\nissued_key_ttl = 2m\n"),
	   "print: issued key settings");
	ok(strstr(out, "[route alipay]") < strstr(out, "[route stripe]") &&
	   strstr(out, "[route stripe]") < strstr(out, "[route api]"),
	   "print: routes in file order");
	free(out);
	config_unref(c);
}

/* ---- key sources -------------------------------------------------------- */

static void test_keysrc_query(void)
{
	char out[IDEMKEY_MAX + 1];

	is_int(keysrc_query("/pay?out_trade_no=T1&x=2", "out_trade_no", "", out), 2,
	       "query: plain");
	is_str(out, "T1", "query: plain value");
	is_int(keysrc_query("/p?a=1&id=ab%2Fc%41", "id", "", out), 5,
	       "query: percent-decoded");
	is_str(out, "ab/cA", "query: percent-decoded value");
	ok(keysrc_query("/p?order+id=X9", "order id", "", out) == 2 &&
	   strcmp(out, "X9") == 0, "query: '+' is a space in names");
	ok(keysrc_query("/p?order%20id=X9", "order id", "", out) == 2,
	   "query: %%20 in names");
	is_int(keysrc_query("/p?id=a+b", "id", "", out), KEYSRC_INVALID,
	       "query: '+' decodes to a space: not a key");
	is_int(keysrc_query("/p?id=a%20b", "id", "", out), KEYSRC_INVALID,
	       "query: decoded space: not a key");
	ok(keysrc_query("/p?xid=1&id=2&id=3", "id", "", out) == 1 &&
	   strcmp(out, "2") == 0, "query: exact name, first occurrence");
	is_int(keysrc_query("/p", "id", "", out), KEYSRC_MISSING, "query: none");
	is_int(keysrc_query("/p?", "id", "", out), KEYSRC_MISSING, "query: empty");
	is_int(keysrc_query("/p?other=1", "id", "", out), KEYSRC_MISSING,
	       "query: name absent");
	is_int(keysrc_query("/p?x=1#id=2", "id", "", out), KEYSRC_MISSING,
	       "query: fragment ignored");
	is_int(keysrc_query("/p?id=", "id", "", out), KEYSRC_INVALID,
	       "query: empty value");
	is_int(keysrc_query("/p?id", "id", "", out), KEYSRC_INVALID,
	       "query: name without '='");
	is_int(keysrc_query("/p?id=%zz", "id", "", out), KEYSRC_INVALID,
	       "query: bad escape");
	is_int(keysrc_query("/p?id=ab%4", "id", "", out), KEYSRC_INVALID,
	       "query: truncated escape");
	is_int(keysrc_query("/p?id=%C3%A9", "id", "", out), KEYSRC_INVALID,
	       "query: non-ASCII after decoding");
	ok(keysrc_query("/p?id=7", "id", "order:", out) == 7 &&
	   strcmp(out, "order:7") == 0, "query: prefix");
}

static void test_keysrc_form(void)
{
	char out[IDEMKEY_MAX + 1];
	const char *b = "trade_status=TRADE_SUCCESS&out_trade_no=2024%2D0001"
			"&total_amount=88.00&subject=a+b";

	is_int(keysrc_form(b, strlen(b), "out_trade_no", "", out), 9, "form: field");
	is_str(out, "2024-0001", "form: percent-decoded");
	ok(keysrc_form(b, strlen(b), "out_trade_no", "pay:", out) == 13 &&
	   strcmp(out, "pay:2024-0001") == 0, "form: prefix");
	is_int(keysrc_form(b, strlen(b), "subject", "", out), KEYSRC_INVALID,
	       "form: '+' is a space: not a key");
	is_int(keysrc_form(b, strlen(b), "trade_no", "", out), KEYSRC_MISSING,
	       "form: missing field");
	is_int(keysrc_form("", 0, "f", "", out), KEYSRC_MISSING, "form: empty body");
	/* the length bounds the body: no NUL needed, nothing read past it */
	is_int(keysrc_form("f=abcdef", 4, "f", "", out), 2, "form: length honoured");
	is_str(out, "ab", "form: value cut at the length");
	is_int(keysrc_form("{\"f\":\"x\"}", 9, "f", "", out), KEYSRC_MISSING,
	       "form: a JSON body has no such field");
	ok(keysrc_form("a=1&&f=v&", 9, "f", "", out) == 1 && strcmp(out, "v") == 0,
	   "form: empty pairs skipped");
}

static void test_keysrc_json(void)
{
	char out[IDEMKEY_MAX + 1];
	const char *b;

#define J(body, ptr, pre) keysrc_json(body, strlen(body), ptr, pre, out)
	b = "{\"data\":{\"id\":\"evt_123\",\"n\":42,\"neg\":-7,\"f\":1.5,"
	    "\"f0\":1.0,\"o\":{},\"a\":[\"x\",\"y\"],\"t\":true,\"z\":null,"
	    "\"e\":\"\",\"u\":\"caf\\u00e9\",\"big\":9007199254740993},"
	    "\"a/b\":\"slash\",\"m~n\":\"tilde\"}";
	is_int(J(b, "/data/id", ""), 7, "json: string");
	is_str(out, "evt_123", "json: string value");
	is_int(J(b, "/data/n", ""), 2, "json: integer");
	is_str(out, "42", "json: integer as decimal");
	ok(J(b, "/data/neg", "") == 2 && strcmp(out, "-7") == 0, "json: negative");
	ok(J(b, "/data/big", "") == 16 && strcmp(out, "9007199254740993") == 0,
	   "json: integer beyond double precision kept exact");
	ok(J(b, "/data/a/1", "") == 1 && strcmp(out, "y") == 0, "json: array index");
	ok(J(b, "/a~1b", "") == 5 && strcmp(out, "slash") == 0, "json: ~1 escape");
	ok(J(b, "/m~0n", "") == 5 && strcmp(out, "tilde") == 0, "json: ~0 escape");
	ok(J(b, "/data/id", "gh:") == 10 && strcmp(out, "gh:evt_123") == 0,
	   "json: prefix");
	is_int(J(b, "/data/missing", ""), KEYSRC_MISSING, "json: missing member");
	is_int(J(b, "/nope/id", ""), KEYSRC_MISSING, "json: missing parent");
	is_int(J(b, "/data/a/5", ""), KEYSRC_MISSING, "json: index out of range");
	is_int(J(b, "/data/f", ""), KEYSRC_INVALID, "json: float refused");
	is_int(J(b, "/data/f0", ""), KEYSRC_INVALID, "json: 1.0 refused (not 1)");
	is_int(J(b, "/data/o", ""), KEYSRC_INVALID, "json: object refused");
	is_int(J(b, "/data/a", ""), KEYSRC_INVALID, "json: array refused");
	is_int(J(b, "/data/t", ""), KEYSRC_INVALID, "json: boolean refused");
	is_int(J(b, "/data/z", ""), KEYSRC_MISSING, "json: null counts as missing");
	is_int(J(b, "/data/e", ""), KEYSRC_INVALID, "json: empty string refused");
	is_int(J(b, "/data/u", ""), KEYSRC_INVALID, "json: non-ASCII refused");
	is_int(J("{\"id\":\"a b\"}", "/id", ""), KEYSRC_INVALID, "json: space refused");
	is_int(J("{\"id\":\"a\\u0000b\"}", "/id", ""), KEYSRC_INVALID,
	       "json: embedded NUL refused");
	is_int(J("{\"id\":\"x\"", "/id", ""), KEYSRC_MISSING, "json: truncated body yields no key");
	is_int(J("{\"id\":\"x\"} garbage", "/id", ""), KEYSRC_MISSING,
	       "json: trailing garbage");
	is_int(J("{\"id\":\"x\"}{}", "/id", ""), KEYSRC_MISSING,
	       "json: two documents");
	is_int(J("{id:x}", "/id", ""), KEYSRC_MISSING, "json: malformed");
	is_int(J("", "/id", ""), KEYSRC_MISSING, "json: empty body");
	is_int(J("id=x", "/id", ""), KEYSRC_MISSING, "json: a form body");
	ok(J("{\"id\":\"x\"}\n", "/id", "") == 1, "json: trailing whitespace is fine");
	ok(J(" \t{\"id\" : 5 }", "/id", "") == 1 && strcmp(out, "5") == 0,
	   "json: leading whitespace is fine");
	is_int(J("\"top\"", "", ""), 3, "json: empty pointer is the whole document");
	/* the length bounds the parse */
	is_int(keysrc_json("{\"id\":\"x\"}JUNK", 10, "/id", "", out), 1,
	       "json: length honoured");
#undef J
}

static void test_keysrc_limits(void)
{
	char out[IDEMKEY_MAX + 1], val[400], body[600];

	memset(val, 'k', sizeof(val));
	is_int(keysrc_finish("", val, 255, out), 255, "limit: 255 characters");
	is_int((int)strlen(out), 255, "limit: 255 written");
	is_int(keysrc_finish("", val, 256, out), KEYSRC_INVALID, "limit: 256 refused");
	is_int(keysrc_finish("pay:", val, 251, out), 255, "limit: prefix counts (255)");
	ok(strncmp(out, "pay:kkk", 7) == 0, "limit: prefix first");
	is_int(keysrc_finish("pay:", val, 252, out), KEYSRC_INVALID,
	       "limit: prefix counts (256 refused)");
	is_int(keysrc_finish("p", "", 0, out), KEYSRC_INVALID, "limit: empty value");
	is_int(keysrc_finish("", "a\x7f", 2, out), KEYSRC_INVALID, "limit: DEL refused");
	is_int(keysrc_finish("", "!~", 2, out), 2, "limit: 0x21 and 0x7e accepted");

	snprintf(body, sizeof(body), "f=%.255s", val);
	is_int(keysrc_form(body, strlen(body), "f", "", out), 255, "limit: form 255");
	snprintf(body, sizeof(body), "f=%.256s", val);
	is_int(keysrc_form(body, strlen(body), "f", "", out), KEYSRC_INVALID,
	       "limit: form 256");
	snprintf(body, sizeof(body), "f=%.251s", val);
	is_int(keysrc_form(body, strlen(body), "f", "pay:", out), 255,
	       "limit: form 251 + prefix");
	snprintf(body, sizeof(body), "f=%.252s", val);
	is_int(keysrc_form(body, strlen(body), "f", "pay:", out), KEYSRC_INVALID,
	       "limit: form 252 + prefix");
	snprintf(body, sizeof(body), "/x?q=%.256s", val);
	is_int(keysrc_query(body, "q", "", out), KEYSRC_INVALID, "limit: query 256");
	snprintf(body, sizeof(body), "{\"id\":\"%.255s\"}", val);
	is_int(keysrc_json(body, strlen(body), "/id", "", out), 255, "limit: json 255");
	snprintf(body, sizeof(body), "{\"id\":\"%.256s\"}", val);
	is_int(keysrc_json(body, strlen(body), "/id", "", out), KEYSRC_INVALID,
	       "limit: json 256");
	snprintf(body, sizeof(body), "{\"id\":\"%.252s\"}", val);
	is_int(keysrc_json(body, strlen(body), "/id", "pay:", out), KEYSRC_INVALID,
	       "limit: json 252 + prefix");
}

/* ---- signatures --------------------------------------------------------- */

/* GitHub, "Validating webhook deliveries": secret, payload, signature. */
#define GH_SECRET "It's a Secret to Everybody"
#define GH_BODY "Hello, World!"
#define GH_SIG "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

/*
 * Stripe style, computed independently with Python:
 *   hmac.new(b"whsec_test_secret", b"1700000000." + body, hashlib.sha256)
 * body = {"id":"evt_1","type":"payment_intent.succeeded"}
 * The second MAC is the same message under b"whsec_old_secret".
 */
#define ST_SECRET "whsec_test_secret"
#define ST_BODY "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\"}"
#define ST_T 1700000000
#define ST_MAC "22d8dc182f5c588077683bd378368e29765bfe5df2560112b4f28fef120f0e31"
#define ST_OLD "01fb11721f95aaf652cd381c2bb35f463528c395c86a34cbf41d7a1b45b2ae9d"

static bool gh(const char *secret, const char *sig, const char *body)
{
	return verify_signature(VERIFY_GITHUB, secret, strlen(secret), sig,
				strlen(sig), body, strlen(body), 0, 0);
}

static bool st(const char *sig, const char *body, time_t now, uint64_t tol_ms)
{
	return verify_signature(VERIFY_STRIPE, ST_SECRET, strlen(ST_SECRET), sig,
				strlen(sig), body, strlen(body), now, tol_ms);
}

static void test_verify_github(void)
{
	char sig[128];

	ok(gh(GH_SECRET, GH_SIG, GH_BODY), "github: documented test vector");
	strcpy(sig, GH_SIG);
	for (char *p = sig + 7; *p; p++)
		if (*p >= 'a' && *p <= 'f')
			*p = (char)(*p - 'a' + 'A');
	ok(gh(GH_SECRET, sig, GH_BODY), "github: upper-case hex accepted");
	ok(!gh("It's a secret to everybody", GH_SIG, GH_BODY), "github: wrong secret");
	ok(!gh(GH_SECRET, GH_SIG, "Hello, World?"), "github: body changed");
	ok(!gh(GH_SECRET, GH_SIG, "Hello, World! "), "github: body extended");
	ok(!gh(GH_SECRET, &GH_SIG[7], GH_BODY), "github: no sha256= prefix");
	ok(!gh(GH_SECRET, "sha1=757107ea0eb2509fc211221cce984b8a37570b6d", GH_BODY),
	   "github: sha1= refused");
	strcpy(sig, GH_SIG);
	sig[strlen(sig) - 1] = '\0';
	ok(!gh(GH_SECRET, sig, GH_BODY), "github: 63 hex digits");
	strcpy(sig, GH_SIG);
	strcat(sig, "0");
	ok(!gh(GH_SECRET, sig, GH_BODY), "github: 65 hex digits");
	strcpy(sig, GH_SIG);
	sig[10] = 'g';
	ok(!gh(GH_SECRET, sig, GH_BODY), "github: non-hex digit");
	strcpy(sig, GH_SIG);
	sig[strlen(sig) - 1] = '6';
	ok(!gh(GH_SECRET, sig, GH_BODY), "github: last digit flipped");
	ok(!gh(GH_SECRET, "", GH_BODY), "github: empty header");
	ok(!gh(GH_SECRET, "sha256=", GH_BODY), "github: empty MAC");
	ok(verify_signature(VERIFY_NONE, "", 0, "", 0, "", 0, 0, 0),
	   "verify none: always true");
	/* the length of sig is honoured: a valid prefix is not enough */
	ok(!verify_signature(VERIFY_GITHUB, GH_SECRET, strlen(GH_SECRET), GH_SIG, 20,
			     GH_BODY, strlen(GH_BODY), 0, 0), "github: sig length honoured");
	/* a binary body with NUL bytes is signed over its full length;
	 * python: hmac.new(b"k", b"a\x00b", hashlib.sha256).hexdigest() */
	{
		const char *s = "sha256=982872ff8422d2d84de2d26d7900850ff9f3b3275079b02813b572f9ff0ef0b2";

		ok(verify_signature(VERIFY_GITHUB, "k", 1, s, strlen(s), "a\0b", 3, 0, 0),
		   "github: binary body, full length");
		ok(!verify_signature(VERIFY_GITHUB, "k", 1, s, strlen(s), "a\0b", 1, 0, 0),
		   "github: binary body, cut at the NUL fails");
	}
}

static void test_verify_stripe(void)
{
	char sig[512];
	const uint64_t tol = 300000;	/* 5m */

	snprintf(sig, sizeof(sig), "t=%d,v1=%s", ST_T, ST_MAC);
	ok(st(sig, ST_BODY, ST_T, tol), "stripe: computed vector");
	ok(st(sig, ST_BODY, ST_T + 300, tol), "stripe: 300s old, tolerance 5m");
	ok(!st(sig, ST_BODY, ST_T + 301, tol), "stripe: 301s old refused");
	ok(!st(sig, ST_BODY, ST_T + 86400, tol), "stripe: a day old refused");
	ok(st(sig, ST_BODY, ST_T - 300, tol), "stripe: 300s in the future accepted");
	ok(!st(sig, ST_BODY, ST_T - 301, tol), "stripe: 301s in the future refused");
	ok(st(sig, ST_BODY, ST_T + 3000, 3600000), "stripe: larger tolerance");
	ok(!st(sig, ST_BODY "x", ST_T, tol), "stripe: body changed");
	ok(!verify_signature(VERIFY_STRIPE, "whsec_other", 11, sig, strlen(sig),
			     ST_BODY, strlen(ST_BODY), ST_T, tol), "stripe: wrong secret");

	/* several v1 values (secrets being rolled): any may match */
	snprintf(sig, sizeof(sig), "t=%d,v1=%s,v1=%s", ST_T, ST_OLD, ST_MAC);
	ok(st(sig, ST_BODY, ST_T, tol), "stripe: second v1 matches");
	snprintf(sig, sizeof(sig), "t=%d,v1=%s,v1=%s", ST_T, ST_MAC, ST_OLD);
	ok(st(sig, ST_BODY, ST_T, tol), "stripe: first v1 matches");
	snprintf(sig, sizeof(sig), "t=%d,v1=%s,v1=%s", ST_T, ST_OLD, ST_OLD);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: no v1 matches");
	snprintf(sig, sizeof(sig), "v1=%s,t=%d", ST_MAC, ST_T);
	ok(st(sig, ST_BODY, ST_T, tol), "stripe: order of elements free");
	snprintf(sig, sizeof(sig), "t=%d, v1=%s", ST_T, ST_MAC);
	ok(st(sig, ST_BODY, ST_T, tol), "stripe: space after the comma");
	snprintf(sig, sizeof(sig), "t=%d,v0=%s,v1=%s", ST_T, ST_OLD, ST_MAC);
	ok(st(sig, ST_BODY, ST_T, tol), "stripe: v0 ignored, v1 checked");
	snprintf(sig, sizeof(sig), "t=%d,v0=%s", ST_T, ST_MAC);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: a v0 MAC does not count");

	/* malformed */
	snprintf(sig, sizeof(sig), "v1=%s", ST_MAC);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: no timestamp");
	snprintf(sig, sizeof(sig), "t=%d", ST_T);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: no v1");
	snprintf(sig, sizeof(sig), "t=,v1=%s", ST_MAC);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: empty timestamp");
	snprintf(sig, sizeof(sig), "t=17e8,v1=%s", ST_MAC);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: non-digit timestamp");
	snprintf(sig, sizeof(sig), "t=-1700000000,v1=%s", ST_MAC);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: negative timestamp");
	snprintf(sig, sizeof(sig), "t=%d,v1=%s", ST_T + 1, ST_MAC);
	ok(!st(sig, ST_BODY, ST_T + 1, tol), "stripe: timestamp is signed too");
	snprintf(sig, sizeof(sig), "t=%d,v1=%.63s", ST_T, ST_MAC);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: short v1");
	snprintf(sig, sizeof(sig), "t=%d,v1=%sz", ST_T, ST_MAC);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: v1 with junk");
	snprintf(sig, sizeof(sig), "t=%d;v1=%s", ST_T, ST_MAC);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: ';' is not a separator");
	ok(!st("", ST_BODY, ST_T, tol), "stripe: empty header");
	ok(!st(",,,", ST_BODY, ST_T, tol), "stripe: only commas");
	snprintf(sig, sizeof(sig), "t=99999999999999999999999999999,v1=%s", ST_MAC);
	ok(!st(sig, ST_BODY, ST_T, tol), "stripe: absurd timestamp");
	/* the GitHub format does not accept a Stripe header and vice versa */
	snprintf(sig, sizeof(sig), "t=%d,v1=%s", ST_T, ST_MAC);
	ok(!verify_signature(VERIFY_GITHUB, ST_SECRET, strlen(ST_SECRET), sig,
			     strlen(sig), ST_BODY, strlen(ST_BODY), ST_T, tol),
	   "github format refuses a stripe header");
	ok(!verify_signature(VERIFY_STRIPE, GH_SECRET, strlen(GH_SECRET), GH_SIG,
			     strlen(GH_SIG), GH_BODY, strlen(GH_BODY), ST_T, tol),
	   "stripe format refuses a github header");
}

int main(void)
{
	if (mkdtemp(tmpdir) == NULL) {
		perror("mkdtemp");
		return 99;
	}
	atexit(cleanup);
	test_glob();
	test_policy();
	test_config_values();
	test_config_errors();
	test_route_bounds();
	test_same_as_global();
	test_print();
	test_keysrc_query();
	test_keysrc_form();
	test_keysrc_json();
	test_keysrc_limits();
	test_verify_github();
	test_verify_stripe();
	return tap_done();
}
