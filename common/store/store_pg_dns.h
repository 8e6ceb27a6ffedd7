/*
 * store_pg_dns.h - the host names of a PostgreSQL connection string,
 * resolved off the event loops.
 *
 * libpq resolves a host name inside PQconnectStart/PQconnectPoll with a
 * blocking getaddrinfo(): on a loop thread, a slow or unreachable DNS
 * server would stall every client of that loop. Instead a resolver thread
 * looks every name up at start, every PG_DNS_REFRESH_MS, and soon after a
 * connection failed (the name may have moved: a DNS name or VIP that
 * follows the primary). A connect then gives libpq each address as
 * hostaddr beside its host name - which TLS verification and the password
 * file still use - so libpq resolves nothing.
 *
 * Host names are resolved as libpq would (getaddrinfo, every address in
 * the resolver's order, at most ADDRS_MAX); numeric hosts, socket
 * directories and hosts given a hostaddr are passed on unchanged.
 */
#ifndef IDEMPROXY_STORE_PG_DNS_H
#define IDEMPROXY_STORE_PG_DNS_H

#include <stddef.h>

#include "store_pg_hosts.h"

#define PG_DNS_REFRESH_MS 5000
#define PG_DNS_MIN_MS 100	/* between two lookups of the names */
#define PG_DNS_START_MS 2000	/* pg_dns_new waits for the first */

struct pg_dns;

/*
 * The names of h, looked up by a thread of their own; waits up to
 * PG_DNS_START_MS for the first answers (call at start). NULL when out of
 * memory.
 */
struct pg_dns *pg_dns_new(const struct pg_hosts *h);

/*
 * The parameter values for set `set` of h, with every host name replaced
 * by its addresses (host, hostaddr and port lists expanded to match): one
 * malloc'ed block for the caller to free once PQconnectStartParams() has
 * returned. NULL, with why, when none of the set's hosts has an address.
 * Never blocks on DNS.
 */
const char **pg_dns_values(struct pg_dns *d, const struct pg_hosts *h,
			   int set, char *why, size_t whylen);

/* A connection failed: look the names up again soon. Never blocks. */
void pg_dns_stale(struct pg_dns *d);

/* Stop using d; its thread ends by itself (it may be in a lookup). */
void pg_dns_free(struct pg_dns *d);

#endif
