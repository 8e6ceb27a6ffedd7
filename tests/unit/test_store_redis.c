/*
 * The Redis fast path (common/store/store_redis.c) over the memory store, against
 * a private redis-server started here on a free 127.0.0.1 port in a temp dir
 * (exit 77, skip, when redis-server is missing).
 *
 * Where an answer came from is shown, not assumed: a record put into Redis
 * only (the memory store has never seen it) answers COMPLETED or MISMATCH
 * through the layer and WON from the memory store; idemproxy_redis_hits_total
 * is read from the metrics registry. Redis is then frozen (SIGSTOP: the
 * lookup times out), killed, restarted and flushed, and claims must keep
 * working through the memory store all along.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>
#include <hiredis/hiredis.h>

#include "metrics.h"
#include "store.h"
#include "store_memory.h"
#include "store_redis.h"
#include "tap.h"

#define TTL 60000
#define LEASE 30000

static char tmpdir[] = "/tmp/idemproxy-redis-XXXXXX";
static char port[16];
static pid_t redis_pid = -1;

/* ---- the private redis-server ---- */

static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), p = -1;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		p = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return p;
}

static redisContext *sync_connect(void)
{
	struct timeval tv = { 1, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", atoi(port), tv);

	if (c != NULL && c->err != 0) {
		redisFree(c);
		return NULL;
	}
	return c;
}

static bool redis_start(void)
{
	redisContext *c;

	redis_pid = fork();
	if (redis_pid < 0)
		return false;
	if (redis_pid == 0) {
		int null = open("/dev/null", 0);

		if (null >= 0) {
			dup2(null, 1);
			dup2(null, 2);
		}
		execlp("redis-server", "redis-server", "--port", port, "--bind",
		       "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
		       tmpdir, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 200; i++) {
		struct timespec ts = { 0, 20 * 1000 * 1000 };

		if ((c = sync_connect()) != NULL) {
			redisReply *r = redisCommand(c, "PING");
			bool up = r != NULL && r->type == REDIS_REPLY_STATUS;

			freeReplyObject(r);
			redisFree(c);
			if (up)
				return true;
		}
		if (waitpid(redis_pid, NULL, WNOHANG) == redis_pid) {
			redis_pid = -1;
			return false;
		}
		nanosleep(&ts, NULL);
	}
	return false;
}

static void redis_stop(void)
{
	if (redis_pid > 0) {
		kill(redis_pid, SIGCONT);
		kill(redis_pid, SIGKILL);
		waitpid(redis_pid, NULL, 0);
	}
	redis_pid = -1;
}

/* A command on a fresh synchronous connection; the reply or NULL. */
static redisReply *sync_cmd(const char *fmt, const char *a, size_t alen,
			    const char *b, size_t blen)
{
	redisContext *c = sync_connect();
	redisReply *r;

	if (c == NULL)
		return NULL;
	r = redisCommand(c, fmt, a, alen, b, blen);
	redisFree(c);
	return r;
}

/* ---- metrics ---- */

static unsigned long metric(const char *name)
{
	char *buf = NULL, *p;
	size_t len = 0;
	unsigned long v = 0;
	FILE *f = open_memstream(&buf, &len);

	metrics_render(f);
	fclose(f);
	for (p = buf; (p = strstr(p, name)) != NULL; p++)
		if ((p == buf || p[-1] == '\n') && p[strlen(name)] == ' ') {
			v = strtoul(p + strlen(name) + 1, NULL, 10);
			break;
		}
	free(buf);
	return v;
}

#define HITS() metric("idemproxy_redis_hits_total")
#define ERRORS() metric("idemproxy_store_errors_total{store=\"redis\"}")

/* ---- results and the loop ---- */

struct res {
	int calls;
	enum store_status status;
	char owner[STORE_HANDLE_MAX + 1];
	struct stored_response *resp;
	struct event_base *base;
};

static void res_reset(struct res *r)
{
	stored_response_unref(r->resp);
	memset(r, 0, sizeof(*r));
}

static void on_result(void *arg, const struct store_result *sr)
{
	struct res *r = arg;

	r->calls++;
	r->status = sr->status;
	memcpy(r->owner, sr->owner, sizeof(r->owner));
	stored_response_unref(r->resp);
	r->resp = sr->resp != NULL ? stored_response_ref(sr->resp) : NULL;
	if (r->base != NULL)
		event_base_loopbreak(r->base);
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void break_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	event_base_loopbreak(arg);
}

/* Run base for up to ms, or until a result breaks the loop. */
static void run_for(struct event_base *base, int ms)
{
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
	struct event *t = evtimer_new(base, break_cb, base);

	evtimer_add(t, &tv);
	event_base_dispatch(base);
	event_free(t);
}

static struct store_claim mkclaim(const char *scope, const char *key, int fpbyte)
{
	struct store_claim c;

	memset(&c, 0, sizeof(c));
	snprintf(c.key.scope, sizeof(c.key.scope), "%s", scope);
	snprintf(c.key.key, sizeof(c.key.key), "%s", key);
	memset(c.fp, fpbyte, FP_LEN);
	c.lease_ms = LEASE;
	c.ttl_ms = TTL;
	return c;
}

/* Claim and wait (up to 2 s) for the answer. */
static enum store_status claim(struct store *s, struct event_base *b,
			       const struct store_claim *c, struct res *r,
			       const char *what)
{
	struct store_op *op;

	res_reset(r);
	r->base = b;
	op = store_claim(s, b, c, on_result, r);
	ok(op != NULL && r->calls == 0, "%s: a handle, no callback inside the call",
	   what);
	if (op == NULL)
		return STORE_ERROR;
	run_for(b, 2000);
	is_int(r->calls, 1, "%s: one callback", what);
	return r->status;
}

static enum store_status complete(struct store *s, struct event_base *b,
				  const struct store_claim *c, const char *owner,
				  struct stored_response *resp)
{
	struct res r = { .base = b };
	struct store_op *op = store_complete(s, b, &c->key, owner, c->fp, resp, TTL,
					     on_result, &r);
	enum store_status st;

	if (op == NULL)
		return STORE_ERROR;
	ok(r.calls == 0, "complete: no callback inside the call");

	run_for(b, 2000);
	st = r.calls == 1 ? r.status : STORE_ERROR;
	res_reset(&r);
	return st;
}

/* Wait until the layer's connection on b is up (made by an operation). */
static bool wait_connected(struct store *s, struct event_base *b, int ms)
{
	double end = now_ms() + ms;

	while (now_ms() < end) {
		if (store_redis_connected(s, b))
			return true;
		run_for(b, 20);
	}
	return store_redis_connected(s, b);
}

/* The epoch a copy written now carries: the server's master_replid. */
static void server_epoch(char epoch[STORE_REDIS_EPOCH_LEN + 1])
{
	redisReply *r = sync_cmd("INFO %s", "replication", (size_t)0, NULL, 0);
	const char *p = r != NULL && r->type == REDIS_REPLY_STRING ?
			strstr(r->str, "master_replid:") : NULL;

	snprintf(epoch, STORE_REDIS_EPOCH_LEN + 1, "%s",
		 p != NULL ? p + strlen("master_replid:") : "????????????????");
	freeReplyObject(r);
}

/* GET a cached value from Redis, waiting for a write-through to land. */
static struct stored_response *redis_value(const char *rkey, uint8_t fp[FP_LEN],
					   struct event_base *b)
{
	char epoch[STORE_REDIS_EPOCH_LEN + 1];

	for (int i = 0; i < 100; i++) {
		redisReply *r = sync_cmd("GET %b", rkey, strlen(rkey), NULL, 0);
		struct stored_response *resp = NULL;

		if (r != NULL && r->type == REDIS_REPLY_STRING)
			resp = store_redis_decode(r->str, r->len, fp, epoch);
		freeReplyObject(r);
		if (resp != NULL)
			return resp;
		run_for(b, 10);
	}
	return NULL;
}

/* Put a record into Redis only. */
static void redis_put(const char *rkey, int fpbyte, const char *body)
{
	uint8_t fp[FP_LEN];
	struct stored_response *resp = stored_response_new(200, "X-Only: redis\r\n",
							   15, body, strlen(body), true);
	char epoch[STORE_REDIS_EPOCH_LEN + 1];
	size_t len;
	char *val;
	redisReply *r;

	memset(fp, fpbyte, FP_LEN);
	server_epoch(epoch);
	val = store_redis_encode(fp, epoch, resp, &len);
	r = sync_cmd("SET %b %b", rkey, strlen(rkey), val, len);
	ok(r != NULL && r->type == REDIS_REPLY_STATUS, "SET %s directly", rkey);
	freeReplyObject(r);
	free(val);
	stored_response_unref(resp);
}

/* ---- the value format, without Redis ---- */

static void test_format(void)
{
	uint8_t fp[FP_LEN], back[FP_LEN];
	struct stored_response *r = stored_response_new(201, "A: b\r\n", 6,
							"body\0x", 6, true);
	const char *ep = "0123456789abcdef";
	char epoch[STORE_REDIS_EPOCH_LEN + 1];
	struct stored_response *d;
	size_t len;
	char *v;

	for (int i = 0; i < FP_LEN; i++)
		fp[i] = (uint8_t)(i * 7);
	v = store_redis_encode(fp, ep, r, &len);
	is_int(len, STORE_REDIS_HDR_LEN + 6 + 6, "encoded length");
	ok(memcmp(v, "IPR2", 4) == 0 && memcmp(v + 4, ep, 16) == 0,
	   "magic, then the epoch");
	d = store_redis_decode(v, len, back, epoch);
	ok(d != NULL && d->status == 201 && d->head_len == 6 &&
	   memcmp(d->head, "A: b\r\n", 6) == 0 && d->body_len == 6 &&
	   memcmp(d->body, "body\0x", 6) == 0 && d->body_stored &&
	   memcmp(back, fp, FP_LEN) == 0 && strcmp(epoch, ep) == 0,
	   "decode(encode(x)) == x");
	stored_response_unref(d);
	for (size_t n = 0; n < len; n++) {
		d = store_redis_decode(v, n, back, epoch);
		if (d != NULL)
			break;
	}
	ok(d == NULL, "every truncation is rejected");
	v[0] = 'X';
	ok(store_redis_decode(v, len, back, epoch) == NULL, "bad magic rejected");
	v[0] = 'I';
	v[54] = 2;
	ok(store_redis_decode(v, len, back, epoch) == NULL, "bad flags rejected");
	free(v);
	ok(store_redis_encode(fp, "short", r, &len) == NULL,
	   "an epoch of another length is refused");
	stored_response_unref(r);

	r = stored_response_new(200, "", 0, "", 0, false);
	v = store_redis_encode(fp, ep, r, &len);
	d = store_redis_decode(v, len, back, epoch);
	ok(d != NULL && !d->body_stored && d->head_len == 0 && d->body_len == 0,
	   "empty, body not stored: round trip");
	stored_response_unref(d);
	free(v);
	stored_response_unref(r);
}

/* ---- a worker thread: its connection closes when it exits ---- */

struct thread_arg {
	struct store *s;
	struct event_base *base;	/* freed by main after the join */
	int won, hit;
};

static void *thread_main(void *p)
{
	struct thread_arg *t = p;
	struct store_claim c = mkclaim("", "thread-key", 9);
	struct res r = { .base = t->base };
	struct stored_response *resp = stored_response_new(200, "", 0, "t", 1, true);
	struct store_op *op;

	op = store_claim(t->s, t->base, &c, on_result, &r);	/* connects */
	if (op != NULL)
		run_for(t->base, 2000);
	for (int i = 0; i < 100 && !store_redis_connected(t->s, t->base); i++)
		run_for(t->base, 20);
	t->won = r.status == STORE_WON;
	if (t->won) {
		struct res rc = { .base = t->base };

		if (store_complete(t->s, t->base, &c.key, r.owner, c.fp, resp, TTL,
				   on_result, &rc) != NULL)
			run_for(t->base, 2000);
		run_for(t->base, 50);	/* the write-through */
		res_reset(&rc);
	}
	res_reset(&r);
	r.base = t->base;
	if (store_claim(t->s, t->base, &c, on_result, &r) != NULL)
		run_for(t->base, 2000);
	t->hit = r.status == STORE_COMPLETED;
	res_reset(&r);
	stored_response_unref(resp);
	return NULL;		/* no thread_done: the exit closes it */
}

int main(void)
{
	struct event_base *base;
	struct store *s, *inner;
	struct res r = { 0 };
	struct store_claim c1, c2, cx;
	struct stored_response *resp, *got;
	uint8_t fp[FP_LEN], want[FP_LEN];
	char err[256];
	unsigned long hits, errors;
	int p;

	signal(SIGPIPE, SIG_IGN);
	if (system("command -v redis-server >/dev/null 2>&1") != 0) {
		printf("1..0 # SKIP redis-server not found\n");
		return 77;
	}
	test_format();
	if (mkdtemp(tmpdir) == NULL || (p = free_port()) < 0) {
		printf("Bail out! no temp dir or port\n");
		return 1;
	}
	snprintf(port, sizeof(port), "%d", p);
	if (!redis_start()) {
		printf("Bail out! redis-server did not start\n");
		return 1;
	}
	evthread_use_pthreads();
	base = event_base_new();

	/* bad arguments: an error, and the inner store is freed */
	ok(store_redis_new(store_memory_new(1 << 20, NULL), "127.0.0.1", "0", 0,
			   err, sizeof(err)) == NULL && strstr(err, "port") != NULL,
	   "bad port refused: %s", err);

	inner = store_memory_new(64 << 20, NULL);
	s = store_redis_new(inner, "localhost", port, 0, err, sizeof(err));
	ok(s != NULL, "store_redis_new (localhost resolved)");
	/* sanitizers and parallel tests are slow: no timeouts by accident */
	store_redis_set_timeout(s, 300);

	/* the first operation on a base starts its connection */
	c1 = mkclaim("", "warm-up", 1);
	is_int(claim(s, base, &c1, &r, "warm-up"), STORE_WON,
	       "warm-up claim: WON (from the memory store)");
	ok(wait_connected(s, base, 2000), "connected");

	/* miss -> the memory store decides; completion is written through */
	c1 = mkclaim("", "k1", 0xa1);
	is_int(claim(s, base, &c1, &r, "k1"), STORE_WON, "k1: WON");
	resp = stored_response_new(201, "X-A: 1\r\n", 8, "hello", 5, true);
	is_int(complete(s, base, &c1, r.owner, resp), STORE_OK, "k1: complete OK");
	stored_response_unref(resp);
	got = redis_value("idemproxy::k1", fp, base);
	memset(want, 0xa1, FP_LEN);
	ok(got != NULL && got->status == 201 && got->body_len == 5 &&
	   memcmp(got->body, "hello", 5) == 0 && got->head_len == 8 &&
	   got->body_stored && memcmp(fp, want, FP_LEN) == 0,
	   "k1 written through to idemproxy::k1 with its fingerprint");
	stored_response_unref(got);
	{
		redisReply *t = sync_cmd("PTTL %b", "idemproxy::k1", 13, NULL, 0);

		ok(t != NULL && t->type == REDIS_REPLY_INTEGER &&
		   t->integer > TTL - 5000 && t->integer <= TTL,
		   "k1 expires with the record's TTL (%lld ms)",
		   t != NULL ? t->integer : -1LL);
		freeReplyObject(t);
	}

	/* a duplicate: from Redis */
	hits = HITS();
	is_int(claim(s, base, &c1, &r, "k1 again"), STORE_COMPLETED,
	       "k1 again: COMPLETED");
	ok(r.resp != NULL && r.resp->status == 201 && r.resp->body_len == 5,
	   "k1 again: the stored response");
	is_int(HITS(), hits + 1, "k1 again: counted as a Redis hit");

	/* a record in Redis only proves where the answers come from */
	redis_put("idemproxy::only-redis", 0x77, "from redis");
	cx = mkclaim("", "only-redis", 0x77);
	is_int(claim(s, base, &cx, &r, "only-redis"), STORE_COMPLETED,
	       "only-redis: COMPLETED (the memory store has no such record)");
	ok(r.resp != NULL && r.resp->body_len == 10 &&
	   memcmp(r.resp->body, "from redis", 10) == 0, "only-redis: its body");
	cx = mkclaim("", "only-redis", 0x78);
	hits = HITS();
	is_int(claim(s, base, &cx, &r, "only-redis, other body"), STORE_MISMATCH,
	       "only-redis, other fingerprint: MISMATCH from Redis");
	is_int(HITS(), hits, "a mismatch is not a hit");
	c2 = mkclaim("", "k1", 0xb2);
	is_int(claim(s, base, &c2, &r, "k1 other body"), STORE_MISMATCH,
	       "k1, other fingerprint: MISMATCH");

	/* scoped keys; records completed without their body are cached too */
	c2 = mkclaim("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		     "big", 0xc3);
	is_int(claim(s, base, &c2, &r, "scoped"), STORE_WON, "scoped: WON");
	resp = stored_response_new(200, "", 0, "", 0, false);
	is_int(complete(s, base, &c2, r.owner, resp), STORE_OK, "scoped: complete");
	stored_response_unref(resp);
	got = redis_value("idemproxy:0123456789abcdef0123456789abcdef0123456789abcdef"
			  "0123456789abcdef:big", fp, base);
	ok(got != NULL && !got->body_stored, "scoped key cached, body_stored false");
	stored_response_unref(got);
	hits = HITS();
	is_int(claim(s, base, &c2, &r, "scoped again"), STORE_COMPLETED,
	       "scoped again: COMPLETED");
	ok(r.resp != NULL && !r.resp->body_stored && HITS() == hits + 1,
	   "scoped again: from Redis, body not stored");

	/* release and fenced completions are not cached */
	c2 = mkclaim("", "released", 0xd4);
	is_int(claim(s, base, &c2, &r, "released"), STORE_WON, "released: WON");
	{
		struct res rr = { .base = base };
		struct store_op *op = store_release(s, base, &c2.key, r.owner,
						    on_result, &rr);

		ok(op != NULL, "release: a handle");
		run_for(base, 1000);
		is_int(rr.status, STORE_OK, "release: OK");
	}
	resp = stored_response_new(200, "", 0, "x", 1, true);
	is_int(complete(s, base, &c2, r.owner, resp), STORE_FENCED,
	       "complete after release: FENCED, passed through");
	stored_response_unref(resp);
	run_for(base, 50);
	{
		redisReply *t = sync_cmd("EXISTS %b", "idemproxy::released", 19,
					 NULL, 0);

		ok(t != NULL && t->integer == 0, "nothing cached for it");
		freeReplyObject(t);
	}

	/* cancel while the lookup is pending: no callback, ever */
	res_reset(&r);
	{
		struct store_op *op;

		c2 = mkclaim("", "cancelled", 0xe5);
		op = store_claim(s, base, &c2, on_result, &r);
		ok(op != NULL && r.calls == 0, "cancel: a pending lookup");
		store_cancel(op);
		run_for(base, 100);
		is_int(r.calls, 0, "cancelled lookup: no callback");
		/* and a cancelled complete */
		c2 = mkclaim("", "cancelled-2", 0xe6);
		is_int(claim(s, base, &c2, &r, "cancelled-2"), STORE_WON,
		       "cancelled-2: WON");
		resp = stored_response_new(200, "", 0, "x", 1, true);
		{
			struct res rc = { 0 };

			op = store_complete(s, base, &c2.key, r.owner, c2.fp, resp, TTL,
					    on_result, &rc);
			store_cancel(op);
			run_for(base, 50);
			is_int(rc.calls, 0, "cancelled complete: no callback");
		}
		stored_response_unref(resp);
	}

	/* Redis frozen: the lookup times out, the memory store answers */
	kill(redis_pid, SIGSTOP);
	errors = ERRORS();
	c2 = mkclaim("", "k1", 0xa1);
	{
		double t0 = now_ms();

		is_int(claim(s, base, &c2, &r, "frozen"), STORE_COMPLETED,
		       "Redis frozen: k1 still COMPLETED (memory store)");
		ok(now_ms() - t0 >= 290 && now_ms() - t0 < 1500,
		   "answered after the 300 ms timeout (%.0f ms)", now_ms() - t0);
	}
	ok(ERRORS() > errors, "the timeout is counted as a Redis error");
	ok(!store_redis_connected(s, base), "the stuck connection was dropped");
	c2 = mkclaim("", "while-frozen", 0xf6);
	is_int(claim(s, base, &c2, &r, "while-frozen"), STORE_WON,
	       "a new key while frozen: WON");
	kill(redis_pid, SIGCONT);
	ok(wait_connected(s, base, 3000), "reconnected after the freeze");

	/* a pending lookup cancelled after it went to the memory store */
	redis_stop();
	run_for(base, 50);
	ok(!store_redis_connected(s, base), "Redis killed: noticed");
	res_reset(&r);
	{
		struct store_op *op;

		c2 = mkclaim("", "cancel-inner", 0x11);
		op = store_claim(s, base, &c2, on_result, &r);
		ok(op != NULL, "claim while down: a handle");
		store_cancel(op);
		run_for(base, 50);
		is_int(r.calls, 0, "cancelled after delegating: no callback");
	}

	/* Redis down: claims keep working */
	hits = HITS();
	c2 = mkclaim("", "k1", 0xa1);
	is_int(claim(s, base, &c2, &r, "down"), STORE_COMPLETED,
	       "Redis down: k1 COMPLETED from the memory store");
	c2 = mkclaim("", "down-key", 0x22);
	is_int(claim(s, base, &c2, &r, "down-key"), STORE_WON, "down: new key WON");
	resp = stored_response_new(200, "", 0, "d", 1, true);
	is_int(complete(s, base, &c2, r.owner, resp), STORE_OK,
	       "down: complete OK (write-through skipped)");
	stored_response_unref(resp);
	is_int(claim(s, base, &c2, &r, "down-key again"), STORE_COMPLETED,
	       "down: duplicate COMPLETED");
	is_int(HITS(), hits, "down: no Redis hits");

	/* restarted (empty): reconnect, miss, then hits again */
	if (!redis_start()) {
		printf("Bail out! redis-server did not restart\n");
		return 1;
	}
	ok(wait_connected(s, base, 8000), "reconnected after the restart");
	hits = HITS();
	c2 = mkclaim("", "k1", 0xa1);
	is_int(claim(s, base, &c2, &r, "restarted"), STORE_COMPLETED,
	       "restarted: k1 COMPLETED (memory store, Redis lost it)");
	is_int(HITS(), hits, "restarted: not a hit");
	c2 = mkclaim("", "after-restart", 0x33);
	is_int(claim(s, base, &c2, &r, "after-restart"), STORE_WON,
	       "after-restart: WON");
	resp = stored_response_new(200, "", 0, "r", 1, true);
	is_int(complete(s, base, &c2, r.owner, resp), STORE_OK,
	       "after-restart: complete");
	stored_response_unref(resp);
	got = redis_value("idemproxy::after-restart", fp, base);
	ok(got != NULL, "after-restart: written through");
	stored_response_unref(got);
	is_int(claim(s, base, &c2, &r, "after-restart again"), STORE_COMPLETED,
	       "after-restart again: COMPLETED");
	is_int(HITS(), hits + 1, "after-restart again: a Redis hit");

	/* FLUSHALL: back to the memory store, never a duplicate */
	freeReplyObject(sync_cmd("FLUSHALL", NULL, 0, NULL, 0));
	hits = HITS();
	is_int(claim(s, base, &c2, &r, "flushed"), STORE_COMPLETED,
	       "flushed: COMPLETED from the memory store");
	is_int(HITS(), hits, "flushed: not a hit");

	/* another thread: its own connection, closed when it exits */
	{
		struct thread_arg t = { .s = s, .base = event_base_new() };
		pthread_t th;

		pthread_create(&th, NULL, thread_main, &t);
		pthread_join(th, NULL);
		ok(t.won && t.hit, "a second thread: WON, then a hit");
		event_base_free(t.base);	/* after its connection closed */
	}

	/* thread_done on this thread's base (with a lookup its owner forgot
	 * to cancel: it fails rather than start work in the inner store) */
	ok(store_redis_connected(s, base), "still connected before thread_done");
	res_reset(&r);
	r.base = base;
	c2 = mkclaim("", "forgotten", 0x66);
	ok(store_claim(s, base, &c2, on_result, &r) != NULL, "a lookup pending");
	store_redis_thread_done(s, base);
	ok(!store_redis_connected(s, base), "thread_done closed the connection");
	run_for(base, 100);
	ok(r.calls == 1 && r.status == STORE_ERROR,
	   "the forgotten lookup: STORE_ERROR");
	store_redis_thread_done(s, base);	/* twice: nothing to do */
	res_reset(&r);
	store_free(s);

	/* Redis down from the start */
	{
		char dead[16];

		snprintf(dead, sizeof(dead), "%d", free_port());
		s = store_redis_new(store_memory_new(1 << 20, NULL), "127.0.0.1",
				    dead, 0, err, sizeof(err));
		c2 = mkclaim("", "never-up", 0x44);
		is_int(claim(s, base, &c2, &r, "never-up"), STORE_WON,
		       "Redis never up: WON");
		run_for(base, 300);	/* a few reconnect attempts */
		is_int(claim(s, base, &c2, &r, "never-up again"), STORE_IN_FLIGHT,
		       "Redis never up: the duplicate is IN_FLIGHT");
		res_reset(&r);
		store_free(s);
	}

	/* a bad database index: SELECT fails, claims still work */
	{
		s = store_redis_new(store_memory_new(1 << 20, NULL), "127.0.0.1",
				    port, 100000, err, sizeof(err));
		c2 = mkclaim("", "bad-db", 0x55);
		is_int(claim(s, base, &c2, &r, "bad db"), STORE_WON, "bad db: WON");
		ok(!wait_connected(s, base, 300), "bad db: never up");
		res_reset(&r);
		store_free(s);
	}

	event_base_free(base);
	redis_stop();
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
		if (system(cmd) != 0)
			printf("# could not remove %s\n", tmpdir);
	}
	return tap_done();
}
