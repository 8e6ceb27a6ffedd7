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

struct config;

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
