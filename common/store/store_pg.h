/*
 * store_pg.h - PostgreSQL as the source of truth (DESIGN.md §2).
 *
 * Each thread that uses the store (every worker, and the main thread for
 * the sweeper) gets its own small pool of asynchronous libpq connections on
 * its own event_base, opened by store_thread_init() and closed by
 * store_thread_done(). Every new connection runs the migration (under an
 * advisory lock, idempotent) and prepares the statements before it takes
 * work. Claims are one atomic statement; completion and release are fenced
 * by the owner token and NOTIFY the key's channel; waiters LISTEN, with a
 * bounded poll as the safety net.
 */
#ifndef IDEMPROXY_STORE_PG_H
#define IDEMPROXY_STORE_PG_H

#include <stddef.h>

#include "compiler.h"
#include "store.h"
#include "store_pg_notify.h"

/* conninfo: a postgres:// URL or key=value string (libpq's);
 * conns_per_thread: statement connections per thread, opened on demand. */
struct store *store_pg_new(const char *conninfo, int conns_per_thread,
			   uint64_t ttl_ms);

/* The same store on a Citus worker (store_citus.c): the statements only;
 * the schema and retention are the coordinator's. */
struct store *store_pg_new_worker(const char *conninfo, int conns_per_thread,
				  uint64_t ttl_ms);

void store_pg_on_notify(struct store *s, store_pg_notify_fn fn, void *arg);

/* Keep the partitions, never sweep rows: a Citus coordinator's store,
 * whose table is partitioned and whose row sweep Citus cannot plan (a
 * scan of every shard FOR UPDATE). Thread-safe. */
void store_pg_no_row_sweep(struct store *s);

/*
 * Create or upgrade the schema with a blocking connection: for
 * `idemproxy migrate` only, never on an event loop. A table of an earlier
 * version becomes the first partition of a partitioned one (new
 * partitions cover ttl_ms / 4). Returns 0, or -1 with a message in err.
 */
int store_pg_migrate(const char *conninfo, uint64_t ttl_ms, char *err,
		     size_t errlen) MUSTCHECK;

/* The SQL the store issues, for docs and benchmarks (pgbench); the
 * schema's is store_pg_schema_sql() (store_pg_schema.h). */
extern const char store_pg_claim_sql[];
extern const char store_pg_claim_worker_sql[];
extern const char store_pg_complete_sql[];

#endif
