/*
 * store_citus_map.c - the coordinator's answers (see store_citus_map.h).
 *
 * The map is Citus' own metadata, read on the coordinator: each shard of
 * idempotency_keys (pg_dist_shard: a range of the key's hash), its
 * placement's group (pg_dist_placement) and that group's active primary
 * (pg_dist_node). One statement, a few rows per shard; asked every
 * couple of seconds, so that node additions, removals, failovers that
 * rewrite pg_dist_node and shard moves reach the instances.
 */
#include "store_citus_map.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "clock.h"
#include "store_pg.h"
#include "store_pg_hosts.h"
#include "store_pg_parts.h"

#define CITUS_MIN_MAJOR 12	/* tested: 13.2 */

/* Wait for fd (events), stop_fd or the deadline. 1: ready; 0: timed out
 * or stopped (err set); -1: poll failed. */
static int wait_fd(int fd, short events, int stop_fd, uint64_t deadline,
		   char *err, size_t errlen)
{
	struct pollfd p[2] = { { .fd = fd, .events = events },
			       { .fd = stop_fd, .events = POLLIN } };

	for (;;) {
		uint64_t now = clock_ms();
		int n;

		if (now >= deadline) {
			snprintf(err, errlen, "no answer within %d ms",
				 CITUS_MAP_TIMEOUT_MS);
			return 0;
		}
		n = poll(p, stop_fd >= 0 ? 2 : 1, (int)(deadline - now));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			snprintf(err, errlen, "poll: %s", strerror(errno));
			return -1;
		}
		if (stop_fd >= 0 && p[1].revents != 0) {
			snprintf(err, errlen, "stopping");
			return 0;
		}
		if (n > 0)
			return 1;
	}
}

/* A connection to the first host of conninfo that accepts, each within
 * the deadline; NULL with err set. */
static PGconn *connect_by(const char *conninfo, int stop_fd, uint64_t deadline,
			  char *err, size_t errlen)
{
	struct pg_hosts h;
	PGconn *pg = NULL;

	if (pg_hosts_parse(&h, conninfo, err, errlen) < 0)
		return NULL;
	for (int i = 0; i < h.n && pg == NULL; i++) {
		PostgresPollingStatusType st = PGRES_POLLING_WRITING;

		pg = PQconnectStartParams(h.keywords, h.values[i], 0);
		if (pg == NULL || PQstatus(pg) == CONNECTION_BAD)
			st = PGRES_POLLING_FAILED;
		while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
			short ev = st == PGRES_POLLING_READING ? POLLIN : POLLOUT;

			if (wait_fd(PQsocket(pg), ev, stop_fd, deadline, err,
				    errlen) <= 0)
				break;
			st = PQconnectPoll(pg);
		}
		if (st == PGRES_POLLING_OK)
			break;
		if (st == PGRES_POLLING_FAILED)
			snprintf(err, errlen, "%s: %s", h.label[i],
				 pg != NULL ? PQerrorMessage(pg) : "out of memory");
		PQfinish(pg);
		pg = NULL;
	}
	pg_hosts_free(&h);
	return pg;
}

/* The last result of sql, NULL with err set (an error, or no answer in
 * time: the connection is then of no further use). */
static PGresult *query_by(PGconn *pg, const char *sql, int stop_fd,
			  uint64_t deadline, char *err, size_t errlen)
{
	PGresult *last = NULL, *r;

	if (!PQsendQuery(pg, sql)) {
		snprintf(err, errlen, "%s", PQerrorMessage(pg));
		return NULL;
	}
	for (;;) {
		int f = PQflush(pg);

		if (f < 0)
			break;
		if (f == 0 && !PQisBusy(pg)) {
			r = PQgetResult(pg);
			if (r == NULL)
				break;
			PQclear(last);
			last = r;
			continue;
		}
		if (wait_fd(PQsocket(pg), (short)(POLLIN | (f > 0 ? POLLOUT : 0)),
			    stop_fd, deadline, err, errlen) <= 0) {
			PQclear(last);
			return NULL;
		}
		if (!PQconsumeInput(pg))
			break;
	}
	if (last == NULL || (PQresultStatus(last) != PGRES_TUPLES_OK &&
			     PQresultStatus(last) != PGRES_COMMAND_OK)) {
		snprintf(err, errlen, "%s", PQerrorMessage(pg));
		PQclear(last);
		return NULL;
	}
	return last;
}

static const char map_sql[] =
	"SELECT s.shardminvalue::int, s.shardmaxvalue::int, p.groupid,\n"
	"       string_agg(n.nodename || ':' || n.nodeport, ','\n"
	"                  ORDER BY n.noderole = 'primary' DESC, n.nodeid)\n"
	"  FROM pg_catalog.pg_dist_shard s\n"
	"  JOIN pg_catalog.pg_dist_placement p ON p.shardid = s.shardid\n"
	"  JOIN pg_catalog.pg_dist_node n ON n.groupid = p.groupid\n"
	"   AND n.isactive AND n.noderole IN ('primary', 'secondary')\n"
	" WHERE s.logicalrelid = to_regclass('idempotency_keys')\n"
	" GROUP BY s.shardid, 1, 2, 3\n"
	" ORDER BY 1, bool_or(n.noderole = 'primary') DESC";

static struct citus_map *map_from(PGresult *r, char *err, size_t errlen)
{
	int n = PQntuples(r);
	struct citus_map *m = calloc(1, sizeof(*m) + (size_t)n * sizeof(m->shards[0]));

	if (m == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	atomic_init(&m->refcount, 1);
	m->citus = m->distributed = true;
	for (int i = 0; i < n; i++) {
		struct citus_shard *sh = &m->shards[m->n];

		sh->lo = (int32_t)strtol(PQgetvalue(r, i, 0), NULL, 10);
		sh->hi = (int32_t)strtol(PQgetvalue(r, i, 1), NULL, 10);
		sh->group = atoi(PQgetvalue(r, i, 2));
		snprintf(sh->nodes, sizeof(sh->nodes), "%s", PQgetvalue(r, i, 3));
		/* a shard placed twice (a move half done): the first */
		if (m->n > 0 && m->shards[m->n - 1].lo == sh->lo)
			continue;
		m->n++;
	}
	if (m->n == 0) {
		snprintf(err, errlen, "idempotency_keys is distributed but has "
			 "no shard on an active primary");
		free(m);
		return NULL;
	}
	return m;
}

/* A map that names no shard: everything on one node. */
static struct citus_map *map_flat(bool citus, char *err, size_t errlen)
{
	struct citus_map *m = calloc(1, sizeof(*m));

	if (m == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	atomic_init(&m->refcount, 1);
	m->citus = citus;
	return m;
}

struct citus_map *citus_map_fetch_on(PGconn **conn, const char *conninfo,
				     int stop_fd, char *err, size_t errlen)
{
	uint64_t deadline = clock_ms() + CITUS_MAP_TIMEOUT_MS;
	struct citus_map *m = NULL;
	PGconn *pg;
	PGresult *r;

	if (*conn == NULL || PQstatus(*conn) != CONNECTION_OK) {
		PQfinish(*conn);
		*conn = connect_by(conninfo, stop_fd, deadline, err, errlen);
	}
	if ((pg = *conn) == NULL)
		return NULL;
	r = query_by(pg, "SELECT to_regclass('pg_catalog.pg_dist_partition') "
		     "IS NOT NULL, to_regclass('idempotency_keys') IS NOT NULL",
		     stop_fd, deadline, err, errlen);
	if (r != NULL && strcmp(PQgetvalue(r, 0, 0), "t") != 0) {
		m = map_flat(false, err, errlen);
	} else if (r != NULL && strcmp(PQgetvalue(r, 0, 1), "t") != 0) {
		m = map_flat(true, err, errlen);	/* no table yet */
	} else if (r != NULL) {
		PQclear(r);
		r = query_by(pg, "SELECT EXISTS (SELECT 1 FROM "
			     "pg_catalog.pg_dist_partition WHERE logicalrelid = "
			     "'idempotency_keys'::regclass)", stop_fd, deadline,
			     err, errlen);
		if (r != NULL && strcmp(PQgetvalue(r, 0, 0), "t") != 0) {
			m = map_flat(true, err, errlen);
		} else if (r != NULL) {
			PQclear(r);
			r = query_by(pg, map_sql, stop_fd, deadline, err, errlen);
			if (r != NULL)
				m = map_from(r, err, errlen);
		}
	}
	if (r == NULL) {	/* no answer, or none in time: of no more use */
		PQfinish(pg);
		*conn = NULL;
	}
	PQclear(r);
	return m;
}

struct citus_map *citus_map_fetch(const char *conninfo, int stop_fd, char *err,
				  size_t errlen)
{
	PGconn *pg = NULL;
	struct citus_map *m = citus_map_fetch_on(&pg, conninfo, stop_fd, err,
						 errlen);

	PQfinish(pg);
	return m;
}

struct citus_map *citus_map_ref(struct citus_map *m)
{
	if (m != NULL)
		atomic_fetch_add(&m->refcount, 1);
	return m;
}

void citus_map_unref(struct citus_map *m)
{
	if (m != NULL && atomic_fetch_sub(&m->refcount, 1) == 1)
		free(m);
}

const struct citus_shard *citus_map_find(const struct citus_map *m, int32_t h)
{
	int lo = 0, hi = m->n - 1;

	while (lo <= hi) {
		int mid = lo + (hi - lo) / 2;
		const struct citus_shard *sh = &m->shards[mid];

		if (h < sh->lo)
			hi = mid - 1;
		else if (h > sh->hi)
			lo = mid + 1;
		else
			return sh;
	}
	return NULL;
}

/* v as a quoted conninfo value. */
static void put_value(char **p, const char *v)
{
	*(*p)++ = '\'';
	for (; *v != '\0'; v++) {
		if (*v == '\'' || *v == '\\')
			*(*p)++ = '\\';
		*(*p)++ = *v;
	}
	*(*p)++ = '\'';
}

/* nodes ("h:p,h:p") as the two lists libpq takes, each malloc()ed;
 * -1 when an entry has no port. */
static int split_nodes(const char *nodes, char **hosts, char **ports)
{
	size_t n = strlen(nodes) + 1;
	char *h = malloc(n), *p = malloc(n), *hp = h, *pp = p;
	const char *at = nodes;

	*hosts = h;
	*ports = p;
	if (h == NULL || p == NULL)
		return -1;
	while (*at != '\0') {
		const char *end = strchr(at, ','), *colon;

		if (end == NULL)
			end = at + strlen(at);
		/* the last colon: a host may be an IPv6 address */
		for (colon = end; colon > at && colon[-1] != ':'; colon--)
			;
		if (colon <= at + 1 || colon == end ||
		    (*end == ',' && end[1] == '\0'))
			return -1;
		if (hp != h) {
			*hp++ = ',';
			*pp++ = ',';
		}
		memcpy(hp, at, (size_t)(colon - 1 - at));
		hp += colon - 1 - at;
		memcpy(pp, colon, (size_t)(end - colon));
		pp += end - colon;
		at = *end == ',' ? end + 1 : end;
	}
	*hp = *pp = '\0';
	return hp == h ? -1 : 0;
}

char *citus_worker_conninfo(const char *conninfo, const char *nodes,
			    char *err, size_t errlen)
{
	char *perr = NULL, *out = NULL, *p, *hosts = NULL, *ports = NULL;
	PQconninfoOption *opts = PQconninfoParse(conninfo, &perr);
	size_t n = strlen(nodes) * 2 + 64;

	if (opts == NULL) {
		if (perr != NULL)
			perr[strcspn(perr, "\n")] = '\0';
		snprintf(err, errlen, "cannot parse the store's connection "
			 "string: %s", perr != NULL ? perr : "out of memory");
		PQfreemem(perr);
		return NULL;
	}
	if (split_nodes(nodes, &hosts, &ports) < 0) {
		snprintf(err, errlen, "the nodes \"%s\" are not host:port,...",
			 nodes);
		goto out;
	}
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
		if (o->val != NULL)
			n += strlen(o->keyword) + strlen(o->val) * 2 + 4;
	out = p = malloc(n);
	if (out == NULL) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	p += sprintf(p, "host=");
	put_value(&p, hosts);
	p += sprintf(p, " port=");
	put_value(&p, ports);
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++) {
		if (o->val == NULL || o->val[0] == '\0' ||
		    strcmp(o->keyword, "host") == 0 ||
		    strcmp(o->keyword, "hostaddr") == 0 ||
		    strcmp(o->keyword, "port") == 0)
			continue;
		p += sprintf(p, " %s=", o->keyword);
		put_value(&p, o->val);
	}
	*p = '\0';
out:
	free(hosts);
	free(ports);
	PQconninfoFree(opts);
	return out;
}

/* ---- idemproxy migrate --distributed ------------------------------------- */

/* sql's first value, copied into out; -1 with err set. */
static int ask(PGconn *pg, const char *sql, char *out, size_t outlen,
	       char *err, size_t errlen)
{
	PGresult *r = PQexec(pg, sql);
	int rc = -1;

	if (PQresultStatus(r) == PGRES_TUPLES_OK) {
		snprintf(out, outlen, "%s", PQntuples(r) > 0 &&
			 !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0) : "");
		rc = 0;
	} else {
		snprintf(err, errlen, "%s", PQerrorMessage(pg));
	}
	PQclear(r);
	return rc;
}

/* Refused unless this is a Citus coordinator of a version we know with
 * at least one active worker. */
static int check_coordinator(PGconn *pg, char *err, size_t errlen)
{
	char v[64];

	if (ask(pg, "SELECT extversion FROM pg_extension WHERE extname = 'citus'",
		v, sizeof(v), err, errlen) < 0)
		return -1;
	if (v[0] == '\0') {
		snprintf(err, errlen, "--distributed needs a Citus coordinator: "
			 "this database has no citus extension (CREATE EXTENSION "
			 "citus on every node; docs/scale.md)");
		return -1;
	}
	if (atoi(v) < CITUS_MIN_MAJOR) {
		snprintf(err, errlen, "Citus %s is too old: --distributed needs "
			 "%d.0 or later (tested with 13.2)", v, CITUS_MIN_MAJOR);
		return -1;
	}
	if (ask(pg, "SELECT citus_is_coordinator()", v, sizeof(v), err,
		errlen) < 0)
		return -1;
	if (strcmp(v, "t") != 0) {
		snprintf(err, errlen, "--distributed runs on the Citus "
			 "coordinator; this node is a worker (or has no "
			 "coordinator set: citus_set_coordinator_host)");
		return -1;
	}
	if (ask(pg, "SELECT count(*) FROM citus_get_active_worker_nodes()",
		v, sizeof(v), err, errlen) < 0)
		return -1;
	if (atoi(v) == 0) {
		snprintf(err, errlen, "the coordinator has no active worker "
			 "(citus_add_node)");
		return -1;
	}
	return 0;
}

/* Run sql unless done answers "t"; -1 with err set. */
static int step(PGconn *pg, const char *done, const char *sql,
		const char *what, char *err, size_t errlen)
{
	char v[8];
	PGresult *r;

	if (ask(pg, done, v, sizeof(v), err, errlen) < 0)
		return -1;
	if (strcmp(v, "t") == 0)
		return 0;
	r = PQexec(pg, sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK &&
	    PQresultStatus(r) != PGRES_COMMAND_OK) {
		snprintf(err, errlen, "%s: %s", what, PQerrorMessage(pg));
		PQclear(r);
		return -1;
	}
	PQclear(r);
	return 0;
}

#define DISTRIBUTED(rel) \
	"SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition " \
	"WHERE logicalrelid = '" rel "'::regclass)"
#define CLAIM_FN \
	"idemproxy_claim6(text,text,bytea,text,bigint,bigint,bigint,boolean,boolean)"

int citus_migrate(const char *conninfo, uint64_t ttl_ms, char *err,
		  size_t errlen)
{
	uint64_t deadline = clock_ms() + CITUS_MAP_TIMEOUT_MS;
	PGconn *pg = connect_by(conninfo, -1, deadline, err, errlen);
	char sql[96];
	int rc = -1;

	if (pg == NULL)
		return -1;
	/* Citus' notices (copying a table's rows) are for a console */
	PQclear(PQexec(pg, "SET client_min_messages = warning"));
	if (check_coordinator(pg, err, errlen) < 0)
		goto out;
	/* the schema of one node first (created, or brought up to date) */
	if (store_pg_migrate(conninfo, ttl_ms, err, errlen) < 0)
		goto out;
	/* the partitions' bookkeeping on every node: claims on the workers
	 * read it (how far the partitions reach) */
	if (step(pg, DISTRIBUTED("idempotency_keys_parts"),
		 "SELECT create_reference_table('idempotency_keys_parts');"
		 "SELECT truncate_local_data_after_distributing_table("
		 "'idempotency_keys_parts')",
		 "create_reference_table", err, errlen) < 0)
		goto out;
	/* rows by key: every statement idemproxy sends names one key, so
	 * each goes to one shard. Copies what the table holds, blocking
	 * writes to it meanwhile (docs/scale.md "Moving a table") */
	if (step(pg, DISTRIBUTED("idempotency_keys"),
		 "SET citus.multi_shard_modify_mode TO 'sequential';"
		 "SELECT create_distributed_table('idempotency_keys', 'key');"
		 "SELECT truncate_local_data_after_distributing_table("
		 "'idempotency_keys')",
		 "create_distributed_table", err, errlen) < 0)
		goto out;
	/* a claim called alone on any node runs where its key lives */
	if (step(pg, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_object "
		 "WHERE objid = to_regprocedure('" CLAIM_FN "') "
		 "AND colocationid IS NOT NULL)",
		 "SELECT create_distributed_function('" CLAIM_FN "', 'p_key', "
		 "colocate_with := 'idempotency_keys')",
		 "create_distributed_function", err, errlen) < 0)
		goto out;
	/* the partitions as far ahead as a distributed table wants them
	 * (idemproxy_parts_ensure): claims on the workers cannot make one */
	snprintf(sql, sizeof(sql), "SELECT idemproxy_parts_ensure(%llu)",
		 (unsigned long long)pg_part_width(ttl_ms));
	if (step(pg, "SELECT false", sql, "idemproxy_parts_ensure", err,
		 errlen) < 0)
		goto out;
	rc = 0;
out:
	PQfinish(pg);
	return rc;
}
