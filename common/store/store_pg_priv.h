/*
 * store_pg_priv.h - the PostgreSQL store's types, which its modules share:
 * store_pg.c (the statements, what their results mean, the store
 * operations), store_pg_batch.c (each thread's queue, batches and
 * results), store_pg_conn.c (each thread's connections) and
 * store_pg_parts.c (retention). Types only: each module's functions are
 * in its own header. Nothing outside common/store includes it.
 */
#ifndef IDEMPROXY_STORE_PG_PRIV_H
#define IDEMPROXY_STORE_PG_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include <event2/event.h>
#include <libpq-fe.h>

#include "store.h"
#include "store_pg_notify.h"
#include "store_pg_dns.h"
#include "store_pg_hosts.h"

enum pg_kind {
	PG_CLAIM,
	PG_COMPLETE,
	PG_RELEASE,
	PG_EXTEND,
	PG_SWEEP,
	PG_WATCH,
	PG_INSPECT,
	PG_PURGE,
};

/* Where an operation is; exactly one place at a time. */
enum op_where {
	OP_NEW,			/* being set up */
	OP_QUEUED,		/* on local->queue; o->ev is its deadline */
	OP_RUNNING,		/* in a connection's batch on the wire */
	OP_WATCHING,		/* on local->watchers; o->ev is the poll */
	OP_DELIVERING,		/* o->ev is active: the callback runs next */
};

struct pg_local;
struct pg_op;
struct pg_conn_hooks;		/* store_pg_conn.h */
struct pg_meaning;		/* store_pg_batch.h */
struct pg_parts;		/* store_pg_parts.h */
TAILQ_HEAD(pg_ops, pg_op);

struct pg_op {
	struct store_op op;		/* first: the generic handle */
	enum pg_kind kind;
	struct pg_local *local;
	store_cb cb;			/* NULL: internal, or cancelled */
	void *arg;
	struct event *ev;		/* see enum op_where */
	struct store_result res;
	TAILQ_ENTRY(pg_op) link;	/* queue, watchers or a batch */
	enum op_where where;
	bool sent;			/* on the wire once: outcome may exist */
	bool solo;			/* retry it alone (failed, or abandoned) */
	bool abandoned;			/* a claim nobody waits for: pg_abandon() */
	bool took_over;			/* a claim's win was not a new row */
	int changed;			/* claims: record changed under us */
	int errors;			/* its own statement failed */
	uint64_t deadline_ms;		/* monotonic: give up after this */
	/* this attempt, until its batch's Sync */
	PGresult *result;
	PGresult *unacked;		/* the result of an attempt whose
					 * commit was not acknowledged */
	bool stmt_failed;

	struct store_key key;
	uint8_t fp[FP_LEN];
	char owner[STORE_OWNER_LEN + 1];
	char hint[24];			/* owner ops: the claim's part hint
					 * (decimal Unix ms), "": none */
	uint64_t lease_ms, ttl_ms;
	int64_t lock;			/* pg_lock_id(&key): the batch order */
	bool wait;			/* claim: store_claim.wait */
	bool takeover;			/* claim: store_claim.takeover */
	struct stored_response *resp;
	bool body;			/* inspect: the stored response too */
};

enum pgc_state {
	PGC_DOWN,		/* waiting to reconnect (back-off timer) */
	PGC_CONNECTING,		/* PQconnectPoll steps */
	PGC_SETUP,		/* migration and PREPAREs (or LISTEN) */
	PGC_IDLE,		/* statement connections: in pipeline mode */
	PGC_BUSY,		/* one batch on the wire */
};

struct pg_conn;

/* One host's connect attempt while a connection looks for the primary. */
struct pg_probe {
	struct pg_conn *c;
	int host;			/* index in s->hosts */
	PGconn *pg;			/* NULL: not connecting now */
	struct event *io;
	uint64_t started;		/* monotonic ms */
	uint64_t next_at;		/* not connecting: try again then */
	uint64_t parked_at;		/* connected to a slow host, waiting
					 * for another to win; 0: not parked */
	char why[160];			/* its last failure, for the log */
};

struct pg_conn {
	struct pg_local *local;
	PGconn *pg;
	int host;			/* s->hosts index pg is connected to */
	struct pg_probe *probes;	/* s->hosts.probe: one per host */
	bool probing;			/* CONNECTING: the probes race */
	uint64_t probe_deadline;	/* probing: give up then */
	bool unacked;			/* the batch's commit: the synchronous
					 * standby's wait was cancelled */
	bool read_only;			/* the batch hit a read-only server */
	int session_pid;		/* listener: pg_backend_pid() at LISTEN */
	struct event *io;
	int io_fd;			/* what io watches, and for what */
	short io_what;
	struct event *timer;		/* back-off, or the batch deadline */
	enum pgc_state state;
	struct pg_ops batch;		/* BUSY: the batch's operations, in order */
	uint64_t sent_us;		/* BUSY: when the batch was sent */
	struct pg_op *reading;		/* whose result comes next; NULL: Sync */
	bool batch_failed;		/* an error: the transaction rolled back */
	bool waking;			/* BUSY: the batch answered, its wake-up
					 * not yet */
	int backoff_ms;
	uint64_t retry_at;		/* DOWN: monotonic ms of the next attempt */
	bool listener;
	bool used;			/* opened: pools grow on demand */
	bool was_up;
};

struct pg_local {
	struct pg_store *s;
	struct event_base *base;
	struct pg_conn *conns;
	int nconns;
	struct pg_conn listen;
	struct pg_ops queue;
	struct pg_ops watchers;
	struct event *kick;		/* dispatch at the end of this turn */
	struct event *hold;		/* dispatch when a held queue may go */
	const struct pg_conn_hooks *hooks;	/* the pool, to its connections */
	int up;				/* connections IDLE or BUSY */
	bool sweeping;
	struct pg_local *next;		/* s->locals */
};

struct pg_store {
	struct store base;
	const struct pg_meaning *meaning;	/* store_pg.c, to the pools */
	char *conninfo;
	struct pg_hosts hosts;		/* conninfo, by host */
	struct pg_dns *dns;		/* their names, resolved off the loops */
	uint64_t part_width_ms;		/* new partitions cover this long */
	struct pg_parts *parts;		/* retention, on the sweeping thread */
	atomic_int primary;		/* hosts index: where writes went last;
					 * -1: not known yet */
	atomic_bool failed[PG_HOSTS_MAX];	/* a connection to this host
					 * failed since one last came up */
	_Atomic uint64_t slow_at[PG_HOSTS_MAX];	/* ms a statement there last
					 * timed out; 0: a batch committed since */
	char *setup_sql;		/* schema + PREPAREs */
	bool worker;			/* a Citus worker's: no schema, no
					 * retention (store_citus.c) */
	atomic_bool no_row_sweep;	/* a Citus coordinator's: partitions
					 * only (store_pg_no_row_sweep) */
	int conns_per_thread;
	atomic_int up;			/* connections up, all threads */
	atomic_bool down_logged;
	atomic_bool shared;		/* a pooler shares sessions: said, and
					 * the cache told (STORE_PG_SHARED) */
	_Atomic uint64_t async_logged_ms;	/* check_replication() */
	pthread_mutex_t mu;
	struct pg_local *locals;
	store_pg_notify_fn notify_fn;	/* every notification (a cache) */
	void *notify_arg;
};

#endif
