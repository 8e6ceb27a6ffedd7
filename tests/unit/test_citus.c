/*
 * The Citus store's pure pieces: hashtext() of PostgreSQL as Citus hashes
 * a text distribution column (common/store/citus_hash.c), against values
 * a live PostgreSQL 15 gave (SELECT hashtext(k)); the shard a hash falls
 * in (citus_map_find); a worker's connection string made from the
 * coordinator's (citus_worker_conninfo).
 */
#include <stdlib.h>
#include <string.h>

#include "citus_hash.h"
#include "store_citus_map.h"
#include "tap.h"

static const struct {
	const char *s;
	int32_t h;
} vectors[] = {
	{ "", -1477818771 },
	{ "a", 1075015857 },
	{ "ab", 1718550461 },
	{ "abc", -785388649 },
	{ "abcd", -393934804 },
	{ "abcde", -445659580 },
	{ "abcdefghijk", -1483803693 },		/* 11: the longest tail */
	{ "abcdefghijkl", -1586087212 },	/* 12: one block, no tail */
	{ "abcdefghijklm", 405849808 },
	{ "0123456789abcdefghijklmnopqrstuvwxyz", -933383701 },
	{ "order-42", 1198831424 },
	{ "k1", -1962252844 },
	{ "\xc3\xa9\xe2\x82\xac\xe6\xbc\xa2\xe5\xad\x97", -143922301 },
};

int main(void)
{
	char err[256], *ci;
	struct citus_map *m;
	const struct citus_shard *sh;

	for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++)
		is_int(citus_hash_text(vectors[i].s, strlen(vectors[i].s)),
		       vectors[i].h, "hashtext(\"%s\")", vectors[i].s);

	/* four shards over the whole int32 range, as Citus cuts them */
	m = calloc(1, sizeof(*m) + 4 * sizeof(m->shards[0]));
	if (m == NULL)
		return 1;
	atomic_init(&m->refcount, 1);
	m->distributed = true;
	m->n = 4;
	m->shards[0] = (struct citus_shard){ .lo = INT32_MIN, .hi = -1073741825,
		.group = 1, .nodes = "w1:1" };
	m->shards[1] = (struct citus_shard){ .lo = -1073741824, .hi = -1,
		.group = 2, .nodes = "w2:2" };
	m->shards[2] = (struct citus_shard){ .lo = 0, .hi = 1073741823,
		.group = 1, .nodes = "w1:1" };
	m->shards[3] = (struct citus_shard){ .lo = 1073741824, .hi = INT32_MAX,
		.group = 2, .nodes = "w2:2" };
	sh = citus_map_find(m, INT32_MIN);
	ok(sh == &m->shards[0], "the lowest hash: the first shard");
	sh = citus_map_find(m, INT32_MAX);
	ok(sh == &m->shards[3], "the highest hash: the last shard");
	sh = citus_map_find(m, -1);
	ok(sh == &m->shards[1], "-1: the second shard's top");
	sh = citus_map_find(m, 0);
	ok(sh == &m->shards[2], "0: the third shard's bottom");
	m->shards[1].hi = -2;	/* a hole, as while a shard splits */
	ok(citus_map_find(m, -1) == NULL, "a hash no shard covers: none");
	citus_map_ref(m);
	citus_map_unref(m);
	is_int(atomic_load(&m->refcount), 1, "ref and unref balance");
	citus_map_unref(m);

	ci = citus_worker_conninfo("postgres://app:s3cret@coord:5432,coord2:5433/"
				   "idem?sslmode=require&target_session_attrs="
				   "read-write", "10.0.0.7:6432", err, sizeof(err));
	ok(ci != NULL && strstr(ci, "host='10.0.0.7' port='6432'") == ci,
	   "a worker's host and port replace the coordinator's: %s",
	   ci != NULL ? ci : err);
	ok(ci != NULL && strstr(ci, "coord") == NULL, "no coordinator host left");
	ok(ci != NULL && strstr(ci, "user='app'") != NULL &&
	   strstr(ci, "password='s3cret'") != NULL &&
	   strstr(ci, "dbname='idem'") != NULL &&
	   strstr(ci, "sslmode='require'") != NULL,
	   "user, password, database and TLS are kept");
	free(ci);
	ci = citus_worker_conninfo("host=c dbname=x", "w1:5432,w1-standby:5433,"
				   "::1:5434", err, sizeof(err));
	ok(ci != NULL && strstr(ci, "host='w1,w1-standby,::1' "
				"port='5432,5433,5434'") == ci,
	   "a primary and its secondaries: one list of hosts, one of ports "
	   "(an IPv6 host split at its last colon): %s", ci != NULL ? ci : err);
	free(ci);
	ci = citus_worker_conninfo("host=a password='it\\'s' dbname=x", "b:1",
				   err, sizeof(err));
	ok(ci != NULL && strstr(ci, "password='it\\'s'") != NULL,
	   "a quote in a value stays quoted: %s", ci != NULL ? ci : err);
	free(ci);
	ci = citus_worker_conninfo("host='unterminated", "b:1", err, sizeof(err));
	ok(ci == NULL && strstr(err, "cannot parse") != NULL,
	   "a string that does not parse: an error (%s)", err);
	static const char *const bad[] = { "w1,w2:1", "", "w1:", ":5", "w1:5," };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ci = citus_worker_conninfo("host=a", bad[i], err, sizeof(err));
		ok(ci == NULL && strstr(err, "host:port") != NULL,
		   "nodes \"%s\": an error (%s)", bad[i], err);
		free(ci);
	}
	return tap_done();
}
