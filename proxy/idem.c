/*
 * idem.c - the idempotency engine (see idem.h).
 *
 *   idem_start ──▶ IDEM_ST_CLAIM ──WON──▶ (require_issued_key: IDEM_ST_CHECK
 *                    │ ▲    │              marker found ─┐  not issued:
 *                    │ │    │                            │  IDEM_ST_UNDO, 400)
 *        IN_FLIGHT   │ │    │ COMPLETED: replay          ▼   won as the lease
 *        (wait mode) ▼ │    │ MISMATCH: 422        (IDEM_ST_CONFIRM: ran out: extend;
 *                    │ │    │                       fenced: claim again)
 *                    │ │    │                            ▼
 *                    │ │    │                      IDEM_ST_FORWARD ── head late: 504
 *                IDEM_ST_WAIT  IN_FLIGHT (reject,        │      to the client, the
 *                 settled:     or wait_timeout): 409     │      exchange goes on
 *                 claim again  UNKNOWN: replay it        │ response done, failed
 *                 (or probe)   store down: 503 or        ▼ or past the deadline
 *                              fail-open forward   IDEM_ST_SETTLE
 *                                                  complete, release or record
 *   no key to be had: IDEM_ST_PASS ──▶ forward     unknown, retried with
 *                     (unprotected)                back-off, then
 *                                                  sink->settled; unknown and a
 *                                                  probe: IDEM_ST_PROBE; freed
 *
 * How an exchange ends decides the record (settlement(), docs/protocol.md
 * "How an exchange ends"): a response is stored, unless its status is one
 * the route releases on (the app did not or could not act); a failure
 * before any request byte left (connect, TLS handshake) releases; any other
 * failure - the connection broken after the request left, the deadline -
 * leaves the outcome unknown: recorded as such, replayed, never sent again
 * (unknown_outcome = release: released, at-least-once). A request that may
 * have reached the upstream is never sent to it again.
 *
 * The store decides every claim (PostgreSQL's single statement, or the
 * memory store's lock); the engine never checks then inserts. A winner's
 * completion and release carry its owner token, so a stale winner whose
 * lease was taken over cannot overwrite the new owner's record. While
 * forwarding, the winner extends its lease at half of what is left of it;
 * it never forwards on a lease that ran out before it heard it won. A
 * duplicate that finds the lease run out does not take the key over: the
 * store records the outcome as unknown (the owner may have executed it and
 * died), and the owner's late completion, fenced by its token, replaces it.
 *
 * Ownership: the engine owns its store handles, its timer, its upstream
 * handle and the captured response. The client is a borrowed pointer,
 * cleared by idem_detach() or by the engine after a final sink call.
 */
#include "idem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "clock.h"
#include "h1.h"
#include "httphdr.h"
#include "issue.h"
#include "log.h"
#include "probe.h"
#include "reply.h"
#include "reqlog.h"

/*
 * Completion/release writes and lease extensions that fail are retried
 * with a doubling back-off (first, cap). The store itself holds each
 * attempt until a connection is up (or its own deadline), so a retry is
 * not spent against a dead pool.
 *
 * An extension is retried for as long as the lease lasts, less a margin
 * (the smaller of LEASE_MARGIN_MS and a tenth of the lease). So is a
 * completion or release, with the guarantee that an outage shorter than
 * the lease loses nothing; once the lease has run out it is "overdue" and
 * still retried, until the record would expire, because every write is
 * fenced by the owner token: it lands if nobody took the key over yet
 * (and a duplicate then replays instead of executing again), and is a
 * no-op if somebody did. OVERDUE_MAX bounds how many engines of one loop
 * do that (each holds its response): a store that fails completions while
 * it accepts claims must not grow the process without end.
 */
#define SETTLE_BACKOFF_MS 100
#define EXTEND_BACKOFF_MS 250
#define RETRY_BACKOFF_MAX_MS 2000
#define LEASE_MARGIN_MS 1000
#define OVERDUE_MAX 1024
/* A win heard of as its lease ran out is extended before the request is
 * sent, at most this many times (forward_owned()). */
#define CONFIRM_MAX 2
/* An outcome probe is asked this many times by the owner that recorded
 * the unknown outcome (PROBE_BACKOFF_MS apart, doubling), once by a
 * duplicate that finds one (its client waits for the answer). */
#define PROBE_TRIES 3
#define PROBE_BACKOFF_MS 1000

enum idem_state {
	IDEM_ST_CLAIM,		/* a claim is with the store */
	IDEM_ST_WAIT,		/* another request holds the key: watching */
	IDEM_ST_FORWARD,	/* ours (or fail-open): exchange upstream */
	IDEM_ST_SETTLE,		/* writing completion or release */
	IDEM_ST_PASS,		/* no key: forward unprotected next turn */
	IDEM_ST_CHECK,		/* won: is the key one this proxy issued? */
	IDEM_ST_UNDO,		/* not issued: give the claims back, answer */
	IDEM_ST_CONFIRM,	/* won as the lease ran out: extend, then go */
	IDEM_ST_RETAKE,		/* that win became unknown before anything was
				 * sent: releasing it, then claiming again */
	IDEM_ST_PROBE,		/* unknown outcome: asking the outcome probe,
				 * then writing what it said */
	IDEM_ST_DONE,		/* over: on env->done, freed next loop turn */
};

/* What the record becomes once the exchange is over (settlement()). */
enum settle_kind {
	SETTLE_STORE,		/* the response is stored and replayed */
	SETTLE_RELEASE,		/* deleted: a retry executes */
	SETTLE_UNKNOWN,		/* recorded as an unknown outcome */
};

/* An engine's flags, one word (idem_flags_str() for logs). */
#define IDEM_FLAG_LIST(X) \
	X(ORPHAN       , "orphan") \
	X(WAITED       , "waited") \
	X(WAIT_EXPIRED , "wait_expired") \
	X(OWNS         , "owns") \
	X(RESP_HEAD    , "resp_head") \
	X(CAP_OVERFLOW , "cap_overflow") \
	X(FAILED       , "failed") \
	X(OVERDUE      , "overdue") \
	X(SENT         , "sent") \
	X(LATE         , "late") \
	X(RESOLVER     , "resolver")

enum {
#define X(name, label) IDEM_BIT_##name,
	IDEM_FLAG_LIST(X)
#undef X
};

#define IF(name) (1u << IDEM_BIT_##name)

struct idem {
	enum idem_state state;
	unsigned flags;			/* IF(...) */
	struct idem_env *env;
	struct idem_request req;
	const struct idem_sink *sink;
	void *client;			/* NULL once detached */
	TAILQ_ENTRY(idem) link;		/* env->orphans, then env->done */

	struct store_op *op;		/* claim, watch, complete or release */
	struct store_op *ext_op;	/* lease extension */
	struct event *timer;		/* WAIT: timeout; FORWARD: extend;
					 * SETTLE: retry back-off */
	uint64_t wait_start_ms;
	char owner[STORE_HANDLE_MAX + 1];
	char marker_owner[STORE_HANDLE_MAX + 1];	/* a marker we created */
	int attempts;			/* failed settle writes */
	int confirms;			/* extensions of a late win */
	int ext_failures;		/* failed extensions in a row */
	uint64_t claim_sent_ms;		/* monotonic: the last claim call */
	uint64_t ext_sent_ms;		/* monotonic: the extension on the wire */
	uint64_t lease_end_ms;		/* monotonic: our lease ends (at least) */
	enum problem undo_problem;	/* what UNDO answers */
	const char *undo_detail;
	enum outcome undo_outcome;

	struct upstream *up;
	uint64_t up_start_ms;
	struct event *deadline;		/* a late head: upstream_deadline */
	int status;
	struct evbuffer *cap_head;	/* "Name: value\r\n"... */
	struct evbuffer *cap_body;
	enum upstream_error error;
	enum unknown_cause cause;	/* FAILED with SENT, or the deadline */
	struct stored_response *outcome;	/* what complete() writes; a
						 * resolver's: the unknown
						 * outcome it found */
	struct reqlog *rl;		/* the client's record of the request
					 * (reqlog.h); NULL with the client */
	char rid[REQLOG_ID_MAX + 1];	/* its request id, for the event log */
	struct probe *probe;		/* the outcome probe being asked */
	int probes;			/* outcome probe attempts made */
	int probe_status;		/* what it answered (0: nothing) */
};

static bool if_has(const struct idem *ix, unsigned f)
{
	return (ix->flags & f) != 0;
}

static void if_set(struct idem *ix, unsigned f)
{
	ix->flags |= f;
}

static void if_clr(struct idem *ix, unsigned f)
{
	ix->flags &= ~f;
}

/* "owns|waited" for logs. */
static const char *idem_flags_str(unsigned flags, char *buf, size_t len)
{
	static const char *const names[] = {
#define X(name, label) label,
		IDEM_FLAG_LIST(X)
#undef X
	};

	return log_flags(flags, names, sizeof(names) / sizeof(names[0]), buf, len);
}

static void claim(struct idem *ix);
static void settle(struct idem *ix);
static void write_settlement(struct idem *ix);
static void ask_probe(struct idem *ix);

static double seconds_since(uint64_t t0_ms)
{
	return (double)(clock_ms() - t0_ms) / 1e3;
}

/* The n-th retry's back-off (n >= 1): first, doubling, capped. */
static uint64_t backoff_ms(uint64_t first, int n)
{
	uint64_t ms = first;

	while (--n > 0 && ms < RETRY_BACKOFF_MAX_MS)
		ms *= 2;
	return ms < RETRY_BACKOFF_MAX_MS ? ms : RETRY_BACKOFF_MAX_MS;
}

/* Can a write issued ms from now still land while our lease holds? The
 * lease is counted from when the claim or extension was sent, so the
 * server's lease_until is at least lease_end_ms. */
static bool lease_allows(const struct idem *ix, uint64_t ms)
{
	uint64_t margin = ix->req.claim.lease_ms / 10;

	if (margin > LEASE_MARGIN_MS)
		margin = LEASE_MARGIN_MS;
	return clock_ms() + ms + margin < ix->lease_end_ms;
}

/* When the next extension is due: half of what is left of the lease (half
 * a lease after a prompt claim or extension; sooner after a slow one). */
static uint64_t half_lease_left(const struct idem *ix)
{
	uint64_t now = clock_ms();

	return ix->lease_end_ms > now ? (ix->lease_end_ms - now) / 2 : 0;
}

static void arm_timer(struct idem *ix, uint64_t ms)
{
	struct timeval tv = clock_tv(ms);

	evtimer_add(ix->timer, &tv);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg);

/* The deadline's timer is made only for an exchange whose head is late:
 * the happy path allocates nothing for it. Returns -1 out of memory. */
static int arm_deadline(struct idem *ix, uint64_t ms)
{
	struct timeval tv = clock_tv(ms);

	if (ix->deadline == NULL)
		ix->deadline = evtimer_new(ix->env->base, deadline_cb, ix);
	if (ix->deadline == NULL)
		return -1;
	return evtimer_add(ix->deadline, &tv);
}

static void disarm_deadline(struct idem *ix)
{
	if (ix->deadline != NULL)
		evtimer_del(ix->deadline);
}

/* The outcome is recorded (or given up): the client may go on. */
static void settled(struct idem *ix)
{
	void *client = ix->client;

	ix->client = NULL;

	ix->rl = NULL;
	if (client != NULL)
		ix->sink->settled(client);
}

/*
 * The one way an engine ends. Everything it holds is given up now - its
 * store handles cancelled, its upstream exchange aborted, its timer
 * stopped - so that no callback of its can run any more; its memory goes
 * on the next loop turn (env->done), after every caller up the stack has
 * returned (pgbouncer's CL_JUSTFREE). Nothing but this function puts an
 * engine there, and nothing but reap() frees one.
 */
static void idem_done(struct idem *ix)
{
	struct idem_env *env = ix->env;

	if (ix->state == IDEM_ST_DONE)
		return;
	if (if_has(ix, IF(ORPHAN))) {
		TAILQ_REMOVE(&env->orphans, ix, link);
		if_clr(ix, IF(ORPHAN));
		env->norphans--;
		if (env->orphans_changed != NULL)
			env->orphans_changed(env->orphans_arg);
	}
	if (ix->op != NULL)
		store_cancel(ix->op);
	if (ix->ext_op != NULL)
		store_cancel(ix->ext_op);
	ix->op = ix->ext_op = NULL;
	if (ix->up != NULL)
		upstream_abort(ix->up);
	ix->up = NULL;
	disarm_deadline(ix);
	probe_cancel(ix->probe);
	ix->probe = NULL;
	if (if_has(ix, IF(OWNS)))
		metrics_gauge_add(GAUGE_in_flight, -1);
	if_clr(ix, IF(OWNS));
	if (if_has(ix, IF(OVERDUE)))
		env->noverdue--;
	if_clr(ix, IF(OVERDUE));
	evtimer_del(ix->timer);
	ix->client = NULL;
	ix->rl = NULL;
	ix->state = IDEM_ST_DONE;
	TAILQ_INSERT_TAIL(&env->done, ix, link);
	event_active(env->reap, EV_TIMEOUT, 1);
}

static void idem_destroy(struct idem *ix)
{
	config_unref(ix->req.cfg);
	event_free(ix->timer);
	if (ix->deadline != NULL)
		event_free(ix->deadline);
	evbuffer_free(ix->req.request);
	evbuffer_free(ix->cap_head);
	evbuffer_free(ix->cap_body);
	stored_response_unref(ix->outcome);
	free(ix);
}

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
	struct idem_env *env = arg;
	struct idem *ix;

	while ((ix = TAILQ_FIRST(&env->done)) != NULL) {
		TAILQ_REMOVE(&env->done, ix, link);
		idem_destroy(ix);
	}
}

/* The client got its final answer; the engine may still have work. */
static void let_go(struct idem *ix)
{
	ix->client = NULL;
	ix->rl = NULL;
	if (ix->state != IDEM_ST_FORWARD && ix->state != IDEM_ST_SETTLE &&
	    ix->state != IDEM_ST_CHECK && ix->state != IDEM_ST_UNDO &&
	    ix->state != IDEM_ST_CONFIRM && ix->state != IDEM_ST_RETAKE &&
	    ix->state != IDEM_ST_PROBE) {
		idem_done(ix);
		return;
	}
	if (!if_has(ix, IF(ORPHAN))) {
		if_set(ix, IF(ORPHAN));
		TAILQ_INSERT_TAIL(&ix->env->orphans, ix, link);
		ix->env->norphans++;
	}
}

/* Nobody waits for this engine any more: it finishes as an orphan. */
static void let_go_if_alone(struct idem *ix)
{
	if (ix->client == NULL)
		let_go(ix);
}

static void observe_wait(struct idem *ix)
{
	reqlog_phase_end(ix->rl, REQLOG_WAIT);
	if (if_has(ix, IF(WAITED)))
		metrics_observe(HISTOGRAM_wait_seconds, seconds_since(ix->wait_start_ms));
}

/* Answer the client with a problem and end. */
static void finish_problem(struct idem *ix, enum problem p, const char *detail,
			   enum outcome o)
{
	observe_wait(ix);
	if (ix->client != NULL)
		ix->sink->problem(ix->client, p, detail, o);
	ix->client = NULL;
	ix->rl = NULL;
	idem_done(ix);
}

/* ---- the upstream exchange ------------------------------------------ */

/* The end-to-end fields a stored response keeps: Set-Cookie only when
 * keys are scoped to a caller (never replay a session to a stranger);
 * Content-Length only where it describes no body of its own. */
static bool stored_field(const struct hdrlist *h, uint32_t i, void *arg)
{
	const struct idem *ix = arg;
	bool is_cl = h->v[i].name_len == 14 &&
		     strcasecmp(hdr_name(h, i), "content-length") == 0;

	/* a HEAD or 304 response says the length of a body it does not
	 * carry: the replay says it too */
	if (is_cl && (ix->req.head_method || ix->status == 304))
		return true;
	if (httphdr_drop_on_forward(h, i))
		return false;
	if (hdr_named(h, i, ix->req.cfg->request_id_header,
		      ix->req.cfg->request_id_len) ||
	    hdr_named(h, i, REPLY_ORIGINAL_ID, sizeof(REPLY_ORIGINAL_ID) - 1))
		return false;	/* ours: the request's own id is stored */
	return policy_scoped(ix->req.policy) || h->v[i].name_len != 10 ||
	       strcasecmp(hdr_name(h, i), "set-cookie") != 0;
}

/* Serialise the end-to-end fields of a response for storage, with the
 * request id of the request that executed (a replay names it). */
static void capture_head(struct idem *ix, const struct upstream_resp *r)
{
	struct h1_out o;

	ix->status = r->status;
	h1_out_init(&o, ix->cap_head);
	h1_write_fields(&o, r->headers, stored_field, ix);
	if (ix->rid[0] != '\0') {
		/* under a name of ours: a replay says it as it is stored, and
		 * a record made before request ids has none */
		h1_out_add(&o, REPLY_ORIGINAL_ID ": ", sizeof(REPLY_ORIGINAL_ID) + 1);
		h1_out_str(&o, ix->rid);
		h1_out_add(&o, "\r\n", 2);
	}
	h1_out_flush(&o);
}

static void up_head(void *arg, const struct upstream_resp *r)
{
	struct idem *ix = arg;

	if (r->status >= 200) {
		if_set(ix, IF(RESP_HEAD));
		capture_head(ix, r);
		disarm_deadline(ix);	/* body gaps are timed again */
	}
	if (ix->client != NULL)
		ix->sink->head(ix->client, r);
}

static void up_body(void *arg, struct evbuffer *src, size_t len)
{
	struct idem *ix = arg;

	if (!if_has(ix, IF(CAP_OVERFLOW))) {
		if (evbuffer_get_length(ix->cap_body) + len >
		    ix->req.policy->max_cached_response) {
			if_set(ix, IF(CAP_OVERFLOW));
			evbuffer_drain(ix->cap_body, evbuffer_get_length(ix->cap_body));
		} else {
			/* copy: the client takes the bytes themselves */
			struct evbuffer_iovec v;

			if (evbuffer_reserve_space(ix->cap_body, (ev_ssize_t)len,
						   &v, 1) == 1 &&
			    evbuffer_copyout(src, v.iov_base, len) == (ev_ssize_t)len) {
				v.iov_len = len;
				evbuffer_commit_space(ix->cap_body, &v, 1);
			} else {
				if_set(ix, IF(CAP_OVERFLOW));	/* out of memory */
			}
		}
	}
	if (ix->client != NULL) {
		if (ix->sink->body(ix->client, src, len))
			upstream_pause_read(ix->up, true);
	} else {
		evbuffer_drain(src, len);
	}
}

static void up_done(void *arg)
{
	struct idem *ix = arg;

	metrics_observe(HISTOGRAM_upstream_seconds, seconds_since(ix->up_start_ms));
	reqlog_phase_end(ix->rl, REQLOG_UPSTREAM);
	upstream_release(ix->up);
	ix->up = NULL;
	evtimer_del(ix->timer);
	disarm_deadline(ix);
	if (if_has(ix, IF(LATE))) {
		metrics_count(COUNTER_late_responses_total);
		log_info_req(ix->rid, "key %s: the late response came after %.1f s (status "
			 "%d); stored for the retries", ix->req.claim.key.key,
			 seconds_since(ix->up_start_ms), ix->status);
	}
	if (ix->client != NULL)
		ix->sink->done(ix->client);
	settle(ix);
}

/* Why a failed exchange that may have reached the upstream has an unknown
 * outcome: the metric's cause and the problem's detail. */
static enum unknown_cause failure_cause(enum upstream_error err)
{
	switch (err) {
	case UPSTREAM_ERROR_TIMEOUT:
		return UNKNOWN_CAUSE_TIMEOUT;
	case UPSTREAM_ERROR_PROTOCOL:
		return UNKNOWN_CAUSE_PROTOCOL;
	case UPSTREAM_ERROR_TLS:
		return UNKNOWN_CAUSE_TLS;
	case UPSTREAM_ERROR_CONNECT:
	case UPSTREAM_ERROR_RESET:
	case UPSTREAM_ERROR_COUNT:
		break;
	}
	return UNKNOWN_CAUSE_RESET;
}

static const char *unknown_detail(enum unknown_cause c)
{
	switch (c) {
	case UNKNOWN_CAUSE_DEADLINE:
		return "the request reached the upstream, which did not answer "
		       "within the route's upstream_deadline; it may have "
		       "executed, and is not sent again";
	case UNKNOWN_CAUSE_PROTOCOL:
		return "the request reached the upstream, whose answer was not "
		       "HTTP; it may have executed, and is not sent again";
	case UNKNOWN_CAUSE_LEASE:
		return NULL;	/* stored_response_unknown()'s */
	case UNKNOWN_CAUSE_RESET:
	case UNKNOWN_CAUSE_TIMEOUT:
	case UNKNOWN_CAUSE_TLS:
	case UNKNOWN_CAUSE_COUNT:
		break;
	}
	return "the request reached the upstream and the connection broke "
	       "before its answer; it may have executed, and is not sent again";
}

/*
 * What the record becomes (DESIGN §1.7, docs/protocol.md "How an exchange
 * ends"). A final status says what the app did: stored, unless the route
 * releases on it - also when the body was cut short after it. A failure
 * before any request byte left releases. Anything else may have executed
 * and nobody knows: unknown (released only on an at-least-once route).
 */
static enum settle_kind settlement(const struct idem *ix)
{
	const struct policy *p = ix->req.policy;

	if (if_has(ix, IF(RESP_HEAD)) || !if_has(ix, IF(FAILED)))
		return policy_status_releases(p, ix->status) ? SETTLE_RELEASE :
							       SETTLE_STORE;
	if (!if_has(ix, IF(SENT)))
		return SETTLE_RELEASE;
	return p->unknown_outcome == UNKNOWN_RELEASE ? SETTLE_RELEASE :
						       SETTLE_UNKNOWN;
}

/* The problem a live client gets for a failed exchange. */
static enum problem failure_problem(const struct idem *ix, const char **detail)
{
	if (if_has(ix, IF(OWNS)) && settlement(ix) == SETTLE_UNKNOWN) {
		*detail = unknown_detail(ix->cause);
		return PROBLEM_OUTCOME_UNKNOWN;
	}
	return problem_upstream(ix->error, detail);
}

/*
 * The exchange failed. A keyed request that may have reached the upstream
 * is never sent again by the proxy (DESIGN §7): the upstream may have
 * read it before the connection broke. (A pooled connection the upstream
 * had closed while idle is seen closed before use: upstream_acquire.)
 */
static void up_error(void *arg, enum upstream_error err, unsigned how)
{
	struct idem *ix = arg;
	const char *detail;
	enum problem p;

	ix->up = NULL;
	if_set(ix, IF(FAILED));
	if (how & UPSTREAM_SENT)
		if_set(ix, IF(SENT));
	ix->error = err;
	if (ix->rl != NULL) {
		reqlog_phase_end(ix->rl, REQLOG_UPSTREAM);
		ix->rl->upstream_error = upstream_error_name(err);
	}
	if (ix->cause != UNKNOWN_CAUSE_DEADLINE)
		ix->cause = failure_cause(err);
	evtimer_del(ix->timer);
	disarm_deadline(ix);
	log_warn_req(ix->rid, "key %s: upstream %s%s", ix->req.claim.key.key,
		 upstream_error_name(err), (how & UPSTREAM_SENT) ?
		 " after the request was sent" : " before anything was sent");
	if (ix->client != NULL) {
		p = failure_problem(ix, &detail);
		ix->sink->failed(ix->client, p, detail);
	}
	settle(ix);
}

/*
 * The response head is later than --upstream-timeout. A keyed request's
 * client gets its 504 now, and the exchange goes on: the late response is
 * stored for the retries (which wait or get 409 meanwhile), until the
 * route's upstream_deadline. An unprotected one fails as a timeout.
 */
static bool up_slow(void *arg)
{
	struct idem *ix = arg;
	uint64_t spent = clock_ms() - ix->up_start_ms;
	uint64_t limit = ix->req.policy->upstream_deadline_ms;

	if (!if_has(ix, IF(OWNS)) || if_has(ix, IF(LATE)) || spent >= limit)
		return false;
	if (arm_deadline(ix, limit - spent) < 0)
		return false;	/* out of memory: a timeout, as before */
	if_set(ix, IF(LATE));
	log_info_req(ix->rid, "key %s: no response head within %.1f s; the client gets 504 "
		 "and the exchange goes on for up to %.0f s more",
		 ix->req.claim.key.key, (double)spent / 1e3,
		 (double)(limit - spent) / 1e3);
	if (ix->rl != NULL) {
		/* the client's part of the exchange ends with its 504; the
		 * exchange goes on, the client's record does not */
		reqlog_phase_end(ix->rl, REQLOG_UPSTREAM);
		ix->rl->upstream_error = "late";
	}
	if (ix->client != NULL) {
		ix->sink->failed(ix->client, PROBLEM_UPSTREAM_TIMEOUT,
				 "the upstream has not answered yet; the request "
				 "goes on, and a retry with the same key gets its "
				 "response once it comes");
		settled(ix);	/* the client may go on: its answer is given */
		let_go(ix);
	}
	return true;
}

static const struct upstream_cbs up_cbs = {
	.on_head = up_head,
	.on_body = up_body,
	.on_done = up_done,
	.on_error = up_error,
	.on_drain = NULL,
	.on_slow = up_slow,
};

/*
 * An extension answered. OK: the lease runs from when it was sent, next
 * one at half of what is left of it. An error is retried soon (not half a lease later,
 * which is about when the lease runs out), while the lease lasts.
 */
static void on_extended(void *arg, const struct store_result *res)
{
	struct idem *ix = arg;
	uint64_t wait;

	ix->ext_op = NULL;
	switch (res->status) {
	case STORE_OK:
		ix->ext_failures = 0;
		ix->lease_end_ms = ix->ext_sent_ms + ix->req.claim.lease_ms;
		if (ix->state == IDEM_ST_FORWARD)
			arm_timer(ix, half_lease_left(ix));
		return;
	case STORE_FENCED:
		log_warn_req(ix->rid, "key %s: lease lost while executing (taken over, or "
			 "the key purged by an operator)", ix->req.claim.key.key);
		return;
	default:
		wait = backoff_ms(EXTEND_BACKOFF_MS, ++ix->ext_failures);
		if (ix->state != IDEM_ST_FORWARD)
			return;
		if (lease_allows(ix, wait)) {
			arm_timer(ix, wait);
			return;
		}
		log_error_req(ix->rid, "key %s: the lease could not be extended (store %s); "
			  "another request may take the key over",
			  ix->req.claim.key.key, store_status_name(res->status));
		return;
	}
}

static bool send_request(struct idem *ix);
static void forward_owned(struct idem *ix);
static void on_confirmed(void *arg, const struct store_result *res);
static void refuse_winner(struct idem *ix, enum problem p, const char *detail,
			  enum outcome o);
static void claim(struct idem *ix);

/* Forward the buffered request: as the key's owner, or unprotected. */
static void forward(struct idem *ix, enum outcome o)
{
	ix->state = IDEM_ST_FORWARD;
	if (ix->client != NULL)
		ix->sink->forwarding(ix->client, o);
	if (!send_request(ix)) {
		up_error(ix, UPSTREAM_ERROR_CONNECT, 0);	/* nothing left */
		return;
	}
	if (if_has(ix, IF(OWNS)))
		arm_timer(ix, half_lease_left(ix));
}

/* Send the buffered request, once, on a pooled or new connection. */
static bool send_request(struct idem *ix)
{
	ix->up = upstream_acquire(ix->env->pool, &up_cbs, ix,
				  ix->req.cfg->upstream_timeout_ms,
				  ix->req.head_method, UPSTREAM_CHECK);
	if (ix->up == NULL)
		return false;
	ix->up_start_ms = clock_ms();
	if (ix->rl != NULL) {
		ix->rl->forwarded = true;
		reqlog_phase_begin(ix->rl, REQLOG_UPSTREAM);
	}
	evbuffer_add_buffer(upstream_output(ix->up), ix->req.request);
	upstream_request_sent(ix->up);
	return true;
}

/* ---- settling the record --------------------------------------------- */

/* The problem document a response cut short after its status is stored
 * as (the client had the status; its retries get this). */
static struct stored_response *cut_response(enum upstream_error err)
{
	static const char head[] = "Content-Type: application/problem+json\r\n";
	const char *detail;
	enum problem p = problem_upstream(err, &detail);
	char body[2048];
	size_t len;

	detail = "the upstream's response was cut short after its status; "
		 "the request was executed and its response is lost";
	len = problem_render(p, detail, body, sizeof(body));
	return stored_response_new(problem_status(p), head, sizeof(head) - 1,
				   body, len, true);
}

/*
 * A settle write failed and the next attempt would land after the lease:
 * may it go on, overdue? Until the record would expire (in flight, it
 * lives max(ttl, lease) from its claim), within OVERDUE_MAX. The first
 * time, the lease-backed guarantee is over: counted and logged as such.
 */
static bool overdue_allows(struct idem *ix, uint64_t wait)
{
	const struct store_claim *cl = &ix->req.claim;
	uint64_t life = cl->ttl_ms > cl->lease_ms ? cl->ttl_ms : cl->lease_ms;
	bool first = !if_has(ix, IF(OVERDUE));

	if (first)
		metrics_count(COUNTER_completion_failures_total);
	if (clock_ms() + wait >= ix->claim_sent_ms + life) {
		log_error_req(ix->rid, "key %s: could not write the outcome before the %s; "
			  "given up%s", cl->key.key,
			  first ? "lease ran out" : "record expired",
			  first ? ": the key stays in flight and may execute "
				  "again" : "");
		return false;
	}
	if (!first)
		return true;
	if (ix->env->noverdue >= OVERDUE_MAX) {
		log_error_req(ix->rid, "key %s: could not write the outcome before the lease "
			  "ran out, and %d others are still being retried; given "
			  "up: the key stays in flight and may execute again",
			  cl->key.key, OVERDUE_MAX);
		return false;
	}
	log_error_req(ix->rid, "key %s: could not write the outcome before the lease ran "
		  "out; still trying until the record expires (a retry that "
		  "comes first takes the key over and may execute again)",
		  cl->key.key);
	if_set(ix, IF(OVERDUE));
	ix->env->noverdue++;
	return true;
}

/*
 * The completion or release answered. An error is retried with back-off
 * while the lease lasts, then overdue (overdue_allows()); the client
 * connection is let go at the first error (its next request does not wait
 * for an outage), and the engine finishes the write as an orphan.
 */
static void on_settled(void *arg, const struct store_result *res)
{
	struct idem *ix = arg;
	uint64_t wait;

	ix->op = NULL;
	reqlog_phase_end(ix->rl, REQLOG_STORE);
	switch (res->status) {
	case STORE_OK:
		if (if_has(ix, IF(OVERDUE)))
			log_warn_req(ix->rid, "key %s: outcome written after the lease ran "
				 "out (%d failed attempts); nobody had taken the "
				 "key over", ix->req.claim.key.key, ix->attempts);
		else if (ix->attempts > 0)
			log_info_req(ix->rid, "key %s: outcome written after %d failed "
				 "attempt(s)", ix->req.claim.key.key, ix->attempts);
		break;
	case STORE_FENCED:
		log_warn_req(ix->rid, "key %s: not ours any more (lease taken over, or the "
			 "key purged by an operator); outcome not written",
			 ix->req.claim.key.key);
		break;
	default:
		wait = backoff_ms(SETTLE_BACKOFF_MS, ++ix->attempts);
		if (lease_allows(ix, wait) || overdue_allows(ix, wait)) {
			metrics_count(COUNTER_completion_retries_total);
			if (ix->attempts == 1)
				log_warn_req(ix->rid, "key %s: could not write the outcome (%s); "
					 "retrying", ix->req.claim.key.key,
					 store_status_name(res->status));
			settled(ix);
			let_go(ix);
			arm_timer(ix, wait);
			return;
		}
		break;
	}
	settled(ix);
	if (res->status == STORE_OK && ix->outcome != NULL &&
	    ix->outcome->unknown && ix->req.policy->probe_target != NULL) {
		ix->state = IDEM_ST_PROBE;
		let_go(ix);
		ask_probe(ix);
		return;
	}
	idem_done(ix);
}

static void write_settlement(struct idem *ix)
{
	struct store *s = ix->env->store;

	reqlog_phase_begin(ix->rl, REQLOG_STORE);
	if (ix->outcome != NULL)
		ix->op = store_complete(s, ix->env->base, &ix->req.claim.key,
					ix->owner, ix->req.claim.fp, ix->outcome, ix->req.claim.ttl_ms,
					on_settled, ix);
	else
		ix->op = store_release(s, ix->env->base, &ix->req.claim.key,
				       ix->owner, on_settled, ix);
	if (ix->op == NULL) {
		metrics_count(COUNTER_completion_failures_total);
		settled(ix);
		idem_done(ix);
	}
}

/* The response as captured, to store. NULL when out of memory. */
static struct stored_response *captured_response(struct idem *ix)
{
	size_t blen = evbuffer_get_length(ix->cap_body);
	size_t hlen = evbuffer_get_length(ix->cap_head);

	return stored_response_new(ix->status,
		hlen ? (const char *)evbuffer_pullup(ix->cap_head, -1) : "",
		hlen,
		blen ? (const char *)evbuffer_pullup(ix->cap_body, -1) : "",
		blen, !if_has(ix, IF(CAP_OVERFLOW)));
}

/*
 * The exchange is over (or failed). Decide between completing the record
 * with the response, recording its outcome as unknown, and releasing the
 * key so that a retry can execute (settlement()).
 */
static void settle(struct idem *ix)
{
	enum settle_kind kind;

	ix->state = IDEM_ST_SETTLE;
	if (!if_has(ix, IF(OWNS))) {
		settled(ix);	/* unprotected: nothing to write */
		idem_done(ix);
		return;
	}
	kind = settlement(ix);
	switch (kind) {
	case SETTLE_STORE:
		/* a final status means the upstream acted: a response cut
		 * short after it is never a release (DESIGN §7) */
		ix->outcome = if_has(ix, IF(FAILED)) ? cut_response(ix->error) :
			      captured_response(ix);
		break;
	case SETTLE_RELEASE:
		if (if_has(ix, IF(FAILED)) && if_has(ix, IF(SENT)) &&
		    !if_has(ix, IF(RESP_HEAD))) {
			metrics_count(COUNTER_unknown_outcomes_released_total);
			log_warn_req(ix->rid, "key %s: outcome unknown (%s); released for a "
				 "retry (unknown_outcome = release)",
				 ix->req.claim.key.key,
				 unknown_cause_name(ix->cause));
		}
		break;
	case SETTLE_UNKNOWN:
		metrics_unknown_outcome(ix->cause);
		reqlog_unknown(ix->rl, ix->cause);
		log_warn_req(ix->rid, "key %s: the request reached the upstream and its "
			 "outcome is unknown (%s); recorded as such, it is not "
			 "sent again%s", ix->req.claim.key.key,
			 unknown_cause_name(ix->cause),
			 ix->req.policy->probe_target != NULL ?
			 "; asking the outcome probe" : "");
		/* the document the client had, its request id included: a
		 * replay is the answer the first request got */
		ix->outcome = stored_response_unknown(unknown_detail(ix->cause),
						      ix->rid[0] ? ix->rid : NULL);
		break;
	}
	/* the captured copies are no longer needed */
	evbuffer_drain(ix->cap_body, evbuffer_get_length(ix->cap_body));
	if (kind != SETTLE_RELEASE && ix->outcome == NULL) {
		/* never a release in its place: the lease runs out, and the
		 * key's outcome becomes unknown */
		log_error_req(ix->rid, "key %s: out of memory for the outcome; the key stays "
			  "in flight until its lease runs out",
			  ix->req.claim.key.key);
		metrics_count(COUNTER_completion_failures_total);
		settled(ix);
		idem_done(ix);
		return;
	}
	if (!if_has(ix, IF(ORPHAN)))
		let_go_if_alone(ix);
	write_settlement(ix);
}

/* A request that waited and claims again keeps what is left of its wait. */
static void rearm_wait(struct idem *ix)
{
	uint64_t spent;

	if (!if_has(ix, IF(WAITED)))
		return;
	spent = clock_ms() - ix->wait_start_ms;
	arm_timer(ix, spent < ix->req.policy->wait_timeout_ms ?
		  ix->req.policy->wait_timeout_ms - spent : 0);
}

/* ---- the outcome probe ------------------------------------------------ */

/*
 * An unknown outcome is asked about (a route's outcome_probe): by its owner
 * once it recorded it (in the background, PROBE_TRIES times), and by a
 * duplicate that finds it (a resolver: once, its client waiting). A 2xx
 * answer becomes the stored response, a 404 releases the key (the request
 * never executed: a retry may), anything else leaves it unknown. Both
 * writes carry the owner's handle, so that they land only on the record
 * still unknown (or in flight) under that owner.
 */

/* How often this engine asks: the owner in the background, a resolver
 * once while its client waits. */
static int probe_tries(const struct idem *ix)
{
	return if_has(ix, IF(RESOLVER)) ? 1 : PROBE_TRIES;
}

/* Reply to a waiting client with r and end. */
static void finish_replay(struct idem *ix, struct stored_response *r)
{
	observe_wait(ix);
	if (ix->client != NULL)
		ix->sink->replay(ix->client, r);
	ix->client = NULL;
	ix->rl = NULL;
	idem_done(ix);
}

/* The probe left the outcome unknown: a resolver replays it. */
static void probe_gave_up(struct idem *ix)
{
	metrics_probe(PROBE_RESULT_UNKNOWN);
	log_warn_req(ix->rid, "key %s: the outcome probe answered %d after %d attempt(s); "
		 "the outcome stays unknown", ix->req.claim.key.key,
		 ix->probe_status, ix->probes);
	if (if_has(ix, IF(RESOLVER)) && ix->outcome != NULL) {
		finish_replay(ix, ix->outcome);
		return;
	}
	idem_done(ix);
}

static void on_probe_written(void *arg, const struct store_result *res)
{
	struct idem *ix = arg;
	bool found = ix->probe_status != 404;

	ix->op = NULL;
	log_info_req(ix->rid, "key %s: outcome probe answered %d; %s %s",
		 ix->req.claim.key.key, ix->probe_status,
		 found ? "stored as its response:" : "released:",
		 store_status_name(res->status));
	if (!if_has(ix, IF(RESOLVER))) {
		idem_done(ix);
		return;
	}
	if (res->status == STORE_OK && found) {
		finish_replay(ix, ix->outcome);
		return;
	}
	if (res->status == STORE_ERROR) {
		finish_problem(ix, PROBLEM_STORE_UNAVAILABLE, "the idempotency "
			       "store cannot be reached", OUTCOME_STORE_UNAVAILABLE);
		return;
	}
	/* released (this request may execute now), or changed meanwhile (the
	 * owner's completion landed, or a purge): claim again - unless the
	 * client left while the probe was asked: nobody to execute it for */
	if (ix->client == NULL) {
		idem_done(ix);
		return;
	}
	if_clr(ix, IF(RESOLVER));
	ix->owner[0] = '\0';
	stored_response_unref(ix->outcome);
	ix->outcome = NULL;
	rearm_wait(ix);
	claim(ix);
}

static void probe_answered(void *arg, int status, struct stored_response *resp)
{
	struct idem *ix = arg;
	struct store *s = ix->env->store;
	const struct store_key *k = &ix->req.claim.key;
	ix->probe = NULL;
	ix->probe_status = status;
	if (status >= 200 && status < 300 && resp != NULL) {
		metrics_probe(PROBE_RESULT_FOUND);
		stored_response_unref(ix->outcome);
		ix->outcome = stored_response_ref(resp);
		ix->op = store_complete(s, ix->env->base, k, ix->owner,
					ix->req.claim.fp, resp,
					ix->req.claim.ttl_ms, on_probe_written, ix);
	} else if (status == 404) {
		metrics_probe(PROBE_RESULT_ABSENT);
		ix->op = store_release(s, ix->env->base, k, ix->owner,
				       on_probe_written, ix);
	} else {
		if (ix->probes < probe_tries(ix)) {
			arm_timer(ix, backoff_ms(PROBE_BACKOFF_MS, ix->probes));
			return;
		}
		probe_gave_up(ix);
		return;
	}
	if (ix->op == NULL)
		probe_gave_up(ix);
}

/* The key without the route's prefix: what the upstream knows it by. */
static const char *client_key(const struct idem *ix)
{
	const char *key = ix->req.claim.key.key;
	size_t n = strlen(ix->req.policy->key_prefix);

	return strncmp(key, ix->req.policy->key_prefix, n) == 0 ? key + n : key;
}

static void ask_probe(struct idem *ix)
{
	ix->state = IDEM_ST_PROBE;
	ix->probes++;
	ix->probe = probe_start(ix->env->pool, ix->req.cfg, ix->req.policy,
				client_key(ix), probe_answered, ix);
	if (ix->probe != NULL)
		return;
	ix->probe_status = 0;
	if (ix->probes < probe_tries(ix)) {
		arm_timer(ix, backoff_ms(PROBE_BACKOFF_MS, ix->probes));
		return;
	}
	probe_gave_up(ix);
}

/* ---- claiming and waiting ------------------------------------------ */

static void on_watch(void *arg, const struct store_result *res)
{
	struct idem *ix = arg;

	ix->op = NULL;
	claim(ix);	/* the wait timer keeps running across re-claims */
}

/*
 * Forward as the key's owner - unless the lease is over, or nearly, by our
 * own count (from when the claim was sent): a claim whose commit was slow
 * (a lock, a stalled or paused server) can win a lease that ended before
 * we heard of it, and another claim may have taken the key over since
 * and be executing it. Then the lease is extended first (on_confirmed()).
 */
static void forward_owned(struct idem *ix)
{
	if (lease_allows(ix, 0)) {
		forward(ix, OUTCOME_FORWARDED);
		return;
	}
	if (ix->confirms >= CONFIRM_MAX) {
		refuse_winner(ix, PROBLEM_STORE_UNAVAILABLE, "the idempotency "
			      "store answers too slowly to hold a lease",
			      OUTCOME_STORE_UNAVAILABLE);
		return;
	}
	log_warn_req(ix->rid, "key %s: won, but the lease ran out (%llu ms after the claim "
		 "was sent); extending it before the request is sent",
		 ix->req.claim.key.key,
		 (unsigned long long)(clock_ms() - ix->claim_sent_ms));
	ix->confirms++;
	ix->state = IDEM_ST_CONFIRM;
	ix->ext_sent_ms = clock_ms();
	ix->op = store_extend(ix->env->store, ix->env->base, &ix->req.claim.key,
			      ix->owner, ix->req.claim.lease_ms, on_confirmed, ix);
	if (ix->op == NULL)
		refuse_winner(ix, PROBLEM_STORE_UNAVAILABLE, NULL,
			      OUTCOME_STORE_UNAVAILABLE);
}

/* A late win, never sent, was given back (or was not ours any more):
 * claim again, with what is left of the wait. */
static void on_retaken(void *arg, const struct store_result *res)
{
	struct idem *ix = arg;

	ix->op = NULL;
	if (res->status == STORE_ERROR) {
		refuse_winner(ix, PROBLEM_STORE_UNAVAILABLE,
			      "the idempotency store cannot be reached",
			      OUTCOME_STORE_UNAVAILABLE);
		return;
	}
	if_clr(ix, IF(OWNS));
	metrics_gauge_add(GAUGE_in_flight, -1);
	ix->owner[0] = '\0';
	rearm_wait(ix);
	claim(ix);
}

/*
 * The extension of a late win answered. OK: the key is still ours, and
 * the lease runs from when the extension was sent. Fenced: another claim
 * took it over (and may be executing it): this request is a duplicate
 * again, and claims anew (with what is left of its wait). An error: the
 * key is given back and the client gets 503.
 */
static void on_confirmed(void *arg, const struct store_result *res)
{
	struct idem *ix = arg;

	ix->op = NULL;
	switch (res->status) {
	case STORE_OK:
		ix->lease_end_ms = ix->ext_sent_ms + ix->req.claim.lease_ms;
		forward_owned(ix);
		return;
	case STORE_FENCED:
		/* taken over (an at-least-once route), purged, or - the lease
		 * having run out - recorded as unknown under our token. Nothing
		 * was sent: give it back if it is still ours, then claim again */
		log_warn_req(ix->rid, "key %s: the lease ran out before the request was sent; "
			 "giving the key back and claiming again",
			 ix->req.claim.key.key);
		ix->state = IDEM_ST_RETAKE;
		ix->op = store_release(ix->env->store, ix->env->base,
				       &ix->req.claim.key, ix->owner,
				       on_retaken, ix);
		if (ix->op == NULL)
			refuse_winner(ix, PROBLEM_STORE_UNAVAILABLE, NULL,
				      OUTCOME_STORE_UNAVAILABLE);
		return;
	default:
		refuse_winner(ix, PROBLEM_STORE_UNAVAILABLE,
			      "the idempotency store cannot be reached",
			      OUTCOME_STORE_UNAVAILABLE);
		return;
	}
}

/* The claim on the marker of an issued key (issue.c). */
static void marker(const struct idem *ix, struct store_claim *m)
{
	issue_marker(ix->req.issued_key, issue_marker_ttl(ix->req.cfg), m);
}

static void undo_step(struct idem *ix);

static void on_undo(void *arg, const struct store_result *res)
{
	struct idem *ix = arg;

	ix->op = NULL;
	undo_step(ix);
}

/*
 * Take back what a refused winner holds - the marker it created while
 * checking, then its claim - and answer. Each step waits for the store.
 */
static void undo_step(struct idem *ix)
{
	struct store_claim m;

	ix->state = IDEM_ST_UNDO;
	if (ix->marker_owner[0] != '\0') {
		marker(ix, &m);
		ix->op = store_release(ix->env->store, ix->env->base, &m.key,
				       ix->marker_owner, on_undo, ix);
		ix->marker_owner[0] = '\0';
		if (ix->op != NULL)
			return;
	}
	if (if_has(ix, IF(OWNS))) {
		if_clr(ix, IF(OWNS));
		metrics_gauge_add(GAUGE_in_flight, -1);
		ix->op = store_release(ix->env->store, ix->env->base,
				       &ix->req.claim.key, ix->owner, on_undo, ix);
		if (ix->op != NULL)
			return;
	}
	finish_problem(ix, ix->undo_problem, ix->undo_detail, ix->undo_outcome);
}

static void refuse_winner(struct idem *ix, enum problem p, const char *detail,
			  enum outcome o)
{
	ix->undo_problem = p;
	ix->undo_detail = detail;
	ix->undo_outcome = o;
	undo_step(ix);
}

static void on_marker(void *arg, const struct store_result *res)
{
	struct idem *ix = arg;

	ix->op = NULL;
	switch (res->status) {
	case STORE_IN_FLIGHT:
		/* the marker lives: the key was issued here and is unexpired */
		forward_owned(ix);
		return;
	case STORE_WON:
		/* no marker: never issued, or expired; ours now, undo it */
		memcpy(ix->marker_owner, res->owner, sizeof(ix->marker_owner));
		refuse_winner(ix, PROBLEM_INVALID_KEY, "this key was not issued by "
			      "GET /.well-known/idempotency-key, or it expired "
			      "before its first use", OUTCOME_INVALID_KEY);
		return;
	default:
		refuse_winner(ix, PROBLEM_STORE_UNAVAILABLE,
			      "the idempotency store cannot be reached",
			      OUTCOME_STORE_UNAVAILABLE);
		return;
	}
}

/* require_issued_key: the first use of a key must come within the route's
 * issued_key_ttl of its issue, and its marker must exist. */
static void check_issued(struct idem *ix)
{
	struct store_claim m;

	if (!issue_fresh(ix->req.issued_at, time(NULL),
			 ix->req.policy->issued_key_ttl_ms)) {
		refuse_winner(ix, PROBLEM_INVALID_KEY, "this key was not issued by "
			      "GET /.well-known/idempotency-key, or it expired "
			      "before its first use", OUTCOME_INVALID_KEY);
		return;
	}
	ix->state = IDEM_ST_CHECK;
	marker(ix, &m);
	ix->op = store_claim(ix->env->store, ix->env->base, &m, on_marker, ix);
	if (ix->op == NULL)
		refuse_winner(ix, PROBLEM_STORE_UNAVAILABLE, NULL,
			      OUTCOME_STORE_UNAVAILABLE);
}

static void on_claim(void *arg, const struct store_result *res)
{
	struct idem *ix = arg;

	ix->op = NULL;
	metrics_observe(HISTOGRAM_store_claim_seconds,
			seconds_since(ix->claim_sent_ms));
	reqlog_phase_end(ix->rl, REQLOG_CLAIM);
	switch (res->status) {
	case STORE_WON:
		if_set(ix, IF(OWNS));
		ix->lease_end_ms = ix->claim_sent_ms + ix->req.claim.lease_ms;
		memcpy(ix->owner, res->owner, sizeof(ix->owner));
		metrics_gauge_add(GAUGE_in_flight, 1);
		evtimer_del(ix->timer);
		observe_wait(ix);
		if (ix->req.policy->require_issued_key) {
			check_issued(ix);
			return;
		}
		forward_owned(ix);
		return;
	case STORE_COMPLETED:
		observe_wait(ix);
		if (!res->resp->body_stored) {
			finish_problem(ix, PROBLEM_RESPONSE_NOT_STORED,
				       "the first response was too large to store; "
				       "it cannot be replayed", OUTCOME_CONFLICT);
			return;
		}
		if (ix->client != NULL)
			ix->sink->replay(ix->client, res->resp);
		ix->client = NULL;
		ix->rl = NULL;
		idem_done(ix);
		return;
	case STORE_UNKNOWN:
		if (res->lapsed) {
			metrics_unknown_outcome(UNKNOWN_CAUSE_LEASE);
			reqlog_unknown(ix->rl, UNKNOWN_CAUSE_LEASE);
			log_warn_req(ix->rid, "key %s: its owner stopped extending the lease "
				 "(killed, stalled or cut off from the store) while "
				 "the request may have executed; its outcome is "
				 "recorded as unknown and it is not sent again",
				 ix->req.claim.key.key);
		}
		if (ix->req.policy->probe_target != NULL && ix->client != NULL) {
			/* the timer is the probe's now; a wait goes on after */
			evtimer_del(ix->timer);
			if_set(ix, IF(RESOLVER));
			memcpy(ix->owner, res->owner, sizeof(ix->owner));
			ix->outcome = stored_response_ref(res->resp);
			ask_probe(ix);
			return;
		}
		finish_replay(ix, res->resp);
		return;
	case STORE_MISMATCH:
		finish_problem(ix, PROBLEM_KEY_MISMATCH,
			       "this key was used with a different request "
			       "(method, target or body)", OUTCOME_MISMATCH);
		return;
	case STORE_IN_FLIGHT:
		if (ix->req.policy->in_flight == IN_FLIGHT_REJECT || if_has(ix, IF(WAIT_EXPIRED))) {
			finish_problem(ix, PROBLEM_IN_PROGRESS,
				       "a request with this key is still in progress",
				       OUTCOME_CONFLICT);
			return;
		}
		if (!if_has(ix, IF(WAITED))) {
			if_set(ix, IF(WAITED));
			ix->wait_start_ms = clock_ms();
			reqlog_phase_begin(ix->rl, REQLOG_WAIT);
			arm_timer(ix, ix->req.policy->wait_timeout_ms);
		}
		ix->state = IDEM_ST_WAIT;
		ix->op = store_watch(ix->env->store, ix->env->base,
				     &ix->req.claim.key, on_watch, ix);
		if (ix->op == NULL)
			finish_problem(ix, PROBLEM_STORE_UNAVAILABLE, NULL,
				       OUTCOME_STORE_UNAVAILABLE);
		return;
	case STORE_FULL:
	case STORE_ERROR:
	default:
		evtimer_del(ix->timer);
		if (ix->req.policy->store_down == STORE_DOWN_FAIL_OPEN) {
			log_warn_req(ix->rid, "key %s: store %s, forwarding unprotected (fail-open)",
				 ix->req.claim.key.key, store_status_name(res->status));
			forward(ix, OUTCOME_FAIL_OPEN);
			return;
		}
		finish_problem(ix, PROBLEM_STORE_UNAVAILABLE,
			       res->status == STORE_FULL ?
				       "the idempotency store is full" :
				       "the idempotency store cannot be reached",
			       OUTCOME_STORE_UNAVAILABLE);
		return;
	}
}

static void claim(struct idem *ix)
{
	ix->state = IDEM_ST_CLAIM;
	ix->claim_sent_ms = clock_ms();
	reqlog_phase_begin(ix->rl, REQLOG_CLAIM);
	ix->op = store_claim(ix->env->store, ix->env->base, &ix->req.claim,
			     on_claim, ix);
	if (ix->op == NULL)
		finish_problem(ix, PROBLEM_STORE_UNAVAILABLE, NULL,
			       OUTCOME_STORE_UNAVAILABLE);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct idem *ix = arg;

	switch (ix->state) {
	case IDEM_ST_WAIT:
		finish_problem(ix, PROBLEM_IN_PROGRESS,
			       "a request with this key is still in progress",
			       OUTCOME_CONFLICT);
		return;
	case IDEM_ST_FORWARD:
		ix->ext_sent_ms = clock_ms();
		if (if_has(ix, IF(OWNS)) && ix->ext_op == NULL)
			ix->ext_op = store_extend(ix->env->store, ix->env->base,
						  &ix->req.claim.key, ix->owner,
						  ix->req.claim.lease_ms,
						  on_extended, ix);
		return;
	case IDEM_ST_SETTLE:
		write_settlement(ix);
		return;
	case IDEM_ST_PASS:
		forward(ix, OUTCOME_PASSTHROUGH);
		return;
	case IDEM_ST_CLAIM:
		/* the wait timed out while a re-claim was with the store:
		 * still in flight, it answers 409; settled, it goes on */
		if_set(ix, IF(WAIT_EXPIRED));
		return;
	case IDEM_ST_PROBE:
		ask_probe(ix);
		return;
	case IDEM_ST_CHECK:
	case IDEM_ST_UNDO:
	case IDEM_ST_CONFIRM:
	case IDEM_ST_RETAKE:
	case IDEM_ST_DONE:
		return;
	}
}

/* The route's upstream_deadline passed with no response head: the outcome
 * is unknown (the request was sent). */
static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	struct idem *ix = arg;
	const char *detail;
	enum problem p;

	if (ix->state != IDEM_ST_FORWARD || ix->up == NULL)
		return;
	log_warn_req(ix->rid, "key %s: no response within upstream_deadline (%.0f s); "
		 "giving the exchange up", ix->req.claim.key.key,
		 (double)ix->req.policy->upstream_deadline_ms / 1e3);
	metrics_upstream_error(UPSTREAM_ERROR_TIMEOUT);
	upstream_abort(ix->up);
	ix->up = NULL;
	if_set(ix, IF(FAILED) | IF(SENT));
	ix->error = UPSTREAM_ERROR_TIMEOUT;
	ix->cause = UNKNOWN_CAUSE_DEADLINE;
	if (ix->rl != NULL) {
		reqlog_phase_end(ix->rl, REQLOG_UPSTREAM);
		ix->rl->upstream_error = "deadline";
	}
	evtimer_del(ix->timer);
	if (ix->client != NULL) {
		p = failure_problem(ix, &detail);
		ix->sink->failed(ix->client, p, detail);
	}
	settle(ix);
}

struct idem *idem_start(struct idem_env *env, struct idem_request *req,
			const struct idem_sink *sink, void *client)
{
	struct idem *ix = calloc(1, sizeof(*ix));

	if (ix == NULL)
		goto fail;
	ix->env = env;
	ix->req = *req;
	ix->req.cfg = config_ref(req->cfg);
	ix->sink = sink;
	ix->client = client;
	ix->rl = req->rl;
	if (req->rl != NULL)
		memcpy(ix->rid, req->rl->request_id, sizeof(ix->rid));
	ix->timer = evtimer_new(env->base, timer_cb, ix);
	ix->cap_head = evbuffer_new();
	ix->cap_body = evbuffer_new();
	ix->cause = UNKNOWN_CAUSE_RESET;
	/* only an at-least-once route takes over a claim whose lease ran out */
	ix->req.claim.takeover = req->policy->unknown_outcome == UNKNOWN_RELEASE;
	if (ix->timer == NULL || ix->cap_head == NULL || ix->cap_body == NULL)
		goto fail;
	if (req->unprotected) {
		/* forwarded on the next loop turn, never inside this call */
		ix->state = IDEM_ST_PASS;
		arm_timer(ix, 0);
	} else {
		ix->claim_sent_ms = clock_ms();
		reqlog_phase_begin(ix->rl, REQLOG_CLAIM);
		ix->op = store_claim(env->store, env->base, &ix->req.claim,
				     on_claim, ix);
		if (ix->op == NULL)
			goto fail;
	}
	req->request = NULL;	/* ours now */
	return ix;
fail:
	if (ix != NULL) {
		if (ix->req.cfg != NULL)
			config_unref(ix->req.cfg);
		if (ix->timer != NULL)
			event_free(ix->timer);
		if (ix->cap_head != NULL)
			evbuffer_free(ix->cap_head);
		if (ix->cap_body != NULL)
			evbuffer_free(ix->cap_body);
		free(ix);
	}
	evbuffer_free(req->request);
	req->request = NULL;
	return NULL;
}

void idem_detach(struct idem *ix)
{
	if (ix->state == IDEM_ST_FORWARD && ix->up != NULL)
		upstream_pause_read(ix->up, false);	/* nobody to wait for */
	let_go(ix);	/* ends it (later) or makes it an orphan */
}

void idem_resume(struct idem *ix)
{
	if (ix->up != NULL)
		upstream_pause_read(ix->up, false);
}

void idem_abort_orphans(struct idem_env *env)
{
	struct idem *ix;
	char flags[128];

	while ((ix = TAILQ_FIRST(&env->orphans)) != NULL) {
		log_warn_req(ix->rid, "key %s: abandoned at shutdown [%s]; once its lease runs "
			 "out, a request that reached the upstream has an "
			 "unknown outcome, any other is free again",
			 ix->req.claim.key.key,
			 idem_flags_str(ix->flags, flags, sizeof(flags)));
		idem_done(ix);
	}
}

int idem_env_init(struct idem_env *env, struct event_base *base,
		  struct upstream_pool *pool, struct store *store)
{
	memset(env, 0, sizeof(*env));
	env->base = base;
	env->pool = pool;
	env->store = store;
	TAILQ_INIT(&env->orphans);
	TAILQ_INIT(&env->done);
	env->reap = event_new(base, -1, 0, reap_cb, env);
	return env->reap != NULL ? 0 : -1;
}

void idem_env_free(struct idem_env *env)
{
	env->orphans_changed = NULL;
	idem_abort_orphans(env);
	reap_cb(-1, 0, env);
	if (env->reap != NULL)
		event_free(env->reap);
	env->reap = NULL;
}
