/*
 * store_pg_notify.h - what the PostgreSQL store tells a cache that must
 * stay coherent (store_pg_on_notify, store_pg.h): its own header, so that
 * the store's modules that raise it need not include store_pg.h.
 */
#ifndef IDEMPROXY_STORE_PG_NOTIFY_H
#define IDEMPROXY_STORE_PG_NOTIFY_H

/*
 * What a listener connection saw, for a cache that must stay coherent:
 * every notification on the "idemproxy" channel (payload "<scope>:<key>":
 * the record was completed, released or purged), and each listener going
 * up or down (while one is down, notifications can be missed). Once, at
 * most: a pooler shares the sessions, so any notification can be missed
 * from now on, whatever the listeners say.
 */
enum store_pg_event {
	STORE_PG_NOTIFY,
	STORE_PG_LISTEN_UP,
	STORE_PG_LISTEN_DOWN,
	STORE_PG_SHARED,
};

/* Called on the listener's thread (STORE_PG_SHARED: any loop's); payload
 * only for STORE_PG_NOTIFY. Set
 * before any thread_init: each thread then LISTENs from the start. */
typedef void (*store_pg_notify_fn)(void *arg, enum store_pg_event ev,
				   const char *payload);

#endif
