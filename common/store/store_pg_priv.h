/*
 * store_pg_priv.h - what the PostgreSQL store's two halves share:
 * store_pg.c (the statements, what their results mean, the store
 * operations) and store_pg_pool.c (each thread's connections, queue and
 * batches). Nothing else includes it.
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

#include "store_pg.h"
#include "store_pg_dns.h"
#include "store_pg_hosts.h"

#define PG_POLL_MS 500
#define PG_OP_TIMEOUT_MS 5000	/* a batch on the wire; an operation's life */
#define PG_CONNECT_TIMEOUT_MS 5000
#define PG_BACKOFF_MIN_MS 100
/* A PostgreSQL that is down is asked again at least this often: a
 * failover's new primary is found within it (docs/ha.md). */
#define PG_BACKOFF_MAX_MS 500
#define PG_BACKOFF_PENDING_MS 250	/* reconnect this often while work waits */
/* The setup's replication check (check_replication): its first column's
 * name, and how often its warning may repeat. */
#define PG_REPLICATION_COLUMN "idemproxy_replication"
#define PG_ASYNC_LOG_MS (10 * 60 * 1000)
/* The listener's backend, in its setup and its probes (and so in
 * pg_stat_activity). */
#define PG_SESSION_COLUMN "idemproxy_listener"
#define PG_SWEEP_BATCH 1000
#define PG_CLAIM_RETRIES 5	/* the record changed under the statement */
#define PG_STMT_ERRORS 3	/* a statement failing on its own */
#define PG_BATCH_MAX 64		/* operations per pipeline */
/* A batch in flight holds the queue for at most this long, while at least
 * PG_HOLD_SIBLINGS operations are outstanding (store_pg_pool.c, hold()). */
#define PG_HOLD_US 2000
#define PG_HOLD_SIBLINGS 4
/* Several hosts (store_pg_hosts.h): each is connected to on its own. */
#define PG_HOST_CONNECT_MS 2000	/* one host's connect and startup */
#define PG_REPROBE_MS 200	/* a host that refused is asked again */
#define PG_PROBE_TICK_MS 50
/* A host where a statement timed out (a primary that lost its role and
 * waits for a standby that is gone, docs/ha.md) loses ties for this long,
 * or until a batch commits there: a probe that reaches it waits up to
 * PG_PARK_MS for another host to accept writes first. */
#define PG_SLOW_HOST_MS 30000
#define PG_PARK_MS 500
#define PG_LISTEN_PROBE_MS 1000	/* the listener proves it hears this often */
#define PG_LISTEN_DEADLINE_MS 2000	/* ... or is down this long after */

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
	bool abandoned;			/* a claim nobody waits for: abandon() */
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
	int up;				/* connections IDLE or BUSY */
	bool sweeping;
	struct pg_local *next;		/* s->locals */
};

struct pg_store {
	struct store base;
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

/* store_pg_pool.c: a thread's pool, its queue, the operations' lives. */
struct pg_local *pg_local_for(struct pg_store *s, struct event_base *base);
/* A new pool on base (one statement connection opened at once; the
 * listener too when s wants every notification). NULL without memory. */
struct pg_local *pg_local_new(struct pg_store *s, struct event_base *base);
void pg_local_free(struct pg_local *l);
struct pg_op *pg_op_alloc(struct pg_local *l, enum pg_kind kind,
			  const struct store_key *k, store_cb cb, void *arg);
struct pg_op *pg_op_new(struct pg_store *s, struct event_base *base,
			enum pg_kind kind, const struct store_key *k,
			store_cb cb, void *arg);
void pg_op_free(struct pg_op *o);
/* Report st on the caller's loop, next turn (an internal op is freed). */
void pg_op_finish(struct pg_op *o, enum store_status st);
/* Queue o (at the head: a retry keeps its turn) under its deadline. */
void pg_enqueue(struct pg_op *o, bool head);
struct store_op *pg_op_submit(struct pg_op *o);
/* A watcher waits for a notification, or its poll. */
void pg_watch_add(struct pg_op *o);
bool pg_may_serve(const struct pg_local *l);

/* Close a connection and its socket event (either may be NULL). */
void pg_close_conn(PGconn **pg, struct event **io);

/* store_pg_parts.c: retention of the partitioned table, on base (the
 * thread that sweeps); its own connection and timer. */
#define PG_PART_MIN_MS 2000
#define PG_PART_MAX_MS (6 * 3600 * 1000ULL)
uint64_t pg_part_width(uint64_t ttl_ms);	/* ttl / 4, within bounds */
struct pg_parts *pg_parts_start(struct pg_store *s, struct event_base *base);
struct event_base *pg_parts_base(const struct pg_parts *p);
void pg_parts_free(struct pg_parts *p);
/* store_pg_schema.c: make a table of an earlier version (not partitioned)
 * the first partition of a partitioned one; blocking (migrate only). */
int pg_convert(PGconn *pg, uint64_t width_ms, char *err, size_t errlen);

/* store_pg.c: what an operation means. */
const char *pg_stmt_name(enum pg_kind kind);
/* Queue o's statement in c's pipeline. 0 or -1. */
int pg_send_op(struct pg_conn *c, struct pg_op *o);
/* Send the wake-up of the completions of c's committed batch that waiters
 * marked (a transaction of its own, and its Sync): 1 sent, 0 nothing to
 * wake, -1 failed. */
int pg_send_wake(struct pg_conn *c);
/* The advisory lock a claim of k takes before it inserts or takes over
 * (idemproxy_claim6): SipHash-2-4 of "scope\0key" under a fixed key, the
 * same in every instance sharing the table. Batches send their claims in
 * its order, so that two batches never wait for each other's keys. */
int64_t pg_lock_id(const struct store_key *k);
/* o's batch committed: its held result is its outcome. */
void pg_op_committed(struct pg_op *o);
/* o's deadline passed without an outcome. */
void pg_give_up(struct pg_op *o);

#endif
