/*
 * store_pg_hosts.h - the hosts of a PostgreSQL connection string, each as
 * its own set of connection parameters.
 *
 * A replicated cluster is named by a multi-host string ("host=pg1,pg2,pg3"
 * or "postgresql://pg1,pg2,pg3/db"). libpq's asynchronous connect walks
 * those hosts one after the other and applies no connect_timeout per host
 * (the application must), so one frozen host - its kernel accepts TCP,
 * nothing answers - stalls the whole walk. The pool (store_pg_conn.c)
 * instead connects to every host at once, each with its own deadline, and
 * keeps the first that accepts writes.
 *
 * Unless the string says otherwise, target_session_attrs is read-write:
 * the store writes, and a standby (after a switchover, behind a VIP or a
 * DNS name that lags) must not be kept.
 */
#ifndef IDEMPROXY_STORE_PG_HOSTS_H
#define IDEMPROXY_STORE_PG_HOSTS_H

#include <stdbool.h>
#include <stddef.h>

#include "compiler.h"

#define PG_HOSTS_MAX 16

/* One host of a set as the string gave it; NULL: not given. */
struct pg_host_entry {
	const char *host, *hostaddr, *port;
};

struct pg_hosts {
	int n;				/* sets; 1 for a single-host string */
	bool probe;			/* connect to each host on its own */
	const char **keywords;		/* NULL-terminated, shared by all */
	const char **values[PG_HOSTS_MAX];	/* parallel to keywords */
	char label[PG_HOSTS_MAX][128];	/* "host:port" for the log */
	/* the hosts of each set (probe: one each; else every host, which
	 * libpq walks), for store_pg_dns.c to resolve */
	int nent[PG_HOSTS_MAX];
	struct pg_host_entry ent[PG_HOSTS_MAX][PG_HOSTS_MAX];
	int ihost, iaddr, iport;	/* their places in keywords */
	void *opts;			/* PQconninfoOption[]: owns the strings */
	char *buf;			/* owns the split host/port strings */
};

/*
 * Split conninfo (key=value or URI) into h. probe is set when there are
 * several hosts and target_session_attrs asks for a primary (read-write,
 * the default, or primary); with any other value the whole string is one
 * set, walked by libpq as the user asked. Returns -1 with err set when
 * libpq cannot parse it, or the host, hostaddr and port lists disagree.
 */
int pg_hosts_parse(struct pg_hosts *h, const char *conninfo, char *err,
		   size_t errlen) MUSTCHECK;
void pg_hosts_free(struct pg_hosts *h);

#endif
