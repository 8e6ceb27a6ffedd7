/*
 * route.h - per-route request policy (DESIGN.md §3 config file, §4).
 *
 * A request gets one struct policy (policy.h): the first [route NAME] whose
 * `match` covers its method and path, or the global policy built from the
 * [idemproxy] options. A route key that is also an [idemproxy] option
 * (ttl, in_flight, max_body, ...) takes the same values, held to the same
 * bounds, and defaults to the option's value.
 */
#ifndef IDEMPROXY_ROUTE_H
#define IDEMPROXY_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compiler.h"
#include "policy.h"

struct route {
	char *name;
	uint64_t methods;	/* bit per llhttp method */
	char *glob;		/* '*' matches any run, '/' included */
	struct policy policy;
};

/* Raw `key = value` lines of [route NAME] sections, kept in file order
 * until the global settings are known. */
struct route_raw;

/* The NAME of a config file section "route NAME" (blanks after "route"
 * skipped; "" for a bare [route]), or NULL for any other section. */
const char *route_section_name(const char *section);

int route_raw_section(struct route_raw **raw, const char *name,
		      const char *file, int line, char *err, size_t errlen) MUSTCHECK;
int route_raw_add(struct route_raw **raw, const char *name, const char *key,
		  const char *value, const char *file, int line, char *err,
		  size_t errlen) MUSTCHECK;
void route_raw_free(struct route_raw *raw);

/*
 * What routes are built from: the [idemproxy] options, as the config
 * module settled them. option() gives the value syntax of the option spelt
 * name ("max_body"), or NULL when it has none of setting.h's; with value
 * non-NULL, *value gets the option's value (opts is handed back to it). A
 * route key that is also an option is held to that syntax and starts from
 * that value.
 */
typedef const struct setting_syntax *(*route_option_fn)(const void *opts,
							const char *name,
							const void **value);

struct route_options {
	const char *key_header;		/* --key-header */
	uint64_t upstream_timeout_ms;	/* a route's lease is longer */
	uint64_t methods_mask;		/* protected without a route */
	bool client_certs;		/* the listener verifies client
					 * certificates: scope = tls: works */
	route_option_fn option;
	const void *opts;
};

/* The policies of a config: the global one and the routes in file order. */
struct route_table {
	struct policy global;
	struct route *routes;
	int nroutes;
	uint64_t methods_mask;
	route_option_fn option;
};

/* Is llhttp method number method in mask (a bit per method)? */
static inline bool route_method_in(uint64_t mask, int method)
{
	return method >= 0 && method < 64 && (mask >> method) & 1;
}

/*
 * Build t->global from o and t->routes from raw (each route starts as a
 * copy of the global policy). envp is searched for verify_secret_env
 * before the process environment. Errors name the file, line, route and
 * key. On failure, routes_free(t) frees what was built.
 */
int routes_build(struct route_table *t, const struct route_options *o,
		 const struct route_raw *raw, char **envp, char *err,
		 size_t errlen) MUSTCHECK;
void routes_free(struct route_table *t);

/*
 * The policy for a request, or NULL when it is not protected (no route
 * matches and the method is not in --methods, or the route says key =
 * none). *name gets the route's name or NULL. target is the raw
 * request-target; its query string is ignored.
 */
const struct policy *route_policy(const struct route_table *t, int method,
				  const char *target, const char **name);

/* May a route or the protected methods cover requests of this method? */
bool routes_consider(const struct route_table *t, int method);

/* Does a route ask for issued keys (GET /.well-known/idempotency-key)? */
bool routes_issue_keys(const struct route_table *t);

bool route_glob_match(const char *glob, const char *s, size_t len);

/* "header:", "query:", "form:", "json:", "auto", "none" */
const char *route_key_source_name(enum key_source k);

/* --check-config: one block per route, effective values. */
void routes_print(const struct route_table *t, FILE *out);

#endif
