/*
 * config.c - idemproxy's settings, from one table.
 *
 * Each row of `options` below is one setting: its long flag name, how its
 * value is parsed (a syntax of setting.h, which route.c's table shares, or
 * an address of hostport.h), where it lands in struct config, its default
 * (a string, parsed by the same code as user input) and its help. From the
 * flag name the other spellings are derived:
 *
 *     flag      --log-format json
 *     env       IDEMPROXY_LOG_FORMAT=json
 *     ini       log_format = json          (in the [idemproxy] section)
 *
 * A build runs the sources from the highest precedence down:
 *
 *     argv ──▶ environment ──▶ config file ──▶ defaults ──▶ cross-checks
 *                                  (inifile.c)                    │
 *                                                     policies ◀──┘
 *                                                     (route.c)
 *
 * Every value of every source is parsed into a scratch config as it is
 * read, so that a typo is an error even when a higher source overrides it
 * (DESIGN.md §7); the winning string of each option is remembered and
 * parsed once more into the config that is handed out. Nothing here exits
 * or prints: errors come back as one line naming the option and where it
 * came from, and the caller decides (exit 2 at start, keep the old config
 * on SIGHUP).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config.h"
#include "hostport.h"
#include "httphdr.h"
#include "inifile.h"
#include "log.h"
#include "setting.h"
#include "units.h"

#ifndef IDEMPROXY_VERSION
#define IDEMPROXY_VERSION "unknown"
#endif

#define ENV_PREFIX "IDEMPROXY_"
#define INI_SECTION "idemproxy"

enum opt_type {
	OPT_VALUE,		/* .syn: a value of setting.h's syntax */
	OPT_HOSTPORT,		/* ADDR:PORT, into a char * and a struct hostport */
	OPT_URL_UPSTREAM,	/* http[s]://HOST[:PORT][/prefix] */
	OPT_STORE,		/* memory | postgres://... */
	OPT_REDIS_URL,		/* redis://HOST[:PORT][/DB] */
	OPT_METHODS,		/* POST,PATCH into a bitmask */
	OPT_LOGLEVEL,		/* debug|info|warn|error */
};

/* Row flags. */
#define OPT_RESTART	0x01	/* SIGHUP cannot change it: a restart can */
#define OPT_NO_FILE	0x02	/* meaningless inside the config file */
#define OPT_CPUS	0x04	/* default is the number of online CPUs */

struct config_opt {
	const char *name;	/* long flag without the dashes */
	enum opt_type type;
	struct setting_syntax syn;	/* OPT_VALUE */
	size_t off;		/* the field */
	size_t aux;		/* HOSTPORT: its struct hostport; METHODS: mask */
	const char *def;	/* NULL: unset (see defdoc) */
	const char *defdoc;	/* what --help says when def is NULL */
	const char *metavar;	/* NULL for booleans */
	unsigned flags;
	const char *help;
};

static const struct setting_word log_format_words[] = {
	{ "text", LOG_FORMAT_TEXT },
	{ "json", LOG_FORMAT_JSON },
	{ NULL, 0 },
};

static const struct setting_word access_log_format_words[] = {
	{ "text", ALOG_FORMAT_TEXT },
	{ "json", ALOG_FORMAT_JSON },
	{ NULL, 0 },
};

static const struct setting_word xff_words[] = {
	{ "append", XFF_APPEND },
	{ "off", XFF_OFF },
	{ NULL, 0 },
};

static const struct setting_word tls_client_cert_words[] = {
	{ "optional", TLS_CLIENT_CERT_OPTIONAL },
	{ "required", TLS_CLIENT_CERT_REQUIRED },
	{ NULL, 0 },
};

_Static_assert(sizeof(enum log_format) == sizeof(int) &&
	       sizeof(enum alog_format) == sizeof(int) &&
	       sizeof(enum tls_client_cert) == sizeof(int) &&
	       sizeof(enum xff_mode) == sizeof(int),
	       "log_format and tls_client_cert are set as words");

#define F(field) offsetof(struct config, field)
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
	  .help = "the protected HTTP/1.1 server, http[s]://HOST[:PORT][/PREFIX]; "
		  "PREFIX is prepended to every request-target" },
	{ .name = "store", .type = OPT_STORE, .off = F(store), .def = "memory",
	  .metavar = "memory|postgres://...", .flags = OPT_RESTART,
	  .help = "where idempotency records live: memory (one process, no "
		  "durability) or a PostgreSQL URL" },
	{ .name = "redis", .type = OPT_REDIS_URL, .off = F(redis),
	  .aux = F(redis_hp), .defdoc = "off",
	  .metavar = "redis://HOST[:PORT][/DB]", .flags = OPT_RESTART,
	  .help = "optional cache of completed responses in front of PostgreSQL; "
		  "redis-sentinel://HOST[:PORT],.../MASTER[/DB] follows the "
		  "master the sentinels name" },
	{ .name = "admin-listen", .type = OPT_HOSTPORT, .off = F(admin_listen),
	  .aux = F(admin_hp), .def = "127.0.0.1:9090", .metavar = "ADDR:PORT",
	  .flags = OPT_RESTART,
	  .help = "address for /healthz, /readyz, /metrics and /keys" },
	{ .name = "admin-token-file", .syn = SYNTAX_STRING,
	  .off = F(admin_token_file), .defdoc = "off", .metavar = "FILE",
	  .help = "bearer token (the file's first line) that DELETE /keys and "
		  "GET /keys?body=1 require; without it they are off. Re-read "
		  "on SIGHUP" },
	{ .name = "config", .syn = SYNTAX_STRING, .off = F(config_file),
	  .defdoc = "none", .metavar = "FILE", .flags = OPT_NO_FILE,
	  .help = "INI file with an [idemproxy] section; re-read on SIGHUP" },
	{ .name = "workers", .syn = SYNTAX_INT(1, 256), .off = F(workers),
	  .defdoc = "number of online CPUs", .metavar = "N",
	  .flags = OPT_RESTART | OPT_CPUS,
	  .help = "event-loop threads (1-256)" },
	{ .name = "key-header", .syn = SYNTAX_TOKEN, .off = F(key_header),
	  .def = "Idempotency-Key", .metavar = "NAME",
	  .help = "request header that carries the idempotency key" },
	{ .name = "methods", .type = OPT_METHODS, .off = F(methods),
	  .aux = F(methods_mask), .def = "POST,PATCH", .metavar = "LIST",
	  .help = "comma-separated HTTP methods that are protected "
		  "(case-sensitive)" },
	{ .name = "require-key", .syn = SYNTAX_BOOL, .off = F(require_key),
	  .def = "no",
	  .help = "answer 400 to a protected request without a key" },
	{ .name = "in-flight", .syn = SYNTAX_WORDS(policy_in_flight_words),
	  .off = F(in_flight),
	  .def = "wait", .metavar = "wait|reject",
	  .help = "a duplicate of a request still running waits for its "
		  "response, or gets 409 at once" },
	{ .name = "wait-timeout", .syn = SYNTAX_DURATION(1), .off = F(wait_timeout_ms),
	  .def = "10s", .metavar = "DUR",
	  .help = "longest a waiting duplicate is held before 409" },
	{ .name = "ttl", .syn = SYNTAX_DURATION(1), .off = F(ttl_ms), .def = "24h",
	  .metavar = "DUR",
	  .help = "how long a completed response is kept and replayed" },
	{ .name = "lease", .syn = SYNTAX_DURATION(1), .off = F(lease_ms),
	  .def = "30s", .metavar = "DUR",
	  .help = "an in-flight claim whose owner is silent this long has an "
		  "unknown outcome; must be longer than --upstream-timeout" },
	{ .name = "upstream-timeout", .syn = SYNTAX_DURATION(1),
	  .off = F(upstream_timeout_ms), .def = "20s", .metavar = "DUR",
	  .help = "wait for the upstream's response head (then the client gets "
		  "504 and a keyed exchange goes on), and for each gap while "
		  "reading its response" },
	{ .name = "upstream-deadline", .syn = SYNTAX_DURATION(1),
	  .off = F(upstream_deadline_ms), .def = "5m", .metavar = "DUR",
	  .help = "how long a keyed request's late response is awaited after "
		  "the request was sent, to be stored and replayed; then its "
		  "outcome is unknown" },
	{ .name = "max-body", .syn = SYNTAX_SIZE(1, GIB), .off = F(max_body),
	  .def = "1MiB", .metavar = "SIZE",
	  .help = "largest keyed request body (buffered); larger gets 413" },
	/* stored as bytea, which PostgreSQL caps at 1 GB */
	{ .name = "max-cached-response", .syn = SYNTAX_SIZE(1, 512 * MIB),
	  .off = F(max_cached_response), .def = "8MiB", .metavar = "SIZE",
	  .help = "largest response stored for replay; larger ones are "
		  "streamed and not stored" },
	{ .name = "store-down", .syn = SYNTAX_WORDS(policy_store_down_words),
	  .off = F(store_down), .def = "fail-closed",
	  .metavar = "fail-closed|fail-open",
	  .help = "when PostgreSQL is unreachable, keyed requests get 503 or "
		  "are forwarded unprotected" },
	{ .name = "release-statuses", .syn = SYNTAX_STATUSES,
	  .off = F(release_statuses), .def = "500,503,401,408,425,429",
	  .metavar = "LIST",
	  .help = "upstream statuses that release the key for a retry (the app "
		  "did not or could not act); every other one is stored and "
		  "replayed" },
	{ .name = "on-upstream-error", .syn = SYNTAX_WORDS(policy_upstream_error_words),
	  .off = F(on_upstream_error), .def = "release",
	  .metavar = "release|keep",
	  .help = "shorthand: keep stores every 5xx, whatever "
		  "--release-statuses lists" },
	{ .name = "unknown-outcome", .syn = SYNTAX_WORDS(policy_unknown_words),
	  .off = F(unknown_outcome), .def = "keep", .metavar = "keep|release",
	  .help = "a request that may have executed and has no answer: kept "
		  "as unknown and never sent again, or released so that a "
		  "retry executes (at-least-once)" },
	{ .name = "drain-timeout", .syn = SYNTAX_DURATION(0),
	  .off = F(drain_timeout_ms), .def = "20s", .metavar = "DUR",
	  .help = "on SIGTERM, how long in-flight exchanges may finish "
		  "(0: exit at once)" },
	{ .name = "sweep-interval", .syn = SYNTAX_DURATION(1),
	  .off = F(sweep_interval_ms), .def = "10s", .metavar = "DUR",
	  .help = "how often expired records are deleted" },
	{ .name = "log-level", .type = OPT_LOGLEVEL, .off = F(log_level),
	  .def = "info", .metavar = "debug|info|warn|error",
	  .help = "least severe level logged" },
	{ .name = "log-format", .syn = SYNTAX_WORDS(log_format_words),
	  .off = F(log_format), .def = "text", .metavar = "text|json",
	  .help = "one line per event on stderr, as text or JSON" },
	{ .name = "access-log", .syn = SYNTAX_STRING, .off = F(access_log),
	  .def = "off", .metavar = "stderr|stdout|PATH|off",
	  .help = "one line per request; a PATH is reopened on SIGUSR1 "
		  "(logrotate)" },
	{ .name = "access-log-format", .syn = SYNTAX_WORDS(access_log_format_words),
	  .off = F(access_log_format), .def = "text", .metavar = "text|json",
	  .help = "access-log lines as nginx's combined format plus the "
		  "idempotency fields, or one JSON object each" },
	{ .name = "access-log-query", .syn = SYNTAX_BOOL,
	  .off = F(access_log_query), .def = "no",
	  .help = "log the target's query string too (it may hold secrets)" },
	{ .name = "trusted-proxies", .syn = SYNTAX_STRING,
	  .off = F(trusted_proxies), .defdoc = "none", .metavar = "CIDR,...",
	  .help = "peers whose X-Forwarded-For names the client in the access "
		  "log and traces, e.g. 10.0.0.0/8,127.0.0.1" },
	{ .name = "proxy-protocol", .syn = SYNTAX_STRING,
	  .off = F(proxy_protocol), .defdoc = "off", .metavar = "CIDR,...",
	  .help = "connections from these sources start with a PROXY protocol "
		  "header (v1 or v2) naming the client, e.g. 10.0.0.0/8; "
		  "required from them, refused from anyone else" },
	{ .name = "x-forwarded-for", .syn = SYNTAX_WORDS(xff_words),
	  .off = F(forwarded_for), .def = "append", .metavar = "append|off",
	  .help = "append the client's address to X-Forwarded-For upstream, "
		  "or pass the field on as the client sent it" },
	{ .name = "request-id-header", .syn = SYNTAX_TOKEN,
	  .off = F(request_id_header), .def = "X-Request-Id", .metavar = "NAME",
	  .help = "the request id: the client's when well-formed, else made; "
		  "sent upstream, echoed in the response and logged" },
	{ .name = "otel-endpoint", .syn = SYNTAX_STRING,
	  .off = F(otel_opt[OTEL_OPT_ENDPOINT]), .defdoc = "$OTEL_EXPORTER_OTLP_ENDPOINT",
	  .metavar = "URL", .flags = OPT_RESTART,
	  .help = "OTLP/HTTP collector base URL (spans to URL/v1/traces); "
		  "tracing is off without one" },
	{ .name = "otel-traces-endpoint", .syn = SYNTAX_STRING,
	  .off = F(otel_opt[OTEL_OPT_TRACES_ENDPOINT]),
	  .defdoc = "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", .metavar = "URL",
	  .flags = OPT_RESTART,
	  .help = "the full URL spans are POSTed to, over --otel-endpoint" },
	{ .name = "otel-headers", .syn = SYNTAX_STRING,
	  .off = F(otel_opt[OTEL_OPT_HEADERS]),
	  .defdoc = "$OTEL_EXPORTER_OTLP_HEADERS", .metavar = "K=V,...",
	  .flags = OPT_RESTART,
	  .help = "header fields of every export request (percent-encoded)" },
	{ .name = "otel-service-name", .syn = SYNTAX_STRING,
	  .off = F(otel_opt[OTEL_OPT_SERVICE_NAME]),
	  .defdoc = "$OTEL_SERVICE_NAME, else idemproxy", .metavar = "NAME",
	  .flags = OPT_RESTART, .help = "service.name of the spans" },
	{ .name = "otel-resource-attributes", .syn = SYNTAX_STRING,
	  .off = F(otel_opt[OTEL_OPT_RESOURCE_ATTRIBUTES]),
	  .defdoc = "$OTEL_RESOURCE_ATTRIBUTES", .metavar = "K=V,...",
	  .flags = OPT_RESTART, .help = "resource attributes of the spans" },
	{ .name = "otel-traces-sampler", .syn = SYNTAX_STRING,
	  .off = F(otel_opt[OTEL_OPT_SAMPLER]),
	  .defdoc = "$OTEL_TRACES_SAMPLER, else parentbased_always_on",
	  .metavar = "NAME", .flags = OPT_RESTART,
	  .help = "always_on, always_off, traceidratio, parentbased_always_on, "
		  "parentbased_always_off or parentbased_traceidratio" },
	{ .name = "otel-traces-sampler-arg", .syn = SYNTAX_STRING,
	  .off = F(otel_opt[OTEL_OPT_SAMPLER_ARG]),
	  .defdoc = "$OTEL_TRACES_SAMPLER_ARG, else 1.0", .metavar = "RATIO",
	  .flags = OPT_RESTART,
	  .help = "the traceidratio samplers' ratio, 0 to 1" },
	{ .name = "otel-sdk-disabled", .syn = SYNTAX_BOOL,
	  .off = F(otel_disabled), .def = "no", .flags = OPT_RESTART,
	  .help = "no spans, whatever the OTEL_* variables say "
		  "($OTEL_SDK_DISABLED=true does the same)" },
	{ .name = "client-timeout", .syn = SYNTAX_DURATION(1),
	  .off = F(client_timeout_ms), .def = "10s", .metavar = "DUR",
	  .help = "wait for a request head, and for each gap while reading a "
		  "body; then 408" },
	{ .name = "tunnel-idle-timeout", .syn = SYNTAX_DURATION(1),
	  .off = F(tunnel_idle_timeout_ms), .def = "1h", .metavar = "DUR",
	  .help = "close an upgraded connection (a WebSocket) when no byte "
		  "went either way for this long" },
	{ .name = "idle-timeout", .syn = SYNTAX_DURATION(1),
	  .off = F(idle_timeout_ms), .def = "60s", .metavar = "DUR",
	  .help = "close a keep-alive client connection idle this long" },
	{ .name = "max-header-size", .syn = SYNTAX_SIZE(KIB, MIB),
	  .off = F(max_header_size), .def = "32KiB", .metavar = "SIZE",
	  .help = "largest request line plus headers; larger gets 431" },
	{ .name = "max-connections", .syn = SYNTAX_INT(1, 1000000),
	  .off = F(max_connections), .def = "10000", .metavar = "N",
	  .help = "client connections per worker; accepting pauses beyond" },
	{ .name = "issued-key-ttl", .syn = SYNTAX_DURATION(1),
	  .off = F(issued_key_ttl_ms), .def = "10m", .metavar = "DUR",
	  .help = "how long a key from GET /.well-known/idempotency-key may "
		  "wait to be used (routes with require_issued_key)" },
	{ .name = "fingerprint", .syn = SYNTAX_WORDS(policy_fp_body_words),
	  .off = F(fp_body), .def = "body", .metavar = "body|json|form",
	  .help = "what of a keyed body counts as the same request: its bytes, "
		  "its canonical JSON (RFC 8785), or its form fields decoded and "
		  "sorted" },
	{ .name = "fingerprint-ignore", .syn = SYNTAX_STRING,
	  .off = F(fp_ignore), .defdoc = "none", .metavar = "LIST",
	  .help = "JSON pointers (json) or form field names (form) the "
		  "fingerprint leaves out, e.g. /sent_at,/meta/nonce" },
	{ .name = "fingerprint-only", .syn = SYNTAX_STRING,
	  .off = F(fp_only), .defdoc = "the whole body", .metavar = "LIST",
	  .help = "instead of --fingerprint-ignore: the only JSON pointers or "
		  "form fields the fingerprint covers" },
	{ .name = "fingerprint-query", .syn = SYNTAX_WORDS(policy_fp_query_words),
	  .off = F(fp_query), .def = "exact", .metavar = "exact|sorted|ignore",
	  .help = "the query string as sent, its parameters decoded, sorted "
		  "and re-encoded, or none of it" },
	{ .name = "memory-max-bytes", .syn = SYNTAX_SIZE(MIB, 64 * 1024 * MIB),
	  .off = F(memory_max_bytes), .def = "256MiB", .metavar = "SIZE",
	  .help = "memory store: records and responses together; beyond, new "
		  "keys get the store-down policy" },
	{ .name = "max-buffered", .syn = SYNTAX_SIZE(MIB, 64 * 1024 * MIB),
	  .off = F(max_buffered), .def = "256MiB", .metavar = "SIZE",
	  .help = "keyed request bodies buffered at once, all connections "
		  "together; beyond, 503 server-busy" },
	{ .name = "store-connections", .syn = SYNTAX_INT(1, 64),
	  .off = F(store_connections), .def = "4", .metavar = "N",
	  .flags = OPT_RESTART,
	  .help = "PostgreSQL statement connections per worker, opened as load "
		  "needs them (plus one listener per worker)" },
	{ .name = "response-cache", .syn = SYNTAX_SIZE(0, 64 * 1024 * MIB),
	  .off = F(response_cache), .def = "64MiB", .metavar = "SIZE",
	  .flags = OPT_RESTART,
	  .help = "in-process cache of completed responses in front of "
		  "PostgreSQL and Redis (0: off)" },
	{ .name = "tls-cert", .syn = SYNTAX_STRING, .off = F(tls_cert),
	  .defdoc = "off", .metavar = "FILE",
	  .help = "PEM certificate (chain allowed): the listener speaks HTTPS; "
		  "re-read on SIGHUP" },
	{ .name = "tls-key", .syn = SYNTAX_STRING, .off = F(tls_key),
	  .defdoc = "off", .metavar = "FILE",
	  .help = "PEM private key of --tls-cert (not encrypted); re-read on "
		  "SIGHUP" },
	{ .name = "tls-ciphers", .syn = SYNTAX_STRING, .off = F(tls_ciphers),
	  .defdoc = "OpenSSL's default", .metavar = "LIST",
	  .help = "OpenSSL cipher list for TLS 1.2 clients (TLS 1.3 suites "
		  "are OpenSSL's)" },
	{ .name = "tls-client-ca", .syn = SYNTAX_STRING, .off = F(tls_client_ca),
	  .defdoc = "off", .metavar = "FILE",
	  .help = "PEM CA certificates that client certificates are verified "
		  "against (mutual TLS; routes may scope by tls:subject or "
		  "tls:san); re-read on SIGHUP" },
	{ .name = "tls-client-cert", .syn = SYNTAX_WORDS(tls_client_cert_words),
	  .off = F(tls_client_cert), .def = "optional",
	  .metavar = "optional|required",
	  .help = "with --tls-client-ca: a client may connect without a "
		  "certificate (tls: routes answer it 401), or must show one" },
	{ .name = "upstream-ca", .syn = SYNTAX_STRING, .off = F(upstream_ca),
	  .defdoc = "the system store", .metavar = "FILE", .flags = OPT_RESTART,
	  .help = "PEM CA certificates an https upstream is verified against" },
	{ .name = "upstream-client-cert", .syn = SYNTAX_STRING,
	  .off = F(upstream_client_cert), .defdoc = "none", .metavar = "FILE",
	  .flags = OPT_RESTART,
	  .help = "PEM certificate (chain allowed) shown to an https upstream "
		  "that asks for one (mutual TLS)" },
	{ .name = "upstream-client-key", .syn = SYNTAX_STRING,
	  .off = F(upstream_client_key), .defdoc = "none", .metavar = "FILE",
	  .flags = OPT_RESTART,
	  .help = "PEM private key of --upstream-client-cert" },
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

/* Is o's field a char *? */
static bool opt_is_string(const struct config_opt *o)
{
	if (o->type == OPT_VALUE)
		return o->syn.type == SETTING_STRING || o->syn.type == SETTING_TOKEN;
	return o->type != OPT_LOGLEVEL;
}

static bool opt_is_bool(const struct config_opt *o)
{
	return o->type == OPT_VALUE && o->syn.type == SETTING_BOOL;
}

const struct setting_syntax *config_option_syntax(const struct config *cfg,
						  const char *key,
						  const void **value)
{
	const struct config_opt *o = opt_by_spelling(key, strlen(key), false);

	if (o == NULL || o->type != OPT_VALUE)
		return NULL;
	if (cfg != NULL && value != NULL)
		*value = cfield(cfg, o->off);
	return &o->syn;
}

/* config_option_syntax as route.c calls it: without knowing the type. */
static const struct setting_syntax *route_option(const void *opts,
						 const char *name,
						 const void **value)
{
	return config_option_syntax(opts, name, value);
}

static int build_routing(struct config *c, const struct route_raw *raw,
			 char **envp, char *err, size_t errlen)
{
	struct route_options o = {
		.key_header = c->key_header,
		.upstream_timeout_ms = c->upstream_timeout_ms,
		.methods_mask = c->methods_mask,
		.client_certs = c->tls_client_ca != NULL,
		.option = route_option,
		.opts = c,
	};

	return routes_build(&c->routing, &o, raw, envp, err, errlen);
}

/*
 * The options with a syntax of their own: the string as given lands in
 * o->off, and what was made of it in fields of its own.
 */
static int parse_special(const struct config_opt *o, const char *v,
			 struct config *c, char *err, size_t errlen)
{
	char sh[80];
	int rc = 0;

	switch (o->type) {
	case OPT_STORE:
		if (strcmp(v, "memory") != 0 && strncmp(v, "postgres://", 11) != 0 &&
		    strncmp(v, "postgresql://", 13) != 0) {
			snprintf(err, errlen, "invalid store \"%s\" (use memory or "
				 "a postgres:// URL)", setting_shown(v, sh, sizeof(sh)));
			rc = -1;
		}
		break;
	case OPT_HOSTPORT:
		rc = hostport_parse(v, NULL, 0, field(c, o->aux), err, errlen);
		break;
	case OPT_URL_UPSTREAM:
		rc = hostport_parse_http_url(v, &c->upstream_hp,
					     &c->upstream_prefix,
					     &c->upstream_tls, err, errlen);
		break;
	case OPT_REDIS_URL:
		rc = hostport_parse_redis_url(v, field(c, o->aux), &c->redis_db,
					      &c->redis_master, err, errlen);
		break;
	case OPT_METHODS:
		rc = setting_parse_methods(v, field(c, o->aux), err, errlen);
		break;
	default:
		break;
	}
	if (rc < 0)
		return -1;
	return setting_set_string(field(c, o->off), v, err, errlen);
}

/*
 * Parse one value of option o into c, replacing what was there. On error
 * err gets the reason, without the option's name (the caller knows where
 * the value came from and prefixes it).
 */
static int opt_parse(const struct config_opt *o, const char *v,
		     struct config *c, char *err, size_t errlen)
{
	char sh[80];
	enum log_level lvl;

	switch (o->type) {
	case OPT_VALUE:
		return setting_parse(&o->syn, v, field(c, o->off), err, errlen);
	case OPT_STORE:
	case OPT_HOSTPORT:
	case OPT_URL_UPSTREAM:
	case OPT_REDIS_URL:
	case OPT_METHODS:
		return parse_special(o, v, c, err, errlen);
	case OPT_LOGLEVEL:
		if (log_level_parse(v, &lvl) < 0) {
			snprintf(err, errlen, "invalid log level \"%s\" (use debug, "
				 "info, warn or error)", setting_shown(v, sh, sizeof(sh)));
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
	case OPT_VALUE:
		setting_clear(&o->syn, field(c, o->off));
		return;
	case OPT_URL_UPSTREAM:
		hostport_clear(&c->upstream_hp);
		free(c->upstream_prefix);
		c->upstream_prefix = NULL;
		break;
	case OPT_HOSTPORT:
		hostport_clear(field(c, o->aux));
		break;
	case OPT_REDIS_URL:
		hostport_clear(field(c, o->aux));
		free(c->redis_master);
		c->redis_master = NULL;
		break;
	case OPT_STORE:
	case OPT_METHODS:
		break;
	case OPT_LOGLEVEL:
		return;
	}
	free(*(char **)field(c, o->off));
	*(char **)field(c, o->off) = NULL;
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
	routes_free(&c->routing);
	cidr_clear(&c->trusted);
	cidr_clear(&c->pp_from);
	free(c->upstream_addr);
	otel_settings_free(&c->otel);
	strv_free(c->argv);
	strv_free(c->env);
	free(c);
}

/* Is s at a "password=" that starts a parameter (after start, '?', '&'
 * or blanks)? */
static bool at_password(const char *start, const char *s)
{
	return strncasecmp(s, "password=", 9) == 0 &&
	       (s == start || strchr("?& \t", s[-1]) != NULL);
}

void config_redact_conninfo(const char *s, char *out, size_t len)
{
	const char *scheme = strstr(s, "://");
	const char *at = scheme ? strchr(scheme + 3, '@') : NULL;
	const char *colon = scheme ? strchr(scheme + 3, ':') : NULL;
	size_t n = 0;

	if (len == 0)
		return;
	for (const char *p = s; *p != '\0' && n + 1 < len; ) {
		if (colon != NULL && at != NULL && colon < at && p == colon) {
			n += (size_t)snprintf(out + n, len - n, ":***");
			p = at;		/* the URL's user:password@ */
			continue;
		}
		if (at_password(s, p)) {
			n += (size_t)snprintf(out + n, len - n, "password=***");
			p += 9;
			if (*p == '\'') {	/* key='quoted \' value' */
				for (p++; *p != '\0' && *p != '\''; p++)
					if (*p == '\\' && p[1] != '\0')
						p++;
				if (*p == '\'')
					p++;
			} else {
				p += strcspn(p, scheme ? "&#" : " \t");
			}
			continue;
		}
		out[n++] = *p++;
	}
	out[n < len ? n : len - 1] = '\0';
}

/* Value of o in c as config_print shows it; mask hides passwords. */
static void opt_format(const struct config_opt *o, const struct config *c,
		       bool mask, char *buf, size_t len)
{
	const char *s;

	if (o->type == OPT_LOGLEVEL) {
		snprintf(buf, len, "%s",
			 log_level_name(*(const enum log_level *)cfield(c, o->off)));
		return;
	}
	if (!opt_is_string(o)) {
		setting_format(&o->syn, cfield(c, o->off), buf, len);
		return;
	}
	s = *(char *const *)cfield(c, o->off);
	if (s == NULL) {
		snprintf(buf, len, "%s", o->defdoc ? o->defdoc : "");
		return;
	}
	if (mask && o->type == OPT_STORE)
		config_redact_conninfo(s, buf, len);
	else
		snprintf(buf, len, "%s", s);
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
				 setting_shown(arg, sh, sizeof(sh)));
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
		} else if (o != NULL && opt_is_bool(o) &&
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
		 "with --; see --help)", setting_shown(arg, sh, sizeof(sh)));
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

/* Reading the config file (inifile.h): [idemproxy] and [route NAME]. */
struct file_ctx {
	struct build *b;
	int first_line[NOPTS];	/* where each key was set, to refuse repeats */
};

static int file_section(void *user, const struct inifile_pos *at,
			const char *name, char *err, size_t errlen)
{
	struct file_ctx *x = user;
	const char *route = route_section_name(name);

	/* announced here: a route without keys is still a route (and an
	 * error: it needs a match) */
	if (route != NULL)
		return route_raw_section(&x->b->routes, route, at->path, at->line,
					 err, errlen);
	if (strcmp(name, INI_SECTION) != 0) {
		inifile_error(at, err, errlen, "unknown section [%.60s] (expected "
			      "[" INI_SECTION "])", name);
		return -1;
	}
	return 0;
}

static int file_value(void *user, const struct inifile_pos *at,
		      const char *section, const char *key, const char *value,
		      char *err, size_t errlen)
{
	struct file_ctx *x = user;
	const char *route = route_section_name(section);
	const struct config_opt *o;
	char label[512];
	int i;

	if (section[0] == '\0') {
		inifile_error(at, err, errlen, "%.60s: key outside a section (put "
			      "it under [" INI_SECTION "])", key);
		return -1;
	}
	if (route != NULL)
		return route_raw_add(&x->b->routes, route, key, value, at->path,
				     at->line, err, errlen);
	o = opt_by_spelling(key, strlen(key), false);
	if (o == NULL) {
		inifile_error(at, err, errlen, "unknown key \"%.60s\"%s", key,
			      strchr(key, '-') != NULL ? " (keys use underscores, "
			      "not dashes)" : "");
		return -1;
	}
	i = opt_index(o);
	if (o->flags & OPT_NO_FILE) {
		inifile_error(at, err, errlen, "%s: not allowed in a config file",
			      key);
		return -1;
	}
	if (x->first_line[i] != 0) {
		inifile_error(at, err, errlen, "%s: set twice (first on line %d)",
			      key, x->first_line[i]);
		return -1;
	}
	x->first_line[i] = at->line;
	/* inih reuses its line buffer; the build keeps the winning string */
	if (setting_set_string(&x->b->owned[i], value, err, errlen) < 0)
		return -1;
	snprintf(label, sizeof(label), "%s:%d: %s", at->path, at->line, key);
	return offer(x->b, o, x->b->owned[i], SRC_FILE, label, err, errlen);
}

static int read_file(struct build *b, const char *path, char *err,
		     size_t errlen)
{
	static const struct inifile_handler handler = {
		.section = file_section,
		.value = file_value,
		.main_section = INI_SECTION,
	};
	struct file_ctx x = { .b = b };

	return inifile_read(path, &handler, &x, err, errlen);
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

		/* ours, and the standard OTEL_* variables (otel.h) */
		if (only_ours && (eq == NULL ||
		    (opt_by_spelling(v[i], (size_t)(eq - v[i]), true) == NULL &&
		     strncmp(v[i], "OTEL_", 5) != 0)))
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

/* argv, then the environment, then the file either names, into b. */
static int read_sources(struct build *b, int argc, char **argv, char **envp,
			char *err, size_t errlen)
{
	size_t cf = (size_t)opt_index(opt_by_flag("config", 6));

	if (read_flags(b, argc, argv, err, errlen) < 0 ||
	    read_env(b, envp, err, errlen) < 0)
		return -1;
	/* --check-config FILE names the file to check, over --config. */
	if (b->check_file != NULL) {
		b->val[cf] = b->check_file;
		b->rank[cf] = SRC_FLAG;
	}
	if (b->val[cf] != NULL && read_file(b, b->val[cf], err, errlen) < 0)
		return -1;
	return 0;
}

/* The winning value of each option, or its default, parsed into c. */
static int settle(const struct build *b, struct config *c, char *err,
		  size_t errlen)
{
	char why[512], cpus[16];
	size_t i;

	snprintf(cpus, sizeof(cpus), "%d", default_workers());
	for (i = 0; i < NOPTS; i++) {
		const struct config_opt *o = &options[i];
		const char *v = b->val[i] ? b->val[i] : o->def;

		if (v == NULL && (o->flags & OPT_CPUS))
			v = cpus;
		if (v == NULL)
			continue;
		if (opt_parse(o, v, c, why, sizeof(why)) < 0) {
			/* only a default can fail here: values were checked */
			snprintf(err, errlen, "--%s: default: %s", o->name, why);
			return -1;
		}
	}
	return 0;
}

/*
 * A field the request id cannot be: one that frames or routes a message,
 * that the proxy writes itself, or that an upstream's response needs kept
 * (the request id's field is replaced on both sides). The key's header may
 * be it (an API whose key is its request id): then the client's field goes
 * upstream untouched (reqlog_upstream_id).
 */
static bool reserved_field(const char *name)
{
	static const char *const reserved[] = {
		"content-length", "content-type", "content-encoding", "host",
		"expect", "forwarded", "x-forwarded-for", "x-forwarded-proto",
		"x-forwarded-host", "traceparent", "tracestate", "cookie",
		"set-cookie", "authorization", "location", "date",
		"retry-after", "www-authenticate", "idempotent-replayed",
		"idempotent-original-request-id", "x-client-cert-subject",
		"x-client-cert-san",
	};

	if (httphdr_is_hop_by_hop(name, strlen(name)))
		return true;
	for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
		if (strcasecmp(name, reserved[i]) == 0)
			return true;
	return false;
}

/* What no single option can check. */
static int cross_check(const struct config *c, char *err, size_t errlen)
{
	char a[32], u[32];

	if (reserved_field(c->request_id_header)) {
		snprintf(err, errlen, "--request-id-header: %s is a field the "
			 "proxy frames, routes or writes itself: name another, "
			 "such as X-Request-Id",
			 c->request_id_header);
		return -1;
	}

	if (c->upstream == NULL) {
		snprintf(err, errlen, "--upstream is required (or "
			 ENV_PREFIX "UPSTREAM, or upstream in the config file)");
		return -1;
	}
	if (c->upstream_deadline_ms < c->upstream_timeout_ms) {
		units_format_duration(c->upstream_deadline_ms, a, sizeof(a));
		units_format_duration(c->upstream_timeout_ms, u, sizeof(u));
		snprintf(err, errlen, "--upstream-deadline (%s) must not be "
			 "shorter than --upstream-timeout (%s)", a, u);
		return -1;
	}
	if (c->lease_ms <= c->upstream_timeout_ms) {
		units_format_duration(c->lease_ms, a, sizeof(a));
		units_format_duration(c->upstream_timeout_ms, u, sizeof(u));
		snprintf(err, errlen, "--lease (%s) must be longer than "
			 "--upstream-timeout (%s), or a slow request's claim is "
			 "taken over while it still runs", a, u);
		return -1;
	}
	if ((c->tls_cert == NULL) != (c->tls_key == NULL)) {
		snprintf(err, errlen, "--tls-cert and --tls-key go together "
			 "(%s is missing)", c->tls_cert ? "--tls-key" : "--tls-cert");
		return -1;
	}
	if (c->tls_ciphers != NULL && c->tls_cert == NULL) {
		snprintf(err, errlen, "--tls-ciphers needs --tls-cert and "
			 "--tls-key");
		return -1;
	}
	if (c->tls_client_ca != NULL && c->tls_cert == NULL) {
		snprintf(err, errlen, "--tls-client-ca needs --tls-cert and "
			 "--tls-key: client certificates are asked for in the "
			 "listener's TLS handshake");
		return -1;
	}
	if ((c->upstream_client_cert == NULL) != (c->upstream_client_key == NULL)) {
		snprintf(err, errlen, "--upstream-client-cert and "
			 "--upstream-client-key go together (%s is missing)",
			 c->upstream_client_cert ? "--upstream-client-key" :
						   "--upstream-client-cert");
		return -1;
	}
	if (!c->upstream_tls && (c->upstream_ca != NULL ||
				 c->upstream_client_cert != NULL)) {
		snprintf(err, errlen, "--%s needs an https:// --upstream",
			 c->upstream_ca ? "upstream-ca" : "upstream-client-cert");
		return -1;
	}
	return 0;
}

/* What is made of settings once all are known: the trusted proxies'
 * ranges, the trace exporter's settings with the OTEL_* variables. */
/* What is made of settings that need a restart: the upstream's address
 * as the access log names it, the trace exporter's settings with the
 * OTEL_* variables. Made again by config_reload() once it has put the
 * running values back. */
static int derive_restart(struct config *c, char **envp, char *err,
			  size_t errlen)
{
	const char *opts[OTEL_OPT_COUNT];
	bool v6 = strchr(c->upstream_hp.host, ':') != NULL;
	size_t i;

	free(c->upstream_addr);
	if (asprintf(&c->upstream_addr, v6 ? "[%s]:%s" : "%s:%s",
		     c->upstream_hp.host, c->upstream_hp.port) < 0) {
		c->upstream_addr = NULL;
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (i = 0; i < OTEL_OPT_COUNT; i++)
		opts[i] = c->otel_opt[i];
	opts[OTEL_OPT_DISABLED] = c->otel_disabled_opt;
	otel_settings_free(&c->otel);
	return otel_settings_resolve(&c->otel, opts, envp, &c->otel_warning,
				     err, errlen);
}

/* What is made of settings once all are known. */
static int derive(const struct build *b, struct config *c, char **envp,
		  char *err, size_t errlen)
{
	size_t dis = (size_t)opt_index(opt_by_flag("otel-sdk-disabled", 17));
	char why[256];

	c->request_id_len = strlen(c->request_id_header);
	if (c->trusted_proxies != NULL &&
	    cidr_parse(c->trusted_proxies, &c->trusted, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "--trusted-proxies: %s", why);
		return -1;
	}
	if (c->proxy_protocol != NULL &&
	    cidr_parse(c->proxy_protocol, &c->pp_from, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "--proxy-protocol: %s", why);
		return -1;
	}
	/* given (either way) it wins over OTEL_SDK_DISABLED; else that decides */
	if (b->rank[dis] != SRC_NONE)
		c->otel_disabled_opt = c->otel_disabled ? "true" : "false";
	return derive_restart(c, envp, err, errlen);
}

/* The whole pipeline of the comment at the top; config_parse and reload. */
static int config_build(int argc, char **argv, char **envp,
			struct config **out, enum config_action *action,
			char *err, size_t errlen)
{
	struct build b;
	struct config *c = NULL;
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
	if (read_sources(&b, argc, argv, envp, err, errlen) < 0 ||
	    settle(&b, c, err, errlen) < 0 || cross_check(c, err, errlen) < 0 ||
	    derive(&b, c, envp, err, errlen) < 0 ||
	    build_routing(c, b.routes, envp, err, errlen) < 0)
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
		if (opt_is_string(o) &&
		    *(char *const *)cfield(running, o->off) == NULL)
			continue;	/* it was unset (redis off) */
		if (opt_parse(o, was, c, why, sizeof(why)) < 0) {
			snprintf(err, errlen, "reload: %s: %s", o->name, why);
			config_free(c);
			return NULL;
		}
	}
	/* and what the running values made: the exporter runs with them */
	c->otel_disabled_opt = running->otel_disabled_opt;
	if (derive_restart(c, c->env, err, errlen) < 0) {
		config_free(c);
		return NULL;
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
	/* what the otel_* options and the OTEL_* variables come to */
	fprintf(out, "otel_traces = %s\n",
		cfg->otel.enabled ? cfg->otel.endpoint : "off");
	routes_print(&cfg->routing, out);
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
		if (opt_is_bool(o))
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
