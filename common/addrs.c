/*
 * addrs.c - the address list of a host name (see addrs.h).
 */
#include "addrs.h"

#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static bool same(const struct sockaddr_storage *a, socklen_t alen,
		 const struct sockaddr *b, socklen_t blen)
{
	return alen == blen && memcmp(a, b, blen) == 0;
}

int addrs_from_addrinfo(struct addrs *a, const struct addrinfo *ai)
{
	a->n = 0;
	for (; ai != NULL && a->n < ADDRS_MAX; ai = ai->ai_next) {
		bool dup = false;

		if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
		    ai->ai_addrlen > sizeof(a->ss[0]))
			continue;
		for (int i = 0; i < a->n && !dup; i++)
			dup = same(&a->ss[i], a->len[i], ai->ai_addr,
				   ai->ai_addrlen);
		if (dup)
			continue;
		memset(&a->ss[a->n], 0, sizeof(a->ss[a->n]));
		memcpy(&a->ss[a->n], ai->ai_addr, ai->ai_addrlen);
		a->len[a->n] = ai->ai_addrlen;
		a->n++;
	}
	return a->n;
}

int addrs_resolve(struct addrs *a, const char *host, const char *port,
		  int passive, const char *what, char *err, size_t errlen)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM,
				  .ai_flags = passive ? AI_PASSIVE : 0 };
	struct addrinfo *res = NULL;
	int rc;

	a->n = 0;
	rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0) {
		snprintf(err, errlen, "%s: cannot resolve %s:%s: %s", what,
			 host, port, gai_strerror(rc));
		return -1;
	}
	addrs_from_addrinfo(a, res);
	freeaddrinfo(res);
	if (a->n == 0) {
		snprintf(err, errlen, "%s: %s:%s has no IPv4 or IPv6 address",
			 what, host, port);
		return -1;
	}
	return 0;
}

const char *addrs_host(const struct sockaddr *sa, socklen_t len, char *buf,
		       size_t buflen)
{
	if (getnameinfo(sa, len, buf, (socklen_t)buflen, NULL, 0,
			NI_NUMERICHOST) != 0)
		snprintf(buf, buflen, "?");
	return buf;
}

const char *addrs_str(const struct sockaddr *sa, socklen_t len, char *buf,
		      size_t buflen)
{
	char h[NI_MAXHOST], p[NI_MAXSERV];

	if (getnameinfo(sa, len, h, sizeof(h), p, sizeof(p),
			NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
		snprintf(buf, buflen, "?");
		return buf;
	}
	snprintf(buf, buflen, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s",
		 h, p);
	return buf;
}
