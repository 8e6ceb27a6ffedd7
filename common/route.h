/*
 * route.h - per-route request policy (DESIGN.md §3 config file, §4).
 *
 * A request gets one struct policy: the first [route NAME] whose `match`
 * covers its method and path, or the global policy built from the
 * [idemproxy] options. A policy says where the key comes from, how it is
 * scoped, whether the body must carry a valid signature, and every
 * per-request setting of the engine.
 */
#ifndef IDEMPROXY_ROUTE_H
#define IDEMPROXY_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compiler.h"

struct config;

enum key_source {
	KEY_SRC_HEADER,		/* header:NAME */
	KEY_SRC_QUERY,		/* query:NAME (percent-decoded) */
	KEY_SRC_FORM,		/* form:FIELD (urlencoded body) */
	KEY_SRC_JSON,		/* json:/pointer (RFC 6901; string or integer) */
	KEY_SRC_AUTO,		/* the request fingerprint itself */
	KEY_SRC_NONE,		/* not protected: pass through */
};

enum verify_format {
	VERIFY_NONE,
	VERIFY_GITHUB,		/* "sha256=<hex>" of HMAC(secret, body) */
	VERIFY_STRIPE,		/* "t=<unix>,v1=<hex>[,v1=...]" over "<t>.<body>" */
};

struct policy {
	enum key_source key_source;
	char *key_name;		/* header/query/form name, or JSON pointer */
	char *key_prefix;	/* "" when none */
	bool require_key;
	int in_flight;		/* enum in_flight_mode */
	uint64_t wait_timeout_ms;
	uint64_t ttl_ms;
	uint64_t lease_ms;
	uint64_t max_body;
	uint64_t max_cached_response;
	int store_down;		/* enum store_down_mode */
	int on_upstream_error;	/* enum upstream_error_mode */
	char *scope_header;	/* NULL: the global scope */
	enum verify_format verify;
	char *verify_header;
	char *verify_secret;	/* read from verify_secret_env at load */
	size_t verify_secret_len;
	uint64_t verify_tolerance_ms;
	bool require_issued_key;
	uint64_t issued_key_ttl_ms;
};

struct route {
	char *name;
	uint64_t methods;	/* bit per llhttp method */
	char *glob;		/* '*' matches any run, '/' included */
	struct policy policy;
};

/* Raw `key = value` lines of [route NAME] sections, kept in file order
 * until the global settings are known. */
struct route_raw;

int route_raw_section(struct route_raw **raw, const char *name,
		      const char *file, int line, char *err, size_t errlen) MUSTCHECK;
int route_raw_add(struct route_raw **raw, const char *name, const char *key,
		  const char *value, const char *file, int line, char *err,
		  size_t errlen) MUSTCHECK;
void route_raw_free(struct route_raw *raw);

/*
 * Build cfg->global from cfg's options and cfg->routes from raw (each route
 * starts as a copy of the global policy). envp is searched for
 * verify_secret_env before the process environment. Errors name the file,
 * line, route and key.
 */
int routes_build(struct config *cfg, const struct route_raw *raw,
		 char **envp, char *err, size_t errlen) MUSTCHECK;
void routes_free(struct config *cfg);

/*
 * The policy for a request, or NULL when it is not protected (no route
 * matches and the method is not in --methods, or the route says key =
 * none). *name gets the route's name or NULL. target is the raw
 * request-target; its query string is ignored.
 */
const struct policy *route_policy(const struct config *cfg, int method,
				  const char *target, const char **name);

bool route_glob_match(const char *glob, const char *s, size_t len);

/* "header:", "query:", "form:", "json:", "auto", "none" */
const char *route_key_source_name(enum key_source k);

/* --check-config: one block per route, effective values. */
void routes_print(const struct config *cfg, FILE *out);

#endif
