/*
 * probe.h - the outcome probe: one GET to the upstream's lookup of a
 * request by its key (a route's outcome_probe = GET /orders/by-key/{key}),
 * asked when a keyed request's outcome is unknown (idem.c).
 *
 * A probe is one exchange on the worker's upstream pool. Its answer is a
 * status and, for a 2xx, the response as it would be stored: end-to-end
 * fields (no Set-Cookie: a lookup hands out no session), and a body of at
 * most max_cached_response bytes. What the statuses mean is the engine's
 * to decide. The callback never runs inside probe_start(), and never
 * after probe_cancel().
 */
#ifndef IDEMPROXY_PROBE_H
#define IDEMPROXY_PROBE_H

#include <stdint.h>

#include "config.h"
#include "store.h"
#include "upstream.h"

struct probe;

/*
 * The probe answered (status, and for a 2xx resp, a reference handed to
 * the callback, NULL when the body was too large to store), or failed
 * (status 0, resp NULL: no connection, a timeout, a broken answer).
 */
typedef void (*probe_cb)(void *arg, int status, struct stored_response *resp);

/* Ask the probe of policy p about key (as the client sent it: without
 * the route's key_prefix). NULL when no request could be started. */
struct probe *probe_start(struct upstream_pool *pool, const struct config *cfg,
			  const struct policy *p, const char *key,
			  probe_cb cb, void *arg);
void probe_cancel(struct probe *pr);

/* The probe's request-target for key: target with every "{key}" replaced
 * by key percent-encoded (RFC 3986 unreserved characters as they are).
 * Returns the length, or 0 when it does not fit in len. */
size_t probe_target(const char *target, const char *key, char *out, size_t len);

#endif
