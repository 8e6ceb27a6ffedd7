/*
 * cidr.c - address ranges (see cidr.h). IPv4 is kept IPv4-mapped, so that
 * one comparison serves both families and a dual-stack socket's
 * "::ffff:10.1.2.3" peer matches "10.0.0.0/8".
 */
#include "cidr.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t v4_mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

int cidr_addr(const char *s, size_t len, uint8_t out[16])
{
	char buf[INET6_ADDRSTRLEN + 1];
	struct in_addr a4;

	if (len == 0 || len >= sizeof(buf))
		return -1;
	memcpy(buf, s, len);
	buf[len] = '\0';
	if (inet_pton(AF_INET, buf, &a4) == 1) {
		memcpy(out, v4_mapped, 12);
		memcpy(out + 12, &a4, 4);
		return 0;
	}
	if (inet_pton(AF_INET6, buf, out) == 1)
		return 0;
	return -1;
}

static bool prefix_equal(const uint8_t *a, const uint8_t *b, unsigned bits)
{
	unsigned whole = bits / 8, rest = bits % 8;

	if (memcmp(a, b, whole) != 0)
		return false;
	if (rest == 0)
		return true;
	return ((a[whole] ^ b[whole]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

/* One "addr[/bits]" item of len bytes into c. */
static int parse_item(const char *s, size_t len, struct cidr *c, char *err,
		      size_t errlen)
{
	const char *slash = memchr(s, '/', len);
	size_t alen = slash ? (size_t)(slash - s) : len;
	bool v4;
	unsigned long bits, max;
	char *end;

	if (cidr_addr(s, alen, c->addr) < 0) {
		snprintf(err, errlen, "\"%.*s\" is not an IP address",
			 (int)(alen > 64 ? 64 : alen), s);
		return -1;
	}
	v4 = memcmp(c->addr, v4_mapped, 12) == 0 && memchr(s, ':', alen) == NULL;
	max = v4 ? 32 : 128;
	bits = max;
	if (slash != NULL) {
		char num[8];
		size_t nlen = len - alen - 1;

		if (nlen == 0 || nlen >= sizeof(num)) {
			snprintf(err, errlen, "\"%.*s\": bad prefix length",
				 (int)(len > 64 ? 64 : len), s);
			return -1;
		}
		memcpy(num, slash + 1, nlen);
		num[nlen] = '\0';
		bits = strtoul(num, &end, 10);
		if (*end != '\0' || num[0] < '0' || num[0] > '9' || bits > max) {
			snprintf(err, errlen, "\"%.*s\": prefix length must be "
				 "0-%lu", (int)(len > 64 ? 64 : len), s, max);
			return -1;
		}
	}
	c->bits = (unsigned)bits + (v4 ? 96 : 0);
	/* the address must be the range's first: no bits past the prefix */
	for (unsigned i = c->bits; i < 128; i++)
		if (c->addr[i / 8] & (0x80 >> (i % 8))) {
			snprintf(err, errlen, "\"%.*s\" has bits set past its "
				 "prefix (the range starts lower)",
				 (int)(len > 64 ? 64 : len), s);
			return -1;
		}
	return 0;
}

static bool blank(char ch)
{
	return ch == ' ' || ch == '\t';
}

int cidr_parse(const char *list, struct cidr_set *out, char *err, size_t errlen)
{
	const char *p = list;
	struct cidr_set s = { NULL, 0 };

	while (*p != '\0') {
		const char *q = p, *e;
		struct cidr *grown;

		while (blank(*q))
			q++;
		e = q;
		while (*e != '\0' && *e != ',')
			e++;
		p = *e == ',' ? e + 1 : e;
		while (e > q && blank(e[-1]))
			e--;
		if (e == q) {
			snprintf(err, errlen, "an empty item in the list");
			goto fail;
		}
		grown = realloc(s.v, (s.n + 1) * sizeof(*s.v));
		if (grown == NULL) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
		s.v = grown;
		if (parse_item(q, (size_t)(e - q), &s.v[s.n], err, errlen) < 0)
			goto fail;
		s.n++;
	}
	if (s.n == 0) {
		snprintf(err, errlen, "no address given");
		goto fail;
	}
	*out = s;
	return 0;
fail:
	free(s.v);
	return -1;
}

void cidr_clear(struct cidr_set *s)
{
	free(s->v);
	s->v = NULL;
	s->n = 0;
}

bool cidr_contains_bytes(const struct cidr_set *s, const uint8_t addr[16])
{
	for (size_t i = 0; i < s->n; i++)
		if (prefix_equal(s->v[i].addr, addr, s->v[i].bits))
			return true;
	return false;
}

bool cidr_contains(const struct cidr_set *s, const char *addr)
{
	uint8_t a[16];

	if (s->n == 0 || cidr_addr(addr, strlen(addr), a) < 0)
		return false;
	return cidr_contains_bytes(s, a);
}
