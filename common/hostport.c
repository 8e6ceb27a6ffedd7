/*
 * hostport.c - addresses and URLs of the settings (see hostport.h).
 *
 * Nothing is resolved here: a name is only checked to be plausible, so that
 * a typo is a configuration error at start-up and a name that does not
 * resolve is the connecting side's error later.
 */
#include "hostport.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "setting.h"

void hostport_clear(struct hostport *hp)
{
	free(hp->host);
	free(hp->port);
	hp->host = NULL;
	hp->port = NULL;
}

/* A host name: letters, digits, '-', '_' and '.', no empty label. */
static bool valid_hostname(const char *h)
{
	size_t i, n = strlen(h);

	if (n == 0 || n > 253 || h[0] == '.' || strstr(h, "..") != NULL)
		return false;
	for (i = 0; i < n; i++) {
		char ch = h[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' ||
		      ch == '.'))
			return false;
	}
	return true;
}

/* "[v6]:port" or "[v6]" with a default port. */
static int split_bracketed(const char *s, const char *defport, char **host,
			   char **port, char *err, size_t errlen)
{
	unsigned char addr[16];
	const char *p = strchr(s, ']');
	char sh[80];

	if (p == NULL) {
		snprintf(err, errlen, "invalid address \"%s\" (missing ']')",
			 setting_shown(s, sh, sizeof(sh)));
		return -1;
	}
	*host = strndup(s + 1, (size_t)(p - s - 1));
	if (*host == NULL)
		goto nomem;
	if (inet_pton(AF_INET6, *host, addr) != 1) {
		snprintf(err, errlen, "invalid IPv6 address \"%s\"",
			 setting_shown(*host, sh, sizeof(sh)));
		return -1;
	}
	p++;
	if (*p == ':') {
		*port = strdup(p + 1);
	} else if (*p == '\0' && defport != NULL) {
		*port = strdup(defport);
	} else {
		snprintf(err, errlen, "invalid address \"%s\" (expected [IPV6]:PORT)",
			 setting_shown(s, sh, sizeof(sh)));
		return -1;
	}
	if (*port == NULL)
		goto nomem;
	return 0;
nomem:
	snprintf(err, errlen, "out of memory");
	return -1;
}

/* "host:port", "1.2.3.4:port" or a bare host with a default port. */
static int split_plain(const char *s, const char *defport, char **host,
		       char **port, char *err, size_t errlen)
{
	const char *colon = strrchr(s, ':');
	unsigned char addr[16];
	char sh[80];

	if (colon == NULL && defport == NULL) {
		snprintf(err, errlen, "invalid address \"%s\" (missing :PORT)",
			 setting_shown(s, sh, sizeof(sh)));
		return -1;
	}
	*host = colon ? strndup(s, (size_t)(colon - s)) : strdup(s);
	*port = strdup(colon ? colon + 1 : defport);
	if (*host == NULL || *port == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (strchr(*host, ':') != NULL) {
		snprintf(err, errlen, "invalid address \"%s\" (an IPv6 address "
			 "needs brackets, e.g. [::1]:8080)",
			 setting_shown(s, sh, sizeof(sh)));
		return -1;
	}
	if ((*host)[0] == '\0') {
		snprintf(err, errlen, "invalid address \"%s\" (missing host; "
			 "use 0.0.0.0 or [::] for all addresses)",
			 setting_shown(s, sh, sizeof(sh)));
		return -1;
	}
	if (strspn(*host, "0123456789.") == strlen(*host)) {
		if (inet_pton(AF_INET, *host, addr) != 1) {
			snprintf(err, errlen, "invalid IPv4 address \"%s\"",
				 setting_shown(*host, sh, sizeof(sh)));
			return -1;
		}
	} else if (!valid_hostname(*host)) {
		snprintf(err, errlen, "invalid host name \"%s\"",
			 setting_shown(*host, sh, sizeof(sh)));
		return -1;
	}
	return 0;
}

int hostport_parse(const char *s, const char *defport, int min_port,
		   struct hostport *hp, char *err, size_t errlen)
{
	char *host = NULL, *port = NULL;
	char sh[80];
	uint64_t n;
	int rc;

	if (s[0] == '[')
		rc = split_bracketed(s, defport, &host, &port, err, errlen);
	else
		rc = split_plain(s, defport, &host, &port, err, errlen);
	if (rc < 0)
		goto fail;
	if (strlen(port) > 5 || setting_parse_uint(port, 65535, &n) < 0 ||
	    n < (uint64_t)min_port) {
		snprintf(err, errlen, "invalid port \"%s\" (use %d-65535)",
			 setting_shown(port, sh, sizeof(sh)), min_port);
		goto fail;
	}
	/* canonical form: "08080" and "8080" are the same port */
	snprintf(port, strlen(port) + 1, "%u", (unsigned)n);
	hostport_clear(hp);
	hp->host = host;
	hp->port = port;
	return 0;
fail:
	free(host);
	free(port);
	return -1;
}

/* The path of an upstream URL: visible ASCII, trailing '/'s dropped. */
static char *url_prefix(const char *url, const char *slash, char *err,
			size_t errlen)
{
	char *prefix = strdup(slash ? slash : "");
	char sh[80];
	size_t i, n;

	if (prefix == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	/* it is pasted in front of request-targets */
	for (i = 0; prefix[i] != '\0'; i++) {
		if (prefix[i] <= 0x20 || prefix[i] >= 0x7f) {
			snprintf(err, errlen, "invalid URL \"%s\" (the path may only "
				 "hold visible ASCII)", setting_shown(url, sh, sizeof(sh)));
			free(prefix);
			return NULL;
		}
	}
	for (n = strlen(prefix); n > 0 && prefix[n - 1] == '/'; n--)
		prefix[n - 1] = '\0';
	return prefix;
}

int hostport_parse_http_url(const char *url, struct hostport *hp,
			    char **prefix, bool *tls, char *err, size_t errlen)
{
	const char *auth, *slash;
	char *authority = NULL, *p;
	bool https = strncasecmp(url, "https://", 8) == 0;
	char sh[80];
	int ret = -1;

	if (!https && strncasecmp(url, "http://", 7) != 0) {
		snprintf(err, errlen, "invalid URL \"%s\" (expected "
			 "http[s]://HOST[:PORT][/PREFIX])",
			 setting_shown(url, sh, sizeof(sh)));
		goto fail;
	}
	auth = url + (https ? 8 : 7);
	if (strpbrk(auth, "?#") != NULL) {
		snprintf(err, errlen, "invalid URL \"%s\" (no query or fragment "
			 "allowed)", setting_shown(url, sh, sizeof(sh)));
		goto fail;
	}
	slash = strchr(auth, '/');
	authority = strndup(auth, slash ? (size_t)(slash - auth) : strlen(auth));
	if (authority == NULL) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (strchr(authority, '@') != NULL || authority[0] == '\0') {
		snprintf(err, errlen, "invalid URL \"%s\" (%s)",
			 setting_shown(url, sh, sizeof(sh)), authority[0] == '\0' ?
			 "missing host" : "no user info allowed");
		goto fail;
	}
	if (hostport_parse(authority, https ? "443" : "80", 1, hp, err,
			   errlen) < 0)
		goto fail;
	p = url_prefix(url, slash, err, errlen);
	if (p == NULL)
		goto fail;
	free(*prefix);
	*prefix = p;
	*tls = https;
	ret = 0;
fail:
	free(authority);
	return ret;
}

/* A Redis Sentinel master name: what sentinel.conf accepts, kept short. */
static bool valid_master(const char *m, size_t n)
{
	if (n == 0 || n > 64)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((m[i] >= 'a' && m[i] <= 'z') || (m[i] >= 'A' && m[i] <= 'Z') ||
		      (m[i] >= '0' && m[i] <= '9') || m[i] == '-' || m[i] == '_' ||
		      m[i] == '.'))
			return false;
	return true;
}

#define SENTINEL_SCHEME "redis-sentinel://"
#define SENTINEL_SYNTAX SENTINEL_SCHEME "HOST[:PORT][,HOST[:PORT]...]/MASTER[/DB]"

/* redis-sentinel://...: hp->host the sentinels, canonical, hp->port NULL. */
static int parse_sentinel_url(const char *url, struct hostport *hp,
			      char **master, int *db, char *err, size_t errlen)
{
	const char *auth = url + strlen(SENTINEL_SCHEME), *slash, *name, *end;
	char *list = NULL, *item, *save = NULL, *out = NULL;
	size_t cap, used = 0;
	uint64_t n = 0;
	int count = 0, ret = -1;
	char sh[80];

	slash = strchr(auth, '/');
	if (slash == NULL || slash == auth || strpbrk(url, "@?#") != NULL) {
		snprintf(err, errlen, "invalid URL \"%s\" (expected %s)",
			 setting_shown(url, sh, sizeof(sh)), SENTINEL_SYNTAX);
		return -1;
	}
	name = slash + 1;
	end = strchr(name, '/');
	if (!valid_master(name, end ? (size_t)(end - name) : strlen(name))) {
		snprintf(err, errlen, "invalid master name in \"%s\" (letters, "
			 "digits, '-', '_', '.'; at most 64)",
			 setting_shown(url, sh, sizeof(sh)));
		return -1;
	}
	if (end != NULL && setting_parse_uint(end + 1, 2147483647, &n) < 0) {
		snprintf(err, errlen, "invalid database number \"%s\"",
			 setting_shown(end + 1, sh, sizeof(sh)));
		return -1;
	}
	list = strndup(auth, (size_t)(slash - auth));
	cap = 2 * (size_t)(slash - auth) + 64;
	out = calloc(1, cap);
	if (list == NULL || out == NULL)
		goto oom;
	for (item = strtok_r(list, ",", &save); item != NULL;
	     item = strtok_r(NULL, ",", &save)) {
		struct hostport one = { 0 };
		bool v6;

		if (++count > HOSTPORT_SENTINELS_MAX) {
			snprintf(err, errlen, "more than %d sentinels",
				 HOSTPORT_SENTINELS_MAX);
			goto fail;
		}
		if (hostport_parse(item, "26379", 1, &one, err, errlen) < 0)
			goto fail;
		v6 = strchr(one.host, ':') != NULL;
		used += (size_t)snprintf(out + used, cap - used, "%s%s%s%s:%s",
					 used ? "," : "", v6 ? "[" : "", one.host,
					 v6 ? "]" : "", one.port);
		hostport_clear(&one);
	}
	if (count == 0) {
		snprintf(err, errlen, "no sentinel in \"%s\"",
			 setting_shown(url, sh, sizeof(sh)));
		goto fail;
	}
	*master = strndup(name, end ? (size_t)(end - name) : strlen(name));
	if (*master == NULL)
		goto oom;
	hostport_clear(hp);
	hp->host = out;
	out = NULL;
	*db = (int)n;
	ret = 0;
	goto fail;
oom:
	snprintf(err, errlen, "out of memory");
fail:
	free(list);
	free(out);
	return ret;
}

int hostport_parse_redis_url(const char *url, struct hostport *hp, int *db,
			     char **master, char *err, size_t errlen)
{
	const char *auth, *slash;
	char *authority = NULL;
	uint64_t n = 0;
	char sh[80];
	int ret = -1;

	free(*master);
	*master = NULL;
	if (strncasecmp(url, SENTINEL_SCHEME, strlen(SENTINEL_SCHEME)) == 0)
		return parse_sentinel_url(url, hp, master, db, err, errlen);
	if (strncasecmp(url, "rediss://", 9) == 0) {
		snprintf(err, errlen, "TLS to Redis (rediss://) is not supported");
		goto fail;
	}
	if (strncasecmp(url, "redis://", 8) != 0) {
		snprintf(err, errlen, "invalid URL \"%s\" (expected "
			 "redis://HOST[:PORT][/DB] or %s)",
			 setting_shown(url, sh, sizeof(sh)), SENTINEL_SYNTAX);
		goto fail;
	}
	auth = url + 8;
	slash = strchr(auth, '/');
	authority = slash ? strndup(auth, (size_t)(slash - auth)) : strdup(auth);
	if (authority == NULL) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (authority[0] == '\0' || strpbrk(authority, "@?#") != NULL) {
		snprintf(err, errlen, "invalid URL \"%s\" (expected "
			 "redis://HOST[:PORT][/DB], no user info or query)",
			 setting_shown(url, sh, sizeof(sh)));
		goto fail;
	}
	if (slash != NULL && setting_parse_uint(slash + 1, 2147483647, &n) < 0) {
		snprintf(err, errlen, "invalid database number \"%s\"",
			 setting_shown(slash + 1, sh, sizeof(sh)));
		goto fail;
	}
	if (hostport_parse(authority, "6379", 1, hp, err, errlen) < 0)
		goto fail;
	*db = (int)n;
	ret = 0;
fail:
	free(authority);
	return ret;
}
