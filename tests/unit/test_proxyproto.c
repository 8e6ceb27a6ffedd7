/*
 * test_proxyproto.c - the PROXY protocol header (common/proxyproto.c):
 * v1 and v2 headers that are accepted, every byte-prefix of them waiting
 * for more, the bytes after them left alone, each refusal with its reason
 * and at the byte it is decided, and the CRC32c TLV checked against a
 * CRC32c written here independently (bit by bit, from RFC 4960).
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "proxyproto.h"
#include "tap.h"

static struct pp_header hdr;
static size_t used;
static const char *why;

static enum pp_result parse(const void *buf, size_t len)
{
	return proxyproto_parse(buf, len, &hdr, &used, &why);
}

/* CRC32c, one bit at a time (RFC 4960 appendix B: reflected 0x1EDC6F41). */
static uint32_t crc32c_bits(const uint8_t *p, size_t n)
{
	uint32_t crc = 0xffffffff;

	for (size_t i = 0; i < n; i++) {
		crc ^= p[i];
		for (int b = 0; b < 8; b++)
			crc = crc & 1 ? (crc >> 1) ^ 0x82f63b78 : crc >> 1;
	}
	return ~crc;
}

/* Every prefix of the header buf[0..len) (shorter than it) waits for more;
 * the whole of it is accepted with *used == len, and so it is with an HTTP
 * request after it. */
static void accepted(const void *buf, size_t len, const char *name)
{
	uint8_t more[PP_MAX + 64];
	const char *tail = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
	size_t k, first_bad = len;

	for (k = 0; k < len; k++)
		if (parse(buf, k) != PP_MORE) {
			first_bad = k;
			break;
		}
	if (!ok(first_bad == len, "%s: every prefix waits for more", name))
		printf("#   prefix of %zu bytes: \"%s\"\n", first_bad,
		       why ? why : "(not refused)");
	memcpy(more, buf, len);
	memcpy(more + len, tail, strlen(tail));
	if (!ok(parse(more, len + strlen(tail)) == PP_OK && used == len,
		"%s: accepted, %zu bytes used of the stream", name, len))
		printf("#   used %zu, why \"%s\"\n", used, why ? why : "");
	/* leaves hdr as the whole header's */
	ok(parse(buf, len) == PP_OK && used == len, "%s: accepted alone", name);
}

/* s for a test's name: CR and LF written as \r and \n. */
static const char *shown(const char *s)
{
	static char out[2 * PP_V1_MAX + 1];
	size_t n = 0;

	for (; *s != '\0' && n + 2 < sizeof(out); s++) {
		if (*s == '\r' || *s == '\n') {
			out[n++] = '\\';
			out[n++] = *s == '\r' ? 'r' : 'n';
		} else {
			out[n++] = *s;
		}
	}
	out[n] = '\0';
	return out;
}

static void accepted_str(const char *s)
{
	accepted(s, strlen(s), shown(s));
}

/* Refused with exactly this reason. */
static void refused(const void *buf, size_t len, const char *want,
		    const char *name)
{
	enum pp_result r = parse(buf, len);

	if (!ok(r == PP_BAD && why != NULL && strcmp(why, want) == 0 &&
		used == 0 && hdr.version == 0,
		"%s: refused, \"%s\"", name, want))
		printf("#   got %d, \"%s\"\n", r, why ? why : "(no reason)");
}

/* Refused with that reason at its last byte, and not one byte earlier. */
static void refused_at_end(const void *buf, size_t len, const char *want,
			   const char *name)
{
	refused(buf, len, want, name);
	is_int(parse(buf, len - 1), PP_MORE, "%s: one byte shorter waits", name);
}

static void refused_str(const char *s, const char *want)
{
	refused(s, strlen(s), want, shown(s));
}

static void test_crc32c(void)
{
	is_int(crc32c_bits((const uint8_t *)"123456789", 9), 0xe3069283,
	       "the test's CRC32c: the check value of \"123456789\"");
	is_int(proxyproto_crc32c((const uint8_t *)"123456789", 9), 0xe3069283,
	       "proxyproto_crc32c: the check value of \"123456789\"");
	is_int(proxyproto_crc32c(NULL, 0), 0, "CRC32c of nothing is 0");
}

static void test_v1_good(void)
{
	uint8_t a[16];
	char line[PP_V1_MAX + 1];

	accepted_str("PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n");
	is_int(hdr.version, 1, "TCP4: version 1");
	ok(!hdr.local && hdr.family == AF_INET, "TCP4: an IPv4 client");
	is_str(hdr.src_str, "192.168.0.1", "TCP4: source as a dotted quad");
	inet_pton(AF_INET6, "::ffff:192.168.0.1", a);
	ok(memcmp(hdr.src, a, 16) == 0, "TCP4: source IPv4-mapped");
	inet_pton(AF_INET6, "::ffff:192.168.0.11", a);
	ok(memcmp(hdr.dst, a, 16) == 0, "TCP4: destination IPv4-mapped");
	ok(hdr.src_port == 56324 && hdr.dst_port == 443, "TCP4: ports");

	accepted_str("PROXY TCP6 2001:db8::1 2001:db8::2 65535 0\r\n");
	ok(!hdr.local && hdr.family == AF_INET6, "TCP6: an IPv6 client");
	is_str(hdr.src_str, "2001:db8::1", "TCP6: source text");
	inet_pton(AF_INET6, "2001:db8::2", a);
	ok(memcmp(hdr.dst, a, 16) == 0, "TCP6: destination");
	ok(hdr.src_port == 65535 && hdr.dst_port == 0, "TCP6: ports 65535, 0");

	/* the longest TCP6 line: 104 bytes */
	accepted_str("PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
		     "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe 65535 65535\r\n");
	is_str(hdr.src_str, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
	       "TCP6: the longest source");
	accepted_str("PROXY TCP6 ::ffff:10.1.2.3 ::1 1 2\r\n");
	ok(hdr.family == AF_INET6 && strcmp(hdr.src_str, "::ffff:10.1.2.3") == 0,
	   "TCP6 with a mapped IPv4 source stays IPv6");
	accepted_str("PROXY TCP4 0.0.0.0 255.255.255.255 00080 0\r\n");
	ok(hdr.src_port == 80, "a port of 5 digits with leading zeros");

	accepted_str("PROXY UNKNOWN\r\n");
	ok(hdr.version == 1 && hdr.local && hdr.family == 0 &&
	   hdr.src_str[0] == '\0', "UNKNOWN: local");
	accepted_str("PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n");
	ok(hdr.local, "UNKNOWN with the spec's worst case: local");
	accepted_str("PROXY UNKNOWN \r\n");

	/* 107 bytes in all is the most */
	memset(line, 'x', sizeof(line));
	memcpy(line, "PROXY UNKNOWN ", 14);
	memcpy(line + PP_V1_MAX - 2, "\r\n", 2);
	accepted(line, PP_V1_MAX, "UNKNOWN of 107 bytes");
	memcpy(line + PP_V1_MAX - 2, "x\r", 2);
	refused(line, PP_V1_MAX, "v1: no CRLF within 107 bytes",
		"UNKNOWN of 108 bytes (CR at the 107th)");
	is_int(parse(line, PP_V1_MAX - 1), PP_MORE, "106 bytes without CRLF wait");
	memset(line + 14, 'x', PP_V1_MAX - 14);
	refused(line, PP_V1_MAX, "v1: no CRLF within 107 bytes",
		"107 bytes without CRLF");
}

static void test_v1_bad(void)
{
	const char *port = "v1: bad source port", *dport = "v1: bad destination port";
	const char *src = "v1: bad source address", *dst = "v1: bad destination address";

	refused_str("PROXY TCP4 ::1 1.2.3.4 1 2\r\n", src);
	refused_str("PROXY TCP6 1.2.3.4 ::1 1 2\r\n", src);
	refused_str("PROXY TCP4 1.2.3.4 ::1 1 2\r\n", dst);
	refused_str("PROXY TCP6 ::1 1.2.3.4 1 2\r\n", dst);
	refused_str("PROXY TCP4 01.2.3.4 1.2.3.4 1 2\r\n", src);
	refused_str("PROXY TCP4 1.2.3 1.2.3.4 1 2\r\n", src);
	refused_str("PROXY TCP4 localhost 1.2.3.4 1 2\r\n", src);
	refused_str("PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", src);
	refused_str("PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n", src);
	refused_str("PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", dst);
	refused_str("PROXY TCP4 1.2.3.4\t5.6.7.8 1 2\r\n", src);
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 +80 2\r\n", port);
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n", port);
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", port);
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 123456 2\r\n", port);
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 8a 2\r\n", port);
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8  2\r\n", port);
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 \r\n", dport);
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 99999\r\n", dport);
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 0x10\r\n", dport);
	refused_str("PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n",
		    "v1: the protocol is not TCP4, TCP6 or UNKNOWN");
	refused_str("PROXY TCP 1.2.3.4 5.6.7.8 1 2\r\n",
		    "v1: the protocol is not TCP4, TCP6 or UNKNOWN");
	refused_str("PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
		    "v1: the protocol is not TCP4, TCP6 or UNKNOWN");
	refused_str("PROXY UNKNOWNX\r\n",
		    "v1: the protocol is not TCP4, TCP6 or UNKNOWN");
	refused_str("PROXY \r\n", "v1: the protocol is not TCP4, TCP6 or UNKNOWN");
	refused_str("PROXY  TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
		    "v1: the protocol is not TCP4, TCP6 or UNKNOWN");
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n",
		    "v1: text after the destination port");
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
		    "v1: text after the destination port");
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
		    "v1: fields missing before the CRLF");
	refused_str("PROXY TCP4\r\n", "v1: fields missing before the CRLF");
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
		    "v1: a line feed without a carriage return");
	refused_str("PROXY UNKNOWN\n", "v1: a line feed without a carriage return");
	refused_str("PROXY UNKNOWN a\nb\r\n",
		    "v1: a line feed without a carriage return");
	refused_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rX",
		    "v1: a carriage return without a line feed");
	refused_str("PROXY UNKNOWN\r\r\n", "v1: a carriage return without a line feed");

	/* decided at the byte that breaks the header */
	refused_at_end("PROXY TCP4 1.2.3.2555", 21, src, "a fourth octet of 4 digits");
	refused_at_end("PROXY TCP4 256", 14, src, "an octet over 255");
	refused_at_end("PROXY TCP4 1.2.3.4.", 19, src, "a fifth octet");
	refused_at_end("PROXY TCP4 1:", 13, src, "a colon under TCP4");
	refused_at_end("PROXY TCP6 1.", 13, src, "a dotted quad under TCP6");
	refused_at_end("PROXY TCP6 1::2::", 17, src, "two '::'");
	refused_at_end("PROXY TCP6 12345", 16, src, "an IPv6 group of 5 digits");
	refused_at_end("PROXY TCP6 1:2:3:4:5:6:7:8:", 27, src, "a ninth IPv6 group");
	refused_at_end("PROXY TCP4 1.2.3.4 5.6.7.8 65536", 32, port,
		       "a port over 65535");
	refused_at_end("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 ", 31,
		       "v1: text after the destination port", "a space after the ports");
	refused_at_end("PROXY X", 7, "v1: the protocol is not TCP4, TCP6 or UNKNOWN",
		       "an unknown protocol");
	/* what can still become an address waits */
	is_int(parse("PROXY TCP6 ::ffff:1.2.3.", 24), PP_MORE, "::ffff:1.2.3. waits");
	is_int(parse("PROXY TCP6 1:2:3:4:5:6:7", 24), PP_MORE, "7 IPv6 groups wait");
	is_int(parse("PROXY TCP6 1:2:3:4:5:6:1.2", 26), PP_MORE,
	       "6 groups and half a quad wait");
	is_int(parse("PROXY TCP4 1.2.3.4 5.6.7.8 6553", 31), PP_MORE, "6553 waits");
}

static void test_not_proxy(void)
{
	static const char *requests[] = {
		"GET / HTTP/1.1\r\n", "HEAD / HTTP/1.1\r\n", "OPTIONS * HTTP/1.1\r\n",
		"\x16\x03\x01\x02\x00",	/* a TLS ClientHello */
	};

	for (size_t i = 0; i < sizeof(requests) / sizeof(requests[0]); i++)
		refused(requests[i], 1, "not a PROXY protocol header",
			"the first byte of a request");
	refused("GET / HTTP/1.1\r\n", 16, "not a PROXY protocol header",
		"a whole request line");
	refused_at_end("POST /", 2, "not a PROXY protocol header", "PO");
	refused_at_end("PUT /", 2, "not a PROXY protocol header", "PU");
	refused_at_end("PRI * HTTP/2.0", 3, "not a PROXY protocol header", "PRI");
	refused_at_end("PROXY\t", 6, "not a PROXY protocol header", "PROXY and a tab");
	refused_at_end("\r\nGET", 3, "not a PROXY protocol header",
		       "an empty line before a request");
	refused_at_end("\r\n\r\n\0\r\nQUIT\r", 12, "not a PROXY protocol header",
		       "the v2 signature's last byte wrong");
	is_int(parse("", 0), PP_MORE, "nothing yet: wait");
	ok(why == NULL && used == 0, "nothing yet: no reason");
}

/* A v2 header: the fixed part, block (blen bytes), then tlvs (tlen), the
 * length field covering all that plus extra. */
static size_t v2(uint8_t *out, uint8_t ver_cmd, uint8_t fam, const void *block,
		 size_t blen, const void *tlvs, size_t tlen)
{
	memcpy(out, "\r\n\r\n\0\r\nQUIT\n", 12);
	out[12] = ver_cmd;
	out[13] = fam;
	out[14] = (uint8_t)((blen + tlen) >> 8);
	out[15] = (uint8_t)(blen + tlen);
	if (blen > 0)
		memcpy(out + 16, block, blen);
	if (tlen > 0)
		memcpy(out + 16 + blen, tlvs, tlen);
	return 16 + blen + tlen;
}

/* Set the CRC32c TLV's value at out[at..at+4) for the n-byte header. */
static void set_crc(uint8_t *out, size_t n, size_t at)
{
	uint32_t c;

	memset(out + at, 0, 4);
	c = crc32c_bits(out, n);
	out[at] = (uint8_t)(c >> 24);
	out[at + 1] = (uint8_t)(c >> 16);
	out[at + 2] = (uint8_t)(c >> 8);
	out[at + 3] = (uint8_t)c;
}

static const uint8_t tcp4[12] = { 10, 1, 2, 3, 192, 0, 2, 7, 0x1f, 0x90, 0x01, 0xbb };

/* ALPN "h2", AUTHORITY "example.com", NOOP of nothing, an SSL TLV */
static const uint8_t tlvs[] = {
	0x01, 0, 2, 'h', '2',
	0x02, 0, 11, 'e', 'x', 'a', 'm', 'p', 'l', 'e', '.', 'c', 'o', 'm',
	0x04, 0, 0,
	0x20, 0, 5, 0x07, 0, 0, 0, 0,
};

/* A v2 header accepted with the TLVs above and without TLVs, to the same
 * effect; hdr is then the one without. */
static void v2_accepted(uint8_t ver_cmd, uint8_t fam, const void *block,
			size_t blen, const char *name)
{
	uint8_t b[16 + 216 + sizeof(tlvs)];
	struct pp_header with;
	char label[80];

	snprintf(label, sizeof(label), "%s with TLVs", name);
	accepted(b, v2(b, ver_cmd, fam, block, blen, tlvs, sizeof(tlvs)), label);
	with = hdr;
	accepted(b, v2(b, ver_cmd, fam, block, blen, NULL, 0), name);
	ok(with.local == hdr.local && with.family == hdr.family &&
	   memcmp(with.src, hdr.src, 16) == 0 && memcmp(with.dst, hdr.dst, 16) == 0 &&
	   with.src_port == hdr.src_port && with.dst_port == hdr.dst_port &&
	   strcmp(with.src_str, hdr.src_str) == 0, "%s: the TLVs change nothing", name);
}

static void test_v2_good(void)
{
	uint8_t b[PP_MAX], a[16], tcp6[36], unix_block[216];
	uint8_t crc_tlvs[sizeof(tlvs) + 7];
	size_t n;

	v2_accepted(0x21, 0x11, tcp4, 12, "v2 TCP4");
	ok(hdr.version == 2 && !hdr.local && hdr.family == AF_INET && !hdr.crc32c,
	   "v2 TCP4: an IPv4 client, no CRC32c");
	is_str(hdr.src_str, "10.1.2.3", "v2 TCP4: source");
	inet_pton(AF_INET6, "::ffff:192.0.2.7", a);
	ok(memcmp(hdr.dst, a, 16) == 0, "v2 TCP4: destination IPv4-mapped");
	ok(hdr.src_port == 8080 && hdr.dst_port == 443, "v2 TCP4: ports");

	inet_pton(AF_INET6, "2001:db8::17", tcp6);
	inet_pton(AF_INET6, "2001:db8::1", tcp6 + 16);
	memcpy(tcp6 + 32, "\xff\xff\x00\x50", 4);
	v2_accepted(0x21, 0x21, tcp6, 36, "v2 TCP6");
	ok(!hdr.local && hdr.family == AF_INET6 && hdr.src_port == 65535 &&
	   hdr.dst_port == 80 && memcmp(hdr.dst, tcp6 + 16, 16) == 0,
	   "v2 TCP6: addresses and ports");
	is_str(hdr.src_str, "2001:db8::17", "v2 TCP6: source");

	v2_accepted(0x20, 0x00, NULL, 0, "v2 LOCAL");
	ok(hdr.version == 2 && hdr.local && hdr.family == 0 && hdr.src_str[0] == '\0',
	   "v2 LOCAL: local");
	v2_accepted(0x20, 0x11, tcp4, 12, "v2 LOCAL with a TCP4 block");
	ok(hdr.local && hdr.family == 0 && hdr.src_port == 0,
	   "v2 LOCAL with a TCP4 block: the block is not used");
	v2_accepted(0x21, 0x00, NULL, 0, "v2 PROXY UNSPEC");
	ok(hdr.local, "v2 PROXY UNSPEC: local");
	memset(unix_block, 0, sizeof(unix_block));
	strcpy((char *)unix_block, "/run/lb.sock");
	v2_accepted(0x21, 0x31, unix_block, 216, "v2 UNIX stream");
	ok(hdr.local, "v2 UNIX stream: local");

	/* the longest: a length of 4096 */
	memset(b, 0, sizeof(b));
	n = v2(b, 0x21, 0x11, tcp4, 12, NULL, 0);
	b[14] = 0x10;
	b[15] = 0x00;
	b[28] = 0x04;			/* NOOP over the rest */
	b[29] = (uint8_t)((4096 - 12 - 3) >> 8);
	b[30] = (uint8_t)(4096 - 12 - 3);
	accepted(b, PP_MAX, "v2 of PP_MAX bytes");

	/* CRC32c: right, then any one bit wrong */
	memcpy(crc_tlvs, tlvs, sizeof(tlvs));
	memcpy(crc_tlvs + sizeof(tlvs), "\x03\x00\x04\0\0\0\0", 7);
	n = v2(b, 0x21, 0x11, tcp4, 12, crc_tlvs, sizeof(crc_tlvs));
	set_crc(b, n, n - 4);
	accepted(b, n, "v2 TCP4 with a right CRC32c");
	ok(hdr.crc32c && hdr.src_port == 8080, "v2 TCP4 with a right CRC32c: seen");
	b[n - 1] ^= 0x01;
	refused(b, n, "v2: CRC32c mismatch", "v2 TCP4 with a wrong CRC32c");
	is_int(parse(b, n - 1), PP_MORE, "a wrong CRC32c is known only at the end");
	b[n - 1] ^= 0x01;
	b[17] ^= 0x80;			/* the source address */
	refused(b, n, "v2: CRC32c mismatch", "v2 TCP4 changed after its CRC32c");

	/* CRC32c first, then the others; and on LOCAL */
	n = v2(b, 0x20, 0x00, NULL, 0, "\x03\x00\x04\0\0\0\0\x04\x00\x01x", 11);
	set_crc(b, n, 19);
	accepted(b, n, "v2 LOCAL with a right CRC32c");
	ok(hdr.crc32c && hdr.local, "v2 LOCAL with a right CRC32c: seen");
	b[19] ^= 0xff;
	refused(b, n, "v2: CRC32c mismatch", "v2 LOCAL with a wrong CRC32c");
}

static void test_v2_bad(void)
{
	uint8_t b[PP_MAX + 16];
	size_t n;

	n = v2(b, 0x11, 0x11, tcp4, 12, NULL, 0);
	refused_at_end(b, 13, "v2: version is not 2", "v2 version 1");
	b[12] = 0x31;
	refused(b, n, "v2: version is not 2", "v2 version 3");
	b[12] = 0x22;
	refused_at_end(b, 13, "v2: command is neither LOCAL nor PROXY", "v2 command 2");
	b[12] = 0x2f;
	refused(b, n, "v2: command is neither LOCAL nor PROXY", "v2 command 15");
	b[12] = 0x21;

	b[13] = 0x12;
	refused_at_end(b, 14, "v2: UDP is not a stream", "v2 UDP over IPv4");
	b[13] = 0x22;
	refused_at_end(b, 14, "v2: UDP is not a stream", "v2 UDP over IPv6");
	b[13] = 0x32;
	refused_at_end(b, 14, "v2: a UNIX datagram socket is not a stream",
		       "v2 UNIX datagram");
	b[12] = 0x20;
	refused(b, n, "v2: a UNIX datagram socket is not a stream",
		"v2 LOCAL UNIX datagram");
	b[12] = 0x21;
	{
		int others = 0, refused_others = 0;

		for (unsigned fam = 0; fam < 256; fam++) {
			if (fam == 0x00 || fam == 0x11 || fam == 0x21 || fam == 0x31 ||
			    fam == 0x12 || fam == 0x22 || fam == 0x32)
				continue;
			b[13] = (uint8_t)fam;
			others++;
			if (parse(b, 14) == PP_BAD &&
			    strcmp(why, "v2: unknown address family or transport") == 0)
				refused_others++;
		}
		ok(others == 249 && refused_others == others,
		   "v2: every other family/transport byte refused at byte 14");
	}

	/* the length, from the 16-byte fixed part */
	n = v2(b, 0x21, 0x11, tcp4, 12, NULL, 0);
	b[14] = 0x10;
	b[15] = 0x01;
	refused_at_end(b, 16, "v2: header longer than 4096 bytes", "v2 length 4097");
	b[14] = 0xff;
	b[15] = 0xff;
	refused_at_end(b, 16, "v2: header longer than 4096 bytes", "v2 length 65535");
	b[14] = 0;
	b[15] = 11;
	refused_at_end(b, 16, "v2: length shorter than its address block",
		       "v2 TCP4 length 11");
	n = v2(b, 0x21, 0x21, tcp4, 12, NULL, 0);
	refused_at_end(b, 16, "v2: length shorter than its address block",
		       "v2 TCP6 length 12");
	n = v2(b, 0x20, 0x31, tcp4, 12, NULL, 0);
	refused_at_end(b, 16, "v2: length shorter than its address block",
		       "v2 LOCAL UNIX length 12");

	/* TLVs: within the header, as soon as their 3 bytes say otherwise */
	n = v2(b, 0x21, 0x11, tcp4, 12, "\x01\x00\x03h2", 5);
	refused_at_end(b, 31, "v2: a TLV runs past the header's end",
		       "v2 TLV one byte longer than the header, from its 3 bytes");
	n = v2(b, 0x21, 0x11, tcp4, 12, "\x01\x00", 2);
	refused_at_end(b, 16, "v2: a TLV runs past the header's end",
		       "v2 room for a TLV of 2 bytes, from the fixed part");
	ok(n == 30, "(that header is 30 bytes)");
	n = v2(b, 0x21, 0x11, tcp4, 12, "\x04\x00\x00\x01", 4);
	refused_at_end(b, 31, "v2: a TLV runs past the header's end",
		       "v2 room for 1 byte after a whole TLV");
	n = v2(b, 0x21, 0x11, tcp4, 12, "\x01\xff\xff" "abc", 6);
	refused(b, 16 + 12 + 3, "v2: a TLV runs past the header's end",
		"v2 TLV of 65535 bytes, from its 3 bytes");
	n = v2(b, 0x21, 0x11, tcp4, 12, "\x03\x00\x03\0\0\0", 6);
	refused(b, n - 3, "v2: the CRC32c TLV is not 4 bytes", "v2 CRC32c of 3 bytes");
	n = v2(b, 0x21, 0x11, tcp4, 12, "\x03\x00\x04\0\0\0\0\x03\x00\x04\0\0\0\0", 14);
	refused(b, n, "v2: two CRC32c TLVs", "v2 two CRC32c TLVs");
	n = v2(b, 0x21, 0x00, NULL, 0, "\x01\x00\x01", 3);
	refused_at_end(b, n, "v2: a TLV runs past the header's end",
		       "v2 UNSPEC TLV past the end");

	/* nothing is read past len: a caller with PP_MAX bytes has its answer */
	memset(b, 0, sizeof(b));
	n = v2(b, 0x21, 0x11, tcp4, 12, NULL, 0);
	b[14] = 0x10;
	b[15] = 0x00;
	b[28] = 0x04;
	b[29] = 0x0f;
	b[30] = 0xf1;			/* 4081 + 3 + 12 = 4096 */
	is_int(parse(b, PP_MAX), PP_OK, "v2 of PP_MAX bytes: decided");
	is_int(parse(b, PP_MAX - 1), PP_MORE, "v2 one byte short: waits");
	b[30] = 0xf2;
	refused(b, PP_MAX, "v2: a TLV runs past the header's end",
		"v2 TLV one byte past PP_MAX");
}

int main(void)
{
	test_crc32c();
	test_v1_good();
	test_v1_bad();
	test_not_proxy();
	test_v2_good();
	test_v2_bad();
	return tap_done();
}
