/*
 * keys.h - a key as an operator addresses and sees it: GET and DELETE
 * /keys/{key} on the admin listener (admin.c) and `idemproxy keys`
 * (main.c) share how a key is found in the store and how it is shown.
 *
 *   KEY [route] [scope]  ──keys_address──▶  store_key (scope hash, prefix)
 *   store result         ──keys_render───▶  JSON (docs/operations.md)
 */
#ifndef IDEMPROXY_KEYS_H
#define IDEMPROXY_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "compiler.h"
#include "store.h"

struct config;

/* What an operator names. */
struct keys_query {
	const char *key;	/* as the client sent it (no route prefix) */
	const char *route;	/* NULL: the global policy */
	const char *scope;	/* the caller's scope header value; NULL: none */
	bool body;		/* show the stored head and body */
};

/*
 * The record q names: the route's key prefix applied and the scope
 * computed as the proxy does for a request. cfg may be NULL (no config:
 * the route's name still gives its namespace, no prefix is known, and a
 * scope is taken as given). Returns 0, or -1 with a message in err.
 */
int keys_address(const struct config *cfg, const struct keys_query *q,
		 struct store_key *k, char *err, size_t errlen) MUSTCHECK;

/*
 * The JSON for a finished inspect (purge false) or purge of k: st is
 * the store's status (OK or ABSENT; not ERROR), res its result. A purge
 * shows the record as it was.
 */
void keys_render(FILE *out, const struct keys_query *q,
		 const struct store_key *k, bool purge,
		 const struct store_result *res);

#endif
