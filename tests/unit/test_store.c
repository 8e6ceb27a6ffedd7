/*
 * The memory store through the store.h interface (common/store/store_memory.c):
 * every branch of the claim table, fencing, expiry, wake-ups (same thread,
 * other threads, lease timeout), cancellation, the byte cap and the sweep;
 * the table under load: keys chosen to collide, doubling while in use,
 * bounded work at the byte cap. Last, the response cache in front of it
 * (store_cache.c): a hit a purge made stale, a purge that waits to hear
 * itself, a cache told it may be deaf.
 *
 * A fake clock drives lease and TTL decisions; a real event_base delivers
 * the callbacks (no sockets). Every call is checked not to run its callback
 * inside the call. Leaks and races are left to ASan/UBSan (the unit suite
 * runs sanitized in tests/run.sh).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "store.h"
#include "store_cache.h"
#include "store_memory.h"
#include "tap.h"

#define BIG (64u * 1024 * 1024)

/* ---- the fake clock ---- */

static _Atomic uint64_t fake_now = 1000000;

static uint64_t fake_clock(void)
{
	return atomic_load(&fake_now);
}

static void advance(uint64_t ms)
{
	atomic_fetch_add(&fake_now, ms);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- results ---- */

struct res {
	_Atomic int calls;
	enum store_status status;
	char owner[STORE_HANDLE_MAX + 1];
	struct stored_response *resp;	/* our own reference */
	bool lapsed;
	struct event_base *stop;	/* loopbreak this base when called */
	double at;			/* when called */
};

static void res_reset(struct res *r)
{
	stored_response_unref(r->resp);
	memset(r, 0, sizeof(*r));
}

static void on_result(void *arg, const struct store_result *sr)
{
	struct res *r = arg;

	r->status = sr->status;
	r->lapsed = sr->lapsed;
	memcpy(r->owner, sr->owner, sizeof(r->owner));
	stored_response_unref(r->resp);
	r->resp = sr->resp != NULL ? stored_response_ref(sr->resp) : NULL;
	r->at = now_s();
	atomic_fetch_add(&r->calls, 1);
	if (r->stop != NULL)
		event_base_loopbreak(r->stop);
}

/* Run what is ready on base (active events), without blocking. */
static void drain(struct event_base *base)
{
	for (int i = 0; i < 4; i++)
		event_base_loop(base, EVLOOP_NONBLOCK);
}

/* Run base until something calls loopbreak, or ms of real time passed. */
static void run_for(struct event_base *base, int ms)
{
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };

	event_base_loopexit(base, &tv);
	event_base_dispatch(base);
}

static struct store_key mkkey(const char *scope, const char *key)
{
	struct store_key k;

	memset(&k, 0, sizeof(k));
	strcpy(k.scope, scope);
	strcpy(k.key, key);
	return k;
}

static struct store_claim mkclaim(const char *key, int fpbyte, uint64_t lease,
				  uint64_t ttl)
{
	struct store_claim c;

	memset(&c, 0, sizeof(c));
	c.key = mkkey("", key);
	memset(c.fp, fpbyte, FP_LEN);
	c.lease_ms = lease;
	c.ttl_ms = ttl;
	return c;
}

static bool is_owner_token(const char *o)
{
	if (strlen(o) != STORE_OWNER_LEN)
		return false;
	for (const char *p = o; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

/*
 * Each operation: call, check the callback did not run inside the call,
 * drain, check it ran exactly once. Returns the status.
 */
static enum store_status do_claim(struct store *s, struct event_base *b,
				  const struct store_claim *c, struct res *r,
				  const char *what)
{
	struct store_op *op;

	res_reset(r);
	op = store_claim(s, b, c, on_result, r);
	ok(op != NULL && atomic_load(&r->calls) == 0,
	   "%s: claim returns a handle, no callback inside the call", what);
	drain(b);
	is_int(atomic_load(&r->calls), 1, "%s: claim callback once", what);
	return r->status;
}

/* The status of the last complete/release/extend callback. */
static enum store_status last_status;

static void on_status(void *arg, const struct store_result *sr)
{
	int *calls = arg;

	last_status = sr->status;
	(*calls)++;
}

static enum store_status op_status(struct store *s, struct event_base *b,
				   struct store_op *(*start)(struct store *,
					struct event_base *, void *, int *),
				   void *ctx, const char *what)
{
	int calls = 0;
	struct store_op *op = start(s, b, ctx, &calls);

	ok(op != NULL && calls == 0, "%s: handle, no callback inside the call",
	   what);
	drain(b);
	is_int(calls, 1, "%s: callback once", what);
	return last_status;
}

/* The memory store keeps the claim's fingerprint itself. */
static const uint8_t nofp[FP_LEN];

struct settle_ctx {
	const char *key;
	const char *owner;
	struct stored_response *resp;
	uint64_t ms;
};

static struct store_op *start_complete(struct store *s, struct event_base *b,
				       void *ctx, int *calls)
{
	struct settle_ctx *x = ctx;
	struct store_key k = mkkey("", x->key);

	return store_complete(s, b, &k, x->owner, nofp, x->resp, x->ms, on_status, calls);
}

static struct store_op *start_release(struct store *s, struct event_base *b,
				      void *ctx, int *calls)
{
	struct settle_ctx *x = ctx;
	struct store_key k = mkkey("", x->key);

	return store_release(s, b, &k, x->owner, on_status, calls);
}

static struct store_op *start_extend(struct store *s, struct event_base *b,
				     void *ctx, int *calls)
{
	struct settle_ctx *x = ctx;
	struct store_key k = mkkey("", x->key);

	return store_extend(s, b, &k, x->owner, x->ms, on_status, calls);
}

static enum store_status complete(struct store *s, struct event_base *b,
				  const char *key, const char *owner,
				  struct stored_response *resp, uint64_t ttl,
				  const char *what)
{
	struct settle_ctx x = { key, owner, resp, ttl };

	return op_status(s, b, start_complete, &x, what);
}

static enum store_status release(struct store *s, struct event_base *b,
				 const char *key, const char *owner, const char *what)
{
	struct settle_ctx x = { key, owner, NULL, 0 };

	return op_status(s, b, start_release, &x, what);
}

static enum store_status extend(struct store *s, struct event_base *b,
				const char *key, const char *owner, uint64_t lease,
				const char *what)
{
	struct settle_ctx x = { key, owner, NULL, lease };

	return op_status(s, b, start_extend, &x, what);
}

static struct stored_response *resp_new(int status, const char *body)
{
	static const char head[] = "Content-Type: text/plain\r\nX-Order: 42\r\n";

	return stored_response_new(status, head, strlen(head), body,
				   strlen(body), true);
}

/* ---- the claim table ---- */

static void test_claim_table(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct store_claim c = mkclaim("k1", 0xaa, 1000, 60000);
	struct store_claim other = mkclaim("k1", 0xbb, 1000, 60000);
	struct res r = { 0 };
	struct stored_response *resp = resp_new(201, "created #1");
	char owner[STORE_HANDLE_MAX + 1];

	is_str(s->ops->name, "memory", "backend name");
	ok(store_ready(s), "memory store is always ready");

	is_int(do_claim(s, b, &c, &r, "new key"), STORE_WON, "new key: WON");
	ok(is_owner_token(r.owner), "new key: owner token is %d hex digits",
	   STORE_OWNER_LEN);
	ok(r.resp == NULL, "new key: no response");
	memcpy(owner, r.owner, sizeof(owner));
	is_int(store_memory_count(s), 1, "one record");

	is_int(do_claim(s, b, &c, &r, "in flight"), STORE_IN_FLIGHT,
	       "same fp while in flight: IN_FLIGHT");
	is_int(do_claim(s, b, &other, &r, "in flight, other fp"), STORE_MISMATCH,
	       "different fp while in flight: MISMATCH");

	/* a different scope is a different record */
	{
		struct store_claim sc = c;

		strcpy(sc.key.scope, "0123abcd");
		is_int(do_claim(s, b, &sc, &r, "other scope"), STORE_WON,
		       "same key in another scope: WON");
		is_int(store_memory_count(s), 2, "two records");
	}

	is_int(complete(s, b, "k1", "00000000000000000000000000000000", resp,
			60000, "complete by a stranger"), STORE_FENCED,
	       "complete with a wrong owner: FENCED");
	is_int(release(s, b, "k1", "ffffffffffffffffffffffffffffffff",
		       "release by a stranger"), STORE_FENCED,
	       "release with a wrong owner: FENCED");
	is_int(do_claim(s, b, &c, &r, "still in flight"), STORE_IN_FLIGHT,
	       "a fenced completion changed nothing");

	is_int(complete(s, b, "k1", owner, resp, 60000, "complete"), STORE_OK,
	       "complete by the owner: OK");

	is_int(do_claim(s, b, &c, &r, "completed"), STORE_COMPLETED,
	       "same fp after completion: COMPLETED");
	ok(r.resp != NULL, "completed: the stored response comes with it");
	if (r.resp != NULL) {
		is_int(r.resp->status, 201, "stored status");
		is_str(r.resp->body, "created #1", "stored body");
		is_int(r.resp->body_len, 10, "stored body length");
		is_str(r.resp->head, "Content-Type: text/plain\r\nX-Order: 42\r\n",
		       "stored head");
		ok(r.resp->body_stored, "body_stored");
		ok(r.resp == resp, "the stored response is shared, not copied");
	}
	is_int(do_claim(s, b, &other, &r, "completed, other fp"), STORE_MISMATCH,
	       "different fp after completion: MISMATCH");
	ok(r.resp == NULL, "mismatch: no response handed out");

	is_int(complete(s, b, "k1", owner, resp, 60000, "complete twice"),
	       STORE_FENCED, "a second completion: FENCED");
	is_int(release(s, b, "k1", owner, "release after completion"),
	       STORE_FENCED, "release of a completed record: FENCED");
	is_int(do_claim(s, b, &c, &r, "completed still"), STORE_COMPLETED,
	       "the completed record survived a late release");
	is_int(extend(s, b, "k1", owner, 1000, "extend completed"), STORE_FENCED,
	       "extend of a completed record: FENCED");

	res_reset(&r);
	stored_response_unref(resp);
	store_free(s);
	event_base_free(b);
}

static void test_release(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct store_claim c = mkclaim("rel", 1, 1000, 60000);
	struct store_claim other = mkclaim("rel", 2, 1000, 60000);
	struct res r = { 0 };
	char owner[STORE_HANDLE_MAX + 1];

	is_int(do_claim(s, b, &c, &r, "release: claim"), STORE_WON, "claim WON");
	memcpy(owner, r.owner, sizeof(owner));
	is_int(release(s, b, "rel", owner, "release"), STORE_OK,
	       "release by the owner: OK");
	is_int(store_memory_count(s), 0, "released record deleted");
	is_int(store_memory_bytes(s), 0, "no bytes left accounted");
	is_int(release(s, b, "rel", owner, "release twice"), STORE_FENCED,
	       "a second release: FENCED");
	is_int(do_claim(s, b, &other, &r, "after release, other fp"), STORE_WON,
	       "after release any request may claim (even another fp): WON");
	ok(strcmp(r.owner, owner) != 0, "with a new owner token");

	res_reset(&r);
	store_free(s);
	event_base_free(b);
}

/*
 * A lease that runs out (the owner killed, stalled or cut off): the
 * request may have executed. A duplicate's claim records the outcome as
 * unknown and replays it - never a win - and the owner's late completion,
 * with its token, replaces it. A release with the token (an operator, a
 * probe that says "never executed") lets a retry win.
 */
static void test_lease_unknown(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct store_claim c = mkclaim("lu", 7, 1000, 60000);
	struct store_claim other = mkclaim("lu", 8, 1000, 60000);
	struct store_claim c2 = mkclaim("lu2", 7, 1000, 60000);
	struct store_key k = mkkey("", "lu");
	struct res r = { 0 }, in = { 0 };
	struct stored_response *resp = resp_new(201, "late");
	struct stored_response *unk = stored_response_unknown("reset", NULL);
	char old[STORE_HANDLE_MAX + 1];

	is_int(do_claim(s, b, &c, &r, "lu: claim"), STORE_WON, "claim WON");
	memcpy(old, r.owner, sizeof(old));
	advance(1000);
	is_int(do_claim(s, b, &other, &r, "lu: other fp"), STORE_MISMATCH,
	       "lease out, another body: MISMATCH (fingerprint first)");
	is_int(do_claim(s, b, &c, &r, "lu: duplicate"), STORE_UNKNOWN,
	       "lease out, same body: UNKNOWN, not a win");
	ok(r.lapsed, "this claim recorded it (lapsed)");
	ok(r.resp != NULL && r.resp->unknown && r.resp->status == 502 &&
	   strstr(r.resp->body, "outcome-unknown") != NULL,
	   "replayed as 502 outcome-unknown");
	is_str(r.owner, old, "the handle that resolves it is the owner's");
	is_int(do_claim(s, b, &c, &r, "lu: again"), STORE_UNKNOWN,
	       "the next duplicate: UNKNOWN");
	ok(!r.lapsed, "... found so");
	advance(59000);
	is_int(do_claim(s, b, &c, &r, "lu: later"), STORE_UNKNOWN,
	       "it lives ttl from when it became unknown");
	is_int(extend(s, b, "lu", old, 1000, "lu: owner extends"), STORE_FENCED,
	       "the owner can no longer extend it");
	store_inspect(s, b, &k, false, on_result, &in);
	drain(b);
	is_int(in.status, STORE_OK, "inspect finds it");
	is_int(complete(s, b, "lu", old, resp, 60000, "lu: late completion"),
	       STORE_OK, "the owner's late completion lands");
	is_int(do_claim(s, b, &c, &r, "lu: after"), STORE_COMPLETED,
	       "then COMPLETED");
	is_str(r.resp ? r.resp->body : NULL, "late", "replays the real response");

	/* the owner records an unknown outcome itself, then a release */
	is_int(do_claim(s, b, &c2, &r, "lu2: claim"), STORE_WON, "claim WON");
	memcpy(old, r.owner, sizeof(old));
	is_int(complete(s, b, "lu2", old, unk, 60000, "lu2: unknown"), STORE_OK,
	       "recorded unknown by its owner");
	is_int(do_claim(s, b, &c2, &r, "lu2: dup"), STORE_UNKNOWN,
	       "a duplicate: UNKNOWN");
	ok(!r.lapsed && r.resp != NULL && strstr(r.resp->body, "reset") != NULL,
	   "the owner's own problem document");
	is_int(release(s, b, "lu2", "00", "lu2: stranger"), STORE_FENCED,
	       "release by another token: FENCED");
	is_int(release(s, b, "lu2", old, "lu2: release"), STORE_OK,
	       "released with the owner's token");
	is_int(do_claim(s, b, &c2, &r, "lu2: retry"), STORE_WON,
	       "a retry wins: it may execute now");

	res_reset(&r);
	res_reset(&in);
	stored_response_unref(resp);
	stored_response_unref(unk);
	store_free(s);
	event_base_free(b);
}

/* At-least-once (store_claim.takeover): a lease that ran out is taken
 * over. */
static void test_lease_takeover(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct store_claim c = mkclaim("lease", 7, 1000, 60000);
	struct store_claim other = mkclaim("lease", 8, 1000, 60000);
	struct res r = { 0 };
	struct stored_response *resp = resp_new(200, "late");
	char old[STORE_HANDLE_MAX + 1], cur[STORE_HANDLE_MAX + 1];

	c.takeover = other.takeover = true;

	is_int(do_claim(s, b, &c, &r, "lease: claim"), STORE_WON, "claim WON");
	memcpy(old, r.owner, sizeof(old));
	advance(999);
	is_int(do_claim(s, b, &c, &r, "lease almost out"), STORE_IN_FLIGHT,
	       "1 ms before the lease runs out: IN_FLIGHT");
	advance(1);
	is_int(do_claim(s, b, &other, &r, "lease out, other fp"), STORE_MISMATCH,
	       "lease ran out, different fp: MISMATCH (fingerprint first)");
	is_int(do_claim(s, b, &c, &r, "takeover"), STORE_WON,
	       "lease ran out, same fp: WON (takeover)");
	memcpy(cur, r.owner, sizeof(cur));
	ok(is_owner_token(cur) && strcmp(cur, old) != 0,
	   "takeover hands out a new owner token");
	is_int(store_memory_count(s), 1, "still one record");
	is_int(do_claim(s, b, &c, &r, "after takeover"), STORE_IN_FLIGHT,
	       "the new owner holds a fresh lease: IN_FLIGHT");

	is_int(extend(s, b, "lease", old, 1000, "stale extend"), STORE_FENCED,
	       "stale owner extend: FENCED");
	is_int(complete(s, b, "lease", old, resp, 60000, "stale complete"),
	       STORE_FENCED, "stale owner complete: FENCED");
	is_int(release(s, b, "lease", old, "stale release"), STORE_FENCED,
	       "stale owner release: FENCED");
	is_int(do_claim(s, b, &c, &r, "after stale writes"), STORE_IN_FLIGHT,
	       "stale writes changed nothing");

	/* the new owner extends its lease past the original end */
	advance(900);
	is_int(extend(s, b, "lease", cur, 1000, "extend"), STORE_OK,
	       "owner extend: OK");
	advance(500);
	is_int(do_claim(s, b, &c, &r, "extended"), STORE_IN_FLIGHT,
	       "past the old lease end, within the extended one: IN_FLIGHT");
	is_int(complete(s, b, "lease", cur, resp, 60000, "new owner completes"),
	       STORE_OK, "new owner complete: OK");
	is_int(do_claim(s, b, &c, &r, "completed after takeover"),
	       STORE_COMPLETED, "COMPLETED");
	is_str(r.resp ? r.resp->body : NULL, "late", "replays the new owner's body");

	res_reset(&r);
	stored_response_unref(resp);
	store_free(s);
	event_base_free(b);
}

static void test_ttl(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct store_claim c = mkclaim("ttl", 3, 1000, 5000);
	struct store_claim other = mkclaim("ttl", 4, 1000, 5000);
	struct res r = { 0 };
	struct stored_response *resp = resp_new(200, "v1");

	/* completed: expires ttl after completion, not after the claim */
	is_int(do_claim(s, b, &c, &r, "ttl: claim"), STORE_WON, "claim WON");
	advance(500);
	is_int(complete(s, b, "ttl", r.owner, resp, 5000, "ttl: complete"),
	       STORE_OK, "complete");
	advance(4999);
	is_int(do_claim(s, b, &c, &r, "ttl: 1 ms left"), STORE_COMPLETED,
	       "completed, 1 ms before expiry: COMPLETED");
	advance(1);
	is_int(do_claim(s, b, &other, &r, "ttl: expired, other fp"), STORE_WON,
	       "completed record expired: a new fp WINS (no mismatch)");
	is_int(store_memory_count(s), 1, "the expired record was replaced");
	is_int(release(s, b, "ttl", r.owner, "ttl: release"), STORE_OK, "release");

	/* in flight: expires ttl after the claim (lease shorter than ttl) */
	{
		struct store_claim c1 = mkclaim("ttl2", 5, 1000, 3000);
		struct store_claim c2 = mkclaim("ttl2", 6, 1000, 3000);
		char owner[STORE_HANDLE_MAX + 1];

		is_int(do_claim(s, b, &c1, &r, "ttl2: claim"), STORE_WON,
		       "claim WON");
		memcpy(owner, r.owner, sizeof(owner));
		advance(2999);
		is_int(do_claim(s, b, &c2, &r, "ttl2: before expiry"),
		       STORE_MISMATCH,
		       "in flight, lease out, before expiry: MISMATCH");
		advance(1);
		is_int(do_claim(s, b, &c2, &r, "ttl2: expired"), STORE_WON,
		       "in-flight record expired: a new fp WINS");
		is_int(complete(s, b, "ttl2", owner, resp, 5000,
				"ttl2: the expired owner completes"),
		       STORE_FENCED, "the expired owner is FENCED");
		is_int(release(s, b, "ttl2", r.owner, "ttl2: release"), STORE_OK,
		       "release");
	}

	/* an in-flight record never expires under a live lease */
	{
		struct store_claim c1 = mkclaim("ttl3", 5, 3000, 1000);
		struct store_claim c2 = mkclaim("ttl3", 6, 3000, 1000);
		char owner[STORE_HANDLE_MAX + 1];

		is_int(do_claim(s, b, &c1, &r, "ttl3: claim"), STORE_WON,
		       "claim WON (lease 3 s, ttl 1 s)");
		memcpy(owner, r.owner, sizeof(owner));
		advance(2999);
		is_int(do_claim(s, b, &c2, &r, "ttl3: past ttl, lease on"),
		       STORE_MISMATCH, "past ttl, within the lease: still there");
		advance(1);
		is_int(do_claim(s, b, &c2, &r, "ttl3: lease over"), STORE_WON,
		       "at the lease end it expires: a new fp WINS");
		is_int(release(s, b, "ttl3", r.owner, "ttl3: release"), STORE_OK,
		       "release");

		/* ... also when the owner extended its lease */
		is_int(do_claim(s, b, &c1, &r, "ttl4: claim"), STORE_WON,
		       "claim WON (lease 3 s, ttl 1 s)");
		memcpy(owner, r.owner, sizeof(owner));
		advance(2000);
		is_int(extend(s, b, "ttl3", owner, 3000, "ttl4: extend"), STORE_OK,
		       "extend by 3 s at 2 s");
		advance(1500);
		is_int(do_claim(s, b, &c2, &r, "ttl4: extended lease on"),
		       STORE_MISMATCH,
		       "past the first lease, within the extended one: "
		       "the record is still there (no expiry under a live owner)");
		is_int(do_claim(s, b, &c1, &r, "ttl4: same fp"), STORE_IN_FLIGHT,
		       "and a duplicate sees it IN_FLIGHT");
		is_int(complete(s, b, "ttl3", owner, resp, 5000, "ttl4: complete"),
		       STORE_OK, "the live owner completes: OK (not FENCED)");
	}

	res_reset(&r);
	stored_response_unref(resp);
	store_free(s);
	is_int(0, 0, "store freed with records inside (ASan checks leaks)");
	event_base_free(b);
}

static void test_sweep(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct res r = { 0 };
	struct stored_response *resp = resp_new(200, "swept");
	char key[32];
	int i, ok_all = 1;

	/* 3000 records (the table grows): even short-lived, odd long-lived;
	 * a third of them completed */
	for (i = 0; i < 3000; i++) {
		struct store_claim c;

		snprintf(key, sizeof(key), "sweep-%d", i);
		c = mkclaim(key, 9, 500, i % 2 ? 100000 : 2000);
		res_reset(&r);
		if (store_claim(s, b, &c, on_result, &r) == NULL)
			ok_all = 0;
		drain(b);
		ok_all &= r.status == STORE_WON;
		if (i % 3 == 0) {
			struct store_key k = mkkey("", key);
			struct res cr = { 0 };

			(void)store_complete(s, b, &k, r.owner, nofp, resp,
					     i % 2 ? 100000 : 2000, on_result, &cr);
			drain(b);
			ok_all &= cr.status == STORE_OK;
			res_reset(&cr);
		}
	}
	ok(ok_all, "3000 claims WON (a third completed)");
	is_int(store_memory_count(s), 3000, "3000 records");
	store_sweep(s, b);
	drain(b);
	is_int(store_memory_count(s), 3000, "sweep before expiry removes nothing");
	advance(2000);
	for (i = 0; i < 8; i++) {		/* batches */
		store_sweep(s, b);
		drain(b);
	}
	is_int(store_memory_count(s), 1500, "sweep removed the 1500 expired records");
	advance(100000);
	for (i = 0; i < 8; i++) {
		store_sweep(s, b);
		drain(b);
	}
	is_int(store_memory_count(s), 0, "sweep removed the rest");
	is_int(store_memory_bytes(s), 0, "no bytes left accounted");

	res_reset(&r);
	stored_response_unref(resp);
	store_free(s);
	event_base_free(b);
}

/* ---- watch ---- */

static struct store_op *watch(struct store *s, struct event_base *b,
			      const char *key, struct res *r, const char *what)
{
	struct store_key k = mkkey("", key);
	struct store_op *op;

	res_reset(r);
	op = store_watch(s, b, &k, on_result, r);
	ok(op != NULL && atomic_load(&r->calls) == 0,
	   "%s: watch returns a handle, no callback inside the call", what);
	return op;
}

static void test_watch(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct store_claim c = mkclaim("w", 1, 60000, 600000);
	struct res r = { 0 }, w = { 0 }, w2 = { 0 };
	struct stored_response *resp = resp_new(200, "watched");
	char owner[STORE_HANDLE_MAX + 1];

	watch(s, b, "nothing-here", &w, "watch: no record");
	drain(b);
	is_int(atomic_load(&w.calls), 1, "no record: watch settles at once");
	is_int(w.status, STORE_SETTLED, "SETTLED");

	/* woken by complete */
	is_int(do_claim(s, b, &c, &r, "watch: claim"), STORE_WON, "claim WON");
	memcpy(owner, r.owner, sizeof(owner));
	watch(s, b, "w", &w, "watch in flight");
	watch(s, b, "w", &w2, "second watcher");
	drain(b);
	is_int(atomic_load(&w.calls) + atomic_load(&w2.calls), 0,
	       "in flight: watchers wait");
	is_int(complete(s, b, "w", owner, resp, 600000, "watch: complete"),
	       STORE_OK, "complete");
	is_int(atomic_load(&w.calls), 1, "complete woke the first watcher");
	is_int(atomic_load(&w2.calls), 1, "complete woke the second watcher");
	is_int(w.status, STORE_SETTLED, "SETTLED");

	watch(s, b, "w", &w, "watch: completed");
	drain(b);
	is_int(atomic_load(&w.calls), 1, "completed: watch settles at once");

	/* woken by release */
	c = mkclaim("w-rel", 1, 60000, 600000);
	is_int(do_claim(s, b, &c, &r, "watch-rel: claim"), STORE_WON, "claim WON");
	watch(s, b, "w-rel", &w, "watch before release");
	drain(b);
	is_int(atomic_load(&w.calls), 0, "waiting");
	is_int(release(s, b, "w-rel", r.owner, "watch: release"), STORE_OK,
	       "release");
	is_int(atomic_load(&w.calls), 1, "release woke the watcher");
	is_int(w.status, STORE_SETTLED, "SETTLED");

	/* woken by a sweep that drops an in-flight record past its TTL */
	c = mkclaim("w-ttl", 1, 500, 1000);
	is_int(do_claim(s, b, &c, &r, "watch-ttl: claim"), STORE_WON, "claim WON");
	watch(s, b, "w-ttl", &w, "watch before expiry");
	drain(b);
	is_int(atomic_load(&w.calls), 0, "waiting");
	advance(1000);
	store_sweep(s, b);
	drain(b);
	is_int(atomic_load(&w.calls), 1, "sweeping the expired record woke the watcher");

	/* the lease already ran out (fake clock): settles at once */
	c = mkclaim("w-lease", 1, 100, 600000);
	is_int(do_claim(s, b, &c, &r, "watch-lease: claim"), STORE_WON, "claim WON");
	advance(100);
	watch(s, b, "w-lease", &w, "watch after the lease ran out");
	drain(b);
	is_int(atomic_load(&w.calls), 1, "lease ran out: watch settles at once");

	res_reset(&r);
	res_reset(&w);
	res_reset(&w2);
	stored_response_unref(resp);
	store_free(s);
	event_base_free(b);
}

/* The watch's own timeout at the end of the lease (real time, real clock). */
static void test_watch_lease_timeout(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, NULL);
	struct store_claim c = mkclaim("lt", 1, 50, 600000);
	struct res r = { 0 }, w = { 0 };
	char old[STORE_HANDLE_MAX + 1];
	double t0;

	is_int(do_claim(s, b, &c, &r, "lease-timeout: claim"), STORE_WON,
	       "claim WON with a 50 ms lease");
	memcpy(old, r.owner, sizeof(old));
	t0 = now_s();
	watch(s, b, "lt", &w, "watch a 50 ms lease");
	w.stop = b;
	run_for(b, 3000);
	is_int(atomic_load(&w.calls), 1, "the lease running out woke the watcher");
	is_int(w.status, STORE_SETTLED, "SETTLED");
	ok(w.at - t0 >= 0.030 && w.at - t0 < 1.0,
	   "woken at the lease end (%.0f ms)", (w.at - t0) * 1000);
	is_int(do_claim(s, b, &c, &r, "lease-timeout: claim again"),
	       STORE_UNKNOWN, "then the watcher finds the outcome unknown");
	ok(r.lapsed && strcmp(r.owner, old) == 0, "recorded so by its claim");

	res_reset(&r);
	res_reset(&w);
	store_free(s);
	event_base_free(b);
}

/* ---- other threads ---- */

struct peer {
	pthread_t tid;
	struct store *s;
	const char *key;
	char owner[STORE_HANDLE_MAX + 1];
	struct stored_response *resp;	/* NULL: release */
	int delay_ms;
	enum store_status status;
	int calls;
	/* watcher threads */
	struct event_base *base;
	struct res w;
	_Atomic int ready;
};

static void on_peer_status(void *arg, const struct store_result *sr)
{
	struct peer *p = arg;

	p->status = sr->status;
	p->calls++;
}

/* A settling thread: its own event_base, complete or release after a delay. */
static void *settler(void *arg)
{
	struct peer *p = arg;
	struct event_base *b = event_base_new();
	struct store_key k = mkkey("", p->key);
	struct store_op *op;

	usleep((useconds_t)p->delay_ms * 1000);
	if (p->resp != NULL)
		op = store_complete(p->s, b, &k, p->owner, nofp, p->resp, 600000,
				    on_peer_status, p);
	else
		op = store_release(p->s, b, &k, p->owner, on_peer_status, p);
	if (op != NULL && p->calls == 0)
		drain(b);
	event_base_free(b);
	return NULL;
}

/* A watching thread: its own event_base, blocked until woken. */
static void *watcher(void *arg)
{
	struct peer *p = arg;
	struct store_key k = mkkey("", p->key);

	p->w.stop = p->base;
	if (store_watch(p->s, p->base, &k, on_result, &p->w) != NULL) {
		atomic_store(&p->ready, 1);
		run_for(p->base, 5000);
	}
	atomic_store(&p->ready, 1);
	return NULL;
}

/* A base like a worker's: no lock, given to the store (its mailbox). */
static struct event_base *worker_base(struct store *s)
{
	struct event_config *ec = event_config_new();
	struct event_base *b;

	event_config_set_flag(ec, EVENT_BASE_FLAG_NOLOCK);
	b = event_base_new_with_config(ec);
	event_config_free(ec);
	if (store_thread_init(s, b) < 0)
		printf("Bail out! store_thread_init\n");
	return b;
}

static void worker_base_free(struct store *s, struct event_base *b)
{
	store_thread_done(s, b);
	event_base_free(b);
}

/*
 * Four threads watch key, each on its own loop; the main thread completes.
 * With nolock, the loops are made as the workers' are (no lock, woken
 * through the store's mailbox); without, they are locked bases the store
 * was not given.
 */
static void many_watchers(struct store *s, struct event_base *b,
			  struct stored_response *resp, const char *key,
			  bool nolock)
{
	enum { N = 4 };
	struct peer ws[N];
	struct store_claim c = mkclaim(key, 1, 60000, 600000);
	struct res r = { 0 };
	int woke = 0, prompt = 0, all_ready;
	const char *what = nolock ? "workers' loops" : "locked loops";
	double t0;

	is_int(do_claim(s, b, &c, &r, "threads-many: claim"), STORE_WON,
	       "%s: claim WON", what);
	memset(ws, 0, sizeof(ws));
	for (int i = 0; i < N; i++) {
		ws[i].s = s;
		ws[i].key = key;
		ws[i].base = nolock ? worker_base(s) : event_base_new();
		pthread_create(&ws[i].tid, NULL, watcher, &ws[i]);
	}
	do {
		usleep(10000);
		all_ready = 1;
		for (int i = 0; i < N; i++)
			all_ready &= atomic_load(&ws[i].ready);
	} while (!all_ready);
	usleep(50000);	/* let them block in dispatch */
	t0 = now_s();
	is_int(complete(s, b, key, r.owner, resp, 600000,
			"threads-many: complete"), STORE_OK, "%s: complete", what);
	for (int i = 0; i < N; i++) {
		pthread_join(ws[i].tid, NULL);
		woke += atomic_load(&ws[i].w.calls) == 1 &&
			ws[i].w.status == STORE_SETTLED;
		prompt += ws[i].w.at - t0 < 2.0;	/* not by run_for's end */
		res_reset(&ws[i].w);
		if (nolock)
			worker_base_free(s, ws[i].base);
		else
			event_base_free(ws[i].base);
	}
	is_int(woke, N, "%s: every watcher thread woke exactly once", what);
	is_int(prompt, N, "%s: each woken when it completed", what);
	res_reset(&r);
}

/*
 * On a worker's loop, a watch woken by another thread and cancelled before
 * its loop ran: no callback, and the mailbox forgets it (under ASan a use
 * after free would end the test). Then one woken and delivered by its
 * loop, and one whose lease ends first on a loop with a wake-up pending.
 */
static void test_mailbox(void)
{
	struct store *s = store_memory_new(BIG, NULL);
	struct event_base *b = worker_base(s);
	struct stored_response *resp = resp_new(200, "mailbox");
	struct store_claim c = mkclaim("mb", 1, 60000, 600000);
	struct res r = { 0 }, w = { 0 }, w2 = { 0 };
	struct store_op *op;
	struct peer p;

	is_int(do_claim(s, b, &c, &r, "mailbox: claim"), STORE_WON, "claim WON");
	op = watch(s, b, "mb", &w, "mailbox: watch");
	memset(&p, 0, sizeof(p));
	p.s = s;
	p.key = "mb";
	memcpy(p.owner, r.owner, sizeof(p.owner));
	p.resp = resp;
	pthread_create(&p.tid, NULL, settler, &p);
	pthread_join(p.tid, NULL);
	is_int(p.status, STORE_OK, "another thread completed it");
	store_cancel(op);
	run_for(b, 100);
	is_int(atomic_load(&w.calls), 0, "a cancelled watch is not called back");

	c = mkclaim("mb2", 1, 60000, 600000);
	is_int(do_claim(s, b, &c, &r, "mailbox: claim 2"), STORE_WON, "claim 2 WON");
	watch(s, b, "mb2", &w, "mailbox: watch 2");
	w.stop = b;
	memcpy(p.owner, r.owner, sizeof(p.owner));
	p.key = "mb2";
	p.calls = 0;
	pthread_create(&p.tid, NULL, settler, &p);
	run_for(b, 5000);
	pthread_join(p.tid, NULL);
	is_int(atomic_load(&w.calls), 1, "woken through the mailbox, once");
	is_int(w.status, STORE_SETTLED, "SETTLED");

	/* the lease ends (50 ms) while the wake-up waits in the mailbox */
	c = mkclaim("mb3", 1, 50, 600000);
	is_int(do_claim(s, b, &c, &r, "mailbox: claim 3"), STORE_WON, "claim 3 WON");
	watch(s, b, "mb3", &w2, "mailbox: watch 3");
	usleep(80000);
	memcpy(p.owner, r.owner, sizeof(p.owner));
	p.key = "mb3";
	p.calls = 0;
	pthread_create(&p.tid, NULL, settler, &p);
	pthread_join(p.tid, NULL);
	w2.stop = b;
	run_for(b, 2000);
	run_for(b, 50);
	is_int(atomic_load(&w2.calls), 1, "timeout and wake-up: one callback");

	res_reset(&r);
	res_reset(&w);
	res_reset(&w2);
	stored_response_unref(resp);
	worker_base_free(s, b);
	store_free(s);
}

static void test_threads(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct store_claim c = mkclaim("t", 1, 60000, 600000);
	struct res r = { 0 }, w = { 0 };
	struct stored_response *resp = resp_new(200, "from another thread");
	struct peer p;
	double t0;

	/* main thread watches, another thread completes */
	is_int(do_claim(s, b, &c, &r, "threads: claim"), STORE_WON, "claim WON");
	memset(&p, 0, sizeof(p));
	p.s = s;
	p.key = "t";
	memcpy(p.owner, r.owner, sizeof(p.owner));
	p.resp = resp;
	p.delay_ms = 100;
	watch(s, b, "t", &w, "threads: main watches");
	w.stop = b;
	t0 = now_s();
	pthread_create(&p.tid, NULL, settler, &p);
	run_for(b, 5000);	/* blocked in the backend until woken */
	pthread_join(p.tid, NULL);
	is_int(p.status, STORE_OK, "the other thread's completion: OK");
	is_int(atomic_load(&w.calls), 1, "a completion on another thread woke the loop");
	ok(w.at - t0 >= 0.05 && w.at - t0 < 2.0,
	   "woken when it completed, not by a timeout (%.0f ms)", (w.at - t0) * 1000);
	is_int(w.status, STORE_SETTLED, "SETTLED");
	is_int(do_claim(s, b, &c, &r, "threads: replay"), STORE_COMPLETED,
	       "then COMPLETED");

	/* main thread watches, another thread releases */
	c = mkclaim("t-rel", 1, 60000, 600000);
	is_int(do_claim(s, b, &c, &r, "threads-rel: claim"), STORE_WON, "claim WON");
	memset(&p, 0, sizeof(p));
	p.s = s;
	p.key = "t-rel";
	memcpy(p.owner, r.owner, sizeof(p.owner));
	p.delay_ms = 100;
	watch(s, b, "t-rel", &w, "threads-rel: main watches");
	w.stop = b;
	t0 = now_s();
	pthread_create(&p.tid, NULL, settler, &p);
	run_for(b, 5000);
	pthread_join(p.tid, NULL);
	is_int(p.status, STORE_OK, "the other thread's release: OK");
	is_int(atomic_load(&w.calls), 1, "a release on another thread woke the loop");
	ok(w.at - t0 < 2.0, "promptly (%.0f ms)", (w.at - t0) * 1000);
	is_int(do_claim(s, b, &c, &r, "threads-rel: reclaim"), STORE_WON,
	       "the waiter re-claims: WON");

	many_watchers(s, b, resp, "t-many", false);
	many_watchers(s, b, resp, "t-many-nolock", true);

	res_reset(&r);
	res_reset(&w);
	stored_response_unref(resp);
	store_free(s);
	event_base_free(b);
}

/* ---- cancellation ---- */

static void test_cancel(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct store_claim c = mkclaim("c", 1, 60000, 600000);
	struct res r = { 0 }, x = { 0 };
	struct stored_response *resp = resp_new(200, "cancelled");
	struct store_op *op;
	struct store_key k = mkkey("", "c");
	char owner[STORE_HANDLE_MAX + 1];

	op = store_claim(s, b, &c, on_result, &x);
	ok(op != NULL, "claim handle");
	store_cancel(op);
	drain(b);
	is_int(atomic_load(&x.calls), 0, "cancelled claim: callback never runs");
	/* the store decided at once, but a win nobody will execute is given
	 * back on cancel: the next claim wins at once, no lease to wait out */
	is_int(store_memory_count(s), 0, "the cancelled win left no record");
	is_int(do_claim(s, b, &c, &r, "after cancelled claim"), STORE_WON,
	       "the next claim wins at once");
	memcpy(owner, r.owner, sizeof(owner));

	/* cancel a watch; the record then settles: nothing runs */
	res_reset(&x);
	op = store_watch(s, b, &k, on_result, &x);
	ok(op != NULL, "watch handle");
	drain(b);
	store_cancel(op);
	is_int(complete(s, b, "c", owner, resp, 600000, "cancel: complete"),
	       STORE_OK, "complete");
	drain(b);
	is_int(atomic_load(&x.calls), 0, "cancelled watch: callback never runs");

	/* cancel a claim that holds a stored response (COMPLETED): no leak */
	op = store_claim(s, b, &c, on_result, &x);
	ok(op != NULL, "claim of a completed record");
	store_cancel(op);
	drain(b);
	is_int(atomic_load(&x.calls), 0, "cancelled COMPLETED claim: no callback");

	/* cancel a watch after the wake-up was posted, before the loop ran */
	c = mkclaim("c2", 1, 60000, 600000);
	is_int(do_claim(s, b, &c, &r, "cancel2: claim"), STORE_WON, "claim WON");
	k = mkkey("", "c2");
	op = store_watch(s, b, &k, on_result, &x);
	{
		int calls = 0;

		(void)store_release(s, b, &k, r.owner, on_status, &calls);
		store_cancel(op);	/* the watch's event is already active */
		drain(b);
		is_int(calls, 1, "release reported");
	}
	is_int(atomic_load(&x.calls), 0,
	       "watch cancelled after its wake-up was posted: no callback");

	/* cancel complete and release handles */
	c = mkclaim("c3", 1, 60000, 600000);
	is_int(do_claim(s, b, &c, &r, "cancel3: claim"), STORE_WON, "claim WON");
	k = mkkey("", "c3");
	op = store_complete(s, b, &k, r.owner, nofp, resp, 600000, on_result, &x);
	store_cancel(op);
	drain(b);
	is_int(atomic_load(&x.calls), 0, "cancelled complete: no callback");
	is_int(do_claim(s, b, &c, &r, "cancel3: replay"), STORE_COMPLETED,
	       "the completion itself was made");
	op = store_release(s, b, &k, "0123", on_result, &x);
	store_cancel(op);
	op = store_extend(s, b, &k, "0123", 10, on_result, &x);
	store_cancel(op);
	drain(b);
	is_int(atomic_load(&x.calls), 0, "cancelled release/extend: no callback");

	/* a watch cancelled from its own thread while another thread settles */
	{
		int raced = 0;

		for (int i = 0; i < 200; i++) {
			struct peer p;
			char key[32];

			snprintf(key, sizeof(key), "race-%d", i);
			c = mkclaim(key, 1, 60000, 600000);
			res_reset(&r);
			(void)store_claim(s, b, &c, on_result, &r);
			drain(b);
			memset(&p, 0, sizeof(p));
			p.s = s;
			p.key = key;
			memcpy(p.owner, r.owner, sizeof(p.owner));
			p.resp = i % 2 ? resp : NULL;
			k = mkkey("", key);
			res_reset(&x);
			op = store_watch(s, b, &k, on_result, &x);
			pthread_create(&p.tid, NULL, settler, &p);
			if (i % 3)
				usleep((useconds_t)(i % 7) * 10);
			store_cancel(op);
			pthread_join(p.tid, NULL);
			drain(b);
			raced += atomic_load(&x.calls);
		}
		is_int(raced, 0, "200 watches cancelled while other threads settle: "
		       "no callback ever");
	}

	res_reset(&r);
	res_reset(&x);
	stored_response_unref(resp);
	store_free(s);
	event_base_free(b);
}

/*
 * A takeover cancelled before it is reported: the record was another
 * request's (its owner's lease ran out, maybe after it executed), so it
 * stays, bound to its fingerprint; only the canceller's lease ends.
 */
static void test_cancel_takeover(void)
{
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct store_claim c = mkclaim("ct", 5, 1000, 60000);
	struct store_claim other = mkclaim("ct", 6, 1000, 60000);
	struct store_key k = mkkey("", "ct");
	struct res r = { 0 }, x = { 0 }, w = { 0 };
	struct store_op *op, *watch;

	c.takeover = other.takeover = true;	/* at-least-once */
	is_int(do_claim(s, b, &c, &r, "ct: claim"), STORE_WON, "claim WON");
	advance(1000);		/* its owner never completes: lease over */
	watch = store_watch(s, b, &k, on_result, &w);
	ok(watch != NULL, "ct: a duplicate watches the lapsed record");
	op = store_claim(s, b, &c, on_result, &x);
	ok(op != NULL, "ct: takeover claim handle");
	store_cancel(op);	/* before its WON is reported */
	drain(b);
	is_int(atomic_load(&x.calls), 0, "cancelled takeover: no callback");
	is_int(atomic_load(&w.calls), 1,
	       "the record's waiter is woken (it may take over now)");
	is_int(store_memory_count(s), 1, "the taken-over record stays");
	is_int(do_claim(s, b, &other, &r, "ct: another body"), STORE_MISMATCH,
	       "another body still gets MISMATCH, not a win");
	is_int(do_claim(s, b, &c, &r, "ct: a retry"), STORE_WON,
	       "a retry of the same body takes over at once (lease ended)");

	res_reset(&r);
	res_reset(&x);
	res_reset(&w);
	store_free(s);
	event_base_free(b);
}

/* ---- the byte cap ---- */

static void test_cap(void)
{
	struct event_base *b = event_base_new();
	struct store *s;
	struct store_claim c;
	struct res r = { 0 };
	struct stored_response *big, *small;
	char big_body[8192];
	char key[32];
	size_t one, cap;
	int n;

	/* learn what one record takes */
	s = store_memory_new(BIG, fake_clock);
	c = mkclaim("cap-0", 1, 500, 1000);
	is_int(do_claim(s, b, &c, &r, "cap: probe"), STORE_WON, "probe WON");
	one = store_memory_bytes(s);
	ok(one > 0, "a record accounts bytes (%zu)", one);
	store_free(s);

	cap = one * 10 + one / 2;	/* room for 10 records */
	s = store_memory_new(cap, fake_clock);
	for (n = 0; n < 100; n++) {
		snprintf(key, sizeof(key), "cap-%d", n);
		c = mkclaim(key, 1, 500, 1000);
		res_reset(&r);
		(void)store_claim(s, b, &c, on_result, &r);
		drain(b);
		if (r.status != STORE_WON)
			break;
	}
	is_int(r.status, STORE_FULL, "a new key at the cap: FULL");
	is_int(n, 10, "10 records fit");
	ok(store_memory_bytes(s) <= cap, "bytes %zu within the cap %zu",
	   store_memory_bytes(s), cap);
	is_int(store_memory_count(s), 10, "no record evicted");
	c = mkclaim("cap-3", 1, 500, 1000);
	is_int(do_claim(s, b, &c, &r, "cap: existing key"), STORE_IN_FLIGHT,
	       "an existing key at the cap: IN_FLIGHT, not FULL");
	c = mkclaim("cap-3", 2, 500, 1000);
	is_int(do_claim(s, b, &c, &r, "cap: existing key, other fp"),
	       STORE_MISMATCH, "an existing key at the cap: MISMATCH, not FULL");

	/* expired records make room again (swept at the cap) */
	advance(1000);
	c = mkclaim("cap-new", 1, 60000, 100000);
	is_int(do_claim(s, b, &c, &r, "cap: after expiry"), STORE_WON,
	       "after the records expire a new key WINS");
	is_int(store_memory_count(s), 1, "the expired records were swept");

	/* a completion over the cap is stored without its body */
	memset(big_body, 'x', sizeof(big_body) - 1);
	big_body[sizeof(big_body) - 1] = '\0';
	big = resp_new(200, big_body);
	small = resp_new(201, "tiny");
	ok(cap < sizeof(big_body), "the body is larger than the whole cap");
	is_int(complete(s, b, "cap-new", r.owner, big, 100000, "cap: big complete"),
	       STORE_OK, "completion over the cap: OK");
	c = mkclaim("cap-new", 1, 60000, 100000);
	is_int(do_claim(s, b, &c, &r, "cap: replay big"), STORE_COMPLETED,
	       "COMPLETED");
	ok(r.resp != NULL && !r.resp->body_stored,
	   "over the cap: body_stored false (duplicates get 409)");
	ok(r.resp != NULL && r.resp->status == 200 && r.resp->body_len == 0,
	   "status kept, no body");
	ok(store_memory_bytes(s) <= cap, "still within the cap");

	c = mkclaim("cap-small", 1, 60000, 100000);
	is_int(do_claim(s, b, &c, &r, "cap: small claim"), STORE_WON, "claim WON");
	is_int(complete(s, b, "cap-small", r.owner, small, 100000,
			"cap: small complete"), STORE_OK, "OK");
	is_int(do_claim(s, b, &c, &r, "cap: small replay"), STORE_COMPLETED,
	       "COMPLETED");
	ok(r.resp != NULL && r.resp->body_stored &&
	   strcmp(r.resp->body, "tiny") == 0, "a response under the cap keeps its body");

	advance(100000);
	store_sweep(s, b);
	drain(b);
	is_int(store_memory_count(s), 0, "all expired and swept");
	is_int(store_memory_bytes(s), 0, "bytes back to 0");

	res_reset(&r);
	stored_response_unref(big);
	stored_response_unref(small);
	store_free(s);
	event_base_free(b);
}

/* ---- the table under load: flooding, doubling, the bound ---- */

/* A claim without TAP lines, for loops over thousands of keys. */
static enum store_status claim_quiet(struct store *s, struct event_base *b,
				     const char *key, int fpbyte, uint64_t ms,
				     struct res *r)
{
	struct store_claim c = mkclaim(key, fpbyte, ms, ms);

	res_reset(r);
	(void)store_claim(s, b, &c, on_result, r);
	drain(b);
	return r->status;
}

/* The record-id hash this store used before (FNV-1a, 64 bit), to choose
 * keys an attacker would have chosen against it. */
static uint64_t fnv1a(const char *p, size_t len, uint64_t h)
{
	for (size_t i = 0; i < len; i++) {
		h ^= (unsigned char)p[i];
		h *= 1099511628211ull;
	}
	return h;
}

#define FNV_BASIS 1469598103934665603ull

/*
 * n keys "f-<i>-<c>" whose ids ("\n" + key, scope "") share the low `bits`
 * bits of their FNV-1a hash: under a low-bit bucket index they all land in
 * one chain of any table up to 2^bits buckets. keys[i] gets KEYLEN bytes.
 */
#define KEYLEN 24
static int fnv_flood(char (*keys)[KEYLEN], int n, unsigned bits)
{
	static const char alphabet[] =
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	uint64_t mask = (1ull << bits) - 1, want = 0;
	int found = 0;

	for (unsigned i = 0; found < n && i < 100000000u; i++) {
		char prefix[16];
		int plen = snprintf(prefix, sizeof(prefix), "f-%u-", i);
		uint64_t h = fnv1a("\n", 1, FNV_BASIS);

		h = fnv1a(prefix, (size_t)plen, h);
		for (const char *c = alphabet; *c && found < n; c++) {
			uint64_t last = fnv1a(c, 1, h);

			if (found == 0)
				want = last & mask;
			if ((last & mask) != want)
				continue;
			snprintf(keys[found++], KEYLEN, "%s%c", prefix, *c);
		}
	}
	return found;
}

/*
 * 3000 keys chosen to share one bucket under FNV-1a (the whole table: it
 * has 4096 buckets at most here) spread over the keyed hash's buckets.
 * Before, they formed one chain of 3000 and every lookup of any of them
 * walked it (with 30,000 such keys: 49 s against 4 s). Asserted on the
 * chain length, not on time.
 */
static void test_flood(void)
{
	enum { N = 3000 };
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	static char keys[N][KEYLEN];
	struct store_memory_stats st;
	struct res r = { 0 };
	int n, won = 0, found = 0, most = 0;
	static int per_bucket[4096];

	n = fnv_flood(keys, N, 12);
	is_int(n, N, "%d keys sharing the low 12 bits of their FNV-1a hash", N);
	{
		char id[STORE_ID_MAX];
		size_t len = store_id("", 0, keys[0], strlen(keys[0]), id);
		uint64_t h0 = fnv1a(id, len, FNV_BASIS) & 4095;
		int same = 0;

		for (int i = 0; i < n; i++) {
			len = store_id("", 0, keys[i], strlen(keys[i]), id);
			same += (fnv1a(id, len, FNV_BASIS) & 4095) == h0;
			/* the shared helper (the response cache's hash) */
			per_bucket[store_id_hash(id, len) & 4095]++;
		}
		is_int(same, n, "(checked: one FNV-1a bucket of 4096 for all)");
		for (int i = 0; i < 4096; i++)
			if (per_bucket[i] > most)
				most = per_bucket[i];
		ok(most <= 16, "store_id_hash() spreads them: at most %d in one "
		   "of 4096 buckets", most);
	}

	for (int i = 0; i < n; i++)
		won += claim_quiet(s, b, keys[i], 1, 600000, &r) == STORE_WON;
	is_int(won, n, "every flood key WON");
	store_memory_stats(s, &st);
	is_int(st.count, n, "%d records", n);
	{
		size_t longest = store_memory_longest_chain(s);

		ok(longest <= 16,
		   "the longest chain is %zu records (FNV-1a: %d), %zu buckets",
		   longest, n, st.nbuckets);
	}
	for (int i = 0; i < n; i++)
		found += claim_quiet(s, b, keys[i], 1, 600000, &r) ==
			 STORE_IN_FLIGHT;
	is_int(found, n, "and each is found again: IN_FLIGHT");

	res_reset(&r);
	store_free(s);
	event_base_free(b);
}

/*
 * The table doubles a few buckets per operation. While it does, every
 * record stays findable - in the old table, or in the new one - whatever
 * the operation: claim (in flight, completed, other fingerprint), watch,
 * complete, release, extend; and no operation moves more than its share.
 */
static void test_doubling(void)
{
	enum { N = 20000 };
	struct event_base *b = event_base_new();
	struct store *s = store_memory_new(BIG, fake_clock);
	struct stored_response *resp = resp_new(200, "moved");
	struct store_memory_stats st;
	static char owners[N][STORE_HANDLE_MAX + 1];
	struct res r = { 0 };
	char key[32];
	int won = 0, lost = 0, doublings = 0, ops_while = 0, fenced = 0;
	bool was = false;
	size_t most_buckets = 0;

	for (int i = 0; i < N; i++) {
		int j = (int)((unsigned)i * 7919u % (unsigned)(i + 1));

		snprintf(key, sizeof(key), "dbl-%d", i);
		won += claim_quiet(s, b, key, 1, 600000, &r) == STORE_WON;
		memcpy(owners[i], r.owner, sizeof(owners[i]));
		if (i % 3 == 0) {
			struct store_key k = mkkey("", key);
			struct res cr = { 0 };

			(void)store_complete(s, b, &k, owners[i], nofp, resp,
					     600000, on_result, &cr);
			drain(b);
			fenced += cr.status != STORE_OK;
			res_reset(&cr);
		}
		/* an earlier record, anywhere in either table */
		snprintf(key, sizeof(key), "dbl-%d", j);
		lost += claim_quiet(s, b, key, 1, 600000, &r) !=
			(j % 3 == 0 ? STORE_COMPLETED : STORE_IN_FLIGHT);
		store_memory_stats(s, &st);
		if (st.op_buckets_max > most_buckets)
			most_buckets = st.op_buckets_max;
		if (st.doubling) {
			ops_while++;
			if (!was)
				doublings++;
		}
		was = st.doubling;
	}
	is_int(won, N, "%d claims WON", N);
	is_int(fenced, 0, "a third completed: OK");
	is_int(lost, 0, "after every claim an earlier record was found");
	ok(doublings >= 4, "the table doubled %d times (1024 -> %zu buckets)",
	   doublings, st.nbuckets);
	ok(ops_while > 2 * doublings,
	   "each doubling spread over operations (%d claims saw one under way)",
	   ops_while);
	ok(most_buckets <= STORE_MEMORY_MOVE_BUCKETS,
	   "no operation moved more than %d buckets (most: %zu)",
	   STORE_MEMORY_MOVE_BUCKETS, most_buckets);

	/* now during one doubling: every record, every kind of lookup */
	for (int i = N; !st.doubling && i < 4 * N; i++) {
		snprintf(key, sizeof(key), "dbl-%d", i);
		(void)claim_quiet(s, b, key, 1, 600000, &r);
		store_memory_stats(s, &st);
	}
	ok(st.doubling, "a doubling has begun (%zu records, %zu buckets)",
	   st.count, st.nbuckets);
	{
		int seen = 0, mismatch = 0, waiting = 0, while_doubling = 0;
		int settled = 0, extended = 0, released = 0, owned = 0;

		for (int i = 0; i < N; i++) {
			struct store_key k;
			struct res w = { 0 };

			snprintf(key, sizeof(key), "dbl-%d", i);
			k = mkkey("", key);
			seen += claim_quiet(s, b, key, 1, 600000, &r) ==
				(i % 3 == 0 ? STORE_COMPLETED : STORE_IN_FLIGHT);
			mismatch += claim_quiet(s, b, key, 2, 600000, &r) ==
				    STORE_MISMATCH;
			if (i % 3 == 1) {
				int calls = 0;

				owned++;
				(void)store_watch(s, b, &k, on_result, &w);
				drain(b);
				waiting += atomic_load(&w.calls) == 0;
				(void)store_extend(s, b, &k, owners[i], 60000,
						   on_status, &calls);
				drain(b);
				extended += calls == 1 && last_status == STORE_OK;
				calls = 0;
				if (i % 2)
					(void)store_release(s, b, &k, owners[i],
							    on_status, &calls);
				else
					(void)store_complete(s, b, &k, owners[i], nofp,
							     resp, 600000, on_status,
							     &calls);
				drain(b);
				released += calls == 1 && last_status == STORE_OK;
				settled += atomic_load(&w.calls) == 1 &&
					   w.status == STORE_SETTLED;
				res_reset(&w);
			}
			store_memory_stats(s, &st);
			while_doubling += st.doubling;
		}
		is_int(seen, N, "while doubling: every record found by a claim");
		is_int(mismatch, N, "... and by a claim with another fingerprint");
		is_int(waiting, owned, "... and watched while in flight");
		is_int(extended, owned, "... and extended by its owner");
		is_int(released, owned, "... and released or completed by its owner");
		is_int(settled, owned, "... which woke its watcher");
		ok(while_doubling > 16, "(%d of those %d rounds ran during the doubling)",
		   while_doubling, N);
	}

	res_reset(&r);
	stored_response_unref(resp);
	store_free(s);
	event_base_free(b);
}

/*
 * At the bound, a claim sweeps a bounded batch from a cursor, not the whole
 * table (before: 20,000 records looked at per refused claim, all under the
 * store's lock). Expired records are still never served, and claims alone
 * reclaim every one of them over time; the sweep timer does too.
 */
static void test_bound(void)
{
	enum { N = 20000, TRIES = 200 };
	struct event_base *b = event_base_new();
	struct store *s;
	struct store_memory_stats st;
	struct res r = { 0 };
	struct store_claim c;
	char key[32];
	size_t one, cap, records_bound, longest;
	int won = 0, full = 0, i;

	/* learn what one record takes (keys of one length: one size) */
	s = store_memory_new(BIG, fake_clock);
	c = mkclaim("b-00000", 1, 1000, 1000);
	is_int(do_claim(s, b, &c, &r, "bound: probe"), STORE_WON, "probe WON");
	one = store_memory_bytes(s);
	store_free(s);

	cap = one * N + one / 2;
	s = store_memory_new(cap, fake_clock);
	/* even keys live 1 s (lease = ttl), odd keys 100 s */
	for (i = 0; i < N; i++) {
		snprintf(key, sizeof(key), "b-%05d", i);
		won += claim_quiet(s, b, key, 1, i % 2 ? 100000 : 1000, &r) ==
		       STORE_WON;
	}
	is_int(won, N, "%d records fill the store", N);
	store_memory_stats(s, &st);	/* forget the filling's work */
	for (i = 0; i < TRIES; i++) {
		snprintf(key, sizeof(key), "x-%05d", i);
		full += claim_quiet(s, b, key, 1, 100000, &r) == STORE_FULL;
	}
	is_int(full, TRIES, "at the bound, nothing expired: %d new keys FULL",
	       TRIES);
	store_memory_stats(s, &st);
	/* a batch ends after the slot (up to 3 buckets) in which it reached
	 * its limit; the doubling's share may come on top */
	longest = store_memory_longest_chain(s);
	records_bound = STORE_MEMORY_SWEEP_RECORDS +
		(3 + STORE_MEMORY_MOVE_BUCKETS) * longest;
	ok(st.op_buckets_max <= STORE_MEMORY_SWEEP_BUCKETS + 2 +
	   STORE_MEMORY_MOVE_BUCKETS,
	   "each refused claim looked at %zu buckets at most (of %zu)",
	   st.op_buckets_max, st.nbuckets);
	ok(st.op_records_max <= records_bound && st.op_records_max < N / 50,
	   "and at %zu records at most (bound %zu; the table holds %d)",
	   st.op_records_max, records_bound, N);

	/* the even half expires; no sweep has run */
	advance(1000);
	c = mkclaim("b-00000", 2, 100000, 100000);
	is_int(do_claim(s, b, &c, &r, "bound: expired, not swept"), STORE_WON,
	       "an expired record no sweep reached is not served: another "
	       "fingerprint WINS (no mismatch)");
	{
		struct store_key k = mkkey("", "b-00002");
		struct res w = { 0 };

		(void)store_watch(s, b, &k, on_result, &w);
		drain(b);
		is_int(atomic_load(&w.calls), 1,
		       "watching an expired record no sweep reached: SETTLED at once");
		res_reset(&w);
	}

	/* claims alone reclaim every expired record, a batch at a time: the
	 * store fills up again exactly when all N/2 are reused */
	won = 1;	/* b-00000 above */
	for (i = 0; i < 2 * N; i++) {
		snprintf(key, sizeof(key), "n-%05d", i);
		if (claim_quiet(s, b, key, 1, 100000, &r) != STORE_WON)
			break;
		won++;
	}
	is_int(r.status, STORE_FULL, "then FULL again");
	is_int(won, N / 2, "after %d new records took the room of the %d expired",
	       won, N / 2);
	store_memory_stats(s, &st);
	is_int(st.count, N, "%d records, none expired left", N);
	ok(store_memory_bytes(s) <= cap, "within the bound");
	ok(st.op_records_max <= STORE_MEMORY_SWEEP_RECORDS +
	   (3 + STORE_MEMORY_MOVE_BUCKETS) * store_memory_longest_chain(s),
	   "each of those claims looked at %zu records at most", st.op_records_max);

	/* the sweep timer reclaims the rest, a bounded batch per call */
	advance(100000);
	for (i = 0; i < 64 && store_memory_count(s) > 0; i++) {
		store_sweep(s, b);
		drain(b);
	}
	is_int(store_memory_count(s), 0, "the sweep timer took the rest (%d batches)",
	       i);
	is_int(store_memory_bytes(s), 0, "bytes back to 0");

	res_reset(&r);
	store_free(s);
	event_base_free(b);
}

/* Owner tokens of two threads, OWNERS_PER_THREAD each: all distinct. */
#define OWNERS_PER_THREAD 20000

static int cmp_owner(const void *a, const void *b)
{
	return memcmp(a, b, STORE_OWNER_LEN);
}

static void *make_owners(void *arg)
{
	char (*out)[STORE_OWNER_LEN + 1] = arg;

	for (int i = 0; i < OWNERS_PER_THREAD; i++)
		if (store_new_owner(out[i]) < 0)
			return NULL;
	return arg;
}

static void test_owner_tokens(void)
{
	char (*all)[STORE_OWNER_LEN + 1] =
		calloc(2 * OWNERS_PER_THREAD, STORE_OWNER_LEN + 1);
	pthread_t t;
	void *got = NULL;
	int bad = 0, dup = 0;
	bool started = all != NULL &&
		       pthread_create(&t, NULL, make_owners, all) == 0;

	ok(started, "owner tokens: a second thread");
	if (!started) {
		free(all);
		return;
	}
	ok(make_owners(all + OWNERS_PER_THREAD) != NULL &&
	   pthread_join(t, &got) == 0 && got != NULL, "both made theirs");
	for (int i = 0; i < 2 * OWNERS_PER_THREAD; i++)
		bad += !is_owner_token(all[i]);
	qsort(all, 2 * OWNERS_PER_THREAD, STORE_OWNER_LEN + 1, cmp_owner);
	for (int i = 1; i < 2 * OWNERS_PER_THREAD; i++)
		dup += memcmp(all[i - 1], all[i], STORE_OWNER_LEN) == 0;
	ok(bad == 0, "every one 32 hex digits");
	ok(dup == 0, "no two alike, within and across threads");
	free(all);
}

/* ---- the response cache in front of it (store_cache.c) ---- */

static struct store_op *start_purge(struct store *s, struct event_base *b,
				    const char *key, struct res *r)
{
	struct store_key k = mkkey("", key);

	res_reset(r);
	return store_purge(s, b, &k, on_result, r);
}

/* Turn b's loop until r's callback ran, for at most ms of real time. */
static void run_until_called(struct event_base *b, struct res *r, int ms)
{
	double end = now_s() + ms / 1000.0;

	while (atomic_load(&r->calls) == 0 && now_s() < end)
		event_base_loop(b, EVLOOP_ONCE);
}

static void test_cache(void)
{
	struct event_base *b = event_base_new();
	struct store *inner = store_memory_new(BIG, fake_clock);
	struct store *s = store_cache_new(inner, BIG);
	struct store_claim c = mkclaim("cached", 0, 1000, 600000);
	struct stored_response *resp = resp_new(201, "order 1");
	struct res r = { 0 };
	double t0;

	store_cache_listening(s, true);
	is_int(do_claim(s, b, &c, &r, "cache: first"), STORE_WON,
	       "cache: the first claim wins");
	is_int(complete(s, b, "cached", r.owner, resp, 600000, "cache: complete"),
	       STORE_OK, "cache: completed (and kept)");
	is_int(do_claim(inner, b, &c, &r, "cache: inner"), STORE_COMPLETED,
	       "cache: the store behind has it too");

	/* the record goes behind the cache's back, its purge not heard yet:
	 * a lookup finds the copy, and the purge heard before the hit is
	 * delivered (the same loop turn) sends the claim to the store behind */
	ok(start_purge(inner, b, "cached", &r) != NULL, "cache: purge behind");
	drain(b);
	is_int(r.status, STORE_OK, "cache: purged behind");
	res_reset(&r);
	ok(store_claim(s, b, &c, on_result, &r) != NULL && r.calls == 0,
	   "cache: a hit waits for the next turn");
	store_cache_notified(s, "purge::cached");
	drain(b);
	is_int(atomic_load(&r.calls), 1, "cache: answered once");
	is_int(r.status, STORE_WON, "cache: a hit gone stale is not replayed");

	/* a purge through the cache answers once this process heard it */
	is_int(complete(s, b, "cached", r.owner, resp, 600000, "cache: again"),
	       STORE_OK, "cache: completed again");
	ok(start_purge(s, b, "cached", &r) != NULL, "cache: purge");
	drain(b);
	is_int(atomic_load(&r.calls), 0, "cache: the purge waits to hear itself");
	store_cache_notified(s, "purge::other");
	run_for(b, 20);
	is_int(atomic_load(&r.calls), 0, "cache: another key's purge is not it");
	store_cache_notified(s, "purge::cached");
	run_until_called(b, &r, 500);
	is_int(atomic_load(&r.calls), 1, "cache: heard, answered");
	is_int(r.status, STORE_OK, "cache: it found the record");
	is_int(do_claim(s, b, &c, &r, "cache: after"), STORE_WON,
	       "cache: the key is new again");

	/* unheard, it answers after a bounded wait; nobody listening: at once */
	ok(start_purge(s, b, "cached", &r) != NULL, "cache: unheard purge");
	t0 = now_s();
	run_until_called(b, &r, 3000);
	ok(atomic_load(&r.calls) == 1 && r.at - t0 > 0.9 && r.at - t0 < 2.0,
	   "cache: an unheard purge answers after about a second (%.3f s)",
	   r.at - t0);
	store_cache_listening(s, false);
	ok(start_purge(s, b, "cached", &r) != NULL, "cache: purge, deaf");
	drain(b);
	is_int(atomic_load(&r.calls), 1, "cache: nobody listening, no wait");

	/* deaf for good (a pooler shares the sessions): nothing is served,
	 * whatever the listeners say */
	store_cache_listening(s, true);
	is_int(do_claim(s, b, &c, &r, "cache: deaf"), STORE_WON,
	       "cache: a key to keep");
	is_int(complete(s, b, "cached", r.owner, resp, 600000, "cache: kept"),
	       STORE_OK, "cache: kept");
	store_cache_deaf(s);
	ok(start_purge(inner, b, "cached", &r) != NULL, "cache: purged behind");
	drain(b);
	is_int(do_claim(s, b, &c, &r, "cache: deaf claim"), STORE_WON,
	       "cache: deaf, the copy is not served");
	is_int(complete(s, b, "cached", r.owner, resp, 600000, "cache: not kept"),
	       STORE_OK, "cache: completed");
	ok(start_purge(inner, b, "cached", &r) != NULL, "cache: behind again");
	drain(b);
	is_int(do_claim(s, b, &c, &r, "cache: deaf again"), STORE_WON,
	       "cache: deaf, nothing was kept");

	res_reset(&r);
	stored_response_unref(resp);
	store_free(s);
	event_base_free(b);
}

static void test_misc(void)
{
	char o1[STORE_OWNER_LEN + 1], o2[STORE_OWNER_LEN + 1];
	struct stored_response *x = stored_response_new(204, "", 0, NULL, 0, true);

	ok(store_new_owner(o1) == 0 && store_new_owner(o2) == 0, "owner tokens");
	ok(is_owner_token(o1) && strcmp(o1, o2) != 0, "random hex, distinct");
	is_str(store_status_name(STORE_WON), "won", "status name won");
	is_str(store_status_name(STORE_MISMATCH), "mismatch", "status name mismatch");
	is_str(store_status_name(STORE_ERROR), "error", "status name error");
	ok(x != NULL && x->body_len == 0 && x->head_len == 0,
	   "an empty stored response");
	ok(x != NULL && stored_response_ref(x) == x, "ref returns itself");
	stored_response_unref(x);
	stored_response_unref(x);
	stored_response_unref(NULL);
}

int main(void)
{
	if (evthread_use_pthreads() < 0) {
		printf("Bail out! evthread_use_pthreads\n");
		return 1;
	}
	test_claim_table();
	test_release();
	test_lease_unknown();
	test_lease_takeover();
	test_ttl();
	test_sweep();
	test_watch();
	test_watch_lease_timeout();
	test_threads();
	test_mailbox();
	test_cancel();
	test_cancel_takeover();
	test_cap();
	test_flood();
	test_doubling();
	test_bound();
	test_misc();
	test_owner_tokens();
	test_cache();
	return tap_done();
}
