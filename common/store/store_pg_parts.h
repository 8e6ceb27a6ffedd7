/*
 * store_pg_parts.h - retention of the PostgreSQL store's partitioned
 * table (store_pg_parts.c), on the thread that sweeps: its own
 * connection and timer.
 */
#ifndef IDEMPROXY_STORE_PG_PARTS_H
#define IDEMPROXY_STORE_PG_PARTS_H

#include <stdint.h>

struct event_base;
struct pg_store;

#define PG_PART_MIN_MS 2000
#define PG_PART_MAX_MS (6 * 3600 * 1000ULL)

struct pg_parts;

uint64_t pg_part_width(uint64_t ttl_ms);	/* ttl / 4, within bounds */
struct pg_parts *pg_parts_start(struct pg_store *s, struct event_base *base);
struct event_base *pg_parts_base(const struct pg_parts *p);
void pg_parts_free(struct pg_parts *p);

#endif
