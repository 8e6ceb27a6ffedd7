/*
 * store_citus_map.h - where each key of a Citus-distributed idempotency
 * table lives, asked of the coordinator (store_citus.c routes by it), and
 * the one-shot commands that need the coordinator: `idemproxy migrate
 * --distributed` and the start-up question "is this table distributed?".
 *
 * Every call here blocks: the map is read on a thread of its own
 * (store_citus.c), the others run before any loop or on the command line.
 * Each network wait has a deadline (a frozen coordinator costs at most
 * CITUS_MAP_TIMEOUT_MS, never a stuck thread).
 */
#ifndef IDEMPROXY_STORE_CITUS_MAP_H
#define IDEMPROXY_STORE_CITUS_MAP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "compiler.h"

#define CITUS_MAP_TIMEOUT_MS 5000
#define CITUS_NODES_LEN 511

/* One shard: the hash range [lo, hi] and the nodes of the group that
 * holds it, "host:port,...", its primary first, then its secondaries
 * (citus_add_secondary_node: standbys that may be promoted). */
struct citus_shard {
	int32_t lo, hi;
	int group;			/* Citus' group id */
	char nodes[CITUS_NODES_LEN + 1];
	int slot;			/* the store's, for its group
					 * (store_citus.c); 0 as fetched */
};

/* An answer of the coordinator. Immutable once made; shared by count. */
struct citus_map {
	atomic_int refcount;
	bool citus;			/* false: no Citus in this database */
	bool distributed;		/* false: a table on one node */
	int n;				/* shards, by lo */
	struct citus_shard shards[];
};

/* What the coordinator says now: a new map (refcount 1), or NULL with
 * err set when it could not be asked. stop, when not NULL and readable,
 * cuts every wait short (shutdown). */
struct citus_map *citus_map_fetch(const char *conninfo, int stop_fd,
				  char *err, size_t errlen);

/* The same on *conn, a connection kept from one call to the next (NULL:
 * none yet; made when needed, closed and NULL again when it failed), so
 * that asking every few seconds costs the coordinator no new backend. */
struct citus_map *citus_map_fetch_on(PGconn **conn,
				     const char *conninfo, int stop_fd,
				     char *err, size_t errlen);
struct citus_map *citus_map_ref(struct citus_map *m);
void citus_map_unref(struct citus_map *m);

/* The shard that holds hash h (citus_hash_text); NULL: none (a map being
 * changed under a rebalance). */
const struct citus_shard *citus_map_find(const struct citus_map *m, int32_t h);

/* conninfo with its host(s) and port(s) replaced by those of nodes
 * ("host:port,...", as in struct citus_shard): a worker's statements go
 * there - to whichever of them is the primary, as with any list of hosts
 * (store_pg_hosts.h) - with the rest of the parameters unchanged.
 * malloc()ed; NULL when conninfo or nodes does not parse (err set). */
char *citus_worker_conninfo(const char *conninfo, const char *nodes,
			    char *err, size_t errlen);

/*
 * idemproxy migrate --distributed: on a Citus coordinator, the schema,
 * then the table distributed by key, its partition bookkeeping a
 * reference table, the claim function delegated by its key, each step
 * only if not done. -1 with err set: not a coordinator, a Citus too old,
 * no worker, or a step failed.
 */
int citus_migrate(const char *conninfo, uint64_t ttl_ms, char *err,
		  size_t errlen) MUSTCHECK;

#endif
