/*
 * test_pg_hosts.c - a connection string split by host, and the parameter
 * values a connect gets once its host names are resolved off the loop:
 * names become hostaddr lists (host kept), numbers, socket directories and
 * given addresses pass unchanged, ports follow their hosts.
 *
 * Names used: "localhost" (every Debian /etc/hosts has it) and a name in
 * the reserved .invalid domain, which no resolver answers (RFC 6761).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_pg_dns.h"
#include "store_pg_hosts.h"
#include "tap.h"

static const char *value(const struct pg_hosts *h, const char **v,
			 const char *kw)
{
	for (int k = 0; h->keywords[k] != NULL; k++)
		if (strcmp(h->keywords[k], kw) == 0)
			return v[k] != NULL ? v[k] : "(null)";
	return "(absent)";
}

static void split_by_host(void)
{
	struct pg_hosts h;
	char err[256];

	ok(pg_hosts_parse(&h, "host=a,b,c port=1,2,3 dbname=x", err,
			  sizeof(err)) == 0, "three hosts parse");
	ok(h.probe && h.n == 3, "read-write by default: a set per host");
	is_str(value(&h, h.values[1], "host"), "b", "set 1's host");
	is_str(value(&h, h.values[1], "port"), "2", "set 1's port");
	is_str(value(&h, h.values[1], "target_session_attrs"), "read-write",
	       "target_session_attrs defaults to read-write");
	ok(h.nent[2] == 1 && strcmp(h.ent[2][0].host, "c") == 0 &&
	   strcmp(h.ent[2][0].port, "3") == 0, "set 2 has its one host");
	pg_hosts_free(&h);

	ok(pg_hosts_parse(&h, "host=a,b target_session_attrs=any", err,
			  sizeof(err)) == 0, "any: parses");
	ok(!h.probe && h.n == 1 && h.nent[0] == 2 &&
	   strcmp(h.ent[0][1].host, "b") == 0,
	   "any: one set, both hosts for libpq to walk");
	pg_hosts_free(&h);

	ok(pg_hosts_parse(&h, "host=a,b port=1,2,3", err, sizeof(err)) < 0,
	   "ports that do not match the hosts: refused (%s)", err);

	ok(pg_hosts_parse(&h, "postgres://a/x?keepalives_idle=30", err,
			  sizeof(err)) == 0, "one host parses");
	is_str(value(&h, h.values[0], "keepalives_idle"), "30",
	       "keepalives_idle as the URL says");
	is_str(value(&h, h.values[0], "keepalives_count"), "3",
	       "keepalives_count: the store's default");
	is_str(value(&h, h.values[0], "tcp_user_timeout"), "10000",
	       "tcp_user_timeout: the store's default");
	pg_hosts_free(&h);
}

static void resolved_values(void)
{
	struct pg_hosts h;
	struct pg_dns *d;
	const char **v;
	char err[256], why[160];

	if (pg_hosts_parse(&h, "host=localhost,127.0.0.2,/run/pg,"
			   "nowhere.invalid port=5001,5002,5003,5004 "
			   "target_session_attrs=any dbname=x", err, sizeof(err)) < 0) {
		ok(0, "parse: %s", err);
		return;
	}
	d = pg_dns_new(&h);
	ok(d != NULL, "a resolver");
	v = pg_dns_values(d, &h, 0, why, sizeof(why));
	ok(v != NULL, "values while one name cannot be resolved");
	if (v != NULL) {
		const char *host = value(&h, v, "host");
		const char *addr = value(&h, v, "hostaddr");
		const char *port = value(&h, v, "port");
		size_t hl = strlen(host), al = strlen(addr), pl = strlen(port);

		/* localhost is 127.0.0.1, and also ::1 in Debian's default */
		ok(strncmp(host, "localhost,", 10) == 0 && hl > 18 &&
		   strcmp(host + hl - 18, ",127.0.0.2,/run/pg") == 0,
		   "the name kept for each of its addresses; the rest as "
		   "given (%s)", host);
		ok(strstr(addr, "127.0.0.1") != NULL && al >= 2 &&
		   strcmp(addr + al - 2, ",,") == 0,
		   "localhost's addresses as hostaddr; none for a number or a "
		   "socket directory (%s)", addr);
		ok(strncmp(port, "5001,", 5) == 0 && pl >= 10 &&
		   strcmp(port + pl - 10, ",5002,5003") == 0,
		   "ports follow their hosts (%s)", port);
		is_str(value(&h, v, "dbname"), "x", "other values as given");
	}
	free(v);
	pg_dns_stale(d);
	pg_dns_free(d);
	pg_hosts_free(&h);

	if (pg_hosts_parse(&h, "host=nowhere.invalid,also.invalid "
			   "target_session_attrs=read-write", err,
			   sizeof(err)) < 0) {
		ok(0, "parse: %s", err);
		return;
	}
	d = pg_dns_new(&h);
	v = pg_dns_values(d, &h, 1, why, sizeof(why));
	ok(v == NULL && strstr(why, "cannot resolve also.invalid") != NULL,
	   "a host without an address: no values, why says so (%s)", why);
	free(v);
	pg_dns_free(d);
	pg_hosts_free(&h);

	if (pg_hosts_parse(&h, "host=db.invalid hostaddr=10.0.0.9 port=7",
			   err, sizeof(err)) < 0) {
		ok(0, "parse: %s", err);
		return;
	}
	d = pg_dns_new(&h);
	v = pg_dns_values(d, &h, 0, why, sizeof(why));
	ok(v != NULL && strcmp(value(&h, v, "host"), "db.invalid") == 0 &&
	   strcmp(value(&h, v, "hostaddr"), "10.0.0.9") == 0,
	   "a host given its address is not looked up");
	free(v);
	pg_dns_free(d);
	pg_hosts_free(&h);
}

int main(void)
{
	split_by_host();
	resolved_values();
	return tap_done();
}
