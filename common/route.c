/*
 * route.c - [route NAME] sections and the policy each request gets (see
 * route.h).
 *
 * The INI reader hands every route line to route_raw_add() as it reads the
 * file; nothing is interpreted then, because a route starts as a copy of
 * the global policy and the globals are final only once flags and
 * environment are applied. routes_build() then builds each route from its
 * lines, checking every value, with the file and line in each error.
 */
#include "route.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <llhttp.h>

#include "config.h"
#include "units.h"

#define ROUTE_MAX_LINE_KEYS 64

struct raw_line {
	char *key, *value;
	int line;
};

struct route_raw {
	char *name;
	char *file;
	int line;
	struct raw_line *lines;
	int n;
	struct route_raw *next;
};

/* ---- collecting --------------------------------------------------------- */

static struct route_raw *raw_find(struct route_raw *raw, const char *name)
{
	for (; raw != NULL; raw = raw->next)
		if (strcmp(raw->name, name) == 0)
			return raw;
	return NULL;
}

int route_raw_section(struct route_raw **raw, const char *name,
		      const char *file, int line, char *err, size_t errlen)
{
	struct route_raw *r, **tail;

	if (name[0] == '\0') {
		snprintf(err, errlen, "%s:%d: [route] needs a name: [route NAME]",
			 file, line);
		return -1;
	}
	for (const char *p = name; *p != '\0'; p++) {
		if (*p <= ' ' || *p == ']' || *p == 0x7f) {
			snprintf(err, errlen, "%s:%d: route name \"%.60s\" may not "
				 "contain spaces or control characters", file, line,
				 name);
			return -1;
		}
	}
	r = raw_find(*raw, name);
	if (r != NULL) {
		snprintf(err, errlen, "%s:%d: [route %s] defined twice (first on "
			 "line %d)", file, line, name, r->line);
		return -1;
	}
	r = calloc(1, sizeof(*r));
	if (r == NULL || (r->name = strdup(name)) == NULL ||
	    (r->file = strdup(file)) == NULL) {
		if (r != NULL) {
			free(r->name);
			free(r);
		}
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	r->line = line;
	for (tail = raw; *tail != NULL; tail = &(*tail)->next)
		;
	*tail = r;	/* file order: the first match wins */
	return 0;
}

int route_raw_add(struct route_raw **raw, const char *name, const char *key,
		  const char *value, const char *file, int line, char *err,
		  size_t errlen)
{
	struct route_raw *r = raw_find(*raw, name);
	struct raw_line *l;

	if (r == NULL && (route_raw_section(raw, name, file, line, err, errlen) < 0 ||
			  (r = raw_find(*raw, name)) == NULL))
		return -1;
	for (int i = 0; i < r->n; i++) {
		if (strcmp(r->lines[i].key, key) == 0) {
			snprintf(err, errlen, "%s:%d: route %s: %s set twice (first "
				 "on line %d)", file, line, name, key,
				 r->lines[i].line);
			return -1;
		}
	}
	if (r->n == ROUTE_MAX_LINE_KEYS) {
		snprintf(err, errlen, "%s:%d: route %s: too many keys", file, line,
			 name);
		return -1;
	}
	l = realloc(r->lines, (size_t)(r->n + 1) * sizeof(*l));
	if (l == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	r->lines = l;
	l = &r->lines[r->n];
	l->key = strdup(key);
	l->value = strdup(value);
	l->line = line;
	if (l->key == NULL || l->value == NULL) {
		free(l->key);
		free(l->value);
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	r->n++;
	return 0;
}

void route_raw_free(struct route_raw *raw)
{
	while (raw != NULL) {
		struct route_raw *next = raw->next;

		for (int i = 0; i < raw->n; i++) {
			free(raw->lines[i].key);
			free(raw->lines[i].value);
		}
		free(raw->lines);
		free(raw->name);
		free(raw->file);
		free(raw);
		raw = next;
	}
}

/* ---- policies ------------------------------------------------------------ */

static void policy_free(struct policy *p)
{
	free(p->key_name);
	free(p->key_prefix);
	free(p->scope_header);
	free(p->verify_header);
	if (p->verify_secret != NULL)
		memset(p->verify_secret, 0, p->verify_secret_len);
	free(p->verify_secret);
	memset(p, 0, sizeof(*p));
}

static char *dup_or_null(const char *s)
{
	return s != NULL ? strdup(s) : NULL;
}

/* A deep copy; returns -1 when out of memory. */
static int policy_copy(struct policy *dst, const struct policy *src)
{
	*dst = *src;
	dst->key_name = dup_or_null(src->key_name);
	dst->key_prefix = dup_or_null(src->key_prefix);
	dst->scope_header = dup_or_null(src->scope_header);
	dst->verify_header = dup_or_null(src->verify_header);
	dst->verify_secret = NULL;
	if (src->verify_secret != NULL) {
		dst->verify_secret = malloc(src->verify_secret_len + 1);
		if (dst->verify_secret != NULL)
			memcpy(dst->verify_secret, src->verify_secret,
			       src->verify_secret_len + 1);
	}
	if ((src->key_name && !dst->key_name) ||
	    (src->key_prefix && !dst->key_prefix) ||
	    (src->scope_header && !dst->scope_header) ||
	    (src->verify_header && !dst->verify_header) ||
	    (src->verify_secret && !dst->verify_secret))
		return -1;
	return 0;
}

static bool is_token(const char *s)
{
	if (*s == '\0')
		return false;
	for (; *s != '\0'; s++)
		if (!(*s > ' ' && *s < 0x7f && strchr("\"(),/:;<=>?@[\\]{}", *s) == NULL))
			return false;
	return true;
}

/* "header:NAME" and friends: the part after the colon, or NULL. */
static const char *after(const char *v, const char *prefix)
{
	size_t n = strlen(prefix);

	return strncasecmp(v, prefix, n) == 0 ? v + n : NULL;
}

static int set_str(char **dst, const char *v)
{
	char *s = strdup(v);

	if (s == NULL)
		return -1;
	free(*dst);
	*dst = s;
	return 0;
}

static int parse_key_source(struct policy *p, const char *v, char *why, size_t len)
{
	const char *arg;

	if (strcasecmp(v, "auto") == 0 || strcasecmp(v, "none") == 0) {
		p->key_source = strcasecmp(v, "auto") == 0 ? KEY_SRC_AUTO : KEY_SRC_NONE;
		free(p->key_name);
		p->key_name = NULL;
		return 0;
	}
	if ((arg = after(v, "header:")) != NULL) {
		if (!is_token(arg))
			goto bad_name;
		p->key_source = KEY_SRC_HEADER;
	} else if ((arg = after(v, "query:")) != NULL) {
		if (*arg == '\0')
			goto bad_name;
		p->key_source = KEY_SRC_QUERY;
	} else if ((arg = after(v, "form:")) != NULL) {
		if (*arg == '\0')
			goto bad_name;
		p->key_source = KEY_SRC_FORM;
	} else if ((arg = after(v, "json:")) != NULL) {
		if (arg[0] != '/' && arg[0] != '\0') {
			snprintf(why, len, "a JSON pointer starts with '/' "
				 "(RFC 6901), e.g. json:/data/id");
			return -1;
		}
		p->key_source = KEY_SRC_JSON;
	} else {
		snprintf(why, len, "expected header:NAME, query:NAME, form:FIELD, "
			 "json:/pointer, auto or none");
		return -1;
	}
	return set_str(&p->key_name, arg);
bad_name:
	snprintf(why, len, "missing or invalid name after the colon");
	return -1;
}

static int parse_duration(const char *v, uint64_t min, uint64_t *out, char *why,
			  size_t len)
{
	if (units_parse_duration(v, out) < 0) {
		snprintf(why, len, "invalid duration (use e.g. 250ms, 10s, 5m, 24h)");
		return -1;
	}
	if (*out < min) {
		snprintf(why, len, "must be more than 0");
		return -1;
	}
	return 0;
}

static int parse_size(const char *v, uint64_t min, uint64_t max, uint64_t *out,
		      char *why, size_t len)
{
	if (units_parse_size(v, out) < 0 || *out < min || *out > max) {
		snprintf(why, len, "invalid size (use e.g. 4096, 512KiB, 1MiB)");
		return -1;
	}
	return 0;
}

static int parse_word(const char *v, const char *a, int va, const char *b,
		      int vb, int *out, char *why, size_t len)
{
	if (strcasecmp(v, a) == 0)
		*out = va;
	else if (strcasecmp(v, b) == 0)
		*out = vb;
	else {
		snprintf(why, len, "expected %s or %s", a, b);
		return -1;
	}
	return 0;
}

static const char *env_lookup(char **envp, const char *name)
{
	size_t n = strlen(name);

	for (; envp != NULL && *envp != NULL; envp++)
		if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
			return *envp + n + 1;
	return getenv(name);
}

/* Apply one `key = value` of a route. Returns -1 with why set. */
static int apply(struct route *r, const char *key, const char *v, char **envp,
		 char *why, size_t len)
{
	struct policy *p = &r->policy;
	bool b;

	if (strcmp(key, "match") == 0) {
		const char *sp = strpbrk(v, " \t");
		char methods[256];

		if (sp == NULL || (size_t)(sp - v) >= sizeof(methods)) {
			snprintf(why, len, "expected \"METHODS PATH-GLOB\", e.g. "
				 "\"POST /orders*\"");
			return -1;
		}
		memcpy(methods, v, (size_t)(sp - v));
		methods[sp - v] = '\0';
		while (*sp == ' ' || *sp == '\t')
			sp++;
		if (*sp != '/' && *sp != '*') {
			snprintf(why, len, "the path glob must start with '/' or '*'");
			return -1;
		}
		if (strcmp(methods, "*") == 0)
			r->methods = ~0ULL;
		else if (config_parse_methods(methods, &r->methods, why, len) < 0)
			return -1;
		return set_str(&r->glob, sp);
	}
	if (strcmp(key, "key") == 0)
		return parse_key_source(p, v, why, len);
	if (strcmp(key, "key_prefix") == 0) {
		for (const char *s = v; *s != '\0'; s++)
			if (*s < 0x21 || *s > 0x7e) {
				snprintf(why, len, "only visible ASCII characters");
				return -1;
			}
		return set_str(&p->key_prefix, v);
	}
	if (strcmp(key, "require_key") == 0 || strcmp(key, "require_issued_key") == 0) {
		if (config_parse_bool(v, &b) < 0) {
			snprintf(why, len, "invalid boolean (use yes/no, on/off, "
				 "true/false, 1/0)");
			return -1;
		}
		*(key[8] == 'k' ? &p->require_key : &p->require_issued_key) = b;
		return 0;
	}
	if (strcmp(key, "in_flight") == 0)
		return parse_word(v, "wait", IN_FLIGHT_WAIT, "reject",
				  IN_FLIGHT_REJECT, &p->in_flight, why, len);
	if (strcmp(key, "store_down") == 0)
		return parse_word(v, "fail-closed", STORE_DOWN_FAIL_CLOSED,
				  "fail-open", STORE_DOWN_FAIL_OPEN, &p->store_down,
				  why, len);
	if (strcmp(key, "on_upstream_error") == 0)
		return parse_word(v, "release", UPSTREAM_ERROR_RELEASE, "keep",
				  UPSTREAM_ERROR_KEEP, &p->on_upstream_error, why, len);
	if (strcmp(key, "wait_timeout") == 0)
		return parse_duration(v, 1, &p->wait_timeout_ms, why, len);
	if (strcmp(key, "ttl") == 0)
		return parse_duration(v, 1, &p->ttl_ms, why, len);
	if (strcmp(key, "lease") == 0)
		return parse_duration(v, 1, &p->lease_ms, why, len);
	if (strcmp(key, "issued_key_ttl") == 0)
		return parse_duration(v, 1, &p->issued_key_ttl_ms, why, len);
	if (strcmp(key, "verify_tolerance") == 0)
		return parse_duration(v, 1, &p->verify_tolerance_ms, why, len);
	if (strcmp(key, "max_body") == 0)
		return parse_size(v, 1, 1ULL << 30, &p->max_body, why, len);
	if (strcmp(key, "max_cached_response") == 0)
		return parse_size(v, 0, 512ULL << 20, &p->max_cached_response, why, len);
	if (strcmp(key, "scope") == 0) {
		const char *arg = after(v, "header:");

		if (strcasecmp(v, "none") == 0) {
			free(p->scope_header);
			p->scope_header = NULL;
			return 0;
		}
		if (arg == NULL || !is_token(arg)) {
			snprintf(why, len, "expected header:NAME or none");
			return -1;
		}
		return set_str(&p->scope_header, arg);
	}
	if (strcmp(key, "verify") == 0) {
		if (strcasecmp(v, "none") == 0) {
			p->verify = VERIFY_NONE;
			return 0;
		}
		if (strcasecmp(v, "hmac-sha256") != 0) {
			snprintf(why, len, "expected hmac-sha256 or none");
			return -1;
		}
		if (p->verify == VERIFY_NONE)
			p->verify = VERIFY_GITHUB;
		return 0;
	}
	if (strcmp(key, "verify_format") == 0) {
		int f;

		if (parse_word(v, "github", VERIFY_GITHUB, "stripe", VERIFY_STRIPE,
			       &f, why, len) < 0)
			return -1;
		p->verify = (enum verify_format)f;
		return 0;
	}
	if (strcmp(key, "verify_header") == 0) {
		if (!is_token(v)) {
			snprintf(why, len, "not a valid header name");
			return -1;
		}
		return set_str(&p->verify_header, v);
	}
	if (strcmp(key, "verify_secret_env") == 0) {
		const char *secret = env_lookup(envp, v);

		if (secret == NULL || secret[0] == '\0') {
			snprintf(why, len, "environment variable %s is not set (the "
				 "secret never goes in the config file)", v);
			return -1;
		}
		free(p->verify_secret);
		p->verify_secret = strdup(secret);
		if (p->verify_secret == NULL)
			return -1;
		p->verify_secret_len = strlen(secret);
		return 0;
	}
	snprintf(why, len, "unknown key (route keys: match, key, key_prefix, "
		 "require_key, in_flight, wait_timeout, ttl, lease, max_body, "
		 "max_cached_response, on_upstream_error, store_down, scope, "
		 "verify, verify_format, verify_header, verify_secret_env, "
		 "verify_tolerance, require_issued_key, issued_key_ttl)");
	return -1;
}

/* Order matters for verify_format vs verify: apply `verify` first. */
static int key_rank(const char *key)
{
	return strcmp(key, "verify") == 0 ? 0 : 1;
}

static int build_route(struct route *r, const struct route_raw *raw,
		       const struct config *cfg, char **envp, char *err,
		       size_t errlen)
{
	char why[512];
	int verify_line = raw->line, matched = 0;

	r->name = strdup(raw->name);
	if (r->name == NULL || policy_copy(&r->policy, &cfg->global) < 0)
		goto oom;
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < raw->n; i++) {
			const struct raw_line *l = &raw->lines[i];

			if (key_rank(l->key) != pass)
				continue;
			if (strncmp(l->key, "verify", 6) == 0)
				verify_line = l->line;
			if (strcmp(l->key, "match") == 0)
				matched = 1;
			if (apply(r, l->key, l->value, envp, why, sizeof(why)) < 0) {
				snprintf(err, errlen, "%s:%d: route %s: %s: %s",
					 raw->file, l->line, raw->name, l->key, why);
				return -1;
			}
		}
	}
	if (!matched) {
		snprintf(err, errlen, "%s:%d: route %s: match is required (e.g. "
			 "match = POST /orders*)", raw->file, raw->line, raw->name);
		return -1;
	}
	if (r->policy.lease_ms <= cfg->upstream_timeout_ms) {
		snprintf(err, errlen, "%s:%d: route %s: lease must be longer than "
			 "upstream_timeout", raw->file, raw->line, raw->name);
		return -1;
	}
	if (r->policy.verify != VERIFY_NONE) {
		if (r->policy.verify_secret == NULL) {
			snprintf(err, errlen, "%s:%d: route %s: verify needs "
				 "verify_secret_env", raw->file, verify_line, raw->name);
			return -1;
		}
		if (r->policy.verify_header == NULL &&
		    set_str(&r->policy.verify_header,
			    r->policy.verify == VERIFY_STRIPE ? "Stripe-Signature" :
								"X-Hub-Signature-256") < 0)
			goto oom;
	}
	return 0;
oom:
	snprintf(err, errlen, "out of memory");
	return -1;
}

int routes_build(struct config *cfg, const struct route_raw *raw,
		 char **envp, char *err, size_t errlen)
{
	struct policy *g = &cfg->global;
	int n = 0;

	memset(g, 0, sizeof(*g));
	g->key_source = KEY_SRC_HEADER;
	g->key_name = strdup(cfg->key_header);
	g->key_prefix = strdup("");
	g->require_key = cfg->require_key;
	g->in_flight = cfg->in_flight;
	g->wait_timeout_ms = cfg->wait_timeout_ms;
	g->ttl_ms = cfg->ttl_ms;
	g->lease_ms = cfg->lease_ms;
	g->max_body = cfg->max_body;
	g->max_cached_response = cfg->max_cached_response;
	g->store_down = cfg->store_down;
	g->on_upstream_error = cfg->on_upstream_error;
	g->verify_tolerance_ms = 5 * 60 * 1000;
	g->issued_key_ttl_ms = cfg->issued_key_ttl_ms;
	if (g->key_name == NULL || g->key_prefix == NULL)
		goto oom;
	for (const struct route_raw *r = raw; r != NULL; r = r->next)
		n++;
	cfg->routes = n ? calloc((size_t)n, sizeof(*cfg->routes)) : NULL;
	if (n && cfg->routes == NULL)
		goto oom;
	for (const struct route_raw *r = raw; r != NULL; r = r->next) {
		/* counted as it goes, so routes_free frees what was built */
		if (build_route(&cfg->routes[cfg->nroutes++], r, cfg, envp, err,
				errlen) < 0)
			return -1;
	}
	return 0;
oom:
	snprintf(err, errlen, "out of memory");
	return -1;
}

void routes_free(struct config *cfg)
{
	for (int i = 0; i < cfg->nroutes; i++) {
		free(cfg->routes[i].name);
		free(cfg->routes[i].glob);
		policy_free(&cfg->routes[i].policy);
	}
	free(cfg->routes);
	cfg->routes = NULL;
	cfg->nroutes = 0;
	policy_free(&cfg->global);
}

/* ---- matching ------------------------------------------------------------ */

bool route_glob_match(const char *glob, const char *s, size_t len)
{
	const char *star = NULL, *g = glob;
	size_t i = 0, mark = 0;

	/* iterative wildcard match: backtrack to the last '*' on mismatch */
	while (i < len) {
		if (*g == '*') {
			star = g++;
			mark = i;
		} else if (*g != '\0' && *g == s[i]) {
			g++;
			i++;
		} else if (star != NULL) {
			g = star + 1;
			i = ++mark;
		} else {
			return false;
		}
	}
	while (*g == '*')
		g++;
	return *g == '\0';
}

const struct policy *route_policy(const struct config *cfg, int method,
				  const char *target, const char **name)
{
	size_t len = strcspn(target, "?");

	*name = NULL;
	for (int i = 0; i < cfg->nroutes; i++) {
		const struct route *r = &cfg->routes[i];

		if (method < 0 || method >= 64 || !((r->methods >> method) & 1))
			continue;
		if (!route_glob_match(r->glob, target, len))
			continue;
		*name = r->name;
		return r->policy.key_source == KEY_SRC_NONE ? NULL : &r->policy;
	}
	if (!config_method_protected(cfg, method))
		return NULL;
	return &cfg->global;
}

/* ---- printing ------------------------------------------------------------ */

const char *route_key_source_name(enum key_source k)
{
	switch (k) {
	case KEY_SRC_HEADER: return "header:";
	case KEY_SRC_QUERY: return "query:";
	case KEY_SRC_FORM: return "form:";
	case KEY_SRC_JSON: return "json:";
	case KEY_SRC_AUTO: return "auto";
	case KEY_SRC_NONE: return "none";
	}
	return "";
}

static void methods_print(uint64_t mask, FILE *out)
{
	bool first = true;

	if (mask == ~0ULL) {
		fputs("*", out);
		return;
	}
	for (int m = 0; m < 64; m++) {
		if (!((mask >> m) & 1))
			continue;
		fprintf(out, "%s%s", first ? "" : ",",
			llhttp_method_name((llhttp_method_t)m));
		first = false;
	}
}

void routes_print(const struct config *cfg, FILE *out)
{
	char a[32], b[32], c[32], d[32], e[32];

	for (int i = 0; i < cfg->nroutes; i++) {
		const struct route *r = &cfg->routes[i];
		const struct policy *p = &r->policy;

		fprintf(out, "\n[route %s]\nmatch = ", r->name);
		methods_print(r->methods, out);
		fprintf(out, " %s\nkey = %s%s\n", r->glob,
			route_key_source_name(p->key_source),
			p->key_name != NULL ? p->key_name : "");
		if (p->key_prefix[0] != '\0')
			fprintf(out, "key_prefix = %s\n", p->key_prefix);
		units_format_duration(p->wait_timeout_ms, a, sizeof(a));
		units_format_duration(p->ttl_ms, b, sizeof(b));
		units_format_duration(p->lease_ms, c, sizeof(c));
		units_format_size(p->max_body, d, sizeof(d));
		units_format_size(p->max_cached_response, e, sizeof(e));
		fprintf(out, "require_key = %s\nin_flight = %s\nwait_timeout = %s\n"
			"ttl = %s\nlease = %s\nmax_body = %s\n"
			"max_cached_response = %s\non_upstream_error = %s\n"
			"store_down = %s\nscope = %s%s\n",
			p->require_key ? "yes" : "no",
			p->in_flight == IN_FLIGHT_WAIT ? "wait" : "reject", a, b, c,
			d, e,
			p->on_upstream_error == UPSTREAM_ERROR_KEEP ? "keep" : "release",
			p->store_down == STORE_DOWN_FAIL_OPEN ? "fail-open" : "fail-closed",
			p->scope_header ? "header:" : "none",
			p->scope_header ? p->scope_header : "");
		if (p->verify != VERIFY_NONE) {
			units_format_duration(p->verify_tolerance_ms, a, sizeof(a));
			fprintf(out, "verify = hmac-sha256\nverify_format = %s\n"
				"verify_header = %s\nverify_secret = (%zu bytes, from "
				"the environment)\nverify_tolerance = %s\n",
				p->verify == VERIFY_STRIPE ? "stripe" : "github",
				p->verify_header, p->verify_secret_len, a);
		}
		if (p->require_issued_key) {
			units_format_duration(p->issued_key_ttl_ms, a, sizeof(a));
			fprintf(out, "require_issued_key = yes\nissued_key_ttl = %s\n", a);
		}
	}
}
