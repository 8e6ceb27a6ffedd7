/*
 * admin.h - the admin listener: /healthz, /readyz, /metrics and /keys
 * (admin_keys.h) (libevent's evhttp, on the main thread's loop).
 */
#ifndef IDEMPROXY_ADMIN_H
#define IDEMPROXY_ADMIN_H

#include <stdbool.h>
#include <stddef.h>

#include "compiler.h"

struct admin;
struct config;
struct event_base;

struct store;

/* /readyz asks the store whether it is reachable. */
struct admin *admin_new(struct event_base *base, const char *host,
			const char *port, struct store *store, char *err,
			size_t errlen) MUSTCHECK;
/* Routes and the admin token of cfg (a reference is taken); -1 with a
 * message in err when the token file cannot be read (nothing changes). */
int admin_set_config(struct admin *a, struct config *cfg, char *err,
		     size_t errlen) MUSTCHECK;
/* While draining, /readyz answers 503 so that balancers stop sending. */
void admin_set_draining(struct admin *a, bool draining);
void admin_free(struct admin *a);

#endif
