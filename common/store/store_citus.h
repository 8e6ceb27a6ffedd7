/*
 * store_citus.h - the PostgreSQL store over a Citus cluster: each key's
 * statements go straight to the worker that holds its shard, through a
 * PostgreSQL store of that worker's own (store_pg_new_worker); the
 * coordinator keeps the schema and the partitions, and says where the
 * shards are (store_citus_map.h). docs/scale.md has the picture.
 */
#ifndef IDEMPROXY_STORE_CITUS_H
#define IDEMPROXY_STORE_CITUS_H

#include <stdbool.h>
#include <stdint.h>

#include "store.h"
#include "store_citus_map.h"
#include "store_pg_notify.h"

/*
 * The store for conninfo (the coordinator): map is the coordinator's
 * first answer, taken (NULL: it could not be asked; the store asks again
 * every few seconds and, until it knows, sends everything to the
 * coordinator, where a claim is refused rather than serialised on the
 * wrong node). NULL after logging why.
 */
struct store *store_citus_new(const char *conninfo, int conns_per_thread,
			      uint64_t ttl_ms, struct citus_map *map);

/* Every notification of every node (store_pg_on_notify's contract). */
void store_citus_on_notify(struct store *s, store_pg_notify_fn fn, void *arg);

/* Is s a Citus store? */
bool store_is_citus(const struct store *s);

#endif
