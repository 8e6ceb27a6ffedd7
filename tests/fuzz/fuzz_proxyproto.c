/*
 * fuzz_proxyproto.c - the PROXY protocol header (common/proxyproto.c) that
 * a load balancer, or anyone reaching the port, sends first.
 *
 * Input: the bytes a connection starts with (any bytes).
 * Invariants: a refusal says why; PP_MORE only below PP_MAX bytes; an
 * accepted header is at most PP_MAX bytes (a v1 one at most 107, ending in
 * CRLF; a v2 one 16 + its length field), reads back the same alone, is
 * waited for at every prefix tried, and its fields agree with the text or
 * bytes they came from (read here independently); bytes after a decided
 * header change nothing.
 */
#include <arpa/inet.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>

#include "fuzz.h"
#include "proxyproto.h"

static const uint8_t tail[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n\r\n\r\n\0\r\nQUIT\n";

static bool same(const struct pp_header *a, const struct pp_header *b)
{
	return a->version == b->version && a->local == b->local &&
		a->family == b->family && memcmp(a->src, b->src, 16) == 0 &&
		memcmp(a->dst, b->dst, 16) == 0 && a->src_port == b->src_port &&
		a->dst_port == b->dst_port && a->crc32c == b->crc32c &&
		strcmp(a->src_str, b->src_str) == 0;
}

/* The 16-byte form of the text address s[0..n) of family af, or false. */
static bool text_addr(int af, const char *s, size_t n, uint8_t out[16])
{
	char t[64];
	uint8_t raw[16];

	if (n == 0 || n >= sizeof(t))
		return false;
	memcpy(t, s, n);
	t[n] = '\0';
	if (inet_pton(af, t, raw) != 1)
		return false;
	if (af == AF_INET) {
		memset(out, 0, 10);
		out[10] = out[11] = 0xff;
		memcpy(out + 12, raw, 4);
	} else {
		memcpy(out, raw, 16);
	}
	return true;
}

/* An accepted v1 TCP line, read again with its own split: six fields at
 * single spaces, each what the header says. */
static void check_v1(const uint8_t *buf, size_t used, const struct pp_header *h)
{
	const char *s = (const char *)buf, *end = s + used - 2;
	const char *f[6];
	size_t n[6], nf = 0;
	uint8_t a[16];
	unsigned long port;

	while (nf < 6) {
		const char *sp = memchr(s, ' ', (size_t)(end - s));

		f[nf] = s;
		n[nf] = sp != NULL ? (size_t)(sp - s) : (size_t)(end - s);
		nf++;
		if (sp == NULL)
			break;
		s = sp + 1;
	}
	FUZZ_REQUIRE(nf == 6 && f[5] + n[5] == end);
	FUZZ_REQUIRE(n[1] == 4 && memcmp(f[1], h->family == AF_INET ? "TCP4" : "TCP6", 4) == 0);
	FUZZ_REQUIRE(text_addr(h->family, f[2], n[2], a) && memcmp(a, h->src, 16) == 0);
	FUZZ_REQUIRE(text_addr(h->family, f[3], n[3], a) && memcmp(a, h->dst, 16) == 0);
	for (int k = 4; k < 6; k++) {
		port = 0;
		FUZZ_REQUIRE(n[k] >= 1 && n[k] <= 5);
		for (size_t i = 0; i < n[k]; i++) {
			FUZZ_REQUIRE(f[k][i] >= '0' && f[k][i] <= '9');
			port = port * 10 + (unsigned long)(f[k][i] - '0');
		}
		FUZZ_REQUIRE(port == (k == 4 ? h->src_port : h->dst_port));
	}
}

/* What an accepted header must look like, whatever its version. */
static void check_ok(const uint8_t *buf, size_t len, size_t used,
		     const struct pp_header *h)
{
	char text[46];

	FUZZ_REQUIRE(used <= len && used <= PP_MAX && used >= 15);
	FUZZ_REQUIRE(h->version == 1 || h->version == 2);
	if (h->version == 1) {
		FUZZ_REQUIRE(used <= PP_V1_MAX && memcmp(buf, "PROXY ", 6) == 0);
		FUZZ_REQUIRE(buf[used - 2] == '\r' && buf[used - 1] == '\n');
		FUZZ_REQUIRE(memchr(buf, '\n', used - 1) == NULL &&
			     memchr(buf, '\r', used - 2) == NULL);
		FUZZ_REQUIRE(!h->crc32c);
		if (h->local)
			FUZZ_REQUIRE(memcmp(buf + 6, "UNKNOWN", 7) == 0);
		else
			check_v1(buf, used, h);
	} else {
		FUZZ_REQUIRE(used == 16 + (size_t)(buf[14] << 8 | buf[15]));
		FUZZ_REQUIRE(memcmp(buf, "\r\n\r\n\0\r\nQUIT\n", 12) == 0);
		FUZZ_REQUIRE(buf[12] == 0x20 || buf[12] == 0x21);
		FUZZ_REQUIRE(h->local == (buf[12] == 0x20 || buf[13] == 0x00 ||
					  buf[13] == 0x31));
		if (!h->local) {
			uint8_t a[16];
			size_t alen = h->family == AF_INET ? 4 : 16;

			FUZZ_REQUIRE(buf[13] == (h->family == AF_INET ? 0x11 : 0x21));
			memset(a, 0, 16);
			if (alen == 4)
				a[10] = a[11] = 0xff;
			memcpy(a + 16 - alen, buf + 16, alen);
			FUZZ_REQUIRE(memcmp(a, h->src, 16) == 0);
			FUZZ_REQUIRE(h->dst_port == (buf[16 + 2 * alen + 2] << 8 |
						     buf[16 + 2 * alen + 3]));
		}
	}
	if (h->local) {
		FUZZ_REQUIRE(h->family == 0 && h->src_str[0] == '\0');
	} else {
		FUZZ_REQUIRE(h->family == AF_INET || h->family == AF_INET6);
		FUZZ_REQUIRE(inet_ntop(h->family, h->family == AF_INET ? h->src + 12 :
				       h->src, text, sizeof(text)) != NULL);
		FUZZ_REQUIRE(strcmp(text, h->src_str) == 0);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *buf = fuzz_copy(data, size, 0), *more = malloc(size + sizeof(tail));
	struct pp_header h, again;
	size_t used, used2;
	const char *why, *why2;
	enum pp_result r, r2;

	if (buf == NULL || more == NULL)
		goto out;
	r = proxyproto_parse(buf, size, &h, &used, &why);
	FUZZ_REQUIRE(r == PP_MORE || r == PP_OK || r == PP_BAD);
	FUZZ_REQUIRE((r == PP_BAD) == (why != NULL));
	FUZZ_REQUIRE(r == PP_OK || used == 0);
	if (r == PP_BAD)
		FUZZ_REQUIRE(why[0] != '\0');
	if (r == PP_MORE)
		FUZZ_REQUIRE(size < PP_MAX);

	/* the same bytes, the same answer */
	r2 = proxyproto_parse(buf, size, &again, &used2, &why2);
	FUZZ_REQUIRE(r2 == r && used2 == used && why2 == why && same(&h, &again));

	if (r == PP_OK) {
		size_t cuts[] = { 0, 1, 6, 12, 13, 14, 15, 16, used / 2,
				  used > 4 ? used - 4 : 0, used - 2, used - 1 };

		check_ok(buf, size, used, &h);
		r2 = proxyproto_parse(buf, used, &again, &used2, &why2);
		FUZZ_REQUIRE(r2 == PP_OK && used2 == used && same(&h, &again));
		for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++)
			if (cuts[i] < used)
				FUZZ_REQUIRE(proxyproto_parse(buf, cuts[i], &again, &used2,
							      &why2) == PP_MORE);
	}

	/* bytes after a decided header are the stream's: nothing changes */
	if (r != PP_MORE) {
		if (size > 0)
			memcpy(more, data, size);
		memcpy(more + size, tail, sizeof(tail));
		r2 = proxyproto_parse(more, size + sizeof(tail), &again, &used2, &why2);
		FUZZ_REQUIRE(r2 == r && used2 == used && same(&h, &again));
		FUZZ_REQUIRE(r == PP_OK || strcmp(why2, why) == 0);
	}
out:
	free(buf);
	free(more);
	return 0;
}
