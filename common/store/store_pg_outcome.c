/*
 * store_pg_outcome.c - what the PostgreSQL store's results mean: a
 * committed statement's result becomes its operation's outcome
 * (pg_op_committed), an operation out of time is given up (pg_give_up),
 * and a claim nobody will execute is abandoned or gives its key back, in
 * the background (see store_pg.c, "Outcomes only after commit").
 */
#include "store_pg_outcome.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "store_pg_batch.h"

#define PG_CLAIM_RETRIES 5	/* the record changed under the statement */
#define PG_ABANDON_GRACE_MS 60000	/* an abandoned claim outlives its lease */

/*
 * Claim c won but nobody will execute it: give the key back in the
 * background, with c's owner token, for as long as its lease could hold
 * the key, and PG_ABANDON_GRACE_MS more: past the lease, a retry records
 * the key's outcome as unknown, and the give-back still lands on that
 * record (it is the owner's), so that an outage shorter than that leaves
 * no unknown outcome behind for a request that was never sent. A row c inserted is deleted. A record c took over (or that an
 * attempt of c before it wrote, maybe taking it over) was another
 * request's, which may have executed: it stays, its fingerprint bound
 * until it expires, and only its lease ends (an extension by 0 ms), so
 * that a retry takes over at once and another body gets 422.
 */
void pg_give_back(const struct pg_op *c)
{
	struct pg_op *o = pg_op_alloc(c->local, c->took_over ? PG_EXTEND :
					PG_RELEASE, &c->key, NULL, NULL);

	if (o == NULL) {
		log_error("key %s: out of memory; an abandoned claim stays until "
			  "its lease ends", c->key.key);
		return;
	}
	memcpy(o->owner, c->owner, sizeof(o->owner));
	o->lease_ms = 0;
	/* a release is kept on retries for its kind, the extension as an
	 * abandoned claim is (retry_op); both go at their deadline */
	o->abandoned = c->took_over;
	o->deadline_ms = clock_ms() + c->lease_ms + PG_ABANDON_GRACE_MS;
	pg_enqueue(o, false);
}

/*
 * Make claim o abandoned: nobody will execute it, but it was sent and may
 * have committed (or may still: a statement that timed out on our side
 * can commit on the server later - a phantom claim). It goes on in the
 * background, alone in its batch, until its outcome is known: claimed
 * again with its own owner token - the INSERT waits on the key's index
 * entry for a transaction still in progress, which a DELETE would not see -
 * and released if won, or if it finds its own record made unknown. Gone
 * PG_ABANDON_GRACE_MS after its lease would have ended (pg_give_back()).
 */
void pg_abandon(struct pg_op *o)
{
	o->cb = NULL;
	o->abandoned = true;
	o->solo = true;
	o->deadline_ms = clock_ms() + o->lease_ms + PG_ABANDON_GRACE_MS;
}

/* A copy of claim o, abandoned and queued (o itself reports to its
 * caller). */
static void abandon_copy(const struct pg_op *o)
{
	struct pg_op *a = pg_op_alloc(o->local, PG_CLAIM, &o->key, NULL, NULL);

	if (a == NULL) {
		log_error("key %s: out of memory; a claim whose outcome is "
			  "unknown stays until its lease ends", o->key.key);
		return;
	}
	memcpy(a->fp, o->fp, FP_LEN);
	memcpy(a->owner, o->owner, sizeof(a->owner));
	a->lease_ms = o->lease_ms;
	a->ttl_ms = o->ttl_ms;
	a->takeover = o->takeover;
	a->sent = true;
	pg_abandon(a);
	pg_enqueue(a, false);
}

/*
 * The operation's deadline passed with its outcome unknown or unsent:
 * report STORE_ERROR; a claim that was sent goes on abandoned. An
 * abandoned claim past its deadline is simply dropped: its lease is over.
 */
void pg_give_up(struct pg_op *o)
{
	if (o->kind == PG_SWEEP)
		o->local->sweeping = false;
	if (o->abandoned) {
		pg_op_free(o);
		return;
	}
	if (o->kind == PG_CLAIM && o->sent)
		abandon_copy(o);
	metrics_store_error(STORE_KIND_POSTGRES);
	pg_op_finish(o, STORE_ERROR);
}

static void get_text(const PGresult *r, int row, int col, char *out, size_t cap);

/* Read a binary int8 column. */
static uint64_t get_int8(const PGresult *r, int row, int col)
{
	const unsigned char *p = (const unsigned char *)PQgetvalue(r, row, col);
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

/* Read a binary int4 column. */
static int get_int4(const PGresult *r, int row, int col)
{
	uint32_t v;

	memcpy(&v, PQgetvalue(r, row, col), 4);
	return (int)ntohl(v);
}

/*
 * A claim found the record's outcome unknown (or, lapsed, made it so): the
 * problem to replay - the row's own when its owner wrote one, else the
 * one for an owner that stopped extending its lease - and the owner's
 * handle, which resolves it.
 */
static void unknown_result(struct pg_op *o, const PGresult *r, bool lapsed)
{
	char owner[STORE_OWNER_LEN + 1];

	if (!PQgetisnull(r, 0, 4)) {
		o->res.resp = stored_response_new(get_int4(r, 0, 2),
			PQgetvalue(r, 0, 3), (size_t)PQgetlength(r, 0, 3),
			PQgetvalue(r, 0, 4), (size_t)PQgetlength(r, 0, 4), true);
		if (o->res.resp != NULL)
			o->res.resp->unknown = true;
	} else {
		o->res.resp = stored_response_unknown(NULL, NULL);
	}
	get_text(r, 0, 7, owner, sizeof(owner));
	if (o->cb == NULL && strcmp(owner, o->owner) == 0) {
		/* an abandoned claim finds its own record made unknown by a
		 * retry after its lease ran out: it was never forwarded, so it
		 * is given back (a release matches an unknown record of its
		 * owner) and the next retry executes */
		o->took_over = false;
		pg_give_back(o);
		pg_op_free(o);
		return;
	}
	if (PQgetisnull(r, 0, 6))
		memcpy(o->res.owner, owner, sizeof(owner));
	else
		snprintf(o->res.owner, sizeof(o->res.owner), "%s@%lld", owner,
			 (long long)get_int8(r, 0, 6));
	if (!PQgetisnull(r, 0, 5) && PQgetlength(r, 0, 5) == 8)
		o->res.ttl_left_ms = get_int8(r, 0, 5);
	o->res.lapsed = lapsed;
	pg_op_finish(o, o->res.resp != NULL && owner[0] != '\0' ?
			STORE_UNKNOWN : STORE_ERROR);
}

/* A committed claim's row: won, or the existing record. */
static void claim_result(struct pg_op *o, const PGresult *r)
{
	const char *state;
	int slen;

	if (PQntuples(r) == 0) {
		/* the record changed under the statement: claim again */
		if (++o->changed >= PG_CLAIM_RETRIES) {
			pg_op_finish(o, STORE_ERROR);
			return;
		}
		pg_enqueue(o, true);
		return;
	}
	state = PQgetvalue(r, 0, 0);
	slen = PQgetlength(r, 0, 0);
	if (slen == 3 && memcmp(state, "won", 3) == 0) {
		if (PQgetisnull(r, 0, 6))
			memcpy(o->res.owner, o->owner, sizeof(o->owner));
		else
			snprintf(o->res.owner, sizeof(o->res.owner), "%s@%lld",
				 o->owner, (long long)get_int8(r, 0, 6));
		/* the function's fingerprint: NULL for a row it inserted */
		o->took_over = !PQgetisnull(r, 0, 1);
		if (o->cb == NULL) {
			/* abandoned: nobody will execute it; give the key back
			 * now rather than leave it stuck for a lease */
			pg_give_back(o);
			pg_op_free(o);
			return;
		}
		pg_op_finish(o, STORE_WON);
		return;
	}
	if (PQgetlength(r, 0, 1) != FP_LEN ||
	    memcmp(PQgetvalue(r, 0, 1), o->fp, FP_LEN) != 0) {
		pg_op_finish(o, STORE_MISMATCH);
		return;
	}
	if ((slen == 6 && memcmp(state, "lapsed", 6) == 0) ||
	    (slen == 7 && memcmp(state, "unknown", 7) == 0)) {
		unknown_result(o, r, slen == 6);
		return;
	}
	if (slen == 9 && memcmp(state, "completed", 9) == 0) {
		bool stored = !PQgetisnull(r, 0, 4);

		o->res.resp = stored_response_new(get_int4(r, 0, 2),
			PQgetvalue(r, 0, 3), (size_t)PQgetlength(r, 0, 3),
			stored ? PQgetvalue(r, 0, 4) : "",
			stored ? (size_t)PQgetlength(r, 0, 4) : 0, stored);
		if (!PQgetisnull(r, 0, 5) && PQgetlength(r, 0, 5) == 8)
			o->res.ttl_left_ms = get_int8(r, 0, 5);
		pg_op_finish(o, o->res.resp != NULL ? STORE_COMPLETED : STORE_ERROR);
		return;
	}
	pg_op_finish(o, STORE_IN_FLIGHT);
}

/* Copy a binary text or bytea column into out[cap] (NUL-terminated). */
static void get_text(const PGresult *r, int row, int col, char *out, size_t cap)
{
	size_t n = (size_t)PQgetlength(r, row, col);

	if (PQgetisnull(r, row, col) || n >= cap)
		n = 0;
	memcpy(out, PQgetvalue(r, row, col), n);
	out[n] = '\0';
}

static int64_t get_ms(const PGresult *r, int row, int col)
{
	return PQgetisnull(r, row, col) ? 0 : (int64_t)get_int8(r, row, col);
}

/* The columns an inspect and a purge share: state, fingerprint, owner,
 * status (0 to 3). */
static void record_head(const PGresult *r, struct store_record *rec)
{
	char state[16];

	get_text(r, 0, 0, state, sizeof(state));
	rec->found = STORE_IN_POSTGRES;
	rec->unknown = strcmp(state, "unknown") == 0;
	rec->completed = rec->unknown || strcmp(state, "completed") == 0;
	if (PQgetlength(r, 0, 1) == FP_LEN)
		memcpy(rec->fp, PQgetvalue(r, 0, 1), FP_LEN);
	if (!rec->completed)
		get_text(r, 0, 2, rec->owner, sizeof(rec->owner));
	if (!PQgetisnull(r, 0, 3))
		rec->status = get_int4(r, 0, 3);
}

/* A committed inspect: the record, and its stored response if asked. */
static void inspect_result(struct pg_op *o, const PGresult *r)
{
	struct store_record *rec = &o->res.rec;

	if (PQntuples(r) != 1) {
		pg_op_finish(o, STORE_ABSENT);
		return;
	}
	record_head(r, rec);
	rec->head_len = (size_t)get_ms(r, 0, 4);
	rec->body_len = (size_t)get_ms(r, 0, 5);
	rec->body_stored = *PQgetvalue(r, 0, 6) != 0;
	rec->created_ms = get_ms(r, 0, 7);
	rec->expires_ms = get_ms(r, 0, 8);
	rec->lease_until_ms = get_ms(r, 0, 9);
	if (o->body && rec->completed) {
		bool stored = !PQgetisnull(r, 0, 11);

		if (rec->unknown && !stored)
			o->res.resp = stored_response_unknown(NULL, NULL);
		else
			o->res.resp = stored_response_new(rec->status,
				PQgetvalue(r, 0, 10), (size_t)PQgetlength(r, 0, 10),
				stored ? PQgetvalue(r, 0, 11) : "",
				stored ? (size_t)PQgetlength(r, 0, 11) : 0, stored);
		if (o->res.resp != NULL)
			o->res.resp->unknown = rec->unknown;
		if (o->res.resp == NULL) {
			pg_op_finish(o, STORE_ERROR);
			return;
		}
	}
	pg_op_finish(o, STORE_OK);
}

/* A committed purge: what the deleted record was. */
static void purge_result(struct pg_op *o, const PGresult *r)
{
	struct store_record *rec = &o->res.rec;

	if (PQntuples(r) != 1 || PQgetisnull(r, 0, 0)) {
		pg_op_finish(o, STORE_ABSENT);
		return;
	}
	record_head(r, rec);
	if (!PQgetisnull(r, 0, 4) && get_ms(r, 0, 4) > 0)
		o->res.ttl_left_ms = (uint64_t)get_ms(r, 0, 4);
	pg_op_finish(o, STORE_OK);
}

/* The batch of o committed: its statement's result is now its outcome. */
void pg_op_committed(struct pg_op *o)
{
	const PGresult *r = o->result;

	switch (o->kind) {
	case PG_CLAIM:
		claim_result(o, r);
		return;
	case PG_COMPLETE:
	case PG_EXTEND:
		/* 'completed' / 'extended', NULL when not ours */
		pg_op_finish(o, !PQgetisnull(r, 0, 0) ? STORE_OK : STORE_FENCED);
		return;
	case PG_RELEASE:
		/* a re-send that found nothing after an attempt whose commit
		 * was not acknowledged: that attempt released it (this commit
		 * confirmed it) */
		pg_op_finish(o, !PQgetisnull(r, 0, 0) ||
				(o->unacked != NULL &&
				 !PQgetisnull(o->unacked, 0, 0)) ?
				STORE_OK : STORE_FENCED);
		return;
	case PG_SWEEP:
		o->local->sweeping = false;
		if (PQntuples(r) == 1) {
			/* rows deleted, and how late the oldest of them was */
			metrics_count_n(COUNTER_sweep_deleted_total,
					strtoul(PQgetvalue(r, 0, 0), NULL, 10));
			metrics_gauge_set(GAUGE_sweep_lag_seconds,
					  strtol(PQgetvalue(r, 0, 1), NULL, 10));
		}
		pg_op_finish(o, STORE_OK);
		return;
	case PG_INSPECT:
		inspect_result(o, r);
		return;
	case PG_PURGE:
		/* as for release: what the unacknowledged attempt deleted */
		purge_result(o, PQgetisnull(r, 0, 0) && o->unacked != NULL ?
				o->unacked : r);
		return;
	case PG_WATCH:
		break;
	}
	pg_op_finish(o, STORE_ERROR);
}
