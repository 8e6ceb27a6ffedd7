/*
 * store_pg_dns.c - PostgreSQL host names resolved by a thread of their own
 * (see store_pg_dns.h).
 *
 * The owner and the thread share one struct, counted (refs): the thread is
 * detached, so that freeing the store never waits on a lookup that takes
 * as long as the resolver's timeouts; whichever lets go last frees it.
 */
#include "store_pg_dns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "addrs.h"
#include "log.h"

struct pg_dns_name {
	char *name;
	struct addrs addrs;		/* under mu; n 0: none (yet) */
	char err[96];			/* under mu: why not */
};

struct pg_dns {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs;			/* owner, thread: under mu */
	bool stop, again;		/* under mu */
	bool looked;			/* under mu: the first pass is done */
	int nnames;			/* fixed after pg_dns_new */
	struct pg_dns_name names[PG_HOSTS_MAX];
};

/* Does libpq resolve this host by name? (Not a number, a socket
 * directory, nor a host whose address is given.) */
static bool needs_lookup(const struct pg_host_entry *e)
{
	unsigned char buf[sizeof(struct in6_addr)];

	if (e->host == NULL || e->host[0] == '\0' || e->host[0] == '/' ||
	    e->host[0] == '@' || (e->hostaddr != NULL && e->hostaddr[0] != '\0'))
		return false;
	return inet_pton(AF_INET, e->host, buf) != 1 &&
	       inet_pton(AF_INET6, e->host, buf) != 1;
}

static int find_name(const struct pg_dns *d, const char *name)
{
	for (int i = 0; i < d->nnames; i++)
		if (strcmp(d->names[i].name, name) == 0)
			return i;
	return -1;
}

/* Look every name up (blocking, without the lock), then publish. */
static void resolve_all(struct pg_dns *d)
{
	for (int i = 0; i < d->nnames; i++) {
		struct pg_dns_name *nm = &d->names[i];
		struct addrinfo hints = { .ai_family = AF_UNSPEC,
					  .ai_socktype = SOCK_STREAM };
		struct addrinfo *ai = NULL;
		struct addrs a = { 0 };
		int rc = getaddrinfo(nm->name, NULL, &hints, &ai);

		if (rc == 0) {
			addrs_from_addrinfo(&a, ai);
			freeaddrinfo(ai);
		}
		pthread_mutex_lock(&d->mu);
		if (a.n > 0) {
			nm->addrs = a;
			nm->err[0] = '\0';
		} else {
			/* keep the last good answer: a resolver that fails
			 * now says nothing about where the host is */
			snprintf(nm->err, sizeof(nm->err), "%s", rc != 0 ?
				 gai_strerror(rc) : "no IPv4 or IPv6 address");
		}
		pthread_mutex_unlock(&d->mu);
	}
}

static void dns_destroy(struct pg_dns *d)
{
	for (int i = 0; i < d->nnames; i++)
		free(d->names[i].name);
	pthread_cond_destroy(&d->cv);
	pthread_mutex_destroy(&d->mu);
	free(d);
}

/* Drop one reference (d->mu held, released here). */
static void dns_unref_locked(struct pg_dns *d)
{
	bool last = --d->refs == 0;

	pthread_mutex_unlock(&d->mu);
	if (last)
		dns_destroy(d);
}

static void *dns_main(void *arg)
{
	struct pg_dns *d = arg;

	pthread_mutex_lock(&d->mu);
	while (!d->stop) {
		struct timespec until;
		struct timespec pause = { 0, PG_DNS_MIN_MS * 1000000L };

		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += PG_DNS_REFRESH_MS / 1000;
		while (!d->stop && !d->again &&
		       pthread_cond_timedwait(&d->cv, &d->mu, &until) != ETIMEDOUT)
			;
		if (d->stop)
			break;
		d->again = false;
		pthread_mutex_unlock(&d->mu);
		resolve_all(d);
		pthread_mutex_lock(&d->mu);
		if (!d->looked) {
			d->looked = true;
			pthread_cond_broadcast(&d->cv);
		}
		pthread_mutex_unlock(&d->mu);
		nanosleep(&pause, NULL);
		pthread_mutex_lock(&d->mu);
	}
	dns_unref_locked(d);
	return NULL;
}

/* Give the first lookups PG_DNS_START_MS: the first connections then
 * find their addresses; a resolver slower than that delays only them. */
static void wait_first(struct pg_dns *d)
{
	struct timespec until;

	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += PG_DNS_START_MS / 1000;
	pthread_mutex_lock(&d->mu);
	while (!d->looked &&
	       pthread_cond_timedwait(&d->cv, &d->mu, &until) != ETIMEDOUT)
		;
	for (int i = 0; i < d->nnames; i++)
		if (d->names[i].addrs.n == 0)
			log_warn("postgres store: cannot resolve %s yet: %s",
				 d->names[i].name, d->names[i].err[0] ?
				 d->names[i].err : "no answer in time");
	pthread_mutex_unlock(&d->mu);
}

struct pg_dns *pg_dns_new(const struct pg_hosts *h)
{
	struct pg_dns *d = calloc(1, sizeof(*d));
	pthread_condattr_t ca;
	pthread_attr_t ta;
	pthread_t t;

	if (d == NULL)
		return NULL;
	for (int i = 0; i < h->n; i++)
		for (int e = 0; e < h->nent[i]; e++) {
			const struct pg_host_entry *en = &h->ent[i][e];

			if (!needs_lookup(en) || find_name(d, en->host) >= 0 ||
			    d->nnames == PG_HOSTS_MAX)
				continue;
			d->names[d->nnames].name = strdup(en->host);
			if (d->names[d->nnames].name == NULL)
				goto oom;
			d->nnames++;
		}
	pthread_mutex_init(&d->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->cv, &ca);
	pthread_condattr_destroy(&ca);
	d->refs = 1;
	if (d->nnames == 0)
		return d;
	pthread_attr_init(&ta);
	pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
	d->refs = 2;
	d->again = true;
	if (pthread_create(&t, &ta, dns_main, d) != 0) {
		d->refs = 1;
		log_warn("postgres store: no resolver thread; host names are "
			 "looked up once, now");
		resolve_all(d);
		d->looked = true;
	}
	pthread_attr_destroy(&ta);
	wait_first(d);
	return d;
	pthread_attr_destroy(&ta);
	return d;
oom:
	for (int i = 0; i < d->nnames; i++)
		free(d->names[i].name);
	free(d);
	return NULL;
}

void pg_dns_stale(struct pg_dns *d)
{
	if (d == NULL || d->nnames == 0)
		return;
	pthread_mutex_lock(&d->mu);
	d->again = true;
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
}

void pg_dns_free(struct pg_dns *d)
{
	if (d == NULL)
		return;
	pthread_mutex_lock(&d->mu);
	d->stop = true;
	pthread_cond_signal(&d->cv);
	dns_unref_locked(d);
}

/* The comma-separated lists being built, each in its own buffer. */
struct lists {
	char *s[3];			/* host, hostaddr, port */
	size_t len[3], cap;
};

static void add(struct lists *l, const char *host, const char *addr,
		const char *port)
{
	const char *v[3] = { host, addr, port };

	for (int k = 0; k < 3; k++) {
		const char *x = v[k] != NULL ? v[k] : "";

		l->len[k] += (size_t)snprintf(l->s[k] + l->len[k],
					      l->cap - l->len[k], "%s%s",
					      l->len[k] > 0 ? "," : "", x);
	}
}

const char **pg_dns_values(struct pg_dns *d, const struct pg_hosts *h,
			   int set, char *why, size_t whylen)
{
	size_t nkw = 0, cap = 1;
	struct lists l;
	const char **v;
	char *at;
	int emitted = 0;
	bool rewrite = false;

	while (h->keywords[nkw] != NULL)
		nkw++;
	for (int e = 0; e < h->nent[set]; e++) {
		const struct pg_host_entry *en = &h->ent[set][e];

		rewrite |= needs_lookup(en);
		cap += ADDRS_MAX * ((en->host ? strlen(en->host) : 0) +
				    (en->port ? strlen(en->port) : 0) +
				    ADDRS_STRLEN + 2);
	}
	if (!rewrite || d == NULL || h->ihost < 0 || h->iaddr < 0 ||
	    h->iport < 0)
		cap = 0;
	v = malloc((nkw + 1) * sizeof(*v) + 3 * cap);
	if (v == NULL) {
		snprintf(why, whylen, "out of memory");
		return NULL;
	}
	memcpy(v, h->values[set], (nkw + 1) * sizeof(*v));
	if (cap == 0)
		return v;
	at = (char *)(v + nkw + 1);
	l.cap = cap;
	for (int k = 0; k < 3; k++) {
		l.s[k] = at + (size_t)k * cap;
		l.s[k][0] = '\0';
		l.len[k] = 0;
	}
	why[0] = '\0';
	pthread_mutex_lock(&d->mu);
	for (int e = 0; e < h->nent[set]; e++) {
		const struct pg_host_entry *en = &h->ent[set][e];
		const struct pg_dns_name *nm;
		int i;

		if (!needs_lookup(en)) {
			add(&l, en->host, en->hostaddr, en->port);
			emitted++;
			continue;
		}
		i = find_name(d, en->host);
		nm = i >= 0 ? &d->names[i] : NULL;
		if (nm == NULL || nm->addrs.n == 0) {
			snprintf(why, whylen, "cannot resolve %s: %s", en->host,
				 nm != NULL && nm->err[0] ? nm->err :
				 "not looked up yet");
			continue;
		}
		for (int j = 0; j < nm->addrs.n; j++) {
			char addr[ADDRS_STRLEN];

			addrs_host((const struct sockaddr *)&nm->addrs.ss[j],
				   nm->addrs.len[j], addr, sizeof(addr));
			add(&l, en->host, addr, en->port);
			emitted++;
		}
	}
	pthread_mutex_unlock(&d->mu);
	if (emitted == 0) {
		free(v);
		return NULL;
	}
	v[h->ihost] = l.s[0];
	v[h->iaddr] = l.s[1];
	v[h->iport] = l.s[2];
	return v;
}
