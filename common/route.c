/*
 * route.c - [route NAME] sections and the policy each request gets (see
 * route.h).
 *
 * The INI reader hands every route line to route_raw_add() as it reads the
 * file; nothing is interpreted then, because a route starts as a copy of
 * the global policy and the globals are final only once flags and
 * environment are applied. routes_build() then builds each route from its
 * lines, checking every value, with the file and line in each error.
 *
 * Every key is a row of route_keys below (twemproxy's conf_commands): its
 * name, the field of struct policy it sets, its value syntax (setting.h)
 * or a setter of its own, and its help. A key that is also an [idemproxy]
 * option (KEY_OPTION) has no syntax of its own: it is held to the option's,
 * with the same bounds and the same errors, and the global policy starts
 * from the option's value.
 */
#include "route.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <llhttp.h>

#include "fpshape.h"
#include "httphdr.h"
#include "jwt.h"
#include "setting.h"

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

const char *route_section_name(const char *section)
{
	if (strncmp(section, "route", 5) != 0 ||
	    (section[5] != '\0' && section[5] != ' ' && section[5] != '\t'))
		return NULL;
	section += 5;
	while (*section == ' ' || *section == '\t')
		section++;
	return section;
}

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

static bool is_token(const char *s)
{
	return httphdr_is_token(s, strlen(s));
}

/* "header:NAME" and friends: the part after the colon, or NULL. */
static const char *after(const char *v, const char *prefix)
{
	size_t n = strlen(prefix);

	return strncasecmp(v, prefix, n) == 0 ? v + n : NULL;
}

static const char *env_lookup(char **envp, const char *name)
{
	size_t n = strlen(name);

	for (; envp != NULL && *envp != NULL; envp++)
		if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
			return *envp + n + 1;
	return getenv(name);
}

/* ---- route keys with a syntax of their own --------------------------------
 *
 * Each setter applies one value to a route (starting as a copy of the
 * global policy) and returns 0, or -1 with why set; each printer writes the
 * key's --check-config line.
 */

/* "METHODS PATH-GLOB"; METHODS is a list as in --methods, or "*". */
static int set_match(struct route *r, const char *v, char **envp, char *why,
		     size_t len)
{
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
	else if (setting_parse_methods(methods, &r->methods, why, len) < 0)
		return -1;
	return setting_set_string(&r->glob, sp, why, len);
}

static void print_match(const struct route *r, FILE *out)
{
	bool first = true;

	fputs("match = ", out);
	if (r->methods == ~0ULL)
		fputs("*", out);
	for (int m = 0; r->methods != ~0ULL && m < 64; m++) {
		if (!((r->methods >> m) & 1))
			continue;
		fprintf(out, "%s%s", first ? "" : ",",
			llhttp_method_name((llhttp_method_t)m));
		first = false;
	}
	fprintf(out, " %s\n", r->glob);
}

/*
 * "header:NAME", "query:NAME", "form:FIELD" or "json:/pointer" into *src
 * and *arg (the part after the colon).
 */
static int key_source_arg(const char *v, enum key_source *src,
			  const char **arg, char *why, size_t len)
{
	static const struct {
		const char *prefix;
		enum key_source src;
	} named[] = {
		{ "header:", KEY_SRC_HEADER },
		{ "query:", KEY_SRC_QUERY },
		{ "form:", KEY_SRC_FORM },
		{ "json:", KEY_SRC_JSON },
	};
	size_t i;

	for (i = 0; i < sizeof(named) / sizeof(named[0]); i++)
		if ((*arg = after(v, named[i].prefix)) != NULL)
			break;
	if (i == sizeof(named) / sizeof(named[0])) {
		snprintf(why, len, "expected header:NAME, query:NAME, form:FIELD, "
			 "json:/pointer, auto or none");
		return -1;
	}
	*src = named[i].src;
	if (*src == KEY_SRC_JSON && (*arg)[0] != '/' && (*arg)[0] != '\0') {
		snprintf(why, len, "a JSON pointer starts with '/' (RFC 6901), "
			 "e.g. json:/data/id");
		return -1;
	}
	if ((*src == KEY_SRC_HEADER && !is_token(*arg)) ||
	    ((*src == KEY_SRC_QUERY || *src == KEY_SRC_FORM) && **arg == '\0')) {
		snprintf(why, len, "missing or invalid name after the colon");
		return -1;
	}
	return 0;
}

static int set_key(struct route *r, const char *v, char **envp, char *why,
		   size_t len)
{
	struct policy *p = &r->policy;
	enum key_source src;
	const char *arg;

	if (strcasecmp(v, "auto") == 0 || strcasecmp(v, "none") == 0) {
		p->key_source = strcasecmp(v, "auto") == 0 ? KEY_SRC_AUTO : KEY_SRC_NONE;
		free(p->key_name);
		p->key_name = NULL;
		return 0;
	}
	if (key_source_arg(v, &src, &arg, why, len) < 0)
		return -1;
	if (setting_set_string(&p->key_name, arg, why, len) < 0)
		return -1;
	p->key_source = src;
	return 0;
}

static void print_key(const struct route *r, FILE *out)
{
	fprintf(out, "key = %s%s\n", route_key_source_name(r->policy.key_source),
		r->policy.key_name != NULL ? r->policy.key_name : "");
}

static int set_key_prefix(struct route *r, const char *v, char **envp,
			  char *why, size_t len)
{
	for (const char *s = v; *s != '\0'; s++) {
		if (*s < 0x21 || *s > 0x7e) {
			snprintf(why, len, "only visible ASCII characters");
			return -1;
		}
	}
	return setting_set_string(&r->policy.key_prefix, v, why, len);
}

static void print_key_prefix(const struct route *r, FILE *out)
{
	if (r->policy.key_prefix[0] != '\0')
		fprintf(out, "key_prefix = %s\n", r->policy.key_prefix);
}

/* A JWT claim's name: what a config can spell, and a log can show. */
static bool claim_name_ok(const char *s)
{
	if (*s == '\0' || strlen(s) > 64)
		return false;
	for (; *s != '\0'; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || strchr("_-.:", *s) != NULL))
			return false;
	return true;
}

static int set_scope(struct route *r, const char *v, char **envp, char *why,
		     size_t len)
{
	struct policy *p = &r->policy;
	const char *arg = NULL;
	enum scope_source src;

	if (strcasecmp(v, "none") == 0)
		src = SCOPE_NONE;
	else if (strcasecmp(v, "tls:subject") == 0)
		src = SCOPE_TLS_SUBJECT;
	else if (strcasecmp(v, "tls:san") == 0)
		src = SCOPE_TLS_SAN;
	else if ((arg = after(v, "header:")) != NULL && is_token(arg))
		src = SCOPE_HEADER;
	else if ((arg = after(v, "jwt:")) != NULL && claim_name_ok(arg))
		src = SCOPE_JWT;
	else {
		snprintf(why, len, "expected header:NAME, jwt:CLAIM (letters, "
			 "digits, _-.:), tls:subject, tls:san or none");
		return -1;
	}
	free(p->scope_name);
	p->scope_name = NULL;
	p->scope = src;
	return arg != NULL ? setting_set_string(&p->scope_name, arg, why, len) : 0;
}

static void print_scope(const struct route *r, FILE *out)
{
	static const char *const words[] = {
		[SCOPE_NONE] = "none", [SCOPE_HEADER] = "header:",
		[SCOPE_JWT] = "jwt:", [SCOPE_TLS_SUBJECT] = "tls:subject",
		[SCOPE_TLS_SAN] = "tls:san",
	};

	fprintf(out, "scope = %s%s\n", words[r->policy.scope],
		r->policy.scope_name ? r->policy.scope_name : "");
}

static int set_jwt_algs(struct route *r, const char *v, char **envp,
			char *why, size_t len)
{
	return jwt_algs_parse(v, &r->policy.jwt_algs, why, len);
}

static void print_jwt_algs(const struct route *r, FILE *out)
{
	char buf[256];

	jwt_algs_format(r->policy.jwt_algs, buf, sizeof(buf));
	fprintf(out, "jwt_algorithms = %s\n", buf);
}

/* The file and what each of its keys is, so that an operator sees a
 * certificate read as its RSA key, not as a secret:
 * "jwt_keys = F (2 keys: RSA 2048 RS/PS, EC P-256 ES256 kid "a")". */
static void print_jwt_keys(const struct route *r, FILE *out)
{
	const struct jwt_keys *k = r->policy.jwt_keys;
	int n = jwt_keys_count(k), skipped = jwt_keys_skipped(k);
	char buf[160];

	fprintf(out, "jwt_keys = %s (%d key%s", r->policy.jwt_keys_file, n,
		n == 1 ? "" : "s");
	for (int i = 0; i < n; i++) {
		jwt_keys_describe(k, i, buf, sizeof(buf));
		fprintf(out, "%s%s", i == 0 ? ": " : ", ", buf);
	}
	if (skipped > 0)
		fprintf(out, "; %d skipped", skipped);
	fprintf(out, ")\n");
}

static void print_jwt_string(const char *name, const char *v, FILE *out)
{
	fprintf(out, "%s = %s\n", name, v != NULL ? v : "(not checked)");
}

static void print_jwt_issuer(const struct route *r, FILE *out)
{
	print_jwt_string("jwt_issuer", r->policy.jwt_issuer, out);
}

static void print_jwt_audience(const struct route *r, FILE *out)
{
	print_jwt_string("jwt_audience", r->policy.jwt_audience, out);
}

/* A list of fingerprint_ignore or _only. Setting one drops the other, as a
 * route inherited it: a route says which of the two it shapes by. */
static int set_fp_list(struct route *r, const char *v, char **own,
		       char **other, char *why, size_t len)
{
	if (fpshape_list(v, own, why, len) < 0)
		return -1;
	free(*other);
	*other = NULL;
	return 0;
}

static int set_fp_ignore(struct route *r, const char *v, char **envp,
			 char *why, size_t len)
{
	return set_fp_list(r, v, &r->policy.fp_ignore, &r->policy.fp_only,
			   why, len);
}

static int set_fp_only(struct route *r, const char *v, char **envp,
		       char *why, size_t len)
{
	return set_fp_list(r, v, &r->policy.fp_only, &r->policy.fp_ignore,
			   why, len);
}

static void print_fp_ignore(const struct route *r, FILE *out)
{
	if (r->policy.fp_ignore != NULL)
		fprintf(out, "fingerprint_ignore = %s\n", r->policy.fp_ignore);
}

static void print_fp_only(const struct route *r, FILE *out)
{
	if (r->policy.fp_only != NULL)
		fprintf(out, "fingerprint_only = %s\n", r->policy.fp_only);
}

/*
 * outcome_probe = GET /orders/by-key/{key}: the upstream's safe lookup of
 * a request by its key, asked when an outcome is unknown (idem.c). GET
 * only (a lookup must not act, and its 2xx body becomes the stored
 * response); the target is origin-form, printable, "{key}" at least once
 * (the key percent-encoded there). "none" turns it off.
 */
static int set_probe(struct route *r, const char *v, char **envp,
		     char *why, size_t len)
{
	const char *sp = strchr(v, ' ');
	char *method = NULL, *target = NULL;

	if (strcmp(v, "none") == 0)
		goto set;
	if (sp == NULL || (size_t)(sp - v) != 3 || strncmp(v, "GET", 3) != 0) {
		snprintf(why, len, "use GET /path/{key} (a safe lookup: only GET)");
		return -1;
	}
	while (*sp == ' ')
		sp++;
	if (*sp != '/' || strstr(sp, "{key}") == NULL) {
		snprintf(why, len, "the target must start with / and hold {key}, "
			 "e.g. GET /orders/by-key/{key}");
		return -1;
	}
	for (const char *p = sp; *p != '\0'; p++)
		if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) {
			snprintf(why, len, "the target has a blank or a byte "
				 "that is not printable ASCII");
			return -1;
		}
	method = strdup("GET");
	target = strdup(sp);
	if (method == NULL || target == NULL) {
		free(method);
		free(target);
		snprintf(why, len, "out of memory");
		return -1;
	}
set:
	free(r->policy.probe_method);
	free(r->policy.probe_target);
	r->policy.probe_method = method;
	r->policy.probe_target = target;
	return 0;
}

static void print_probe(const struct route *r, FILE *out)
{
	fprintf(out, "outcome_probe = %s%s%s\n",
		r->policy.probe_method ? r->policy.probe_method : "none",
		r->policy.probe_method ? " " : "",
		r->policy.probe_target ? r->policy.probe_target : "");
}

static const struct setting_word verify_words[] = {
	{ "hmac-sha256", 1 },
	{ "none", 0 },
	{ NULL, 0 },
};

/* hmac-sha256 turns verifying on, github style. It is applied before the
 * route's other keys (KEY_FIRST), so that a verify_format line anywhere in
 * the section picks the format. */
static int set_verify(struct route *r, const char *v, char **envp, char *why,
		      size_t len)
{
	static const struct setting_syntax syn = SYNTAX_WORDS(verify_words);
	int on;

	if (setting_parse(&syn, v, &on, why, len) < 0)
		return -1;
	if (!on)
		r->policy.verify = VERIFY_NONE;
	else if (r->policy.verify == VERIFY_NONE)
		r->policy.verify = VERIFY_GITHUB;
	return 0;
}

static void print_verify(const struct route *r, FILE *out)
{
	fputs("verify = hmac-sha256\n", out);
}

/* The name of an environment variable: the secret never goes in a file. */
static int set_verify_secret_env(struct route *r, const char *v, char **envp,
				 char *why, size_t len)
{
	const char *secret = env_lookup(envp, v);

	if (secret == NULL || secret[0] == '\0') {
		snprintf(why, len, "environment variable %s is not set (the "
			 "secret never goes in the config file)", v);
		return -1;
	}
	if (policy_set_secret(&r->policy, secret) < 0) {
		snprintf(why, len, "out of memory");
		return -1;
	}
	return 0;
}

static void print_verify_secret(const struct route *r, FILE *out)
{
	fprintf(out, "verify_secret = (%zu bytes, from the environment)\n",
		r->policy.verify_secret_len);
}

/* ---- the route table ------------------------------------------------------ */

typedef int (*route_set_fn)(struct route *r, const char *v, char **envp,
			    char *why, size_t len);
typedef void (*route_print_fn)(const struct route *r, FILE *out);

/* Row flags. */
#define KEY_OPTION	0x01	/* syntax, bounds and default are those of the
				 * [idemproxy] option of the same name */
#define KEY_FIRST	0x02	/* applied before the route's other keys */
#define KEY_VERIFY	0x04	/* printed only when the route verifies */
#define KEY_ISSUED	0x08	/* printed only with require_issued_key */
#define KEY_JWT		0x10	/* printed only with scope = jwt:CLAIM */

struct route_key {
	const char *name;
	size_t off;			/* the field of struct policy */
	struct setting_syntax syn;	/* its value, unless KEY_OPTION */
	const char *def;		/* the global policy's value, unless
					 * KEY_OPTION (NULL: zero) */
	route_set_fn set;		/* NULL: setting_parse() into .off */
	route_print_fn print;		/* NULL: "name = " setting_format() */
	unsigned flags;
	const char *help;
};

#define P(field) offsetof(struct policy, field)

/* docs/configuration.md "Routes" in its order, which is also the order of
 * --check-config's lines and of the list in the unknown-key error. */
static const struct route_key route_keys[] = {
	{ .name = "match", .set = set_match, .print = print_match,
	  .help = "METHODS PATH-GLOB; the first route that matches wins" },
	{ .name = "key", .set = set_key, .print = print_key,
	  .help = "header:NAME, query:NAME, form:FIELD, json:/pointer, auto "
		  "or none" },
	{ .name = "key_prefix", .set = set_key_prefix, .print = print_key_prefix,
	  .help = "prepended to the key" },
	{ .name = "require_key", .off = P(require_key), .flags = KEY_OPTION,
	  .help = "400 when the key source yields nothing" },
	{ .name = "in_flight", .off = P(in_flight), .flags = KEY_OPTION,
	  .help = "a duplicate of a running request waits, or gets 409" },
	{ .name = "wait_timeout", .off = P(wait_timeout_ms), .flags = KEY_OPTION,
	  .help = "longest a waiting duplicate is held" },
	{ .name = "ttl", .off = P(ttl_ms), .flags = KEY_OPTION,
	  .help = "how long a completed response is replayed" },
	{ .name = "lease", .off = P(lease_ms), .flags = KEY_OPTION,
	  .help = "a silent owner's claim is taken over after this" },
	{ .name = "max_body", .off = P(max_body), .flags = KEY_OPTION,
	  .help = "largest keyed request body" },
	{ .name = "max_cached_response", .off = P(max_cached_response),
	  .flags = KEY_OPTION, .help = "largest response stored for replay" },
	{ .name = "release_statuses", .off = P(release_statuses),
	  .flags = KEY_OPTION,
	  .help = "upstream statuses that release the key; others are stored" },
	{ .name = "on_upstream_error", .off = P(on_upstream_error),
	  .flags = KEY_OPTION, .help = "keep: every 5xx is stored, whatever "
	  "release_statuses lists" },
	{ .name = "upstream_deadline", .off = P(upstream_deadline_ms),
	  .flags = KEY_OPTION,
	  .help = "how long a late response is awaited and then stored" },
	{ .name = "unknown_outcome", .off = P(unknown_outcome),
	  .flags = KEY_OPTION,
	  .help = "keep (never sent again) or release (at-least-once)" },
	{ .name = "outcome_probe", .set = set_probe, .print = print_probe,
	  .help = "METHOD /path/{key}: the upstream's lookup of a request "
		  "whose outcome is unknown (2xx: its response; 404: never "
		  "executed)" },
	{ .name = "store_down", .off = P(store_down), .flags = KEY_OPTION,
	  .help = "503, or forward unprotected, when the store is down" },
	{ .name = "fingerprint", .off = P(fp_body), .flags = KEY_OPTION,
	  .help = "body, json (RFC 8785) or form: what of the body counts" },
	{ .name = "fingerprint_ignore", .off = P(fp_ignore), .set = set_fp_ignore,
	  .print = print_fp_ignore, .flags = KEY_OPTION,
	  .help = "JSON pointers or form fields the fingerprint leaves out" },
	{ .name = "fingerprint_only", .off = P(fp_only), .set = set_fp_only,
	  .print = print_fp_only, .flags = KEY_OPTION,
	  .help = "instead: the only pointers or fields it covers" },
	{ .name = "fingerprint_query", .off = P(fp_query), .flags = KEY_OPTION,
	  .help = "exact, sorted or ignore: what of the query string counts" },
	{ .name = "scope", .set = set_scope, .print = print_scope,
	  .help = "namespaces keys per caller: header:NAME, jwt:CLAIM, "
		  "tls:subject, tls:san; none" },
	{ .name = "jwt_keys", .off = P(jwt_keys_file), .syn = SYNTAX_STRING,
	  .print = print_jwt_keys, .flags = KEY_JWT,
	  .help = "JWKS, PEM or DER public keys or certificates, or "
		  "hmac:FILE (a shared secret), that sign bearer tokens; "
		  "re-read on SIGHUP" },
	{ .name = "jwt_algorithms", .set = set_jwt_algs, .print = print_jwt_algs,
	  .flags = KEY_JWT,
	  .help = "the signature algorithms accepted (never none); default: "
		  "what the keys can verify" },
	{ .name = "jwt_issuer", .off = P(jwt_issuer), .syn = SYNTAX_STRING,
	  .print = print_jwt_issuer, .flags = KEY_JWT,
	  .help = "the iss a token must carry" },
	{ .name = "jwt_audience", .off = P(jwt_audience), .syn = SYNTAX_STRING,
	  .print = print_jwt_audience, .flags = KEY_JWT,
	  .help = "an aud a token must carry" },
	{ .name = "jwt_leeway", .off = P(jwt_leeway_ms), .syn = SYNTAX_DURATION(0),
	  .def = "60s", .flags = KEY_JWT,
	  .help = "clock skew allowed for exp and nbf" },
	{ .name = "verify", .set = set_verify, .print = print_verify,
	  .flags = KEY_FIRST | KEY_VERIFY,
	  .help = "hmac-sha256: the body must carry a valid signature; none" },
	{ .name = "verify_format", .off = P(verify),
	  .syn = SYNTAX_WORDS(policy_verify_format_words),
	  .flags = KEY_VERIFY, .help = "github or stripe" },
	{ .name = "verify_header", .off = P(verify_header),
	  .syn = SYNTAX_TOKEN, .flags = KEY_VERIFY,
	  .help = "the header carrying the signature" },
	{ .name = "verify_secret_env", .set = set_verify_secret_env,
	  .print = print_verify_secret, .flags = KEY_VERIFY,
	  .help = "the environment variable holding the secret" },
	{ .name = "verify_tolerance", .off = P(verify_tolerance_ms),
	  .syn = SYNTAX_DURATION(1), .def = "5m", .flags = KEY_VERIFY,
	  .help = "stripe: how far the signed time may be from now" },
	{ .name = "require_issued_key", .off = P(require_issued_key),
	  .syn = SYNTAX_BOOL, .def = "no", .flags = KEY_ISSUED,
	  .help = "only keys from GET /.well-known/idempotency-key" },
	{ .name = "issued_key_ttl", .off = P(issued_key_ttl_ms),
	  .flags = KEY_OPTION | KEY_ISSUED,
	  .help = "how long after issue a key may first be used" },
};

#define NKEYS (sizeof(route_keys) / sizeof(route_keys[0]))

static const struct route_key *key_by_name(const char *name)
{
	for (size_t i = 0; i < NKEYS; i++)
		if (strcmp(route_keys[i].name, name) == 0)
			return &route_keys[i];
	return NULL;
}

/* The syntax of a row with none of its own: the option's. */
static const struct setting_syntax *key_syntax(const struct route_table *t,
					       const struct route_key *k)
{
	if (k->flags & KEY_OPTION)
		return t->option(NULL, k->name, NULL);
	return &k->syn;
}

/* Apply one `key = value` of a route. Returns -1 with why set. */
static int apply(const struct route_table *t, struct route *r,
		 const struct route_key *k, const char *v, char **envp,
		 char *why, size_t len)
{
	const struct setting_syntax *syn;

	if (k->set != NULL)
		return k->set(r, v, envp, why, len);
	syn = key_syntax(t, k);
	if (syn == NULL) {
		snprintf(why, len, "internal error: no [idemproxy] option");
		return -1;
	}
	return setting_parse(syn, v, (char *)&r->policy + k->off, why, len);
}

static void unknown_key(char *why, size_t len)
{
	size_t used = (size_t)snprintf(why, len, "unknown key (route keys:");

	for (size_t i = 0; i < NKEYS && used < len; i++)
		used += (size_t)snprintf(why + used, len - used, "%s %s",
					 i == 0 ? "" : ",", route_keys[i].name);
	if (used < len)
		snprintf(why + used, len - used, ")");
}

/* Apply the lines of raw in two passes: KEY_FIRST keys, then the rest. */
static int apply_lines(const struct route_table *t, struct route *r,
		       const struct route_raw *raw, char **envp,
		       int *verify_line, char *err, size_t errlen)
{
	char why[512];

	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < raw->n; i++) {
			const struct raw_line *l = &raw->lines[i];
			const struct route_key *k = key_by_name(l->key);
			int first = k != NULL && (k->flags & KEY_FIRST);

			if (first != (pass == 0))
				continue;
			if (strncmp(l->key, "verify", 6) == 0)
				*verify_line = l->line;
			if (k == NULL)
				unknown_key(why, sizeof(why));
			if (k == NULL || apply(t, r, k, l->value, envp, why,
					       sizeof(why)) < 0) {
				snprintf(err, errlen, "%s:%d: route %s: %s: %s",
					 raw->file, l->line, raw->name, l->key, why);
				return -1;
			}
		}
	}
	return 0;
}

static bool has_key(const struct route_raw *raw, const char *key)
{
	for (int i = 0; i < raw->n; i++)
		if (strcmp(raw->lines[i].key, key) == 0)
			return true;
	return false;
}

/*
 * A route with scope = jwt:CLAIM loads its keys (and so re-reads them on
 * every reload); the jwt_ keys elsewhere are an error, not silently unused.
 */
static int jwt_route(struct route *r, const struct route_raw *raw, char *err,
		     size_t errlen)
{
	struct policy *p = &r->policy;
	char why[512];
	unsigned can;

	if (p->scope != SCOPE_JWT) {
		for (int i = 0; i < raw->n; i++)
			if (strncmp(raw->lines[i].key, "jwt_", 4) == 0) {
				snprintf(err, errlen, "%s:%d: route %s: %s needs "
					 "scope = jwt:CLAIM", raw->file,
					 raw->lines[i].line, raw->name,
					 raw->lines[i].key);
				return -1;
			}
		return 0;
	}
	if (p->jwt_keys_file == NULL) {
		snprintf(err, errlen, "%s:%d: route %s: scope = jwt:%s needs "
			 "jwt_keys (the keys that sign the tokens)", raw->file,
			 raw->line, raw->name, p->scope_name);
		return -1;
	}
	p->jwt_keys = jwt_keys_load(p->jwt_keys_file, why, sizeof(why));
	if (p->jwt_keys == NULL) {
		snprintf(err, errlen, "%s:%d: route %s: jwt_keys: %s", raw->file,
			 raw->line, raw->name, why);
		return -1;
	}
	can = jwt_keys_algs(p->jwt_keys);
	if (p->jwt_algs == 0)
		p->jwt_algs = can;
	if ((p->jwt_algs & can) == 0) {
		jwt_algs_format(can, why, sizeof(why));
		snprintf(err, errlen, "%s:%d: route %s: jwt_algorithms: no key "
			 "of %s verifies any of them (its keys verify %s)",
			 raw->file, raw->line, raw->name, p->jwt_keys_file, why);
		return -1;
	}
	p->jwt_algs &= can;	/* what --check-config shows is what counts */
	return 0;
}

static int build_route(const struct route_table *t, struct route *r,
		       const struct route_options *o,
		       const struct route_raw *raw, char **envp, char *err,
		       size_t errlen)
{
	int verify_line = raw->line;
	char why[512];

	r->name = strdup(raw->name);
	if (r->name == NULL || policy_copy(&r->policy, &t->global) < 0)
		goto oom;
	if (apply_lines(t, r, raw, envp, &verify_line, err, errlen) < 0)
		return -1;
	if (!has_key(raw, "match")) {
		snprintf(err, errlen, "%s:%d: route %s: match is required (e.g. "
			 "match = POST /orders*)", raw->file, raw->line, raw->name);
		return -1;
	}
	if (has_key(raw, "fingerprint_ignore") && has_key(raw, "fingerprint_only")) {
		snprintf(err, errlen, "%s:%d: route %s: fingerprint_ignore and "
			 "fingerprint_only exclude each other", raw->file,
			 raw->line, raw->name);
		return -1;
	}
	if (fpshape_check(&r->policy, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "%s:%d: route %s: %s", raw->file, raw->line,
			 raw->name, why);
		return -1;
	}
	if (jwt_route(r, raw, err, errlen) < 0)
		return -1;
	if ((r->policy.scope == SCOPE_TLS_SUBJECT ||
	     r->policy.scope == SCOPE_TLS_SAN) && !o->client_certs) {
		snprintf(err, errlen, "%s:%d: route %s: scope = tls:%s needs "
			 "verified client certificates (--tls-client-ca)",
			 raw->file, raw->line, raw->name,
			 r->policy.scope == SCOPE_TLS_SAN ? "san" : "subject");
		return -1;
	}
	if (r->policy.upstream_deadline_ms < o->upstream_timeout_ms) {
		snprintf(err, errlen, "%s:%d: route %s: upstream_deadline must "
			 "not be shorter than upstream_timeout", raw->file,
			 raw->line, raw->name);
		return -1;
	}
	if (r->policy.lease_ms <= o->upstream_timeout_ms) {
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
		    setting_set_string(&r->policy.verify_header,
				       r->policy.verify == VERIFY_STRIPE ?
				       "Stripe-Signature" : "X-Hub-Signature-256",
				       err, errlen) < 0)
			return -1;
	}
	return 0;
oom:
	snprintf(err, errlen, "out of memory");
	return -1;
}

/*
 * The global policy: keys from --key-header, and every row's default -
 * the option's value for KEY_OPTION rows, .def for the route-only ones.
 */
static int global_policy(struct route_table *t, const struct route_options *o,
			 char *err, size_t errlen)
{
	struct policy *g = &t->global;
	char why[512];

	memset(g, 0, sizeof(*g));
	g->key_source = KEY_SRC_HEADER;
	if (setting_set_string(&g->key_name, o->key_header, err, errlen) < 0 ||
	    setting_set_string(&g->key_prefix, "", err, errlen) < 0)
		return -1;
	for (size_t i = 0; i < NKEYS; i++) {
		const struct route_key *k = &route_keys[i];
		void *field = (char *)g + k->off;
		const struct setting_syntax *syn;
		const void *value;

		if (k->flags & KEY_OPTION) {
			syn = o->option(o->opts, k->name, &value);
			if (syn == NULL) {
				snprintf(err, errlen, "internal error: route key "
					 "%s has no [idemproxy] option", k->name);
				return -1;
			}
			if (setting_copy(syn, field, value) < 0)
				goto oom;
		} else if (k->def != NULL &&
			   setting_parse(&k->syn, k->def, field, why, sizeof(why)) < 0) {
			snprintf(err, errlen, "internal error: route key %s: "
				 "default: %s", k->name, why);
			return -1;
		}
	}
	/* the lists as the options gave them, in the form routes keep */
	if ((g->fp_ignore != NULL &&
	     fpshape_list(g->fp_ignore, &g->fp_ignore, why, sizeof(why)) < 0) ||
	    (g->fp_only != NULL &&
	     fpshape_list(g->fp_only, &g->fp_only, why, sizeof(why)) < 0) ||
	    fpshape_check(g, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "fingerprint options: %s", why);
		return -1;
	}
	return 0;
oom:
	snprintf(err, errlen, "out of memory");
	return -1;
}

int routes_build(struct route_table *t, const struct route_options *o,
		 const struct route_raw *raw, char **envp, char *err,
		 size_t errlen)
{
	int n = 0;

	memset(t, 0, sizeof(*t));
	t->methods_mask = o->methods_mask;
	t->option = o->option;
	if (global_policy(t, o, err, errlen) < 0)
		return -1;
	for (const struct route_raw *r = raw; r != NULL; r = r->next)
		n++;
	t->routes = n ? calloc((size_t)n, sizeof(*t->routes)) : NULL;
	if (n && t->routes == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (const struct route_raw *r = raw; r != NULL; r = r->next) {
		/* counted as it goes, so routes_free frees what was built */
		if (build_route(t, &t->routes[t->nroutes++], o, r, envp, err,
				errlen) < 0)
			return -1;
	}
	return 0;
}

void routes_free(struct route_table *t)
{
	for (int i = 0; i < t->nroutes; i++) {
		free(t->routes[i].name);
		free(t->routes[i].glob);
		policy_free(&t->routes[i].policy);
	}
	free(t->routes);
	t->routes = NULL;
	t->nroutes = 0;
	policy_free(&t->global);
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

const struct policy *route_policy(const struct route_table *t, int method,
				  const char *target, const char **name)
{
	size_t len = strcspn(target, "?");

	*name = NULL;
	for (int i = 0; i < t->nroutes; i++) {
		const struct route *r = &t->routes[i];

		if (!route_method_in(r->methods, method))
			continue;
		if (!route_glob_match(r->glob, target, len))
			continue;
		*name = r->name;
		return r->policy.key_source == KEY_SRC_NONE ? NULL : &r->policy;
	}
	if (!route_method_in(t->methods_mask, method))
		return NULL;
	return &t->global;
}

bool routes_consider(const struct route_table *t, int method)
{
	if (route_method_in(t->methods_mask, method))
		return true;
	for (int i = 0; i < t->nroutes; i++)
		if (route_method_in(t->routes[i].methods, method))
			return true;
	return false;
}

bool routes_issue_keys(const struct route_table *t)
{
	for (int i = 0; i < t->nroutes; i++)
		if (t->routes[i].policy.require_issued_key)
			return true;
	return false;
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

void routes_print(const struct route_table *t, FILE *out)
{
	char buf[1024];

	for (int i = 0; i < t->nroutes; i++) {
		const struct route *r = &t->routes[i];
		const struct policy *p = &r->policy;

		fprintf(out, "\n[route %s]\n", r->name);
		for (size_t j = 0; j < NKEYS; j++) {
			const struct route_key *k = &route_keys[j];
			const struct setting_syntax *syn = key_syntax(t, k);

			if (((k->flags & KEY_VERIFY) && p->verify == VERIFY_NONE) ||
			    ((k->flags & KEY_ISSUED) && !p->require_issued_key) ||
			    ((k->flags & KEY_JWT) && p->scope != SCOPE_JWT))
				continue;
			if (k->print != NULL) {
				k->print(r, out);
			} else if (syn != NULL) {
				setting_format(syn, (const char *)p + k->off, buf,
					       sizeof(buf));
				fprintf(out, "%s = %s\n", k->name, buf);
			}
		}
	}
}
