/*
 * hostport.h - the address settings: "ADDR:PORT" for listening sockets,
 * http:// for the upstream, redis:// for the cache, each split into a host
 * and a port that getaddrinfo() takes as they are.
 */
#ifndef IDEMPROXY_HOSTPORT_H
#define IDEMPROXY_HOSTPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "compiler.h"

/* "host:port" split; host is an IP literal or a name, without brackets. */
struct hostport {
	char *host;
	char *port;
};

/*
 * Split "host:port", "[v6]:port" or, when defport is given, a bare host
 * into hp (both strings allocated; brackets removed; the port canonical,
 * "08080" is "8080"). The host must be an IP literal or a plausible name;
 * the port numeric, min_port..65535. On error hp is unchanged.
 */
int hostport_parse(const char *s, const char *defport, int min_port,
		   struct hostport *hp, char *err, size_t errlen) MUSTCHECK;

/* http[s]://HOST[:PORT][/PREFIX] into hp, *prefix ("" or "/prefix" without
 * a trailing '/', allocated) and *tls (https; the port defaults to 443).
 * Neither user info, query nor fragment. */
int hostport_parse_http_url(const char *url, struct hostport *hp,
			    char **prefix, bool *tls, char *err,
			    size_t errlen) MUSTCHECK;

#define HOSTPORT_SENTINELS_MAX 8

/*
 * redis://HOST[:PORT][/DB] into hp and *db (0 when none), *master NULL; or
 * redis-sentinel://HOST[:PORT][,HOST[:PORT]...]/MASTER[/DB] (sentinel
 * ports default to 26379): hp->host is then the sentinels as a canonical
 * list ("10.0.0.1:26379,[::1]:26379"), hp->port NULL, *master the master's
 * name (allocated). Whatever *master held is freed first.
 */
int hostport_parse_redis_url(const char *url, struct hostport *hp, int *db,
			     char **master, char *err, size_t errlen) MUSTCHECK;

/* Free both strings and set them to NULL. */
void hostport_clear(struct hostport *hp);

#endif
