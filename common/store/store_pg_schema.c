/*
 * store_pg_schema.c - the PostgreSQL store's schema, and the conversion of
 * an earlier version's table (see store_pg.h, docs/architecture.md
 * "Retention by partition").
 *
 * The table is partitioned by part_at, the time of the write that last
 * made a record live (an insert, a takeover, a completion, an extension:
 * they all set it to its default, clock_timestamp()). A partition covers
 * [lo, hi) of that clock; retention drops a whole partition once nothing
 * in it can be served or still protects a request, moving the last few
 * live records forward first (idemproxy_parts_plan, store_pg_parts.c).
 *
 * A key stays unique across partitions: PostgreSQL enforces (scope, key)
 * only within each partition, so a claim that would insert or take over
 * first takes a transaction-level advisory lock on the key and then reads
 * again, in a statement whose snapshot is newer than the lock
 * (idemproxy_claim6): two claims of one key are serialised whatever
 * partition each would write, and at most one row of a key exists.
 *
 * A table of an earlier version (not partitioned) gets the part_at column
 * with a constant default (no rewrite) and keeps working, swept row by row
 * as before, until `idemproxy migrate` attaches it, as it is, as the first
 * partition (store_pg_convert).
 *
 * Every connection runs the schema. It is idempotent and cheap once done:
 * catalog checks that take no table lock; creators serialise on an
 * advisory lock; one that still finds things created meanwhile swallows
 * the duplicate error.
 */
#include "store_pg_schema.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Marks the functions as this version's: a database whose functions an
 * earlier version created gets them replaced. Change it with them. */
#define SCHEMA_MARK "idemproxy schema 9"

/* In pieces: C compilers need not take longer literals. */
static const char *const schema_parts[] = {
	/* head */
	"SET client_min_messages = warning;\n"
	"DO $migrate$ BEGIN\n"
	"IF to_regclass('idempotency_keys_parts') IS NULL\n"
	"   OR to_regclass('idempotency_keys') IS NULL\n"
	"   OR to_regprocedure('idemproxy_claim6(text,text,bytea,text,bigint,bigint,bigint,boolean,boolean)') IS NULL\n"
	"   OR to_regprocedure('idemproxy_part_hint(timestamptz)') IS NULL\n"
	"   OR to_regprocedure('idemproxy_parts_plan(bigint)') IS NULL\n"
	"   OR NOT EXISTS (SELECT 1 FROM pg_attribute\n"
	"                   WHERE attrelid = to_regclass('idempotency_keys')\n"
	"                     AND attname = 'watched' AND NOT attisdropped)\n"
	"   -- the functions of this version (replaced when they change)\n"
	"   OR obj_description(to_regprocedure('idemproxy_parts_plan(bigint)'),\n"
	"                      'pg_proc') IS DISTINCT FROM '" SCHEMA_MARK "' THEN\n"
	"  PERFORM pg_advisory_xact_lock(7165310201);\n",
	/* ensure */
	"CREATE OR REPLACE FUNCTION idemproxy_parts_ensure(p_width_ms bigint)\n"
	"RETURNS int LANGUAGE plpgsql AS $ens$\n"
	"DECLARE\n"
	"  w interval := greatest(p_width_ms, 1000) * interval '1 millisecond';\n"
	"  last record;\n"
	"  now_ts timestamptz := clock_timestamp();\n"
	"  top timestamptz;\n"
	"  hi timestamptz;\n"
	"  name text;\n"
	"  n int := 0;\n"
	"  cnt int;\n"
	"  oldest timestamptz;\n"
	"  lead interval;\n"
	"BEGIN\n"
	"  IF (SELECT relkind FROM pg_class\n"
	"       WHERE oid = to_regclass('idempotency_keys')) IS DISTINCT FROM 'p' THEN\n"
	"    RETURN 0;\n"
	"  END IF;\n"
	"  PERFORM pg_advisory_xact_lock(7165310203);\n"
	"  SET LOCAL lock_timeout = '2s';\n"
	"  SELECT p.lo, p.hi INTO last FROM idempotency_keys_parts p\n"
	"   ORDER BY p.hi DESC LIMIT 1;\n"
	"  top := last.hi;\n"
	"  IF w IS NULL THEN\n"
	"    -- a claim found no partition ahead: the width the last one had\n"
	"    w := CASE WHEN last.lo > '-infinity' THEN last.hi - last.lo\n"
	"              ELSE interval '1 hour' END;\n"
	"  END IF;\n"
	"  -- how far ahead partitions reach: claims read every partition, so\n"
	"  -- no further than maintenance needs - a round (every half width, at\n"
	"  -- most 10 s: store_pg_parts.c) and 3 s - and at most a width\n"
	"  lead := least(w, least(w / 2, interval '10 seconds') + interval '3 seconds');\n"
	"  SELECT count(*), min(p.lo) FILTER (WHERE p.lo > '-infinity')\n"
	"    INTO cnt, oldest FROM idempotency_keys_parts p;\n"
	"  IF cnt >= 24 AND oldest IS NOT NULL THEN\n"
	"    -- old partitions cannot go (a long transaction holds them back) and\n"
	"    -- every claim reads them all: each new one spans as long as all the\n"
	"    -- others, so that their number grows with the log of the time\n"
	"    w := greatest(w, top - oldest);\n"
	"  END IF;\n"
	"  IF top IS NULL OR top < now_ts - w THEN\n"
	"    -- no partition yet, or none for a while: start at the current bucket\n"
	"    hi := to_timestamp(floor(extract(epoch FROM now_ts) * 1000 /\n"
	"                             (extract(epoch FROM w) * 1000)) *\n"
	"                       extract(epoch FROM w));\n"
	"    IF top IS NULL THEN top := hi; END IF;\n"
	"  ELSE\n"
	"    hi := top + w;\n"
	"  END IF;\n"
	"  WHILE top < now_ts + lead LOOP\n"
	"    IF hi <= top THEN hi := top + w; END IF;\n"
	"    name := 'idempotency_keys_p' ||\n"
	"            to_char(top AT TIME ZONE 'UTC', 'YYYYMMDD\"t\"HH24MISSMS');\n"
	"    EXECUTE format('CREATE TABLE %I (LIKE idempotency_keys INCLUDING DEFAULTS)', name);\n"
	"    EXECUTE format('CREATE UNIQUE INDEX ON %I (scope, key)', name);\n"
	"    EXECUTE format('CREATE INDEX ON %I (expires_at)', name);\n"
	"    EXECUTE format('ALTER TABLE idempotency_keys ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', name, top, hi);\n"
	"    INSERT INTO idempotency_keys_parts (name, lo, hi) VALUES (name, top, hi);\n"
	"    n := n + 1;\n"
	"    top := hi;\n"
	"    hi := top + w;\n"
	"  END LOOP;\n"
	"  RETURN n;\n"
	"END $ens$;\n",
	/* plan */
	"-- What retention may do now, for the caller to carry out outside a\n"
	"-- transaction: ('detach'|'finalize'|'drop', partition) rows, then one\n"
	"-- ('stats', count, lag seconds) row.\n"
	"CREATE OR REPLACE FUNCTION idemproxy_parts_plan(p_width_ms bigint)\n"
	"RETURNS TABLE (action text, part text, n bigint) LANGUAGE plpgsql AS $plan$\n"
	"DECLARE\n"
	"  snap txid_snapshot := txid_current_snapshot();\n"
	"  r record;\n"
	"  live bigint;\n"
	"  keep bigint;\n"
	"  attached boolean;\n"
	"  pending boolean;\n"
	"  total bigint := 0;\n"
	"  lag bigint := 0;\n"
	"  oldest bigint;\n"
	"BEGIN\n"
	"  IF (SELECT relkind FROM pg_class\n"
	"       WHERE oid = to_regclass('idempotency_keys')) IS DISTINCT FROM 'p' THEN\n"
	"    RETURN;\n"
	"  END IF;\n"
	"  -- the oldest snapshot another session holds, as a txid (rounded\n"
	"  -- down): a writer can have taken its snapshot and its part_at before\n"
	"  -- a partition ended and still have no transaction id to wait for\n"
	"  -- (stopped between the two, or a long INSERT ... SELECT)\n"
	"  SELECT txid_snapshot_xmax(snap) - max(age(a.backend_xmin)) INTO oldest\n"
	"    FROM pg_stat_activity a\n"
	"   WHERE a.pid <> pg_backend_pid() AND a.backend_xmin IS NOT NULL\n"
	"     AND a.backend_type IS DISTINCT FROM 'walsender'\n"
	"     AND a.backend_type IS DISTINCT FROM 'autovacuum worker';\n"
	"  PERFORM idemproxy_parts_ensure(p_width_ms);\n"
	"  IF NOT pg_try_advisory_xact_lock(7165310202) THEN\n"
	"    -- another instance keeps them now\n"
	"    action := 'stats'; part := NULL;\n"
	"    n := (SELECT count(*) FROM idempotency_keys_parts); RETURN NEXT;\n"
	"    action := 'lag'; n := 0; RETURN NEXT;\n"
	"    RETURN;\n"
	"  END IF;\n"
	"  SET LOCAL lock_timeout = '1s';\n"
	"  FOR r IN SELECT * FROM idempotency_keys_parts ORDER BY hi LOOP\n"
	"    total := total + 1;\n"
	"    CONTINUE WHEN r.hi > clock_timestamp();\n"
	"    SELECT true, i.inhdetachpending INTO attached, pending\n"
	"      FROM pg_inherits i\n"
	"     WHERE i.inhrelid = to_regclass(r.name)\n"
	"       AND i.inhparent = 'idempotency_keys'::regclass;\n"
	"    IF NOT FOUND THEN\n"
	"      attached := false;\n"
	"    END IF;\n"
	"    IF attached AND pending THEN\n"
	"      action := 'finalize'; part := r.name; n := NULL; RETURN NEXT;\n"
	"      CONTINUE;\n"
	"    ELSIF NOT attached THEN\n"
	"      action := 'drop'; part := r.name; n := NULL; RETURN NEXT;\n"
	"      CONTINUE;\n"
	"    END IF;\n"
	"    IF r.fence IS NULL THEN\n"
	"      -- transactions under way may still write into it: wait for them\n"
	"      UPDATE idempotency_keys_parts SET fence = txid_snapshot_xmax(snap)\n"
	"       WHERE name = r.name;\n"
	"      lag := greatest(lag, extract(epoch FROM now() - r.hi)::bigint);\n"
	"      CONTINUE;\n"
	"    END IF;\n"
	"    IF txid_snapshot_xmin(snap) < r.fence OR oldest <= r.fence THEN\n"
	"      lag := greatest(lag, extract(epoch FROM now() - r.hi)::bigint);\n"
	"      CONTINUE;\n"
	"    END IF;\n"
	"    SELECT least(10000, greatest(100, (c.reltuples * 0.05)::bigint)) INTO keep\n"
	"      FROM pg_class c WHERE c.oid = to_regclass(r.name);\n"
	"    EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM %I '\n"
	"                   'WHERE expires_at > now() LIMIT %s) x', r.name, keep + 1)\n"
	"       INTO live;\n"
	"    IF live > keep OR (live > 0 AND r.lo > '-infinity' AND\n"
	"                       now() - r.hi < 8 * (r.hi - r.lo)) THEN\n"
	"      CONTINUE;             -- still serving: its records expire first\n"
	"    END IF;\n"
	"    IF live > 0 THEN\n"
	"      -- the last live records move to the current partition\n"
	"      -- (never backwards: an owner's later statements look for its row\n"
	"      -- from the part_at its claim wrote on)\n"
	"      -- (its bounds prune the others: a filter on tableoid would\n"
	"      -- look through the live records of every partition)\n"
	"      EXECUTE format('UPDATE idempotency_keys '\n"
	"                     'SET part_at = greatest(part_at, clock_timestamp()) '\n"
	"                     'WHERE part_at >= %L AND part_at < %L '\n"
	"                     'AND expires_at > now()', r.lo, r.hi);\n"
	"    END IF;\n"
	"    lag := greatest(lag, extract(epoch FROM now() - r.hi)::bigint);\n"
	"    action := 'detach'; part := r.name; n := live; RETURN NEXT;\n"
	"  END LOOP;\n"
	"  action := 'stats'; part := NULL; n := total; RETURN NEXT;\n"
	"  action := 'lag'; part := NULL; n := lag; RETURN NEXT;\n"
	"END $plan$;\n",
	/* claim */
	"-- A lower bound of part_at in Unix ms (1 ms below its floor, so that\n"
	"-- no rounding on the way back can pass it); NULL for a record of an\n"
	"-- earlier version's table.\n"
	"CREATE OR REPLACE FUNCTION idemproxy_part_hint(t timestamptz) RETURNS bigint\n"
	"LANGUAGE sql STABLE AS $hint$\n"
	"  SELECT CASE WHEN t > '-infinity' AND t < 'infinity'\n"
	"              THEN floor(extract(epoch FROM t) * 1000)::bigint - 1 END\n"
	"$hint$;\n",
	"-- One claim (store_pg.c store_pg_claim_sql). part_hint: a lower bound\n"
	"-- (Unix ms) of the won row's part_at, for the owner's later statements\n"
	"-- to prune partitions with; NULL when there is none. p_wait: the caller\n"
	"-- waits for a record in flight, which is marked watched so that its\n"
	"-- completion wakes the waiters (store_pg_complete_sql). p_takeover: a\n"
	"-- record whose lease ran out is taken over; else its outcome becomes\n"
	"-- unknown ('lapsed': this claim did it) and rec_owner, with part_hint,\n"
	"-- is what resolves it, as for a record found 'unknown'.\n"
	"CREATE OR REPLACE FUNCTION idemproxy_claim6(p_scope text, p_key text,\n"
	"    p_fp bytea, p_owner text, p_lease bigint, p_ttl bigint, p_lock bigint,\n"
	"    p_wait boolean, p_takeover boolean,\n"
	"    OUT state text, OUT fingerprint bytea, OUT status int, OUT headers bytea,\n"
	"    OUT body bytea, OUT ttl_left bigint, OUT part_hint bigint,\n"
	"    OUT rec_owner text)\n"
	"RETURNS SETOF record LANGUAGE plpgsql AS $claim$\n"
	"DECLARE\n"
	"  c record;\n"
	"  have boolean;\n"
	"  horizon text;\n"
	"  top timestamptz;\n"
	"  at timestamptz;\n"
	"BEGIN\n"
	"  -- one claim of a key at a time (held to the commit; free unless another\n"
	"  -- claim of the key is under way); the read below, a statement of its\n"
	"  -- own, has a snapshot newer than the lock: it sees what the previous\n"
	"  -- holder committed\n"
	"  PERFORM pg_advisory_xact_lock(p_lock);\n"
	"  SELECT k.state, k.fingerprint, k.status, k.headers, k.body, k.owner,\n"
	"         k.part_at, k.watched, k.expires_at <= now() AS expired,\n"
	"         (k.state = 'in_flight' AND k.lease_until <= now()) AS lapsed,\n"
	"         greatest(0, extract(epoch FROM k.expires_at - now()) * 1000)::bigint\n"
	"           AS ttl_left\n"
	"    INTO c\n"
	"    FROM idempotency_keys k\n"
	"   WHERE k.scope = p_scope AND k.key = p_key\n"
	"   -- (at most one row: the lock; the latest if a hand made two) -\n"
	"   -- an expression the expires_at index cannot serve: a generic\n"
	"   -- plan made while the partitions were empty would walk that\n"
	"   -- index backwards in each (a Merge Append under the LIMIT),\n"
	"   -- through every row of the current one, for as long as it lives\n"
	"   ORDER BY k.expires_at + interval '0 seconds' DESC\n"
	"   LIMIT 1;\n"
	"  have := FOUND;\n"
	"  IF have AND c.owner = p_owner AND c.state = 'in_flight' THEN\n"
	"    -- ours already (an earlier attempt committed): written again\n"
	"    UPDATE idempotency_keys k SET lease_until = k.lease_until\n"
	"     WHERE k.scope = p_scope AND k.key = p_key AND k.owner = p_owner\n"
	"       AND k.state = 'in_flight' AND k.part_at >= c.part_at\n"
	"    RETURNING k.part_at INTO at;\n"
	"    IF FOUND THEN\n"
	"      state := 'won';\n"
	"      -- not known to be new (that attempt may have taken it over):\n"
	"      -- an abandoned claim lapses it rather than delete it. Without\n"
	"      -- takeovers that attempt inserted it, or took over an expired one\n"
	"      IF p_takeover THEN fingerprint := c.fingerprint; END IF;\n"
	"      part_hint := idemproxy_part_hint(at);\n"
	"      RETURN NEXT;\n"
	"    END IF;\n"
	"    RETURN;\n"
	"  END IF;\n",
	/* claim: a lease that ran out */
	"  IF have AND NOT c.expired AND c.lapsed AND c.fingerprint = p_fp AND\n"
	"     NOT p_takeover THEN\n"
	"    -- the owner stopped extending its lease (killed, stalled, cut off):\n"
	"    -- the request may have executed and is never executed again. Its\n"
	"    -- outcome is unknown, for ttl; the owner keeps the row, so that its\n"
	"    -- late completion still lands; the waiters wake to replay it\n"
	"    UPDATE idempotency_keys k\n"
	"       SET state = 'unknown', lease_until = NULL, status = 502,\n"
	"           headers = NULL, body = NULL,\n"
	"           expires_at = now() + p_ttl * interval '1 millisecond',\n"
	"           part_at = CASE WHEN k.part_at > '-infinity'\n"
	"                     THEN greatest(k.part_at, clock_timestamp())\n"
	"                     ELSE k.part_at END\n"
	"     WHERE k.scope = p_scope AND k.key = p_key AND k.part_at >= c.part_at\n"
	"       AND k.state = 'in_flight' AND k.owner = c.owner\n"
	"       AND k.lease_until <= now()\n"
	"    RETURNING k.part_at INTO at;\n"
	"    IF NOT FOUND THEN\n"
	"      RETURN;                 -- changed meanwhile: claim again\n"
	"    END IF;\n"
	"    PERFORM pg_notify('idemproxy', p_scope || ':' || p_key);\n"
	"    state := 'lapsed'; fingerprint := c.fingerprint; status := 502;\n"
	"    ttl_left := p_ttl; part_hint := idemproxy_part_hint(at);\n"
	"    rec_owner := c.owner;\n"
	"    RETURN NEXT;\n"
	"    RETURN;\n"
	"  END IF;\n",
	/* claim: the record as it is */
	"  IF have AND NOT (c.owner IS DISTINCT FROM p_owner AND\n"
	"                   (c.expired OR (p_takeover AND c.lapsed AND\n"
	"                                  c.fingerprint = p_fp))) THEN\n"
	"    IF p_wait AND c.state = 'in_flight' AND c.fingerprint = p_fp AND\n"
	"       c.watched IS NOT TRUE THEN\n"
	"      -- a waiter: its completion must wake it. The row lock orders this\n"
	"      -- with the owner's completion (which reads watched as it writes):\n"
	"      -- either that sees the mark, or this finds the row completed\n"
	"      UPDATE idempotency_keys k SET watched = true\n"
	"       WHERE k.scope = p_scope AND k.key = p_key AND k.state = 'in_flight'\n"
	"         AND k.part_at >= c.part_at AND k.watched IS NOT TRUE;\n"
	"      IF NOT FOUND THEN\n"
	"        RETURN;               -- changed meanwhile: claim again\n"
	"      END IF;\n"
	"    END IF;\n"
	"    state := c.state; fingerprint := c.fingerprint; status := c.status;\n"
	"    headers := c.headers; body := c.body; ttl_left := c.ttl_left;\n"
	"    IF c.state = 'unknown' THEN\n"
	"      rec_owner := c.owner; part_hint := idemproxy_part_hint(c.part_at);\n"
	"    END IF;\n"
	"    RETURN NEXT;\n"
	"    RETURN;\n"
	"  END IF;\n",
	/* claim, continued */
	"  -- a partition for the row: this session remembers how far they reach,\n"
	"  -- and looks again only when that is close\n"
	"  horizon := current_setting('idemproxy.parts_hi', true);\n"
	"  IF horizon IS NULL OR horizon = '' OR\n"
	"     clock_timestamp() + interval '1 second' >= horizon::timestamptz THEN\n"
	"    SELECT max(p.hi) INTO top FROM idempotency_keys_parts p;\n"
	"    IF clock_timestamp() + interval '1 second' >= top THEN\n"
	"      -- no maintenance lately: the partition this row needs, now\n"
	"      PERFORM idemproxy_parts_ensure(NULL);\n"
	"      SELECT max(p.hi) INTO top FROM idempotency_keys_parts p;\n"
	"    END IF;\n"
	"    PERFORM set_config('idemproxy.parts_hi', coalesce(top::text, ''), false);\n"
	"  END IF;\n"
	"  IF NOT have THEN\n"
	"    INSERT INTO idempotency_keys AS k\n"
	"      (scope, key, fingerprint, state, owner, lease_until, expires_at)\n"
	"    VALUES (p_scope, p_key, p_fp, 'in_flight', p_owner,\n"
	"            now() + p_lease * interval '1 millisecond',\n"
	"            now() + greatest(p_lease, p_ttl) * interval '1 millisecond')\n"
	"    RETURNING k.part_at INTO at;\n"
	"  ELSE\n"
	"    UPDATE idempotency_keys k\n"
	"       SET fingerprint = p_fp, state = 'in_flight', owner = p_owner,\n"
	"           lease_until = now() + p_lease * interval '1 millisecond',\n"
	"           status = NULL, headers = NULL, body = NULL, created_at = now(),\n"
	"           -- the waiters of a lapsed request wait for this one\n"
	"           watched = CASE WHEN k.state = 'in_flight' THEN k.watched END,\n"
	"           expires_at = now() + greatest(p_lease, p_ttl) * interval '1 millisecond',\n"
	"           part_at = DEFAULT\n"
	"     WHERE k.scope = p_scope AND k.key = p_key AND k.part_at >= c.part_at\n"
	"       AND k.owner IS DISTINCT FROM p_owner\n"
	"       AND (k.expires_at <= now()\n"
	"            OR (p_takeover AND k.state = 'in_flight'\n"
	"                AND k.lease_until <= now() AND k.fingerprint = p_fp))\n"
	"    RETURNING k.part_at INTO at;\n"
	"    IF NOT FOUND THEN\n"
	"      RETURN;                 -- changed meanwhile: claim again\n"
	"    END IF;\n"
	"    IF NOT c.expired THEN\n"
	"      -- taken over from a request that may have executed: its\n"
	"      -- fingerprint must stay bound (claim_result, abandoned)\n"
	"      fingerprint := c.fingerprint;\n"
	"    END IF;\n"
	"  END IF;\n"
	"  state := 'won';\n"
	"  part_hint := idemproxy_part_hint(at);\n"
	"  RETURN NEXT;\n"
	"END $claim$;\n",
	/* tables */
	"  CREATE TABLE IF NOT EXISTS idempotency_keys_parts (\n"
	"    name   text        PRIMARY KEY,\n"
	"    lo     timestamptz NOT NULL,\n"
	"    hi     timestamptz NOT NULL,\n"
	"    fence  bigint\n"
	"  );\n"
	"  IF to_regclass('idempotency_keys') IS NULL THEN\n"
	"    CREATE TABLE idempotency_keys (\n"
	"      scope        text        NOT NULL,\n"
	"      key          text        NOT NULL,\n"
	"      fingerprint  bytea       NOT NULL,\n"
	"      state        text        NOT NULL,\n"
	"      owner        text,\n"
	"      lease_until  timestamptz,\n"
	"      status       int,\n"
	"      headers      bytea,\n"
	"      body         bytea,\n"
	"      created_at   timestamptz NOT NULL DEFAULT now(),\n"
	"      expires_at   timestamptz NOT NULL,\n"
	"      part_at      timestamptz NOT NULL DEFAULT clock_timestamp(),\n"
	"      watched      boolean\n"
	"    ) PARTITION BY RANGE (part_at);\n"
	"  ELSIF NOT EXISTS (SELECT 1 FROM pg_attribute\n"
	"                     WHERE attrelid = 'idempotency_keys'::regclass\n"
	"                       AND attname = 'part_at' AND NOT attisdropped) THEN\n"
	"    -- a table of an earlier version: the column the statements set, with\n"
	"    -- a constant default (no rewrite); idemproxy migrate partitions it\n"
	"    SET LOCAL lock_timeout = '10s';\n"
	"    ALTER TABLE idempotency_keys\n"
	"      ADD COLUMN part_at timestamptz NOT NULL DEFAULT '-infinity';\n"
	"  END IF;\n"
	"  IF NOT EXISTS (SELECT 1 FROM pg_attribute\n"
	"                  WHERE attrelid = 'idempotency_keys'::regclass\n"
	"                    AND attname = 'watched' AND NOT attisdropped) THEN\n"
	"    -- set by a claim that waits for a record in flight; no default:\n"
	"    -- no rewrite, on every partition at once\n"
	"    SET LOCAL lock_timeout = '10s';\n"
	"    ALTER TABLE idempotency_keys ADD COLUMN watched boolean;\n"
	"  END IF;\n"
	"  COMMENT ON FUNCTION idemproxy_parts_plan(bigint) IS '" SCHEMA_MARK "';\n"
	"END IF;\n"
	"EXCEPTION WHEN duplicate_table OR duplicate_object OR unique_violation THEN\n"
	"  NULL;  -- created meanwhile by another instance\n"
	"END $migrate$;\n",
};

char *store_pg_schema_sql(void)
{
	size_t n = 1;
	char *sql, *at;

	for (size_t i = 0; i < sizeof(schema_parts) / sizeof(schema_parts[0]); i++)
		n += strlen(schema_parts[i]);
	sql = malloc(n);
	if (sql == NULL)
		return NULL;
	at = sql;
	for (size_t i = 0; i < sizeof(schema_parts) / sizeof(schema_parts[0]); i++) {
		size_t len = strlen(schema_parts[i]);

		memcpy(at, schema_parts[i], len);
		at += len;
	}
	*at = '\0';
	return sql;
}

/* Run sql alone; false with err set when it failed. */
static bool run(PGconn *pg, const char *sql, char *err, size_t errlen)
{
	PGresult *r = PQexec(pg, sql);
	bool ok = PQresultStatus(r) == PGRES_COMMAND_OK ||
		  PQresultStatus(r) == PGRES_TUPLES_OK;

	if (!ok)
		snprintf(err, errlen, "%s", PQerrorMessage(pg));
	PQclear(r);
	return ok;
}

/*
 * The table of an earlier version becomes, as it is, the partition of
 * part_at from MINVALUE to now: no row is copied or rewritten. Every row
 * of it has part_at '-infinity' - the column's default there, and writes
 * keep it so (a completion or an extension moves part_at only when it is
 * a time) - which a CHECK constraint proves (validated without blocking
 * writes), so that ATTACH scans nothing. New records go to the new
 * partitions at once; a record taken over moves there too; retention
 * drops the old table like any other partition once nothing in it lives.
 */
int pg_convert(PGconn *pg, uint64_t width_ms, char *err, size_t errlen)
{
	char sql[1024], cut[64];
	PGresult *r;

	r = PQexec(pg, "SELECT relkind, to_char(date_trunc('second', "
		   "clock_timestamp() + interval '1 second') AT TIME ZONE 'UTC', "
		   "'YYYY-MM-DD HH24:MI:SS+00') FROM pg_class "
		   "WHERE oid = 'idempotency_keys'::regclass");
	if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
		snprintf(err, errlen, "%s", PQerrorMessage(pg));
		PQclear(r);
		return -1;
	}
	if (strcmp(PQgetvalue(r, 0, 0), "p") == 0) {
		PQclear(r);	/* partitioned already: the next partitions */
		snprintf(sql, sizeof(sql), "SELECT idemproxy_parts_ensure(%llu)",
			 (unsigned long long)width_ms);
		return run(pg, sql, err, errlen) ? 0 : -1;
	}
	snprintf(cut, sizeof(cut), "%s", PQgetvalue(r, 0, 1));
	PQclear(r);
	snprintf(sql, sizeof(sql),
		 "SET lock_timeout = '10s';"
		 "ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS "
		 "idempotency_keys_before_partitions;"
		 "ALTER TABLE idempotency_keys ADD CONSTRAINT "
		 "idempotency_keys_before_partitions CHECK (part_at < '%s') "
		 "NOT VALID", cut);
	if (!run(pg, sql, err, errlen) ||
	    !run(pg, "ALTER TABLE idempotency_keys VALIDATE CONSTRAINT "
		 "idempotency_keys_before_partitions", err, errlen))
		return -1;
	snprintf(sql, sizeof(sql),
		 "BEGIN;"
		 "ALTER TABLE idempotency_keys RENAME TO idempotency_keys_legacy;"
		 "CREATE TABLE idempotency_keys (LIKE idempotency_keys_legacy "
		 "INCLUDING DEFAULTS) PARTITION BY RANGE (part_at);"
		 "ALTER TABLE idempotency_keys ALTER COLUMN part_at "
		 "SET DEFAULT clock_timestamp();"
		 "ALTER TABLE idempotency_keys ATTACH PARTITION "
		 "idempotency_keys_legacy FOR VALUES FROM (MINVALUE) TO ('%s');"
		 "INSERT INTO idempotency_keys_parts (name, lo, hi) VALUES "
		 "('idempotency_keys_legacy', '-infinity', '%s');"
		 "SELECT idemproxy_parts_ensure(%llu);"
		 "COMMIT", cut, cut, (unsigned long long)width_ms);
	if (!run(pg, sql, err, errlen)) {
		PQclear(PQexec(pg, "ROLLBACK"));
		return -1;
	}
	return 0;
}
