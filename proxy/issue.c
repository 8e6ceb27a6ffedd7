/*
 * issue.c - minting and checking issued keys (see issue.h).
 */
#include "issue.h"

#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "config.h"

bool issue_is_path(const char *target)
{
	size_t n = strcspn(target, "?");

	return n == sizeof(ISSUE_PATH) - 1 && memcmp(target, ISSUE_PATH, n) == 0;
}

int issue_mint(char key[IDEMKEY_MAX + 1], time_t now)
{
	unsigned char raw[16], b64[32];
	int n;

	if (RAND_bytes(raw, sizeof(raw)) != 1)
		return -1;
	n = EVP_EncodeBlock(b64, raw, sizeof(raw));
	while (n > 0 && b64[n - 1] == '=')
		n--;
	for (int i = 0; i < n; i++)
		b64[i] = b64[i] == '+' ? '-' : b64[i] == '/' ? '_' : b64[i];
	snprintf(key, IDEMKEY_MAX + 1, "%.*s.%lld", n, (char *)b64,
		 (long long)now);
	return 0;
}

uint64_t issue_marker_ttl(const struct config *cfg)
{
	uint64_t ttl = cfg->issued_key_ttl_ms;

	for (int i = 0; i < cfg->routing.nroutes; i++)
		if (cfg->routing.routes[i].policy.issued_key_ttl_ms > ttl)
			ttl = cfg->routing.routes[i].policy.issued_key_ttl_ms;
	return ttl;
}

void issue_marker(const char *key, uint64_t ttl_ms, struct store_claim *m)
{
	memset(m, 0, sizeof(*m));
	snprintf(m->key.scope, sizeof(m->key.scope), "%s", ISSUE_SCOPE);
	snprintf(m->key.key, sizeof(m->key.key), "%s", key);
	m->lease_ms = ttl_ms;
	m->ttl_ms = ttl_ms;
	m->takeover = true;	/* a marker is no request: it just lapses */
}

time_t issue_time(const char *key)
{
	const char *dot = strrchr(key, '.');
	long long t = 0;

	if (dot == NULL || dot[1] == '\0' || strlen(dot + 1) > 12)
		return 0;
	for (const char *p = dot + 1; *p != '\0'; p++) {
		if (*p < '0' || *p > '9')
			return 0;
		t = t * 10 + (*p - '0');
	}
	return (time_t)t;
}

bool issue_fresh(time_t at, time_t now, uint64_t ttl_ms)
{
	return at != 0 && at <= now + 60 &&
	       (at >= now || (uint64_t)(now - at) * 1000 <= ttl_ms);
}
