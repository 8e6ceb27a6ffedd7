/*
 * config.c - idemproxy's settings, from one table.
 *
 * Each row of `options` below is one setting: its long flag name, how its
 * value is parsed, where it lands in struct config, its default (a string,
 * parsed by the same code as user input) and its help. From the flag name
 * the other spellings are derived:
 *
 *     flag      --log-format json
 *     env       IDEMPROXY_LOG_FORMAT=json
 *     ini       log_format = json          (in the [idemproxy] section)
 *
 * A build runs the sources from the highest precedence down:
 *
 *     argv ──▶ environment ──▶ config file ──▶ defaults ──▶ cross-checks
 *
 * Every value of every source is parsed into a scratch config as it is
 * read, so that a typo is an error even when a higher source overrides it
 * (DESIGN.md §7); the winning string of each option is remembered and
 * parsed once more into the config that is handed out. Nothing here exits
 * or prints: errors come back as one line naming the option and where it
 * came from, and the caller decides (exit 2 at start, keep the old config
 * on SIGHUP).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <ini.h>
#include <llhttp.h>

#include "config.h"
#include "log.h"
#include "units.h"

#ifndef IDEMPROXY_VERSION
#define IDEMPROXY_VERSION "unknown"
#endif

#define ENV_PREFIX "IDEMPROXY_"
#define INI_SECTION "idemproxy"

enum opt_type {
	OPT_STRING,		/* free text (non-empty) */
	OPT_HOSTPORT,		/* ADDR:PORT, into a char * and a struct hostport */
	OPT_URL_UPSTREAM,	/* http://HOST[:PORT][/prefix] */
	OPT_STORE,		/* memory | postgres://... */
	OPT_REDIS_URL,		/* redis://HOST[:PORT][/DB] */
	OPT_INT,		/* decimal, min..max */
	OPT_BOOL,		/* 1/0 true/false yes/no on/off */
	OPT_DURATION,		/* units.h, milliseconds, min..max */
	OPT_SIZE,		/* units.h, bytes, min..max */
	OPT_ENUM,		/* one of `words` */
	OPT_METHODS,		/* POST,PATCH into a bitmask */
	OPT_LOGLEVEL,		/* debug|info|warn|error */
};

/* Row flags. */
#define OPT_RESTART	0x01	/* SIGHUP cannot change it: a restart can */
#define OPT_NO_FILE	0x02	/* meaningless inside the config file */
#define OPT_CPUS	0x04	/* default is the number of online CPUs */
#define OPT_TOKEN	0x08	/* OPT_STRING that must be an HTTP token */

struct opt_word {
	const char *word;
	int value;
};

struct config_opt {
	const char *name;	/* long flag without the dashes */
	enum opt_type type;
	size_t off;		/* the field */
	size_t aux;		/* HOSTPORT: its struct hostport; METHODS: mask */
	const char *def;	/* NULL: unset (see defdoc) */
	const char *defdoc;	/* what --help says when def is NULL */
	const char *metavar;	/* NULL for booleans */
	const struct opt_word *words;	/* OPT_ENUM */
	uint64_t min, max;	/* OPT_INT, OPT_DURATION, OPT_SIZE */
	unsigned flags;
	const char *help;
};

static const struct opt_word in_flight_words[] = {
	{ "wait", IN_FLIGHT_WAIT },
	{ "reject", IN_FLIGHT_REJECT },
	{ NULL, 0 },
};

static const struct opt_word store_down_words[] = {
	{ "fail-closed", STORE_DOWN_FAIL_CLOSED },
	{ "fail-open", STORE_DOWN_FAIL_OPEN },
	{ NULL, 0 },
};

static const struct opt_word upstream_error_words[] = {
	{ "release", UPSTREAM_ERROR_RELEASE },
	{ "keep", UPSTREAM_ERROR_KEEP },
	{ NULL, 0 },
};

static const struct opt_word log_format_words[] = {
	{ "text", LOG_FORMAT_TEXT },
	{ "json", LOG_FORMAT_JSON },
	{ NULL, 0 },
};

#define F(field) offsetof(struct config, field)
#define SEC 1000ULL
/* Durations stay below INT32_MAX seconds so that any timeval or SQL
 * interval built from them fits. */
#define DUR_MAX (2147483647ULL * SEC)
#define KIB 1024ULL
#define MIB (1024ULL * KIB)
#define GIB (1024ULL * MIB)

/* DESIGN.md §3 in its order, then the additions documented in docs/. */
static const struct config_opt options[] = {
	{ .name = "listen", .type = OPT_HOSTPORT, .off = F(listen),
	  .aux = F(listen_hp), .def = "127.0.0.1:8080", .metavar = "ADDR:PORT",
	  .flags = OPT_RESTART,
	  .help = "address for client traffic (IPv4, [IPv6] or a name)" },
	{ .name = "upstream", .type = OPT_URL_UPSTREAM, .off = F(upstream),
	  .defdoc = "required", .metavar = "URL", .flags = OPT_RESTART,
	  .help = "the protected HTTP/1.1 server, http://HOST[:PORT][/PREFIX]; "
		  "PREFIX is prepended to every request-target" },
	{ .name = "store", .type = OPT_STORE, .off = F(store), .def = "memory",
	  .metavar = "memory|postgres://...", .flags = OPT_RESTART,
	  .help = "where idempotency records live: memory (one process, no "
		  "durability) or a PostgreSQL URL" },
	{ .name = "redis", .type = OPT_REDIS_URL, .off = F(redis),
	  .aux = F(redis_hp), .defdoc = "off",
	  .metavar = "redis://HOST[:PORT][/DB]", .flags = OPT_RESTART,
	  .help = "optional cache of completed responses in front of PostgreSQL" },
	{ .name = "admin-listen", .type = OPT_HOSTPORT, .off = F(admin_listen),
	  .aux = F(admin_hp), .def = "127.0.0.1:9090", .metavar = "ADDR:PORT",
	  .flags = OPT_RESTART,
	  .help = "address for /healthz, /readyz and /metrics" },
	{ .name = "config", .type = OPT_STRING, .off = F(config_file),
	  .defdoc = "none", .metavar = "FILE", .flags = OPT_NO_FILE,
	  .help = "INI file with an [idemproxy] section; re-read on SIGHUP" },
	{ .name = "workers", .type = OPT_INT, .off = F(workers),
	  .defdoc = "number of online CPUs", .metavar = "N", .min = 1,
	  .max = 256, .flags = OPT_RESTART | OPT_CPUS,
	  .help = "event-loop threads (1-256)" },
	{ .name = "key-header", .type = OPT_STRING, .off = F(key_header),
	  .def = "Idempotency-Key", .metavar = "NAME", .flags = OPT_TOKEN,
	  .help = "request header that carries the idempotency key" },
	{ .name = "methods", .type = OPT_METHODS, .off = F(methods),
	  .aux = F(methods_mask), .def = "POST,PATCH", .metavar = "LIST",
	  .help = "comma-separated HTTP methods that are protected "
		  "(case-sensitive)" },
	{ .name = "require-key", .type = OPT_BOOL, .off = F(require_key),
	  .def = "no",
	  .help = "answer 400 to a protected request without a key" },
	{ .name = "in-flight", .type = OPT_ENUM, .off = F(in_flight),
	  .def = "wait", .metavar = "wait|reject", .words = in_flight_words,
	  .help = "a duplicate of a request still running waits for its "
		  "response, or gets 409 at once" },
	{ .name = "wait-timeout", .type = OPT_DURATION,
	  .off = F(wait_timeout_ms), .def = "10s", .metavar = "DUR", .min = 1,
	  .max = DUR_MAX,
	  .help = "longest a waiting duplicate is held before 409" },
	{ .name = "ttl", .type = OPT_DURATION, .off = F(ttl_ms), .def = "24h",
	  .metavar = "DUR", .min = 1, .max = DUR_MAX,
	  .help = "how long a completed response is kept and replayed" },
	{ .name = "lease", .type = OPT_DURATION, .off = F(lease_ms),
	  .def = "30s", .metavar = "DUR", .min = 1, .max = DUR_MAX,
	  .help = "an in-flight claim whose owner is silent this long is taken "
		  "over; must be longer than --upstream-timeout" },
	{ .name = "upstream-timeout", .type = OPT_DURATION,
	  .off = F(upstream_timeout_ms), .def = "20s", .metavar = "DUR",
	  .min = 1, .max = DUR_MAX,
	  .help = "wait for the upstream's response head, and for each gap "
		  "while reading its response" },
	{ .name = "max-body", .type = OPT_SIZE, .off = F(max_body),
	  .def = "1MiB", .metavar = "SIZE", .min = 1, .max = GIB,
	  .help = "largest keyed request body (buffered); larger gets 413" },
	/* stored as bytea, which PostgreSQL caps at 1 GB */
	{ .name = "max-cached-response", .type = OPT_SIZE,
	  .off = F(max_cached_response), .def = "8MiB", .metavar = "SIZE",
	  .min = 1, .max = 512 * MIB,
	  .help = "largest response stored for replay; larger ones are "
		  "streamed and not stored" },
	{ .name = "store-down", .type = OPT_ENUM, .off = F(store_down),
	  .def = "fail-closed", .metavar = "fail-closed|fail-open",
	  .words = store_down_words,
	  .help = "when PostgreSQL is unreachable, keyed requests get 503 or "
		  "are forwarded unprotected" },
	{ .name = "on-upstream-error", .type = OPT_ENUM,
	  .off = F(on_upstream_error), .def = "release",
	  .metavar = "release|keep", .words = upstream_error_words,
	  .help = "5xx, 502 and 504 release the key for a retry, or are "
		  "stored and replayed" },
	{ .name = "drain-timeout", .type = OPT_DURATION,
	  .off = F(drain_timeout_ms), .def = "20s", .metavar = "DUR",
	  .min = 0, .max = DUR_MAX,
	  .help = "on SIGTERM, how long in-flight exchanges may finish "
		  "(0: exit at once)" },
	{ .name = "sweep-interval", .type = OPT_DURATION,
	  .off = F(sweep_interval_ms), .def = "10s", .metavar = "DUR",
	  .min = 1, .max = DUR_MAX,
	  .help = "how often expired records are deleted" },
	{ .name = "log-level", .type = OPT_LOGLEVEL, .off = F(log_level),
	  .def = "info", .metavar = "debug|info|warn|error",
	  .help = "least severe level logged" },
	{ .name = "log-format", .type = OPT_ENUM, .off = F(log_format),
	  .def = "text", .metavar = "text|json", .words = log_format_words,
	  .help = "one line per event on stderr, as text or JSON" },
	{ .name = "client-timeout", .type = OPT_DURATION,
	  .off = F(client_timeout_ms), .def = "10s", .metavar = "DUR",
	  .min = 1, .max = DUR_MAX,
	  .help = "wait for a request head, and for each gap while reading a "
		  "body; then 408" },
	{ .name = "idle-timeout", .type = OPT_DURATION,
	  .off = F(idle_timeout_ms), .def = "60s", .metavar = "DUR", .min = 1,
	  .max = DUR_MAX,
	  .help = "close a keep-alive client connection idle this long" },
	{ .name = "max-header-size", .type = OPT_SIZE,
	  .off = F(max_header_size), .def = "32KiB", .metavar = "SIZE",
	  .min = KIB, .max = MIB,
	  .help = "largest request line plus headers; larger gets 431" },
	{ .name = "max-connections", .type = OPT_INT,
	  .off = F(max_connections), .def = "10000", .metavar = "N", .min = 1,
	  .max = 1000000,
	  .help = "client connections per worker; accepting pauses beyond" },
	{ .name = "issued-key-ttl", .type = OPT_DURATION,
	  .off = F(issued_key_ttl_ms), .def = "10m", .metavar = "DUR",
	  .min = 1, .max = DUR_MAX,
	  .help = "how long a key from GET /.well-known/idempotency-key may "
		  "wait to be used (routes with require_issued_key)" },
	{ .name = "memory-max-bytes", .type = OPT_SIZE,
	  .off = F(memory_max_bytes), .def = "256MiB", .metavar = "SIZE",
	  .min = MIB, .max = (uint64_t)64 * 1024 * MIB,
	  .help = "memory store: records and responses together; beyond, new "
		  "keys get the store-down policy" },
	{ .name = "store-connections", .type = OPT_INT,
	  .off = F(store_connections), .def = "4", .metavar = "N", .min = 1,
	  .max = 64, .flags = OPT_RESTART,
	  .help = "PostgreSQL statement connections per worker, opened as load "
		  "needs them (plus one listener per worker)" },
	{ .name = "response-cache", .type = OPT_SIZE,
	  .off = F(response_cache), .def = "64MiB", .metavar = "SIZE",
	  .min = 0, .max = (uint64_t)64 * 1024 * MIB, .flags = OPT_RESTART,
	  .help = "in-process cache of completed responses in front of "
		  "PostgreSQL and Redis (0: off)" },
};

#define NOPTS (sizeof(options) / sizeof(options[0]))

/* Precedence of a source; higher wins. */
enum src_rank {
	SRC_NONE,
	SRC_FILE,
	SRC_ENV,
	SRC_FLAG,
};

/* State of one build: the winning string of each option so far. */
struct build {
	const char *val[NOPTS];
	enum src_rank rank[NOPTS];
	char *owned[NOPTS];	/* file values; inih reuses its line buffer */
	struct config *scratch;	/* every value is parsed here to validate it */
	const char *check_file;	/* --check-config FILE */
	enum config_action action;
	struct route_raw *routes;	/* [route NAME] lines, in file order */
};

static void *field(struct config *c, size_t off)
{
	return (char *)c + off;
}

static const void *cfield(const struct config *c, size_t off)
{
	return (const char *)c + off;
}

static int opt_index(const struct config_opt *o)
{
	return (int)(o - options);
}

/* "log-format" -> "IDEMPROXY_LOG_FORMAT" (env) or "log_format" (ini). */
static void opt_spelling(const struct config_opt *o, bool env, char *buf,
			 size_t len)
{
	size_t i = 0, j;

	if (env) {
		snprintf(buf, len, "%s", ENV_PREFIX);
		i = strlen(buf);
	}
	for (j = 0; o->name[j] != '\0' && i + 1 < len; j++, i++) {
		char ch = o->name[j];

		if (ch == '-')
			ch = '_';
		else if (env && ch >= 'a' && ch <= 'z')
			ch = (char)(ch - 'a' + 'A');
		buf[i] = ch;
	}
	buf[i] = '\0';
}

static const struct config_opt *opt_by_flag(const char *name, size_t len)
{
	size_t i;

	for (i = 0; i < NOPTS; i++) {
		if (strlen(options[i].name) == len &&
		    memcmp(options[i].name, name, len) == 0)
			return &options[i];
	}
	return NULL;
}

static const struct config_opt *opt_by_spelling(const char *s, size_t len,
						bool env)
{
	char buf[64];
	size_t i;

	for (i = 0; i < NOPTS; i++) {
		opt_spelling(&options[i], env, buf, sizeof(buf));
		if (strlen(buf) == len && memcmp(buf, s, len) == 0)
			return &options[i];
	}
	return NULL;
}

/*
 * Copy a user-supplied value for an error message: cut short, and with
 * control bytes replaced, so that the message stays one printable line.
 */
static const char *shown(const char *v, char *buf, size_t len)
{
	size_t i;

	for (i = 0; v[i] != '\0' && i + 1 < len; i++)
		buf[i] = (v[i] >= 0x20 && v[i] < 0x7f) ? v[i] : '?';
	buf[i] = '\0';
	if (v[i] != '\0' && len > 4)
		memcpy(buf + len - 4, "...", 4);
	return buf;
}

/* Decimal digits only, no sign or spaces, at most max. */
static int parse_uint(const char *s, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;

	if (*s == '\0')
		return -1;
	for (; *s != '\0'; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (uint64_t)(*s - '0');
		if (v > max)
			return -1;
	}
	*out = v;
	return 0;
}

int config_parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "1", "true", "yes", "on" };
	static const char *const no[] = { "0", "false", "no", "off" };
	size_t i;

	for (i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return -1;
}

/* RFC 9110 tchar: what a header name may be made of. */
static bool is_tchar(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
	       (ch >= '0' && ch <= '9') || (ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch));
}

static void hostport_clear(struct hostport *hp)
{
	free(hp->host);
	free(hp->port);
	hp->host = NULL;
	hp->port = NULL;
}

/* A host name: letters, digits, '-', '_' and '.', no empty label. */
static bool valid_hostname(const char *h)
{
	size_t i, n = strlen(h);

	if (n == 0 || n > 253 || h[0] == '.' || strstr(h, "..") != NULL)
		return false;
	for (i = 0; i < n; i++) {
		char ch = h[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' ||
		      ch == '.'))
			return false;
	}
	return true;
}

/*
 * Split "host:port", "[v6]:port" or, when defport is given, a bare host
 * into hp (both strings allocated; brackets removed). The host must be an
 * IP literal or a plausible name; the port numeric, min_port..65535.
 */
static int hostport_parse(const char *s, const char *defport, int min_port,
			  struct hostport *hp, char *err, size_t errlen)
{
	char *host = NULL, *port = NULL;
	const char *p, *colon;
	char sh[80];
	unsigned char addr[16];
	uint64_t n;

	if (s[0] == '[') {
		p = strchr(s, ']');
		if (p == NULL) {
			snprintf(err, errlen, "invalid address \"%s\" (missing ']')",
				 shown(s, sh, sizeof(sh)));
			goto fail;
		}
		host = strndup(s + 1, (size_t)(p - s - 1));
		if (host == NULL)
			goto nomem;
		if (inet_pton(AF_INET6, host, addr) != 1) {
			snprintf(err, errlen, "invalid IPv6 address \"%s\"",
				 shown(host, sh, sizeof(sh)));
			goto fail;
		}
		p++;
		if (*p == ':') {
			port = strdup(p + 1);
		} else if (*p == '\0' && defport != NULL) {
			port = strdup(defport);
		} else {
			snprintf(err, errlen, "invalid address \"%s\" (expected [IPV6]:PORT)",
				 shown(s, sh, sizeof(sh)));
			goto fail;
		}
		if (port == NULL)
			goto nomem;
	} else {
		colon = strrchr(s, ':');
		if (colon == NULL && defport == NULL) {
			snprintf(err, errlen, "invalid address \"%s\" (missing :PORT)",
				 shown(s, sh, sizeof(sh)));
			goto fail;
		}
		host = colon ? strndup(s, (size_t)(colon - s)) : strdup(s);
		port = strdup(colon ? colon + 1 : defport);
		if (host == NULL || port == NULL)
			goto nomem;
		if (strchr(host, ':') != NULL) {
			snprintf(err, errlen, "invalid address \"%s\" (an IPv6 address "
				 "needs brackets, e.g. [::1]:8080)", shown(s, sh, sizeof(sh)));
			goto fail;
		}
		if (host[0] == '\0') {
			snprintf(err, errlen, "invalid address \"%s\" (missing host; "
				 "use 0.0.0.0 or [::] for all addresses)",
				 shown(s, sh, sizeof(sh)));
			goto fail;
		}
		if (strspn(host, "0123456789.") == strlen(host)) {
			if (inet_pton(AF_INET, host, addr) != 1) {
				snprintf(err, errlen, "invalid IPv4 address \"%s\"",
					 shown(host, sh, sizeof(sh)));
				goto fail;
			}
		} else if (!valid_hostname(host)) {
			snprintf(err, errlen, "invalid host name \"%s\"",
				 shown(host, sh, sizeof(sh)));
			goto fail;
		}
	}
	if (strlen(port) > 5 || parse_uint(port, 65535, &n) < 0 ||
	    n < (uint64_t)min_port) {
		snprintf(err, errlen, "invalid port \"%s\" (use %d-65535)",
			 shown(port, sh, sizeof(sh)), min_port);
		goto fail;
	}
	/* canonical form: "08080" and "8080" are the same port */
	snprintf(port, strlen(port) + 1, "%u", (unsigned)n);
	hostport_clear(hp);
	hp->host = host;
	hp->port = port;
	return 0;
nomem:
	snprintf(err, errlen, "out of memory");
fail:
	free(host);
	free(port);
	return -1;
}

static int set_string(struct config *c, size_t off, const char *v,
		      char *err, size_t errlen)
{
	char **dst = field(c, off);
	char *dup = strdup(v);

	if (dup == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	free(*dst);
	*dst = dup;
	return 0;
}

/* http://HOST[:PORT][/prefix] into upstream, upstream_hp, upstream_prefix. */
static int parse_upstream(const char *v, struct config *c, char *err,
			  size_t errlen)
{
	const char *auth, *slash;
	char *authority = NULL, *prefix = NULL;
	size_t n, i;
	char sh[80];

	if (strncasecmp(v, "https://", 8) == 0) {
		snprintf(err, errlen, "https upstreams are not supported "
			 "(idemproxy speaks plain HTTP/1.1 to its upstream; "
			 "use the app's plain-HTTP port)");
		goto fail;
	}
	if (strncasecmp(v, "http://", 7) != 0) {
		snprintf(err, errlen, "invalid URL \"%s\" (expected "
			 "http://HOST[:PORT][/PREFIX])", shown(v, sh, sizeof(sh)));
		goto fail;
	}
	auth = v + 7;
	if (strpbrk(auth, "?#") != NULL) {
		snprintf(err, errlen, "invalid URL \"%s\" (no query or fragment "
			 "allowed)", shown(v, sh, sizeof(sh)));
		goto fail;
	}
	slash = strchr(auth, '/');
	n = slash ? (size_t)(slash - auth) : strlen(auth);
	authority = strndup(auth, n);
	if (authority == NULL)
		goto nomem;
	if (strchr(authority, '@') != NULL) {
		snprintf(err, errlen, "invalid URL \"%s\" (no user info allowed)",
			 shown(v, sh, sizeof(sh)));
		goto fail;
	}
	if (authority[0] == '\0') {
		snprintf(err, errlen, "invalid URL \"%s\" (missing host)",
			 shown(v, sh, sizeof(sh)));
		goto fail;
	}
	if (hostport_parse(authority, "80", 1, &c->upstream_hp, err, errlen) < 0)
		goto fail;

	/* The prefix is pasted in front of request-targets: visible ASCII only. */
	prefix = strdup(slash ? slash : "");
	if (prefix == NULL)
		goto nomem;
	for (i = 0; prefix[i] != '\0'; i++) {
		if (prefix[i] <= 0x20 || prefix[i] >= 0x7f) {
			snprintf(err, errlen, "invalid URL \"%s\" (the path may only "
				 "hold visible ASCII)", shown(v, sh, sizeof(sh)));
			goto fail;
		}
	}
	for (n = strlen(prefix); n > 0 && prefix[n - 1] == '/'; n--)
		prefix[n - 1] = '\0';

	if (set_string(c, F(upstream), v, err, errlen) < 0)
		goto fail;
	free(c->upstream_prefix);
	c->upstream_prefix = prefix;
	free(authority);
	return 0;
nomem:
	snprintf(err, errlen, "out of memory");
fail:
	free(authority);
	free(prefix);
	return -1;
}

/* redis://HOST[:PORT][/DB] into redis, redis_hp, redis_db. */
static int parse_redis(const struct config_opt *o, const char *v,
		       struct config *c, char *err, size_t errlen)
{
	const char *auth, *slash;
	char *authority = NULL;
	uint64_t db = 0;
	char sh[80];

	if (strncasecmp(v, "rediss://", 9) == 0) {
		snprintf(err, errlen, "TLS to Redis (rediss://) is not supported");
		goto fail;
	}
	if (strncasecmp(v, "redis://", 8) != 0) {
		snprintf(err, errlen, "invalid URL \"%s\" (expected "
			 "redis://HOST[:PORT][/DB])", shown(v, sh, sizeof(sh)));
		goto fail;
	}
	auth = v + 8;
	slash = strchr(auth, '/');
	authority = slash ? strndup(auth, (size_t)(slash - auth)) : strdup(auth);
	if (authority == NULL) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (authority[0] == '\0' || strpbrk(authority, "@?#") != NULL) {
		snprintf(err, errlen, "invalid URL \"%s\" (expected "
			 "redis://HOST[:PORT][/DB], no user info or query)",
			 shown(v, sh, sizeof(sh)));
		goto fail;
	}
	if (slash != NULL && parse_uint(slash + 1, 2147483647, &db) < 0) {
		snprintf(err, errlen, "invalid database number \"%s\"",
			 shown(slash + 1, sh, sizeof(sh)));
		goto fail;
	}
	if (hostport_parse(authority, "6379", 1, field(c, o->aux), err, errlen) < 0)
		goto fail;
	if (set_string(c, o->off, v, err, errlen) < 0)
		goto fail;
	c->redis_db = (int)db;
	free(authority);
	return 0;
fail:
	free(authority);
	return -1;
}

/*
 * "POST,PATCH" into a mask of llhttp method numbers. Only the HTTP methods
 * llhttp knows are accepted (not RTSP's), spelt as on the wire.
 */
int config_parse_methods(const char *v, uint64_t *mask, char *err,
			 size_t errlen)
{
#define XX(num, name, string) num,
	static const int http_methods[] = { HTTP_METHOD_MAP(XX) };
#undef XX
	const char *p = v, *end;
	uint64_t m = 0;
	size_t n, i;
	char sh[80];

	if (*v == '\0') {
		snprintf(err, errlen, "empty method list (e.g. POST,PATCH)");
		return -1;
	}
	for (;;) {
		end = strchr(p, ',');
		if (end == NULL)
			end = p + strlen(p);
		/* "POST, PATCH" reads naturally in an INI file */
		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		n = (size_t)(end - p);
		while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
			n--;
		if (n == 0) {
			snprintf(err, errlen, "empty method in list \"%s\"",
				 shown(v, sh, sizeof(sh)));
			return -1;
		}
		for (i = 0; i < sizeof(http_methods) / sizeof(http_methods[0]); i++) {
			const char *name = llhttp_method_name((llhttp_method_t)http_methods[i]);

			if (strlen(name) == n && memcmp(name, p, n) == 0)
				break;
		}
		if (i == sizeof(http_methods) / sizeof(http_methods[0])) {
			char item[40];

			snprintf(item, sizeof(item), "%.*s", (int)(n < 32 ? n : 32), p);
			snprintf(err, errlen, "unknown HTTP method \"%s\" (methods "
				 "are case-sensitive, e.g. POST,PATCH)",
				 shown(item, sh, sizeof(sh)));
			return -1;
		}
		m |= 1ULL << http_methods[i];
		if (*end == '\0')
			break;
		p = end + 1;
	}
	*mask = m;
	return 0;
}

static const char *enum_word(const struct opt_word *w, int value)
{
	for (; w->word != NULL; w++) {
		if (w->value == value)
			return w->word;
	}
	return "?";
}

/* "use wait or reject" */
static void enum_choices(const struct opt_word *w, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (; w->word != NULL && used < len; w++) {
		used += (size_t)snprintf(buf + used, len - used, "%s%s",
					 used == 0 ? "" : (w[1].word ? ", " : " or "),
					 w->word);
	}
}

/*
 * Parse one value of option o into c, replacing what was there. On error
 * err gets the reason, without the option's name (the caller knows where
 * the value came from and prefixes it).
 */
static int opt_parse(const struct config_opt *o, const char *v,
		     struct config *c, char *err, size_t errlen)
{
	char sh[80], buf[64];
	uint64_t n;
	bool b;
	enum log_level lvl;
	const struct opt_word *w;

	switch (o->type) {
	case OPT_STRING:
		if (v[0] == '\0') {
			snprintf(err, errlen, "empty value");
			return -1;
		}
		if (o->flags & OPT_TOKEN) {
			size_t i;

			for (i = 0; v[i] != '\0' && is_tchar(v[i]); i++)
				;
			if (v[i] != '\0') {
				snprintf(err, errlen, "invalid header name \"%s\"",
					 shown(v, sh, sizeof(sh)));
				return -1;
			}
		}
		return set_string(c, o->off, v, err, errlen);
	case OPT_HOSTPORT:
		if (hostport_parse(v, NULL, 0, field(c, o->aux), err, errlen) < 0)
			return -1;
		return set_string(c, o->off, v, err, errlen);
	case OPT_URL_UPSTREAM:
		return parse_upstream(v, c, err, errlen);
	case OPT_STORE:
		if (strcmp(v, "memory") != 0 && strncmp(v, "postgres://", 11) != 0 &&
		    strncmp(v, "postgresql://", 13) != 0) {
			snprintf(err, errlen, "invalid store \"%s\" (use memory or a "
				 "postgres:// URL)", shown(v, sh, sizeof(sh)));
			return -1;
		}
		return set_string(c, o->off, v, err, errlen);
	case OPT_REDIS_URL:
		return parse_redis(o, v, c, err, errlen);
	case OPT_INT:
		if (parse_uint(v, o->max, &n) < 0 || n < o->min) {
			snprintf(err, errlen, "invalid number \"%s\" (use %llu-%llu)",
				 shown(v, sh, sizeof(sh)), (unsigned long long)o->min,
				 (unsigned long long)o->max);
			return -1;
		}
		*(int *)field(c, o->off) = (int)n;
		return 0;
	case OPT_BOOL:
		if (config_parse_bool(v, &b) < 0) {
			snprintf(err, errlen, "invalid boolean \"%s\" (use yes/no, "
				 "true/false, on/off or 1/0)", shown(v, sh, sizeof(sh)));
			return -1;
		}
		*(bool *)field(c, o->off) = b;
		return 0;
	case OPT_DURATION:
		if (units_parse_duration(v, &n) < 0) {
			snprintf(err, errlen, "invalid duration \"%s\" (use e.g. "
				 "250ms, 10s, 5m, 24h)", shown(v, sh, sizeof(sh)));
			return -1;
		}
		if (n < o->min) {
			snprintf(err, errlen, "must be greater than 0");
			return -1;
		}
		if (n > o->max) {
			units_format_duration(o->max, buf, sizeof(buf));
			snprintf(err, errlen, "%s is too long (at most %s)",
				 shown(v, sh, sizeof(sh)), buf);
			return -1;
		}
		*(uint64_t *)field(c, o->off) = n;
		return 0;
	case OPT_SIZE:
		if (units_parse_size(v, &n) < 0) {
			snprintf(err, errlen, "invalid size \"%s\" (use e.g. 4096, "
				 "512KiB, 1MiB)", shown(v, sh, sizeof(sh)));
			return -1;
		}
		if (n < o->min || n > o->max) {
			char lo[32];

			units_format_size(o->min, lo, sizeof(lo));
			units_format_size(o->max, buf, sizeof(buf));
			snprintf(err, errlen, "size %s out of range (%s-%s)",
				 shown(v, sh, sizeof(sh)), lo, buf);
			return -1;
		}
		*(uint64_t *)field(c, o->off) = n;
		return 0;
	case OPT_ENUM:
		for (w = o->words; w->word != NULL; w++) {
			if (strcasecmp(v, w->word) == 0) {
				*(int *)field(c, o->off) = w->value;
				return 0;
			}
		}
		enum_choices(o->words, buf, sizeof(buf));
		snprintf(err, errlen, "invalid value \"%s\" (use %s)",
			 shown(v, sh, sizeof(sh)), buf);
		return -1;
	case OPT_METHODS:
		if (config_parse_methods(v, field(c, o->aux), err, errlen) < 0)
			return -1;
		return set_string(c, o->off, v, err, errlen);
	case OPT_LOGLEVEL:
		if (log_level_parse(v, &lvl) < 0) {
			snprintf(err, errlen, "invalid log level \"%s\" (use debug, "
				 "info, warn or error)", shown(v, sh, sizeof(sh)));
			return -1;
		}
		*(enum log_level *)field(c, o->off) = lvl;
		return 0;
	}
	snprintf(err, errlen, "internal error: option type %d", (int)o->type);
	return -1;
}

/* Free what opt_parse may have allocated for o in c. */
static void opt_clear(const struct config_opt *o, struct config *c)
{
	switch (o->type) {
	case OPT_URL_UPSTREAM:
		hostport_clear(&c->upstream_hp);
		free(c->upstream_prefix);
		c->upstream_prefix = NULL;
		/* fallthrough */
	case OPT_STRING:
	case OPT_STORE:
	case OPT_METHODS:
		free(*(char **)field(c, o->off));
		*(char **)field(c, o->off) = NULL;
		break;
	case OPT_HOSTPORT:
	case OPT_REDIS_URL:
		hostport_clear(field(c, o->aux));
		free(*(char **)field(c, o->off));
		*(char **)field(c, o->off) = NULL;
		break;
	default:
		break;
	}
}

static void strv_free(char **v)
{
	size_t i;

	if (v == NULL)
		return;
	for (i = 0; v[i] != NULL; i++)
		free(v[i]);
	free(v);
}

static void config_free(struct config *c)
{
	size_t i;

	if (c == NULL)
		return;
	for (i = 0; i < NOPTS; i++)
		opt_clear(&options[i], c);
	routes_free(c);
	strv_free(c->argv);
	strv_free(c->env);
	free(c);
}

/* Value of o in c as config_print shows it; mask hides passwords. */
static void opt_format(const struct config_opt *o, const struct config *c,
		       bool mask, char *buf, size_t len)
{
	const char *s;

	switch (o->type) {
	case OPT_STRING:
	case OPT_HOSTPORT:
	case OPT_URL_UPSTREAM:
	case OPT_REDIS_URL:
	case OPT_METHODS:
	case OPT_STORE:
		s = *(char *const *)cfield(c, o->off);
		if (s == NULL) {
			snprintf(buf, len, "%s", o->defdoc ? o->defdoc : "");
			break;
		}
		snprintf(buf, len, "%s", s);
		if (mask && o->type == OPT_STORE) {
			/* postgres://user:secret@host -> postgres://user:***@host */
			char *scheme = strstr(buf, "://");
			char *at = scheme ? strchr(scheme + 3, '@') : NULL;
			char *colon = scheme ? strchr(scheme + 3, ':') : NULL;

			if (at != NULL && colon != NULL && colon < at)
				snprintf(colon, len - (size_t)(colon - buf), ":***%s",
					 s + (at - buf));
		}
		break;
	case OPT_INT:
		snprintf(buf, len, "%d", *(const int *)cfield(c, o->off));
		break;
	case OPT_BOOL:
		snprintf(buf, len, "%s", *(const bool *)cfield(c, o->off) ? "yes" : "no");
		break;
	case OPT_DURATION:
		units_format_duration(*(const uint64_t *)cfield(c, o->off), buf, len);
		break;
	case OPT_SIZE:
		units_format_size(*(const uint64_t *)cfield(c, o->off), buf, len);
		break;
	case OPT_ENUM:
		snprintf(buf, len, "%s", enum_word(o->words, *(const int *)cfield(c, o->off)));
		break;
	case OPT_LOGLEVEL:
		snprintf(buf, len, "%s",
			 log_level_name(*(const enum log_level *)cfield(c, o->off)));
		break;
	}
}

/*
 * Record value v of option o from a source of rank r, after checking it
 * by parsing it into the scratch config. label names the source for the
 * error ("--ttl", "IDEMPROXY_TTL", "file.ini:7: ttl").
 */
static int offer(struct build *b, const struct config_opt *o, const char *v,
		 enum src_rank r, const char *label, char *err, size_t errlen)
{
	char why[512];
	int i = opt_index(o);

	if (opt_parse(o, v, b->scratch, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "%s: %s", label, why);
		return -1;
	}
	if (r >= b->rank[i]) {
		b->val[i] = v;
		b->rank[i] = r;
	}
	return 0;
}

static bool is_flag(const char *arg, const char *lng, const char *shrt)
{
	return strcmp(arg, lng) == 0 || (shrt != NULL && strcmp(arg, shrt) == 0);
}

/* --help or --version anywhere (before "--") wins over everything else. */
static enum config_action scan_action(int argc, char **argv)
{
	int i;

	for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		if (is_flag(argv[i], "--help", "-h"))
			return CONFIG_HELP;
		if (is_flag(argv[i], "--version", "-V"))
			return CONFIG_VERSION;
	}
	return CONFIG_RUN;
}

static int read_flags(struct build *b, int argc, char **argv, char *err,
		      size_t errlen)
{
	char label[80], sh[80];
	const char *arg = NULL;
	int i;

	for (i = 1; i < argc; i++) {
		const char *name, *eq, *v;
		const struct config_opt *o;
		size_t n;

		arg = argv[i];
		if (strcmp(arg, "--") == 0) {
			if (i + 1 < argc) {
				arg = argv[i + 1];
				goto positional;
			}
			break;
		}
		if (arg[0] != '-' || arg[1] == '\0')
			goto positional;
		if (arg[1] != '-') {
			snprintf(err, errlen, "unknown option %s (see --help)",
				 shown(arg, sh, sizeof(sh)));
			return -1;
		}
		name = arg + 2;
		eq = strchr(name, '=');
		n = eq ? (size_t)(eq - name) : strlen(name);
		o = opt_by_flag(name, n);
		if (o == NULL && !(n == 12 && memcmp(name, "check-config", 12) == 0)) {
			snprintf(err, errlen, "unknown option --%.*s (see --help)",
				 (int)(n < 40 ? n : 40), name);
			return -1;
		}
		snprintf(label, sizeof(label), "--%.*s", (int)n, name);
		if (eq != NULL) {
			v = eq + 1;
		} else if (o != NULL && o->type == OPT_BOOL &&
			   (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
			v = "yes";	/* --require-key alone */
		} else if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
			/* no value of ours starts with "--": a forgotten value */
			snprintf(err, errlen, "%s: missing value", label);
			return -1;
		} else {
			v = argv[++i];
		}
		if (o == NULL) {
			if (v[0] == '\0') {
				snprintf(err, errlen, "%s: missing file name", label);
				return -1;
			}
			b->action = CONFIG_CHECK;
			b->check_file = v;
			continue;
		}
		if (offer(b, o, v, SRC_FLAG, label, err, errlen) < 0)
			return -1;
	}
	return 0;
positional:
	snprintf(err, errlen, "unexpected argument \"%s\" (options start "
		 "with --; see --help)", shown(arg, sh, sizeof(sh)));
	return -1;
}

/* Only IDEMPROXY_* names of the table are read; a first duplicate wins. */
static int read_env(struct build *b, char **envp, char *err, size_t errlen)
{
	bool seen[NOPTS] = { false };
	char label[64];
	size_t i;

	for (i = 0; envp != NULL && envp[i] != NULL; i++) {
		const char *e = envp[i], *eq = strchr(e, '=');
		const struct config_opt *o;

		if (eq == NULL || strncmp(e, ENV_PREFIX, strlen(ENV_PREFIX)) != 0)
			continue;
		o = opt_by_spelling(e, (size_t)(eq - e), true);
		if (o == NULL || seen[opt_index(o)])
			continue;
		seen[opt_index(o)] = true;
		opt_spelling(o, true, label, sizeof(label));
		if (offer(b, o, eq + 1, SRC_ENV, label, err, errlen) < 0)
			return -1;
	}
	return 0;
}

/* Reading the config file: inih drives, these keep line numbers and state. */
struct ini_ctx {
	struct build *b;
	const char *path;
	FILE *f;
	char *line;		/* getline buffer */
	size_t cap;
	int lineno;
	int first_line[NOPTS];	/* where each key was set, to refuse repeats */
	bool failed;
	int err_line;
	char *err;
	size_t errlen;
};

static void ini_fail(struct ini_ctx *x, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void ini_fail(struct ini_ctx *x, const char *fmt, ...)
{
	char why[512];
	va_list ap;

	if (x->failed)
		return;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	snprintf(x->err, x->errlen, "%s:%d: %s", x->path, x->lineno, why);
	x->failed = true;
	x->err_line = x->lineno;
}

/*
 * inih's line reader. We feed it one line per call so that our line count
 * is its line count (Debian builds inih without INI_HANDLER_LINENO), and we
 * look at section headers here because inih only tells the handler about
 * sections that contain keys. Leading blanks are stripped, which turns off
 * inih's multi-line continuation: an indented key is a key, not a silent
 * continuation of the previous value. Returning NULL ends the parse.
 */
static char *ini_read(char *str, int num, void *stream)
{
	struct ini_ctx *x = stream;
	char *p, *end, *close;
	ssize_t n;
	size_t len;

	if (x->failed)
		return NULL;
	errno = 0;
	n = getline(&x->line, &x->cap, x->f);
	if (n < 0) {
		if (ferror(x->f)) {
			x->lineno++;
			ini_fail(x, "cannot read: %s", strerror(errno ? errno : EIO));
		}
		return NULL;
	}
	x->lineno++;
	if (strlen(x->line) != (size_t)n) {
		ini_fail(x, "NUL byte in line");
		return NULL;
	}
	p = x->line;
	if (x->lineno == 1 && strncmp(p, "\xEF\xBB\xBF", 3) == 0)
		p += 3;
	while (*p == ' ' || *p == '\t')
		p++;
	len = strlen(p);
	while (len > 0 && (p[len - 1] == '\n' || p[len - 1] == '\r'))
		p[--len] = '\0';
	if (len >= (size_t)num) {
		ini_fail(x, "line too long (at most %d characters)", num - 1);
		return NULL;
	}

	if (*p == '[') {
		close = strchr(p, ']');
		if (close == NULL) {
			ini_fail(x, "missing ']' in section header");
			return NULL;
		}
		/* nothing but a comment may follow the header */
		for (end = close + 1; *end == ' ' || *end == '\t'; end++)
			;
		if (*end != '\0' && *end != ';' && *end != '#') {
			ini_fail(x, "unexpected text after section header");
			return NULL;
		}
		*close = '\0';
		for (p++; *p == ' ' || *p == '\t'; p++)
			;
		for (end = close; end > p && (end[-1] == ' ' || end[-1] == '\t'); end--)
			end[-1] = '\0';
		if (strncmp(p, "route", 5) == 0 &&
		    (p[5] == '\0' || p[5] == ' ' || p[5] == '\t')) {
			/* announced here: a route without keys is still a route
			 * (and an error: it needs a match) */
			const char *name = p + 5;
			char why[512];

			while (*name == ' ' || *name == '\t')
				name++;
			if (route_raw_section(&x->b->routes, name, x->path,
					      x->lineno, why, sizeof(why)) < 0) {
				snprintf(x->err, x->errlen, "%s", why);
				x->failed = true;
				x->err_line = x->lineno;
				return NULL;
			}
			snprintf(str, (size_t)num, "[route %s]", name);
			return str;
		}
		if (strcmp(p, INI_SECTION) != 0) {
			ini_fail(x, "unknown section [%.60s] (expected [" INI_SECTION "])",
				 p);
			return NULL;
		}
		snprintf(str, (size_t)num, "[%s]", INI_SECTION);
		return str;
	}
	memcpy(str, p, len + 1);
	return str;
}

static int ini_on_value(void *user, const char *section, const char *name,
			const char *value)
{
	struct ini_ctx *x = user;
	const struct config_opt *o;
	char label[512];
	char *copy;
	int i;

	if (section[0] == '\0') {
		ini_fail(x, "%.60s: key outside a section (put it under ["
			 INI_SECTION "])", name);
		return 0;
	}
	if (strncmp(section, "route ", 6) == 0) {
		if (route_raw_add(&x->b->routes, section + 6, name, value, x->path,
				  x->lineno, x->err, x->errlen) < 0) {
			x->failed = true;
			x->err_line = x->lineno;
			return 0;
		}
		return 1;
	}
	if (strcmp(section, INI_SECTION) != 0) {
		ini_fail(x, "unknown section [%.60s]", section);
		return 0;
	}
	o = opt_by_spelling(name, strlen(name), false);
	if (o == NULL) {
		if (strchr(name, '-') != NULL)
			ini_fail(x, "unknown key \"%.60s\" (keys use underscores, "
				 "not dashes)", name);
		else
			ini_fail(x, "unknown key \"%.60s\"", name);
		return 0;
	}
	i = opt_index(o);
	if (o->flags & OPT_NO_FILE) {
		ini_fail(x, "%s: not allowed in a config file", name);
		return 0;
	}
	if (x->first_line[i] != 0) {
		ini_fail(x, "%s: set twice (first on line %d)", name,
			 x->first_line[i]);
		return 0;
	}
	x->first_line[i] = x->lineno;
	copy = strdup(value);
	if (copy == NULL) {
		ini_fail(x, "out of memory");
		return 0;
	}
	free(x->b->owned[i]);
	x->b->owned[i] = copy;
	snprintf(label, sizeof(label), "%s:%d: %s", x->path, x->lineno, name);
	if (offer(x->b, o, copy, SRC_FILE, label, x->err, x->errlen) < 0) {
		x->failed = true;
		x->err_line = x->lineno;
		return 0;
	}
	return 1;
}

static int read_file(struct build *b, const char *path, char *err,
		     size_t errlen)
{
	struct ini_ctx x;
	int rc, ret = -1;

	memset(&x, 0, sizeof(x));
	x.b = b;
	x.path = path;
	x.err = err;
	x.errlen = errlen;
	x.f = fopen(path, "r");
	if (x.f == NULL) {
		snprintf(err, errlen, "%s: cannot open config file: %s", path,
			 strerror(errno));
		goto fail;
	}
	rc = ini_parse_stream(ini_read, &x, ini_on_value, &x);
	if (rc > 0 && (!x.failed || rc < x.err_line)) {
		snprintf(err, errlen, "%s:%d: syntax error (expected "
			 "\"key = value\" or \"[" INI_SECTION "]\")", path, rc);
		goto fail;
	}
	if (x.failed)
		goto fail;
	if (rc < 0) {
		snprintf(err, errlen, "%s: out of memory", path);
		goto fail;
	}
	ret = 0;
fail:
	if (x.f != NULL)
		fclose(x.f);
	free(x.line);
	return ret;
}

static int default_workers(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (n < 1)
		return 1;
	return n > 256 ? 256 : (int)n;
}

static char **strv_dup(char **v, int n, bool only_ours)
{
	char **out;
	int i, j = 0;

	out = calloc((size_t)n + 1, sizeof(*out));
	if (out == NULL)
		return NULL;
	for (i = 0; i < n; i++) {
		const char *eq = strchr(v[i], '=');

		if (only_ours && (eq == NULL ||
		    opt_by_spelling(v[i], (size_t)(eq - v[i]), true) == NULL))
			continue;
		out[j] = strdup(v[i]);
		if (out[j] == NULL) {
			strv_free(out);
			return NULL;
		}
		j++;
	}
	return out;
}

static int strv_len(char **v)
{
	int n = 0;

	while (v != NULL && v[n] != NULL)
		n++;
	return n;
}

/* The whole pipeline of the comment at the top; config_parse and reload. */
static int config_build(int argc, char **argv, char **envp,
			struct config **out, enum config_action *action,
			char *err, size_t errlen)
{
	struct build b;
	struct config *c = NULL;
	const char *file;
	char why[512], cpus[16], a[32], u[32];
	size_t i;
	int ret = -1;

	memset(&b, 0, sizeof(b));
	*out = NULL;
	b.action = scan_action(argc, argv);
	*action = b.action;
	if (b.action == CONFIG_HELP || b.action == CONFIG_VERSION)
		return 0;

	b.scratch = calloc(1, sizeof(*b.scratch));
	c = calloc(1, sizeof(*c));
	if (b.scratch == NULL || c == NULL) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	atomic_init(&c->refcount, 1);

	if (read_flags(&b, argc, argv, err, errlen) < 0)
		goto fail;
	if (read_env(&b, envp, err, errlen) < 0)
		goto fail;

	/* --check-config FILE names the file to check, over --config. */
	if (b.check_file != NULL) {
		i = (size_t)opt_index(opt_by_flag("config", 6));
		b.val[i] = b.check_file;
		b.rank[i] = SRC_FLAG;
	}
	file = b.val[opt_index(opt_by_flag("config", 6))];
	if (file != NULL && read_file(&b, file, err, errlen) < 0)
		goto fail;

	snprintf(cpus, sizeof(cpus), "%d", default_workers());
	for (i = 0; i < NOPTS; i++) {
		const struct config_opt *o = &options[i];
		const char *v = b.val[i] ? b.val[i] : o->def;

		if (v == NULL && (o->flags & OPT_CPUS))
			v = cpus;
		if (v == NULL)
			continue;
		if (opt_parse(o, v, c, why, sizeof(why)) < 0) {
			/* only a default can fail here: values were checked */
			snprintf(err, errlen, "--%s: default: %s", o->name, why);
			goto fail;
		}
	}

	if (c->upstream == NULL) {
		snprintf(err, errlen, "--upstream is required (or "
			 ENV_PREFIX "UPSTREAM, or upstream in the config file)");
		goto fail;
	}
	if (c->lease_ms <= c->upstream_timeout_ms) {
		units_format_duration(c->lease_ms, a, sizeof(a));
		units_format_duration(c->upstream_timeout_ms, u, sizeof(u));
		snprintf(err, errlen, "--lease (%s) must be longer than "
			 "--upstream-timeout (%s), or a slow request's claim is "
			 "taken over while it still runs", a, u);
		goto fail;
	}

	if (routes_build(c, b.routes, envp, err, errlen) < 0)
		goto fail;

	c->argc = argc;
	c->argv = strv_dup(argv, argc, false);
	c->env = strv_dup(envp, strv_len(envp), true);
	if (c->argv == NULL || c->env == NULL) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	*out = c;
	*action = b.action;
	c = NULL;
	ret = 0;
fail:
	config_free(c);
	config_free(b.scratch);
	route_raw_free(b.routes);
	for (i = 0; i < NOPTS; i++)
		free(b.owned[i]);
	return ret;
}

int config_parse(int argc, char **argv, char **envp, struct config **out,
		 enum config_action *action, char *err, size_t errlen)
{
	if (errlen > 0)
		err[0] = '\0';
	return config_build(argc, argv, envp, out, action, err, errlen);
}

/*
 * Settings marked OPT_RESTART are bound at start (sockets, threads, store
 * connections). When the file changed them, the new config keeps the
 * running value, so that it describes the process as it really is, and a
 * warning says a restart is needed.
 */
struct config *config_reload(const struct config *running, char *err,
			     size_t errlen)
{
	struct config *c;
	enum config_action action;
	char why[512], was[512], now[512], shown_was[512], shown_now[512];
	size_t i;

	if (errlen > 0)
		err[0] = '\0';
	if (config_build(running->argc, running->argv, running->env, &c,
			 &action, err, errlen) < 0)
		return NULL;
	if (c == NULL) {
		snprintf(err, errlen, "reload: the command line asks for no config");
		return NULL;
	}
	for (i = 0; i < NOPTS; i++) {
		const struct config_opt *o = &options[i];

		if (!(o->flags & OPT_RESTART))
			continue;
		opt_format(o, running, false, was, sizeof(was));
		opt_format(o, c, false, now, sizeof(now));
		if (strcmp(was, now) == 0)
			continue;
		opt_format(o, running, true, shown_was, sizeof(shown_was));
		opt_format(o, c, true, shown_now, sizeof(shown_now));
		log_warn("config reload: %s changed from %s to %s; it needs a "
			 "restart, keeping %s", o->name, shown_was, shown_now,
			 shown_was);
		opt_clear(o, c);
		if (o->type != OPT_INT &&
		    *(char *const *)cfield(running, o->off) == NULL)
			continue;	/* it was unset (redis off) */
		if (opt_parse(o, was, c, why, sizeof(why)) < 0) {
			snprintf(err, errlen, "reload: %s: %s", o->name, why);
			config_free(c);
			return NULL;
		}
	}
	return c;
}

void config_print(const struct config *cfg, FILE *out)
{
	char key[64], val[1024];
	size_t i;

	for (i = 0; i < NOPTS; i++) {
		opt_spelling(&options[i], false, key, sizeof(key));
		opt_format(&options[i], cfg, true, val, sizeof(val));
		fprintf(out, "%s = %s\n", key, val);
	}
	routes_print(cfg, out);
}

void config_usage(FILE *out)
{
	char env[64], def[64];
	size_t i;

	fprintf(out,
		"Usage: idemproxy --upstream URL [options]\n"
		"       idemproxy --check-config FILE [options]\n"
		"       idemproxy --version | --help\n"
		"\n"
		"idemproxy %s - an idempotency sidecar for HTTP/1.1 upstreams.\n"
		"\n"
		"Every option is also read from the environment and from the\n"
		"[" INI_SECTION "] section of the config file (dashes written as\n"
		"underscores). Precedence: flag > environment > file > default.\n"
		"Durations: 250ms, 10s, 5m, 24h. Sizes: 4096, 512KiB, 1MiB.\n"
		"\n"
		"Options:\n", IDEMPROXY_VERSION);
	for (i = 0; i < NOPTS; i++) {
		const struct config_opt *o = &options[i];

		opt_spelling(o, true, env, sizeof(env));
		snprintf(def, sizeof(def), "%s", o->def ? o->def : o->defdoc);
		if (o->type == OPT_BOOL)
			fprintf(out, "  --%s[=yes|no]\n", o->name);
		else
			fprintf(out, "  --%s %s\n", o->name, o->metavar);
		fprintf(out, "        %s\n        env %s, default %s\n", o->help,
			env, def);
	}
	fprintf(out,
		"  --check-config FILE\n"
		"        parse FILE with the flags and environment, print the\n"
		"        effective settings and exit (0 if valid, 2 if not)\n"
		"  -h, --help\n"
		"        print this help and exit\n"
		"  -V, --version\n"
		"        print the version and exit\n");
}

void config_version(FILE *out)
{
	fprintf(out, "idemproxy %s\n", IDEMPROXY_VERSION);
}

struct config *config_ref(struct config *cfg)
{
	atomic_fetch_add_explicit(&cfg->refcount, 1, memory_order_relaxed);
	return cfg;
}

void config_unref(struct config *cfg)
{
	if (cfg == NULL)
		return;
	/* acq_rel: the last owner must see every other owner's reads done */
	if (atomic_fetch_sub_explicit(&cfg->refcount, 1, memory_order_acq_rel) == 1)
		config_free(cfg);
}
