/*
 * admin.h - the admin listener: /healthz, /readyz, /metrics (libevent's
 * evhttp, on the main thread's loop).
 */
#ifndef IDEMPROXY_ADMIN_H
#define IDEMPROXY_ADMIN_H

#include <stdbool.h>
#include <stddef.h>

#include "compiler.h"

struct event_base;
struct admin;

struct store;

/* /readyz asks the store whether it is reachable. */
struct admin *admin_new(struct event_base *base, const char *host,
			const char *port, struct store *store, char *err,
			size_t errlen) MUSTCHECK;
/* While draining, /readyz answers 503 so that balancers stop sending. */
void admin_set_draining(struct admin *a, bool draining);
void admin_free(struct admin *a);

#endif
