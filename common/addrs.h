/*
 * addrs.h - every address a host name resolves to, in the resolver's order.
 *
 * A name commonly has more than one: Debian's and Ubuntu's /etc/hosts give
 * "localhost" both ::1 and 127.0.0.1 (getaddrinfo() returns ::1 first),
 * and a service name may have several A/AAAA records. The connecting side
 * tries them in turn and remembers which one answered (upstream.c, the
 * Redis store); the listening side binds them all (main.c, admin.c).
 */
#ifndef IDEMPROXY_ADDRS_H
#define IDEMPROXY_ADDRS_H

#include <stddef.h>
#include <sys/socket.h>

#include "compiler.h"

struct addrinfo;

/* Beyond this many, the rest of a resolver's answer is ignored. */
#define ADDRS_MAX 8
/* "[v6]:port" at its longest, with the terminating NUL. */
#define ADDRS_STRLEN 64

struct addrs {
	int n;
	struct sockaddr_storage ss[ADDRS_MAX];
	socklen_t len[ADDRS_MAX];
};

/* Copy the distinct IPv4/IPv6 addresses of an addrinfo list into a, in its
 * order, at most ADDRS_MAX. Returns how many were kept. */
int addrs_from_addrinfo(struct addrs *a, const struct addrinfo *ai);

/*
 * Resolve host:port into a (blocking getaddrinfo: at start only, or on a
 * thread that may block). `passive` is for an address to listen on. On
 * error a->n is 0 and err says why, naming `what` (e.g. "--listen").
 */
int addrs_resolve(struct addrs *a, const char *host, const char *port,
		  int passive, const char *what, char *err,
		  size_t errlen) MUSTCHECK;

/* "127.0.0.1:8000" or "[::1]:8000" (numeric) into buf; returns buf. */
const char *addrs_str(const struct sockaddr *sa, socklen_t len, char *buf,
		      size_t buflen);

/* The numeric host alone ("::1", without brackets) into buf; returns buf. */
const char *addrs_host(const struct sockaddr *sa, socklen_t len, char *buf,
		       size_t buflen);

#endif
