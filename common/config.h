/*
 * config.h - idemproxy's settings: one table drives the command line, the
 * environment, the INI file and --help (see config.c).
 *
 * Precedence: flag > environment > config file > default. Every source is
 * parsed and validated in full, so a bad value is an error even when a
 * higher source overrides it. A struct config is immutable once built and
 * shared between threads by reference count; SIGHUP builds a new one.
 */
#ifndef IDEMPROXY_CONFIG_H
#define IDEMPROXY_CONFIG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "compiler.h"
#include "hostport.h"
#include "accesslog.h"
#include "cidr.h"
#include "log.h"
#include "otel.h"
#include "policy.h"
#include "route.h"	/* struct route_table, for users of cfg->routing */

struct setting_syntax;

/* What the command line asks for. */
enum config_action {
	CONFIG_RUN,		/* run the proxy */
	CONFIG_HELP,		/* --help: usage on stdout, exit 0 */
	CONFIG_VERSION,		/* --version: version on stdout, exit 0 */
	CONFIG_CHECK,		/* --check-config FILE: print settings, exit 0 */
};

/* --tls-client-cert */
enum tls_client_cert {
	TLS_CLIENT_CERT_OPTIONAL,	/* a client may show none (tls: routes: 401) */
	TLS_CLIENT_CERT_REQUIRED,	/* the handshake fails without one */
};

/* --x-forwarded-for: the client's address appended, or the field left as
 * the client sent it */
enum xff_mode {
	XFF_APPEND,
	XFF_OFF,
};

struct config {
	atomic_int refcount;

	/* DESIGN.md §3, in table order */
	char *listen;			/* as given, "ADDR:PORT" */
	struct hostport listen_hp;
	char *upstream;			/* as given, "http://host:port[/prefix]" */
	struct hostport upstream_hp;
	bool upstream_tls;		/* https:// */
	char *upstream_prefix;		/* "" or "/prefix" without trailing '/' */
	char *store;			/* "memory" or a postgres:// URL */
	char *redis;			/* NULL when off */
	struct hostport redis_hp;	/* host/port of redis; NULLs when off;
					 * sentinels: hostport.h */
	int redis_db;			/* "/DB" of the redis URL, 0 when none */
	char *redis_master;		/* redis-sentinel://: the master's name */
	char *admin_listen;
	struct hostport admin_hp;
	char *config_file;		/* NULL when none */
	int workers;			/* >= 1; default: number of CPUs */
	char *key_header;
	char *methods;			/* as given, "POST,PATCH" */
	uint64_t methods_mask;		/* bit (1 << llhttp_method_t) per method */
	bool require_key;
	enum in_flight_mode in_flight;
	uint64_t wait_timeout_ms;
	uint64_t ttl_ms;
	uint64_t lease_ms;
	uint64_t upstream_timeout_ms;
	uint64_t max_body;
	uint64_t max_cached_response;
	enum store_down_mode store_down;
	enum upstream_error_mode on_upstream_error;
	uint64_t drain_timeout_ms;
	uint64_t sweep_interval_ms;
	enum log_level log_level;
	enum log_format log_format;

	/* additions to DESIGN.md §3, documented in docs/configuration.md */
	uint64_t client_timeout_ms;	/* request head, and each body read gap: 408 */
	uint64_t idle_timeout_ms;	/* idle keep-alive client connection */
	uint64_t tunnel_idle_timeout_ms; /* an upgraded connection, both ways quiet */
	uint64_t max_header_size;	/* request line + headers: 431 */
	int max_connections;		/* per worker; accept pauses beyond */
	uint64_t memory_max_bytes;	/* memory store bound */
	uint64_t issued_key_ttl_ms;	/* GET /.well-known/idempotency-key */
	enum fp_body fp_body;		/* --fingerprint (fpshape.h) */
	enum fp_query fp_query;		/* --fingerprint-query */
	char *fp_ignore;		/* --fingerprint-ignore, as given */
	char *fp_only;			/* --fingerprint-only, as given */
	int store_connections;		/* PostgreSQL statement conns per worker */
	uint64_t max_buffered;		/* keyed bodies buffered, process-wide */
	uint64_t response_cache;	/* bytes; 0: no in-process cache */
	char *tls_cert;			/* PEM chain: the listener speaks TLS */
	char *tls_key;
	char *admin_token_file;		/* NULL: mutating /keys off */
	char *tls_ciphers;		/* TLS 1.2 cipher list; NULL: OpenSSL's */
	char *tls_client_ca;		/* verify client certificates; NULL: no */
	enum tls_client_cert tls_client_cert;	/* ... and whether one is a must */
	char *upstream_ca;		/* PEM CAs; NULL: the system store */
	char *upstream_client_cert;	/* mutual TLS with the upstream */
	char *upstream_client_key;
	/* issue 43: what ends an exchange (docs/protocol.md "How an exchange
	 * ends") */
	uint64_t upstream_deadline_ms;	/* a late response is awaited */
	struct status_set release_statuses;
	enum unknown_mode unknown_outcome;
	/* issue 45: logs and traces (docs/operations.md "Logs and traces") */
	char *access_log;		/* stderr | stdout | PATH | off */
	enum alog_format access_log_format;
	bool access_log_query;		/* log the query string too */
	char *trusted_proxies;		/* as given; NULL: none */
	struct cidr_set trusted;	/* ... parsed */
	/* issue 46: the PROXY protocol (docs/deploy.md "Behind a load balancer") */
	char *proxy_protocol;		/* sources that send it; NULL: off */
	struct cidr_set pp_from;	/* ... parsed */
	enum xff_mode forwarded_for;	/* --x-forwarded-for */
	char *request_id_header;	/* "X-Request-Id" */
	size_t request_id_len;		/* ... its length */
	char *upstream_addr;		/* "host:port" of the upstream, as the
					 * access log names it */
	char *otel_opt[OTEL_OPT_COUNT];	/* --otel-*, as given (NULL: unset) */
	bool otel_disabled;		/* --otel-sdk-disabled */
	const char *otel_disabled_opt;	/* ... as otel_settings_resolve takes it:
					 * "true", "false", NULL (not given) */
	struct otel_settings otel;	/* resolved with the OTEL_* variables */
	const char *otel_warning;	/* for main to log once; NULL */

	/* per-request policy: the global one, and [route NAME] sections in
	 * file order (route.c) */
	struct route_table routing;

	/* private: what was parsed, kept so that SIGHUP can re-apply it */
	int argc;
	char **argv;
	char **env;			/* the IDEMPROXY_* variables only */
};

/*
 * Parse the command line (argv[0] is the program) and the environment
 * (NULL-terminated "NAME=value" strings, usually environ), then the config
 * file if one is named by either. On success returns 0 with *out set (for
 * CONFIG_RUN and CONFIG_CHECK; NULL otherwise) and *action set. On failure
 * returns -1 with a one-line message naming the option in err; the caller
 * exits with status 2.
 */
int config_parse(int argc, char **argv, char **envp, struct config **out,
		 enum config_action *action, char *err, size_t errlen) MUSTCHECK;

/*
 * Build a new config from the same flags and environment as `running` and
 * the config file as it is now on disk (SIGHUP). Returns NULL with err set
 * when the file is bad; the caller keeps `running`. Settings that need a
 * restart (listen, admin_listen, workers, upstream, store, redis) keep the
 * running values in the new config, with a log_warn() for each that the
 * file changed.
 */
struct config *config_reload(const struct config *running, char *err,
			     size_t errlen) MUSTCHECK;

/* Print every effective setting, one "name = value" per line. */
void config_print(const struct config *cfg, FILE *out);

/* Print --help: usage, then each option with env name, default and help. */
void config_usage(FILE *out);

/* Print --version: "idemproxy VERSION". */
void config_version(FILE *out);

/*
 * The value syntax of the option spelt `key` in the file ("max_body"), or
 * NULL when it has none of setting.h's (addresses, URLs, lists). When cfg
 * and value are given, *value points at the option's field in cfg. A route
 * key of the same name is held to this syntax and starts from this value.
 */
const struct setting_syntax *config_option_syntax(const struct config *cfg,
						  const char *key,
						  const void **value);

/* A libpq connection string with every password replaced by "***": the
 * URL's user:password@, ?password= / &password=, and key=value
 * password=... (quoted or not). For logs and --check-config. */
void config_redact_conninfo(const char *s, char *out, size_t len);

struct config *config_ref(struct config *cfg);
void config_unref(struct config *cfg);

/* Is this llhttp method number protected by cfg->methods? */
static inline bool config_method_protected(const struct config *cfg, int method)
{
	return route_method_in(cfg->methods_mask, method);
}

#endif
