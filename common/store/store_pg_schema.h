/*
 * store_pg_schema.h - the PostgreSQL store's schema
 * and its conversion (store_pg_schema.c).
 */
#ifndef IDEMPROXY_STORE_PG_SCHEMA_H
#define IDEMPROXY_STORE_PG_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

/* The schema and its functions, as the store runs them at setup. The
 * schema is malloc'ed (the caller frees it), NULL without memory. */
char *store_pg_schema_sql(void);
/* Make a table of an earlier version (not partitioned) the first
 * partition of a partitioned one; blocking (migrate only). */
int pg_convert(PGconn *pg, uint64_t width_ms, char *err, size_t errlen);

#endif
