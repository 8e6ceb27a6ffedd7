/*
 * store_pg_conn.h - a PostgreSQL store thread's connections
 * (store_pg_conn.c): connecting, the setup, following the primary, the
 * listener. What they carry is their pool's (store_pg_batch.c), reached
 * through the hooks it sets in pg_local.hooks.
 */
#ifndef IDEMPROXY_STORE_PG_CONN_H
#define IDEMPROXY_STORE_PG_CONN_H

#include <stdbool.h>

#include <libpq-fe.h>

#include "store_pg_priv.h"

/* The setup's replication check (check_replication): its first column's
 * name (store_pg.c writes the query, this module reads its result). */
#define PG_REPLICATION_COLUMN "idemproxy_replication"

/* What a statement connection tells the pool that owns it (all on the
 * pool's loop). */
struct pg_conn_hooks {
	/* c failed and closed, before it reconnects: its batch's outcome
	 * is unknown. True when work waits for a connection (c then comes
	 * back sooner). */
	bool (*lost)(struct pg_conn *c);
	/* One result of c's batch (NULL: the end of one statement's). */
	void (*result)(struct pg_conn *c, PGresult *r);
	/* The listener heard "<scope>:<key>". */
	void (*notified)(struct pg_local *l, const char *payload);
	/* A connection of l is idle: work may go. */
	void (*idle)(struct pg_local *l);
};

/* Open c (a statement connection, or l's listener) and start connecting.
 * 0, or -1 without memory. */
int pg_conn_init(struct pg_local *l, struct pg_conn *c, bool listener);
/* Thread shutdown: close c (its batch is the pool's to free first). */
void pg_conn_close(struct pg_conn *c);
/* Fail c: close, reconnect later (hooks->lost first). */
void pg_conn_fail(struct pg_conn *c, const char *why);
/* Send what libpq has buffered; watch for writability until done. */
void pg_conn_flush(struct pg_conn *c);
/* Is any statement connection of l up, or on its way up? */
bool pg_conn_may_serve(const struct pg_local *l);
/* Work waits and no connection is up: reconnect soon. */
void pg_conn_hasten(struct pg_local *l);
/* The primary moved: l's connections elsewhere reconnect. */
void pg_conn_drop_stale(struct pg_local *l);
/* The session behind c is another client's too (seen: how we know):
 * said once, and the cache told (STORE_PG_SHARED). */
void pg_conn_shared(struct pg_conn *c, const char *seen);
/* Does r's error say the session is another client's? */
bool pg_conn_not_ours(const PGresult *r);
/* Close a connection and its socket event (either may be NULL). */
void pg_conn_shut(PGconn **pg, struct event **io);

#endif
