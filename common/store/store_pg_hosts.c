/*
 * store_pg_hosts.c - a connection string split by host (see
 * store_pg_hosts.h).
 */
#include "store_pg_hosts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

/* Split the comma-separated list s (modified) into out; returns the
 * count, or PG_HOSTS_MAX + 1 when there are more. NULL: one NULL. */
static int split(char *s, char **out)
{
	int n = 0;

	if (s == NULL) {
		out[0] = NULL;
		return 1;
	}
	for (;;) {
		char *comma = strchr(s, ',');

		if (n == PG_HOSTS_MAX)
			return PG_HOSTS_MAX + 1;
		out[n++] = s;
		if (comma == NULL)
			return n;
		*comma = '\0';
		s = comma + 1;
	}
}

static char *dup_into(char **at, const char *s)
{
	char *r = *at;

	if (s == NULL)
		return NULL;
	strcpy(r, s);
	*at += strlen(s) + 1;
	return r;
}

static bool wants_primary(const char *tsa)
{
	return tsa == NULL || strcmp(tsa, "read-write") == 0 ||
	       strcmp(tsa, "primary") == 0;
}

/*
 * Parameters every connection gets unless the string sets them. The
 * store's sessions are long-lived and often idle (the listener always):
 * a flow that a NAT or a load balancer forgot without a reset must fail
 * in seconds, not after the kernel's two hours of TCP keepalive. Idle
 * 5 s, then a probe every 2 s, 3 unanswered: down after 11 s; data sent
 * and not acknowledged for 10 s: down (tcp_user_timeout, Linux). The
 * listener also probes itself every second (store_pg_conn.c).
 */
static const char *const defaults[][2] = {
	{ "target_session_attrs", "read-write" },
	{ "keepalives", "1" },
	{ "keepalives_idle", "5" },
	{ "keepalives_interval", "2" },
	{ "keepalives_count", "3" },
	{ "tcp_user_timeout", "10000" },
};

/* What keyword is set to when the string leaves it out; NULL: libpq's
 * own default. */
static const char *default_of(const char *keyword)
{
	for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
		if (strcmp(defaults[i][0], keyword) == 0)
			return defaults[i][1];
	return NULL;
}

/* The host, hostaddr and port lists of a string, split. */
struct lists {
	char *hv[PG_HOSTS_MAX], *av[PG_HOSTS_MAX], *pv[PG_HOSTS_MAX];
	int nh, na, np, n;
	const char *host, *port;	/* as given, for the labels */
};

/* The keywords every set passes to libpq: every option set, host, hostaddr
 * and port always (their values differ by host), and those the store
 * gives a default. Returns how many. */
static int set_keywords(struct pg_hosts *h, const PQconninfoOption *opts)
{
	int nkw = 0;

	h->ihost = h->iaddr = h->iport = -1;
	for (const PQconninfoOption *o = opts; o->keyword != NULL; o++) {
		bool per_host = strcmp(o->keyword, "host") == 0 ||
				strcmp(o->keyword, "hostaddr") == 0 ||
				strcmp(o->keyword, "port") == 0;

		if (o->val == NULL && !per_host &&
		    default_of(o->keyword) == NULL)
			continue;
		if (strcmp(o->keyword, "host") == 0)
			h->ihost = nkw;
		else if (strcmp(o->keyword, "hostaddr") == 0)
			h->iaddr = nkw;
		else if (strcmp(o->keyword, "port") == 0)
			h->iport = nkw;
		h->keywords[nkw++] = o->keyword;
	}
	return nkw;
}

/* Set i: its values, the hosts it names, its label. -1: out of memory. */
static int set_host(struct pg_hosts *h, int i, int nkw,
		    const PQconninfoOption *opts, const struct lists *l)
{
	const PQconninfoOption *o;
	const char *hs, *ps;

	h->values[i] = calloc((size_t)nkw + 1, sizeof(char *));
	if (h->values[i] == NULL)
		return -1;
	for (int k = 0; k < nkw; k++) {
		for (o = opts; o->keyword != h->keywords[k]; o++)
			;
		h->values[i][k] = o->val != NULL ? o->val :
				  default_of(o->keyword);
	}
	if (h->probe) {
		if (h->ihost >= 0)
			h->values[i][h->ihost] = l->nh > 1 ? l->hv[i] : l->hv[0];
		if (h->iaddr >= 0)
			h->values[i][h->iaddr] = l->na > 1 ? l->av[i] : l->av[0];
		if (h->iport >= 0)
			h->values[i][h->iport] = l->np > 1 ? l->pv[i] : l->pv[0];
	}
	for (int e = 0; e < (h->probe ? 1 : l->n); e++) {
		int x = h->probe ? i : e;

		h->ent[i][e].host = l->nh > 1 ? l->hv[x] : l->hv[0];
		h->ent[i][e].hostaddr = l->na > 1 ? l->av[x] : l->av[0];
		h->ent[i][e].port = l->np > 1 ? l->pv[x] : l->pv[0];
	}
	h->nent[i] = h->probe ? 1 : l->n;
	hs = l->nh > 1 ? l->hv[i] : l->hv[0];
	if (hs == NULL || hs[0] == '\0')
		hs = l->na > 1 ? l->av[i] : l->av[0];
	ps = l->np > 1 ? l->pv[i] : l->pv[0];
	snprintf(h->label[i], sizeof(h->label[i]), "%s:%s",
		 hs != NULL && hs[0] != '\0' && h->probe ? hs :
		 l->host != NULL ? l->host : "(default)",
		 ps != NULL && ps[0] != '\0' && h->probe ? ps :
		 l->port != NULL ? l->port : "5432");
	return 0;
}

int pg_hosts_parse(struct pg_hosts *h, const char *conninfo, char *err,
		   size_t errlen)
{
	char *perr = NULL, *at;
	PQconninfoOption *opts = PQconninfoParse(conninfo, &perr), *o;
	const char *hostaddr = NULL, *tsa = NULL;
	struct lists l = { .host = NULL };
	int nkw;
	size_t len = 4, total = 0;

	memset(h, 0, sizeof(*h));
	if (opts == NULL) {
		snprintf(err, errlen, "--store: %s",
			 perr != NULL ? perr : "out of memory");
		PQfreemem(perr);
		return -1;
	}
	h->opts = opts;
	for (o = opts; o->keyword != NULL; o++) {
		total++;
		if (o->val == NULL)
			continue;
		if (strcmp(o->keyword, "host") == 0)
			l.host = o->val;
		else if (strcmp(o->keyword, "hostaddr") == 0)
			hostaddr = o->val;
		else if (strcmp(o->keyword, "port") == 0)
			l.port = o->val;
		else if (strcmp(o->keyword, "target_session_attrs") == 0)
			tsa = o->val;
		len += strlen(o->val) + 1;
	}
	h->buf = malloc(len);
	h->keywords = calloc(total + 1, sizeof(char *));
	if (h->buf == NULL || h->keywords == NULL)
		goto oom;
	at = h->buf;
	l.nh = split(dup_into(&at, l.host), l.hv);
	l.na = split(dup_into(&at, hostaddr), l.av);
	l.np = split(dup_into(&at, l.port), l.pv);
	l.n = l.nh > l.na ? l.nh : l.na;
	if (l.n > PG_HOSTS_MAX || l.np > PG_HOSTS_MAX) {
		snprintf(err, errlen, "--store: more than %d hosts", PG_HOSTS_MAX);
		goto fail;
	}
	if ((l.host != NULL && hostaddr != NULL && l.nh != l.na) ||
	    (l.np > 1 && l.np != l.n)) {
		snprintf(err, errlen, "--store: %d hosts, %d host addresses and "
			 "%d ports do not match", l.nh, l.na, l.np);
		goto fail;
	}
	h->probe = l.n > 1 && wants_primary(tsa);
	h->n = h->probe ? l.n : 1;
	nkw = set_keywords(h, opts);
	for (int i = 0; i < h->n; i++)
		if (set_host(h, i, nkw, opts, &l) < 0)
			goto oom;
	return 0;
oom:
	snprintf(err, errlen, "--store: out of memory");
fail:
	pg_hosts_free(h);
	return -1;
}

void pg_hosts_free(struct pg_hosts *h)
{
	for (int i = 0; i < PG_HOSTS_MAX; i++)
		free(h->values[i]);
	free(h->keywords);
	free(h->buf);
	if (h->opts != NULL)
		PQconninfoFree(h->opts);
	memset(h, 0, sizeof(*h));
}
