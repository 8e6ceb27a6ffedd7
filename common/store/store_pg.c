/*
 * store_pg.c - PostgreSQL store (see store_pg.h).
 *
 *   thread_init ──▶ per-thread pool: up to N statement connections (grown
 *                   on demand) + 1 listener
 *
 *   connection: DOWN ──start──▶ CONNECTING ──ok──▶ SETUP ──ok──▶ IDLE ⇄ BUSY
 *                 ▲  back-off      │ (PQconnectPoll)  (migrate,      (one
 *                 └────────────────┴── any failure ──  PREPARE)      batch)
 *
 * Operations wait in the thread's queue for an idle connection. An idle
 * connection takes everything queued (up to PG_BATCH_MAX) and sends it as
 * one pipeline: a prepared statement per operation, then one Sync. The
 * statements up to a Sync are one implicit transaction, so a batch costs
 * one round trip and one commit (one WAL flush) however many keys it
 * carries. Nothing waits to fill a batch: the queue goes to idle
 * connections at the end of the loop turn in which it grew (what one turn
 * queued leaves together; a lone operation leaves in its own turn), and
 * larger batches form from what queued while a batch was in flight. Under
 * load (PG_HOLD_SIBLINGS operations outstanding) the queue waits for the
 * batch in flight, for at most PG_HOLD_US, instead of leaving at once on
 * another connection as a small transaction of its own
 * (store_pg_batch.c, hold()).
 *
 * Outcomes only after commit. A statement's result is held until the
 * PGRES_PIPELINE_SYNC of its batch, i.e. until ReadyForQuery arrived after
 * the commit; only then does it become an outcome. A connection lost, a
 * statement timeout or an error before that point leaves the outcome
 * unknown, and every operation is written so that sending it again is
 * safe (same owner token: a claim finds its own row and is won again, a
 * completion finds its own completed row). Unknown operations are re-sent
 * until their deadline; an error in one statement rolls back its
 * neighbours, which are re-sent, while the failing one is retried alone.
 * docs/architecture.md "Outcomes only after commit" has the protocol.
 *
 * What is never lost: completions, releases and extensions, and claims
 * already sent once, stay queued while no connection is up (and hasten
 * the reconnection) until their deadline. A fresh claim with no connection
 * up fails at once (STORE_ERROR: the engine applies --store-down). A claim
 * whose caller gave up (cancelled, or the deadline passed) after it was
 * sent, or that won after its caller left, is released in the background
 * with its owner token until its lease would have ended anyway.
 *
 * Waiting: completion and release NOTIFY channel "idemproxy" with the
 * payload "<scope>:<key>"; each thread's listener connection wakes its
 * waiters. A release notifies in its own transaction. A completion is
 * announced only when a waiter marked its record (a claim with
 * store_claim.wait that found it in flight: idemproxy_claim6), after the
 * batch committed, by a transaction of its own that does not wait for its
 * WAL flush (store_pg_wake_sql), so that notifying commits, which
 * PostgreSQL serialises, never hold that lock through a flush; a key
 * nobody waits for wakes nobody. A waiter also wakes every PG_POLL_MS to
 * claim again, so a lost notification (listener reconnecting, a crash
 * between the two commits) costs at most that much latency.
 */
#include "store_pg.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "store_pg_batch.h"
#include "store_pg_conn.h"
#include "store_pg_outcome.h"
#include "store_pg_parts.h"
#include "store_pg_priv.h"
#include "store_pg_schema.h"

#define PG_LOCK_MIGRATE "7165310201"	/* advisory lock keys */
#define PG_LOCK_SWEEP "7165310202"
#define PG_SWEEP_BATCH 1000

/*
 * A claim reads every partition: each btree scan it starts allocates a
 * ~27 KB work area, freed at the end of the statement. With a few
 * partitions that is more than glibc's default trim threshold (128 KiB),
 * and the backend gives the top of its heap back to the kernel after
 * every claim and faults it in again on the next one (page faults and
 * TLB shootdowns: a claim over 6 partitions took 4x as long as over
 * one). glibc raises its thresholds for a process that frees a block it
 * had mmap()ed (mallopt(3), "dynamic mmap threshold"): one 4 MiB value,
 * made and freed once per connection, sets the mmap threshold to 4 MiB
 * and the trim threshold to 8 MiB in that backend. Other C libraries
 * ignore it; it costs a few milliseconds once.
 */
#define PG_MALLOC_PAD "4194304"

/*
 * An owner's statements (complete, release, extend) look for its row only
 * in the partitions that can hold it. part_at never moves backwards
 * (greatest() wherever it is written again), so the part hint its claim
 * returned, a Unix ms just below the part_at the claim wrote, bounds it
 * from below for as long as the owner holds the row, and every partition
 * older than that is pruned when the statement starts (a generic plan:
 * plan_cache_mode in the setup). Without it an UPDATE starts on every
 * partition of the table. NULL (no hint: a row of an earlier version's
 * table) looks everywhere. The hint travels in the handle the engine gets
 * for a won claim: "<owner>@<hint>" (claim_result in store_pg_outcome.c,
 * take_handle).
 */
#define PART_SINCE(p) \
	"part_at >= coalesce(timestamptz 'epoch' + " p "::bigint\n" \
	"                             * interval '1 millisecond', '-infinity')"

/*
 * $1 scope, $2 key, $3 fingerprint, $4 owner, $5 lease ms, $6 ttl ms, $7
 * the key's lock (pg_lock_id()), $8 whether the caller waits for a record
 * in flight, $9 whether a record whose lease ran out is taken over (else
 * its outcome becomes unknown). idemproxy_claim6 (store_pg_schema.c):
 *
 * The key's advisory lock first (one claim of a key at a time, whatever
 * partition each would write), then a read in a statement newer than the
 * lock. Write only when needed: a replay, an in-flight duplicate or a
 * mismatch reads the row and nothing else (no row lock, no transaction
 * id, no WAL, no flush at commit). A new key is inserted; an expired
 * record is taken over (moved to the current partition); one whose lease
 * ran out, with the same fingerprint, is recorded as of unknown outcome
 * ('lapsed'), or taken over when $9 says so. A row this
 * owner already holds (an earlier attempt of this very claim committed,
 * but its outcome was lost with the connection) is reported won again: a
 * claim can be re-sent until its outcome is known. That row is written
 * again, never only read: the earlier commit may be one PostgreSQL made
 * visible without the synchronous standby's acknowledgement (a cancelled
 * wait, a connection cut during it). A transaction that writes waits for
 * the standby, and its commit comes after the earlier one in the WAL, so
 * its acknowledged commit is what proves the claim will survive a
 * failover.
 *
 * One row: ('won' and its part hint), or the existing record as the
 * function saw it. No row: the record changed under it (taken over or
 * completed meanwhile); claim again.
 *
 * A replay reads and returns first, in plain SQL: the key's latest row,
 * when it is completed and not expired, is what the function would
 * return for it, and the function is not called (an InitPlan gates it).
 * That costs PostgreSQL a quarter of the function's call (pgbench,
 * 8 statements a pipeline: 42,000-58,000 replays/s against 14,800); a
 * claim the read does not answer pays the read on top. The read takes no
 * lock: a completed record changes only when it expires (the filter) or
 * is purged, and a replay read just before a purge is one that came just
 * before it. The read is the function's own (the same row, the same
 * order by an expression no index serves: store_pg_schema.c says why).
 */
const char store_pg_claim_sql[] =
	"WITH c AS (\n"
	"  SELECT k.state, k.fingerprint, k.status, k.headers, k.body,\n"
	"         k.expires_at,\n"
	"         greatest(0, extract(epoch FROM k.expires_at - now()) * 1000)\n"
	"           ::bigint AS ttl_left\n"
	"    FROM idempotency_keys k\n"
	"   WHERE k.scope = $1 AND k.key = $2\n"
	"   ORDER BY k.expires_at + interval '0 seconds' DESC\n"
	"   LIMIT 1),\n"
	"hit AS (\n"
	"  SELECT c.state, c.fingerprint, c.status, c.headers, c.body,\n"
	"         c.ttl_left, NULL::bigint AS part_hint, NULL::text AS rec_owner\n"
	"    FROM c WHERE c.state = 'completed' AND c.expires_at > now())\n"
	"SELECT * FROM hit\n"
	"UNION ALL\n"
	"SELECT state, fingerprint, status, headers, body, ttl_left, part_hint,\n"
	"       rec_owner\n"
	"  FROM idemproxy_claim6($1, $2, $3, $4, $5, $6, $7, $8, $9)\n"
	" WHERE NOT EXISTS (SELECT 1 FROM hit)";

/* The claim on a Citus worker: the function alone. Citus plans no
 * statement that reads a distributed table beside a function call with
 * parameters; the function reads the record itself (a replay takes the
 * key's lock there, for as long as its statement runs). */
const char store_pg_claim_worker_sql[] =
	"SELECT state, fingerprint, status, headers, body, ttl_left, part_hint,\n"
	"       rec_owner\n"
	"  FROM idemproxy_claim6($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/*
 * A column that makes an owner's statement (complete, release, extend)
 * and a purge write WAL even when it found no row, so that its commit
 * waits for a synchronous standby like any other. Only such a commit
 * vouches for an answer:
 *   - "not ours" from a server that lost its role without knowing it (a
 *     primary whose Patroni died, after its standby was promoted) - it
 *     accepts writes, but there a writing commit waits for a standby
 *     that is gone, while a transaction that wrote nothing commits at
 *     once and reports a row missing that the real primary holds: the key
 *     would stay in flight there until a retry executed it again;
 *   - "done" from a re-send that finds nothing after an attempt whose
 *     commit was not acknowledged (that attempt deleted the row): its own
 *     acknowledged commit, later in the WAL, confirms the earlier one.
 * An id alone (txid_current()) is not enough: PostgreSQL waits for the
 * standby only when the transaction wrote WAL before its commit record.
 * A transactional logical message of prefix "idemproxy" and no content
 * is the smallest such write; it needs no table and no privilege, and a
 * logical decoding consumer may ignore it by its prefix. When the
 * statement wrote a row it is not emitted.
 */
#define WRITES_ANYWAY(cte) \
	"CASE WHEN NOT EXISTS (SELECT 1 FROM " cte ")\n" \
	"     THEN pg_logical_emit_message(true, 'idemproxy', '') END"

/*
 * $1 scope, $2 key, $3 owner, $4 status, $5 headers, $6 body (NULL: not
 * stored), $7 ttl ms, $8 the claim's part hint, $9 the response is an
 * unknown outcome's problem. One row: 'completed', and whether a waiter
 * marked the record (then the waiters are woken after the commit,
 * store_pg_wake_sql), when this owner holds the key: in flight or of
 * unknown outcome (the response is stored: state 'completed', or
 * 'unknown' with $9) or completed already (a re-sent completion whose
 * first attempt committed, or an unknown outcome somebody resolved: the
 * row is written again, unchanged); NULLs when fenced. A completed row
 * keeps its owner, which is what makes the re-send recognisable, and an
 * unknown one too: the owner's late completion replaces it. Fenced writes
 * all the same (WRITES_ANYWAY).
 *
 * watched is read as the row is written: a waiter's claim marks the row
 * with an UPDATE too, so the row lock orders the two. A mark committed
 * first is seen here (an UPDATE that waited for the row re-reads it); a
 * mark that comes after finds the row completed and the waiter claims
 * again. A key nobody waits for costs no wake-up at all.
 *
 * One UPDATE for both, never a read: the first attempt's commit may not
 * have reached the synchronous standby (a cancelled wait, a connection cut
 * during it), and only a commit of our own that waits for the standby,
 * later in the WAL, vouches for it. And when the first attempt still holds
 * the row (its backend waits for the standby), this UPDATE waits for it
 * and then re-checks the row as it is now - completed - instead of
 * reporting fenced.
 */
const char store_pg_complete_sql[] =
	"WITH u AS (\n"
	"  UPDATE idempotency_keys\n"
	"     SET status = CASE WHEN state <> 'completed' THEN $4 ELSE status END,\n"
	"         headers = CASE WHEN state <> 'completed' THEN $5 ELSE headers END,\n"
	"         body = CASE WHEN state <> 'completed' THEN $6 ELSE body END,\n"
	"         expires_at = CASE WHEN state <> 'completed'\n"
	"                      THEN now() + $7 * interval '1 millisecond'\n"
	"                      ELSE expires_at END,\n"
	"         part_at = CASE WHEN state <> 'completed'\n"
	"                          AND part_at > '-infinity'\n"
	"                   THEN greatest(part_at, clock_timestamp())\n"
	"                   ELSE part_at END,\n"
	"         state = CASE WHEN state <> 'completed' AND $9 THEN 'unknown'\n"
	"                      ELSE 'completed' END,\n"
	"         lease_until = NULL\n"
	"   WHERE scope = $1 AND key = $2 AND owner = $3\n"
	"     AND state IN ('in_flight', 'unknown', 'completed')\n"
	"     AND " PART_SINCE("$8") "\n"
	"  RETURNING watched)\n"
	"SELECT (SELECT 'completed'::text FROM u), (SELECT watched IS TRUE FROM u),\n"
	"       " WRITES_ANYWAY("u");

/*
 * $1 text[]: "<scope>:<key>" of each completion of a batch that a waiter
 * had marked, sent once the batch committed. PostgreSQL
 * serialises the commits of notifying transactions on one lock held to the
 * end of the commit; with synchronous_commit off for this transaction the
 * lock is held for no WAL flush, and the completions themselves share
 * flushes (group commit). Waking is a hint: waiters poll too (PG_POLL_MS).
 */
const char store_pg_wake_sql[] =
	"SELECT count(pg_notify('idemproxy', w))\n"
	"  FROM set_config('synchronous_commit', 'off', true),\n"
	"       unnest($1::text[]) AS w";

/*
 * $1 scope, $2 key, $3 owner, $4 part hint. One row: 'released', or NULL
 * when the record was not ours in flight or of unknown outcome; the
 * transaction writes either way (WRITES_ANYWAY).
 */
static const char release_sql[] =
	"WITH d AS (\n"
	"  DELETE FROM idempotency_keys\n"
	"   WHERE scope = $1 AND key = $2 AND owner = $3\n"
	"     AND state IN ('in_flight', 'unknown')\n"
	"     AND " PART_SINCE("$4") "\n"
	"  RETURNING 1)\n"
	"SELECT (SELECT 'released'::text\n"
	"          FROM d, pg_notify('idemproxy', $1 || ':' || $2)),\n"
	"       " WRITES_ANYWAY("d");

/* $1 scope, $2 key, $3 owner, $4 lease ms, $5 part hint. One row:
 * 'extended', or NULL when the record was not ours in flight; the
 * transaction writes either way (WRITES_ANYWAY). */
static const char extend_sql[] =
	"WITH u AS (\n"
	"  UPDATE idempotency_keys\n"
	"     SET lease_until = now() + $4 * interval '1 millisecond',\n"
	"         part_at = CASE WHEN part_at > '-infinity'\n"
	"                   THEN greatest(part_at, clock_timestamp())\n"
	"                   ELSE part_at END,\n"
	"         expires_at = greatest(expires_at,\n"
	"                               now() + $4 * interval '1 millisecond')\n"
	"   WHERE scope = $1 AND key = $2 AND owner = $3 AND state = 'in_flight'\n"
	"     AND " PART_SINCE("$5") "\n"
	"  RETURNING 1)\n"
	"SELECT (SELECT 'extended'::text FROM u), " WRITES_ANYWAY("u");

/*
 * $1 scope, $2 key, $3 with the stored head and body. A live record (an
 * in-flight one whose lease ran out included: it is what an operator looks
 * for), times in Unix milliseconds.
 */
static const char inspect_sql[] =
	"SELECT state, fingerprint, owner, status,\n"
	"       octet_length(headers)::bigint, octet_length(body)::bigint,\n"
	"       body IS NOT NULL,\n"
	"       (extract(epoch FROM created_at) * 1000)::bigint,\n"
	"       (extract(epoch FROM expires_at) * 1000)::bigint,\n"
	"       (extract(epoch FROM lease_until) * 1000)::bigint,\n"
	"       CASE WHEN $3 THEN headers END, CASE WHEN $3 THEN body END\n"
	"  FROM idempotency_keys\n"
	" WHERE scope = $1 AND key = $2 AND expires_at > now()";

/*
 * $1 scope, $2 key. Deletes the record whatever its state and owner (the
 * owner is fenced: its completion finds no row), wakes its waiters
 * ("<scope>:<key>") and tells every instance's cache ("purge:..."), also
 * when there was no row: a copy may outlive a row deleted by hand. One row:
 * the state the live record had, NULL when there was none. The commit is
 * written and waited for either way (WRITES_ANYWAY).
 */
static const char purge_sql[] =
	"WITH d AS (\n"
	"  DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2\n"
	"  RETURNING state, expires_at > now() AS live, fingerprint, status,\n"
	"            owner, (extract(epoch FROM expires_at - now()) * 1000)\n"
	"                   ::bigint AS left_ms)\n"
	"SELECT (SELECT state FROM d WHERE live), (SELECT fingerprint FROM d),\n"
	"       (SELECT owner FROM d), (SELECT status FROM d),\n"
	"       (SELECT left_ms FROM d), " WRITES_ANYWAY("d") "\n"
	"  FROM pg_notify('idemproxy', $1 || ':' || $2) AS wake,\n"
	"       pg_notify('idemproxy', 'purge:' || $1 || ':' || $2) AS forget";

/* A table of an earlier version (not partitioned): expired rows, deleted
 * one instance at a time (advisory lock), a batch, no long locks. A
 * partitioned table is kept by store_pg_parts.c instead. */
static const char sweep_sql[] =
	"WITH lock AS (SELECT pg_try_advisory_xact_lock(" PG_LOCK_SWEEP ") AS ok),\n"
	"victims AS (\n"
	"  SELECT ctid FROM idempotency_keys\n"
	"   WHERE expires_at <= now() AND (SELECT ok FROM lock)\n"
	"     AND (SELECT relkind FROM pg_class\n"
	"           WHERE oid = 'idempotency_keys'::regclass) = 'r'\n"
	"   LIMIT $1 FOR UPDATE SKIP LOCKED),\n"
	"d AS (DELETE FROM idempotency_keys\n"
	"       WHERE ctid IN (SELECT ctid FROM victims) RETURNING expires_at)\n"
	"SELECT count(*)::text,\n"
	"       coalesce(extract(epoch FROM now() - min(expires_at)), 0)::bigint::text\n"
	"  FROM d";

static const char *const stmt_names[] = {
	[PG_CLAIM] = "idem_claim", [PG_COMPLETE] = "idem_complete",
	[PG_RELEASE] = "idem_release", [PG_EXTEND] = "idem_extend",
	[PG_SWEEP] = "idem_sweep", [PG_INSPECT] = "idem_inspect",
	[PG_PURGE] = "idem_purge",
};

static const char *pg_stmt_name(enum pg_kind kind)
{
	return stmt_names[kind];
}


/* Queue o's statement in the pipeline. Text parameters except the binary
 * ones (fingerprint, headers, body); results in binary. */
static int pg_send_op(struct pg_conn *c, struct pg_op *o)
{
	char lease[24], ttl[24], status[16], batch[16], lock[24];
	const char *v[9];
	int len[9] = { 0 }, fmt[9] = { 0 };
	const char *hint = o->hint[0] != '\0' ? o->hint : NULL;
	int n = 0;

	switch (o->kind) {
	case PG_CLAIM:
		snprintf(lease, sizeof(lease), "%llu", (unsigned long long)o->lease_ms);
		snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)o->ttl_ms);
		snprintf(lock, sizeof(lock), "%lld", (long long)o->lock);
		v[0] = o->key.scope; v[1] = o->key.key;
		v[2] = (const char *)o->fp; len[2] = FP_LEN; fmt[2] = 1;
		v[3] = o->owner; v[4] = lease; v[5] = ttl; v[6] = lock;
		v[7] = o->wait ? "true" : "false";
		v[8] = o->takeover ? "true" : "false";
		n = 9;
		break;
	case PG_COMPLETE:
		snprintf(status, sizeof(status), "%d", o->resp->status);
		snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)o->ttl_ms);
		v[0] = o->key.scope; v[1] = o->key.key; v[2] = o->owner;
		v[3] = status;
		v[4] = o->resp->head; len[4] = (int)o->resp->head_len; fmt[4] = 1;
		v[5] = o->resp->body_stored ? o->resp->body : NULL;
		len[5] = (int)o->resp->body_len; fmt[5] = 1;
		v[6] = ttl; v[7] = hint;
		v[8] = o->resp->unknown ? "true" : "false";
		n = 9;
		break;
	case PG_RELEASE:
		v[0] = o->key.scope; v[1] = o->key.key; v[2] = o->owner;
		v[3] = hint;
		n = 4;
		break;
	case PG_EXTEND:
		snprintf(lease, sizeof(lease), "%llu", (unsigned long long)o->lease_ms);
		v[0] = o->key.scope; v[1] = o->key.key; v[2] = o->owner;
		v[3] = lease; v[4] = hint;
		n = 5;
		break;
	case PG_SWEEP:
		snprintf(batch, sizeof(batch), "%d", PG_SWEEP_BATCH);
		v[0] = batch;
		n = 1;
		break;
	case PG_INSPECT:
		v[0] = o->key.scope; v[1] = o->key.key;
		v[2] = o->body ? "true" : "false";
		n = 3;
		break;
	case PG_PURGE:
		v[0] = o->key.scope; v[1] = o->key.key;
		n = 2;
		break;
	case PG_WATCH:
		return -1;
	}
	if (!PQsendQueryPrepared(c->pg, stmt_names[o->kind], n, v, len, fmt, 1))
		return -1;
	return 0;
}

/* Copy s to p escaped for a quoted array element; the end. */
static char *array_escape(char *p, const char *s)
{
	for (; *s != '\0'; s++) {
		if (*s == '"' || *s == '\\')
			*p++ = '\\';
		*p++ = *s;
	}
	return p;
}

/* Whether completion o, committed, found its record marked by a waiter. */
static bool watched(const struct pg_op *o)
{
	const PGresult *r = o->result;

	return o->kind == PG_COMPLETE && r != NULL && PQntuples(r) == 1 &&
	       PQnfields(r) == 3 && !PQgetisnull(r, 0, 1) &&
	       PQgetlength(r, 0, 1) == 1 && *PQgetvalue(r, 0, 1) == 1;
}

static int pg_send_wake(struct pg_conn *c)
{
	struct pg_op *o;
	size_t size = 3;		/* {} and the NUL */
	const char *v[1];
	char *lit, *p;
	int n = 0, rc;

	TAILQ_FOREACH(o, &c->batch, link)
		if (watched(o)) {
			size += 4 + 2 * (strlen(o->key.scope) + strlen(o->key.key));
			n++;
		}
	if (n == 0)
		return 0;
	lit = p = malloc(size);
	if (lit == NULL)
		return -1;
	*p++ = '{';
	TAILQ_FOREACH(o, &c->batch, link) {
		if (!watched(o))
			continue;
		if (p > lit + 1)
			*p++ = ',';
		*p++ = '"';		/* "scope:key" */
		p = array_escape(p, o->key.scope);
		*p++ = ':';
		p = array_escape(p, o->key.key);
		*p++ = '"';
	}
	*p++ = '}';
	*p = '\0';
	v[0] = lit;
	rc = PQsendQueryPrepared(c->pg, "idem_wake", 1, v, NULL, NULL, 0) &&
	     PQpipelineSync(c->pg) == 1 ? 1 : -1;
	free(lit);
	return rc;
}

/* ---- the store operations ------------------------------------------ */

static struct store_op *pg_claim(struct store *st, struct event_base *base,
				 const struct store_claim *c, store_cb cb, void *arg)
{
	struct pg_op *o = pg_op_new((struct pg_store *)st, base, PG_CLAIM, &c->key,
				 cb, arg);

	if (o == NULL)
		return NULL;
	memcpy(o->fp, c->fp, FP_LEN);
	o->lease_ms = c->lease_ms;
	o->ttl_ms = c->ttl_ms;
	o->wait = c->wait;
	o->takeover = c->takeover;
	if (store_new_owner(o->owner) < 0) {
		pg_op_finish(o, STORE_ERROR);
		return &o->op;
	}
	return pg_op_submit(o);
}

/* An owner op's handle: the owner token, and the claim's part hint when
 * it came with one (claim_result). A hint that is not a number is left
 * out: it only ever narrows where to look. */
static void take_handle(struct pg_op *o, const char *handle)
{
	const char *at = strchr(handle, '@');
	size_t n = at != NULL ? (size_t)(at - handle) : strlen(handle);
	char *end;

	if (n > STORE_OWNER_LEN)
		n = STORE_OWNER_LEN;
	memcpy(o->owner, handle, n);
	o->owner[n] = '\0';
	o->hint[0] = '\0';
	if (at == NULL || at[1] == '\0' || strlen(at + 1) >= sizeof(o->hint))
		return;
	(void)strtoll(at + 1, &end, 10);
	if (*end == '\0')
		memcpy(o->hint, at + 1, strlen(at + 1) + 1);
}

static struct store_op *pg_complete(struct store *st, struct event_base *base,
				    const struct store_key *k, const char *owner,
				    const uint8_t fp[FP_LEN],
				    struct stored_response *resp, uint64_t ttl_ms,
				    store_cb cb, void *arg)
{
	struct pg_op *o = pg_op_new((struct pg_store *)st, base, PG_COMPLETE, k,
				 cb, arg);

	if (o == NULL)
		return NULL;
	take_handle(o, owner);
	memcpy(o->fp, fp, FP_LEN);
	o->resp = stored_response_ref(resp);
	o->ttl_ms = ttl_ms;
	return pg_op_submit(o);
}

static struct store_op *pg_release(struct store *st, struct event_base *base,
				   const struct store_key *k, const char *owner,
				   store_cb cb, void *arg)
{
	struct pg_op *o = pg_op_new((struct pg_store *)st, base, PG_RELEASE, k,
				 cb, arg);

	if (o == NULL)
		return NULL;
	take_handle(o, owner);
	return pg_op_submit(o);
}

static struct store_op *pg_extend(struct store *st, struct event_base *base,
				  const struct store_key *k, const char *owner,
				  uint64_t lease_ms, store_cb cb, void *arg)
{
	struct pg_op *o = pg_op_new((struct pg_store *)st, base, PG_EXTEND, k,
				 cb, arg);

	if (o == NULL)
		return NULL;
	take_handle(o, owner);
	o->lease_ms = lease_ms;
	return pg_op_submit(o);
}

static struct store_op *pg_watch(struct store *st, struct event_base *base,
				 const struct store_key *k, store_cb cb, void *arg)
{
	struct pg_op *o = pg_op_new((struct pg_store *)st, base, PG_WATCH, k, cb, arg);

	if (o == NULL)
		return NULL;
	pg_watch_add(o);
	return &o->op;
}

static struct store_op *pg_inspect(struct store *st, struct event_base *base,
				   const struct store_key *k, bool body,
				   store_cb cb, void *arg)
{
	struct pg_op *o = pg_op_new((struct pg_store *)st, base, PG_INSPECT, k,
				 cb, arg);

	if (o == NULL)
		return NULL;
	o->body = body;
	return pg_op_submit(o);
}

static struct store_op *pg_purge(struct store *st, struct event_base *base,
				 const struct store_key *k, store_cb cb, void *arg)
{
	struct pg_op *o = pg_op_new((struct pg_store *)st, base, PG_PURGE, k,
				 cb, arg);

	if (o == NULL)
		return NULL;
	return pg_op_submit(o);
}

/*
 * The caller withdraws. A claim that may hold the key - sent and its
 * outcome not yet known, or won but not yet delivered - is given back
 * rather than left in flight until its lease ends.
 */
static void pg_cancel(struct store_op *op)
{
	struct pg_op *o = (struct pg_op *)op;

	switch (o->where) {
	case OP_QUEUED:
		TAILQ_REMOVE(&o->local->queue, o, link);
		if (o->kind == PG_CLAIM && o->sent) {
			pg_abandon(o);
			pg_enqueue(o, true);
			return;
		}
		pg_op_free(o);
		return;
	case OP_WATCHING:
		TAILQ_REMOVE(&o->local->watchers, o, link);
		pg_op_free(o);
		return;
	case OP_RUNNING:
		/* on the wire: forget the caller; its batch decides */
		if (o->kind == PG_CLAIM)
			pg_abandon(o);
		o->cb = NULL;
		return;
	case OP_DELIVERING:
		if (o->kind == PG_CLAIM && o->res.status == STORE_WON)
			pg_give_back(o);
		pg_op_free(o);	/* event_free drops the pending activation */
		return;
	case OP_NEW:
		pg_op_free(o);
		return;
	}
}

static bool pg_ready(struct store *st)
{
	return atomic_load(&((struct pg_store *)st)->up) > 0;
}

static void pg_sweep(struct store *st, struct event_base *base)
{
	struct pg_store *s = (struct pg_store *)st;
	struct pg_local *l = pg_local_for(s, base);
	struct pg_op *o;

	if (s->worker)		/* the coordinator's store keeps them */
		return;
	if (s->parts == NULL)	/* this thread keeps the partitions */
		s->parts = pg_parts_start(s, base);
	if (l == NULL || l->sweeping || l->up == 0 ||
	    atomic_load(&s->no_row_sweep))
		return;
	o = pg_op_new(s, base, PG_SWEEP, NULL, NULL, NULL);
	if (o == NULL)
		return;
	l->sweeping = true;
	pg_op_submit(o);
}

static int pg_thread_init(struct store *st, struct event_base *base)
{
	struct pg_store *s = (struct pg_store *)st;
	struct pg_local *l = pg_local_new(s, base);

	if (l == NULL) {
		log_error("postgres store: out of memory for a thread's pool");
		return -1;
	}
	pthread_mutex_lock(&s->mu);
	l->next = s->locals;
	s->locals = l;
	pthread_mutex_unlock(&s->mu);
	return 0;
}


static void pg_thread_done(struct store *st, struct event_base *base)
{
	struct pg_store *s = (struct pg_store *)st;
	struct pg_local **pp, *l = NULL;

	pthread_mutex_lock(&s->mu);
	for (pp = &s->locals; *pp != NULL; pp = &(*pp)->next) {
		if ((*pp)->base == base) {
			l = *pp;
			*pp = l->next;
			break;
		}
	}
	pthread_mutex_unlock(&s->mu);
	if (l != NULL)
		pg_local_free(l);
	if (s->parts != NULL && pg_parts_base(s->parts) == base) {
		pg_parts_free(s->parts);
		s->parts = NULL;
	}
}

static void pg_free(struct store *st)
{
	struct pg_store *s = (struct pg_store *)st;

	pg_parts_free(s->parts);
	while (s->locals != NULL) {
		struct pg_local *l = s->locals;

		s->locals = l->next;
		pg_local_free(l);
	}
	pthread_mutex_destroy(&s->mu);
	pg_dns_free(s->dns);
	pg_hosts_free(&s->hosts);
	free(s->conninfo);
	free(s->setup_sql);
	free(s);
}

/* What the pools (store_pg_batch.c) ask of an operation. */
static const struct pg_meaning pg_meaning_table = {
	.name = pg_stmt_name,
	.send = pg_send_op,
	.wake = pg_send_wake,
	.committed = pg_op_committed,
	.give_up = pg_give_up,
};

static const struct store_ops pg_ops_table = {
	.name = "postgres",
	.claim = pg_claim,
	.complete = pg_complete,
	.release = pg_release,
	.extend = pg_extend,
	.watch = pg_watch,
	.inspect = pg_inspect,
	.purge = pg_purge,
	.cancel = pg_cancel,
	.ready = pg_ready,
	.sweep = pg_sweep,
	.thread_init = pg_thread_init,
	.thread_done = pg_thread_done,
	.free = pg_free,
};

void store_pg_no_row_sweep(struct store *st)
{
	atomic_store(&((struct pg_store *)st)->no_row_sweep, true);
}

void store_pg_on_notify(struct store *st, store_pg_notify_fn fn, void *arg)
{
	struct pg_store *s = (struct pg_store *)st;

	s->notify_fn = fn;
	s->notify_arg = arg;
}

/* A Citus worker's statements: the schema's functions (idemproxy_w_*,
 * store_pg_schema.c) in place of the statements above, with the same
 * parameters and columns; no row sweep (a distributed table is always
 * partitioned: retention drops partitions). */
static const char w_complete_sql[] =
	"SELECT * FROM idemproxy_w_complete($1, $2, $3, $4, $5, $6, $7, $8, $9)";
static const char w_release_sql[] =
	"SELECT * FROM idemproxy_w_release($1, $2, $3, $4)";
static const char w_extend_sql[] =
	"SELECT * FROM idemproxy_w_extend($1, $2, $3, $4, $5)";
static const char w_purge_sql[] = "SELECT * FROM idemproxy_w_purge($1, $2)";
static const char w_sweep_sql[] = "SELECT '0'::text, '0'::text";

static struct store *pg_new(const char *conninfo, int conns_per_thread,
			    uint64_t ttl_ms, bool worker)
{
	struct pg_store *s = calloc(1, sizeof(*s));
	char err[256], ensure[96], *schema;

	if (s == NULL)
		return NULL;
	s->worker = worker;
	s->base.ops = &pg_ops_table;
	s->meaning = &pg_meaning_table;
	s->conns_per_thread = conns_per_thread > 0 ? conns_per_thread : 2;
	s->part_width_ms = pg_part_width(ttl_ms);
	s->conninfo = strdup(conninfo);
	if (pg_hosts_parse(&s->hosts, conninfo, err, sizeof(err)) < 0) {
		log_error("%s", err);
		free(s->conninfo);
		free(s);
		return NULL;
	}
	/* a Citus worker's schema and partitions are the coordinator's
	 * (store_citus.c) */
	schema = worker ? strdup("") : store_pg_schema_sql();
	if (worker)
		ensure[0] = '\0';
	else
		snprintf(ensure, sizeof(ensure),
			 "SELECT idemproxy_parts_ensure(%llu);\n",
			 (unsigned long long)s->part_width_ms);
	if (schema == NULL || asprintf(&s->setup_sql, "%s%s"
		     /* plans prune partitions when they start (PART_SINCE),
		      * with no planning per statement; but Citus plans a
		      * statement on a distributed table only with its
		      * parameters' values (and prunes shards then), and is
		      * slower with the plans it can cache (docs/benchmarks.md
		      * "Citus beside one node") */
		     "SELECT set_config('plan_cache_mode', CASE WHEN "
		     "to_regclass('pg_catalog.pg_dist_partition') IS NULL "
		     "THEN 'force_generic_plan' ELSE 'force_custom_plan' END, "
		     "false);\n"
		     /* every statement finds its rows by key (or, in
		      * retention, by expires_at) through an index; a
		      * generic plan made while a partition was new and
		      * nearly empty would scan it whole for as long as the
		      * plan lives (until the next ANALYZE or partition) */
		     "SET enable_seqscan = off;\n"
		     "SET enable_bitmapscan = off;\n"
		     /* ... and the few that must scan (the partitions'
		      * bookkeeping, a handful of rows) cost so much on paper
		      * that PostgreSQL would compile them with LLVM on every
		      * run: 40-150 ms for a read of three rows. No statement
		      * of the store is long enough for JIT to pay */
		     "SET jit = off;\n"
		     /* see PG_MALLOC_PAD */
		     "SELECT length(repeat('x', " PG_MALLOC_PAD "));\n"
		     /* may a failover lose what this store acknowledged?
		      * (check_replication, store_pg_conn.c) */
		     "SELECT (SELECT count(*) FROM pg_stat_replication)"
		     " AS " PG_REPLICATION_COLUMN ","
		     " current_setting('synchronous_standby_names'),"
		     " current_setting('synchronous_commit');\n"
		     "PREPARE idem_claim (text, text, bytea, text, bigint, bigint, bigint, boolean, boolean) AS %s;\n"
		     "PREPARE idem_complete (text, text, text, int, bytea, bytea, bigint, bigint, boolean) AS %s;\n"
		     "PREPARE idem_release (text, text, text, bigint) AS %s;\n"
		     "PREPARE idem_extend (text, text, text, bigint, bigint) AS %s;\n"
		     "PREPARE idem_sweep (int) AS %s;\n"
		     "PREPARE idem_inspect (text, text, boolean) AS %s;\n"
		     "PREPARE idem_purge (text, text) AS %s;\n"
		     "PREPARE idem_wake (text[]) AS %s;\n",
		     schema, ensure,
		     worker ? store_pg_claim_worker_sql : store_pg_claim_sql,
		     worker ? w_complete_sql : store_pg_complete_sql,
		     worker ? w_release_sql : release_sql,
		     worker ? w_extend_sql : extend_sql,
		     worker ? w_sweep_sql : sweep_sql, inspect_sql,
		     worker ? w_purge_sql : purge_sql, store_pg_wake_sql) < 0)
		s->setup_sql = NULL;
	free(schema);
	s->dns = pg_dns_new(&s->hosts);
	if (s->conninfo == NULL || s->setup_sql == NULL || s->dns == NULL) {
		pg_dns_free(s->dns);
		pg_hosts_free(&s->hosts);
		free(s->conninfo);
		free(s->setup_sql);
		free(s);
		return NULL;
	}
	atomic_init(&s->primary, -1);
	for (int i = 0; i < PG_HOSTS_MAX; i++) {
		atomic_init(&s->failed[i], false);
		atomic_init(&s->slow_at[i], 0);
	}
	pthread_mutex_init(&s->mu, NULL);
	atomic_init(&s->up, 0);
	atomic_init(&s->no_row_sweep, false);
	return &s->base;
}

struct store *store_pg_new(const char *conninfo, int conns_per_thread,
			   uint64_t ttl_ms)
{
	return pg_new(conninfo, conns_per_thread, ttl_ms, false);
}

struct store *store_pg_new_worker(const char *conninfo, int conns_per_thread,
				  uint64_t ttl_ms)
{
	return pg_new(conninfo, conns_per_thread, ttl_ms, true);
}

/* A blocking connection to the primary: each host of conninfo in turn
 * (store_pg_hosts.h: read-write unless the string says otherwise), for
 * the command line, where blocking is fine. */
static PGconn *connect_primary(const char *conninfo, char *err, size_t errlen)
{
	struct pg_hosts h;
	PGconn *pg = NULL;

	if (pg_hosts_parse(&h, conninfo, err, errlen) < 0)
		return NULL;
	for (int i = 0; i < h.n; i++) {
		pg = PQconnectdbParams(h.keywords, h.values[i], 0);
		if (PQstatus(pg) == CONNECTION_OK)
			break;
		snprintf(err, errlen, "cannot connect: %s%s", h.n > 1 ?
			 "no primary among the hosts; last: " : "",
			 PQerrorMessage(pg));
		PQfinish(pg);
		pg = NULL;
	}
	pg_hosts_free(&h);
	return pg;
}

int store_pg_migrate(const char *conninfo, uint64_t ttl_ms, char *err,
		     size_t errlen)
{
	PGconn *pg = connect_primary(conninfo, err, errlen);
	char *schema = store_pg_schema_sql();
	PGresult *r;
	int rc = -1;

	if (pg == NULL || schema == NULL) {
		if (schema == NULL)
			snprintf(err, errlen, "out of memory");
		goto out;
	}
	r = PQexec(pg, schema);
	if (PQresultStatus(r) != PGRES_TUPLES_OK &&
	    PQresultStatus(r) != PGRES_COMMAND_OK)
		snprintf(err, errlen, "migration failed: %s", PQerrorMessage(pg));
	else
		rc = pg_convert(pg, pg_part_width(ttl_ms), err, errlen);
	PQclear(r);
out:
	free(schema);
	if (pg != NULL)
		PQfinish(pg);
	return rc;
}
