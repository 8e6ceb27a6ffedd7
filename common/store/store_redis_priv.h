/*
 * store_redis_priv.h - what the Redis fast path's two halves share:
 * store_redis_conn.c owns the connections (one per event_base, sentinel
 * lookups, the preparation of each new connection), store_redis.c the
 * operations that use them.
 */
#ifndef IDEMPROXY_STORE_REDIS_PRIV_H
#define IDEMPROXY_STORE_REDIS_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include <event2/event.h>
#include <hiredis/async.h>

#include "addrs.h"
#include "hostport.h"
#include "store_redis.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define RC_CONNECT_MS 2000	/* connect and prepare, or ask a sentinel */
#define MAX_PENDING 4096	/* commands awaiting replies, per connection */
#define KEY_PREFIX "idemproxy:"
#define KEY_MAX (sizeof(KEY_PREFIX) + STORE_SCOPE_LEN + 1 + IDEMKEY_MAX + 1)

/*
 * A purge leaves "idemproxy:purged:<T>" in place of the copy, T the Redis
 * server's clock (Unix ms) when it ran, for at least TOMBSTONE_MS and at
 * least as long as the purged record would have lived. Claims read it as
 * a miss; a write of a copy whose record was learned before T is refused
 * (see PUT_LUA), one learned after T is a new record and replaces it.
 */
#define TOMBSTONE "idemproxy:purged"
#define TOMBSTONE_MS 10000

/*
 * Writes every copy: KEYS[1] the key; ARGV[1] the value, ARGV[2] when it
 * expires and ARGV[3] a moment before the record was learned, both on the
 * server's clock (Unix ms), ARGV[4] the epoch the value carries. Nothing
 * is written when the expiry has passed (a late write), when a tombstone
 * is younger than what the write learned, or when a copy of this epoch is
 * there (the first copy stays: NX). A copy of another epoch (written
 * before a failover or a restart) is replaced. 1 written, 0 not.
 */
#define PUT_LUA \
	"if redis.replicate_commands then redis.replicate_commands() end\n" \
	"local t = redis.call('TIME')\n" \
	"local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n" \
	"local px = tonumber(ARGV[2]) - now\n" \
	"if px <= 0 then return 0 end\n" \
	"local cur = redis.call('GET', KEYS[1])\n" \
	"if cur then\n" \
	"  if string.sub(cur, 1, 16) == '" TOMBSTONE "' then\n" \
	"    local ts = tonumber(string.sub(cur, 18))\n" \
	"    if ts == nil or ts >= tonumber(ARGV[3]) then return 0 end\n" \
	"  elseif string.sub(cur, 1, 4) == '" STORE_REDIS_MAGIC "' and\n" \
	"         string.sub(cur, 5, 4 + string.len(ARGV[4])) == ARGV[4] then\n" \
	"    return 0\n" \
	"  end\n" \
	"end\n" \
	"redis.call('SET', KEYS[1], ARGV[1], 'PX', px)\n" \
	"return 1\n"

/*
 * A purge: KEYS[1] the key, ARGV[1] how long the tombstone lives at least
 * (ms). Returns the old value (to say whether a copy was there); the
 * tombstone lives as long as what it replaces, if that is longer.
 */
#define PURGE_LUA \
	"if redis.replicate_commands then redis.replicate_commands() end\n" \
	"local t = redis.call('TIME')\n" \
	"local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n" \
	"local v = redis.call('GET', KEYS[1])\n" \
	"local keep = tonumber(ARGV[1])\n" \
	"local left = redis.call('PTTL', KEYS[1])\n" \
	"if left > keep then keep = left end\n" \
	"redis.call('SET', KEYS[1], '" TOMBSTONE ":' .. now, 'PX', keep)\n" \
	"return v\n"

enum rconn_state {
	RC_DOWN,		/* no connection; the retry timer may be armed */
	RC_ASKING,		/* sentinel mode: asking a sentinel for the master */
	RC_CONNECTING,		/* TCP connect in progress */
	RC_PREPARING,		/* connected: SELECT, scripts, epoch, clock */
	RC_UP,			/* usable for lookups and write-through */
};

/* One Redis connection, used by one event_base (one thread). */
struct rconn {
	struct redis_store *rs;
	struct event_base *base;
	enum rconn_state state;
	redisAsyncContext *ac;		/* NULL when RC_DOWN */
	struct event *retry;		/* reconnect timer */
	unsigned backoff_ms;		/* the next retry's delay */
	unsigned pending;		/* commands awaiting replies */
	bool failing;			/* an outage was logged */
	int addr;			/* rs->addrs[addr]: connecting to */
	int tried;			/* addresses refused in a row */
	redisAsyncContext *sac;		/* RC_ASKING: the sentinel asked */
	int sentinel;			/* rs->sentinels[sentinel]: asked next */
	int asked;			/* sentinels that failed in a row */
	bool have_master;		/* master_addr is the answer to use */
	char master_addr[64];		/* what a sentinel said */
	int master_port;
	bool closing;			/* rc_free(): no new work for anyone */
	/* learned while RC_PREPARING */
	char put_sha[41], purge_sha[41];	/* the scripts, loaded */
	char epoch[STORE_REDIS_EPOCH_LEN + 1];	/* the server's replication id */
	int64_t clock_lo;		/* server ms >= our monotonic ms + this */
	LIST_ENTRY(rconn) link;		/* rs->conns, under rs->mu */
	struct rconn *tl_next;		/* the creating thread's list */
};

struct redis_store {
	struct store base;
	struct store *inner;
	char host[256];			/* as configured */
	char label[320];		/* for the log: host:port, or the master */
	char addrs[ADDRS_MAX][64];	/* numeric, IPv4 first, once resolved */
	int naddrs;
	atomic_int cur;			/* the one that connected last */
	atomic_bool resolved;
	int port;
	int db;
	char *master;			/* sentinel mode: the master's name */
	int nsentinels;
	struct {
		char host[256];		/* as configured */
		int port;
		char addr[64];		/* numeric, once resolved */
	} sentinels[HOSTPORT_SENTINELS_MAX];
	atomic_uint timeout_ms;
	pthread_key_t tl_key;		/* this thread's struct rconn list */
	pthread_mutex_t mu;		/* conns */
	LIST_HEAD(, rconn) conns;
};

/* This thread's connection for base; made (and started) if create. */
struct rconn *rc_get(struct redis_store *rs, struct event_base *base,
		     bool create);
/* Close rc's connection; why: reconnect after the back-off (logged),
 * NULL: for good. Pending replies run with NULL. */
void rc_drop(struct rconn *rc, const char *why);
/* Close and free rc (already off every list); needs rc->base alive. */
void rc_free(struct rconn *rc);
/* The thread-specific destructor of rs->tl_key. */
void rc_thread_exit(void *head);
/* Resolve the host (or the sentinels) into rs; may block in DNS. */
bool redis_resolve(struct redis_store *rs);

/* A reply with an error: count it; NOSCRIPT or READONLY drop rc (the
 * next connection loads the scripts, or looks for the master, again). */
void rc_reply_error(struct rconn *rc, const char *cmd, const char *err);

#endif
