/*
 * proxyproto.c - the PROXY protocol header (see proxyproto.h).
 *
 * Both versions are checked as the bytes come, so that a refusal comes at
 * the first byte that cannot belong to a valid header: "GET" fails at 'G',
 * "PROXY TCP4 1.2.3.256" at the '6', a v2 length over 4096 as soon as the
 * 16-byte fixed part is in. v1 checks the line it has so far as if it
 * were cut short, then, once the CRLF is there, as a whole line; a field
 * still arriving is checked as a prefix (can some ending make it an address
 * or a port?). The one approximation: a v1 line whose fields could still be
 * completed, but not within 107 bytes, is refused only at byte 107.
 * v2 walks its TLVs as they arrive; the CRC32c, when there is one, is
 * checked once the whole header is in.
 */
#include "proxyproto.h"

#include <arpa/inet.h>
#include <string.h>
#include <sys/socket.h>

#define V1_SIG "PROXY "
#define V1_SIG_LEN 6
#define V2_SIG "\r\n\r\n\0\r\nQUIT\n"
#define V2_SIG_LEN 12
#define V2_FIXED 16		/* signature, ver_cmd, fam, length */
#define V2_LEN_MAX (PP_MAX - V2_FIXED)
#define PP2_TYPE_CRC32C 0x03

/* the longest address text inet_pton may take: "ffff:...:255.255.255.255" */
#define ADDR_TEXT_MAX (INET6_ADDRSTRLEN - 1)

static const uint8_t v4_mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

static enum pp_result bad(const char **why, const char *reason)
{
	if (why != NULL)
		*why = reason;
	return PP_BAD;
}

/* Do the len bytes at buf begin (or make up) the n-byte sig? */
static bool starts(const uint8_t *buf, size_t len, const char *sig, size_t n)
{
	return memcmp(buf, sig, len < n ? len : n) == 0;
}

static uint16_t be16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

/* CRC32c, reflected, four bits at a time: a 16-entry table, no set-up
 * (neither OpenSSL nor libc offer the Castagnoli polynomial). */
static uint32_t crc32c_update(uint32_t crc, const uint8_t *p, size_t n)
{
	static const uint32_t nibble[16] = {
		0x00000000, 0x105ec76f, 0x20bd8ede, 0x30e349b1,
		0x417b1dbc, 0x5125dad3, 0x61c69362, 0x7198540d,
		0x82f63b78, 0x92a8fc17, 0xa24bb5a6, 0xb21572c9,
		0xc38d26c4, 0xd3d3e1ab, 0xe330a81a, 0xf36e6f75,
	};

	for (size_t i = 0; i < n; i++) {
		crc ^= p[i];
		crc = (crc >> 4) ^ nibble[crc & 15];
		crc = (crc >> 4) ^ nibble[crc & 15];
	}
	return crc;
}

uint32_t proxyproto_crc32c(const uint8_t *buf, size_t len)
{
	return ~crc32c_update(~(uint32_t)0, buf, len);
}

/* The 16-byte form of a raw address of family af (4 or 16 bytes at p). */
static void addr_bytes(int af, const uint8_t *p, uint8_t out[16])
{
	if (af == AF_INET) {
		memcpy(out, v4_mapped, 12);
		memcpy(out + 12, p, 4);
	} else {
		memcpy(out, p, 16);
	}
}

/*
 * A v1 address of family af in s[0..n): whole, it must be one (out, when
 * not NULL, gets its bytes); else it is what has arrived of one, and some
 * ending must make it one. The endings tried finish an IPv4 quad (".0",
 * "0.0.0", ...), an IPv6 group or a "::"; the shortest that fits is among
 * them whenever any does. -1 when it is not (or cannot become) an address.
 */
static int v1_addr(int af, const char *s, size_t n, bool whole, uint8_t out[16])
{
	static const char *const endings[] = {
		"", "0", ".0", ".0.0", ".0.0.0", "0.0", "0.0.0", "0.0.0.0",
		":", ":0", "::",
	};
	char text[ADDR_TEXT_MAX + 8];
	uint8_t raw[16];

	if (n > ADDR_TEXT_MAX || (whole && n == 0))
		return -1;
	memcpy(text, s, n);
	for (size_t i = 0; i < (whole ? 1 : sizeof(endings) / sizeof(endings[0])); i++) {
		strcpy(text + n, endings[i]);
		if (inet_pton(af, text, raw) == 1) {
			if (out != NULL)
				addr_bytes(af, raw, out);
			return 0;
		}
	}
	return -1;
}

/* A v1 port in s[0..n): 1-5 decimal digits, at most 65535 (no sign, no
 * blank); when not whole, what has arrived of one (may be empty). */
static int v1_port(const char *s, size_t n, bool whole, uint16_t *out)
{
	unsigned long v = 0;

	if (n > 5 || (whole && n == 0))
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (unsigned long)(s[i] - '0');
	}
	if (v > 65535)
		return -1;
	*out = (uint16_t)v;
	return 0;
}

struct piece {
	const char *s;
	size_t n;
};

/* Split s[0..n) at single spaces into at most max pieces (the last one
 * holds the rest); how many. */
static size_t split(const char *s, size_t n, struct piece *v, size_t max)
{
	size_t np = 0;

	for (;;) {
		const char *sp = np + 1 < max ? memchr(s, ' ', n) : NULL;

		v[np].s = s;
		v[np].n = sp != NULL ? (size_t)(sp - s) : n;
		np++;
		if (sp == NULL)
			return np;
		n -= v[np - 1].n + 1;
		s = sp + 1;
	}
}

/* Is the word w[0..n) one of the protocols, or (not whole) a beginning of
 * one? Its family (AF_UNSPEC for UNKNOWN), or -1. */
static int v1_proto(const char *w, size_t n, bool whole)
{
	static const struct {
		const char *name;
		int af;
	} protos[] = {
		{ "TCP4", AF_INET }, { "TCP6", AF_INET6 }, { "UNKNOWN", AF_UNSPEC },
	};

	for (size_t i = 0; i < sizeof(protos) / sizeof(protos[0]); i++) {
		size_t len = strlen(protos[i].name);

		if (whole ? n == len && memcmp(w, protos[i].name, len) == 0 :
		    n <= len && memcmp(w, protos[i].name, n) == 0)
			return protos[i].af;
	}
	return -1;
}

/*
 * The v1 line s[0..n) after "PROXY ": whole when its CRLF follows, else
 * what has arrived of it (and then never PP_OK). *h filled on PP_OK.
 */
static enum pp_result v1_line(const char *s, size_t n, bool whole,
			      struct pp_header *h, const char **why)
{
	static const char *const reasons[] = {
		"v1: bad source address", "v1: bad destination address",
		"v1: bad source port", "v1: bad destination port",
	};
	struct piece f[6];
	size_t np = split(s, n, f, 6);
	int af = v1_proto(f[0].s, f[0].n, whole || np > 1);
	uint16_t ports[2];

	if (af < 0)
		return bad(why, "v1: the protocol is not TCP4, TCP6 or UNKNOWN");
	if (af == AF_UNSPEC) {
		/* UNKNOWN: whatever follows a space, up to the CRLF */
		if (!whole)
			return PP_MORE;
		h->local = true;
		return PP_OK;
	}
	for (size_t k = 1; k < np && k < 5; k++) {
		bool open = !whole && k == np - 1;	/* still arriving */
		uint8_t *addr = open ? NULL : k == 1 ? h->src : h->dst;
		int r;

		if (k <= 2)
			r = v1_addr(af, f[k].s, f[k].n, !open, addr);
		else
			r = v1_port(f[k].s, f[k].n, !open, &ports[k - 3]);

		if (r < 0)
			return bad(why, reasons[k - 1]);
	}
	if (np > 5)
		return bad(why, "v1: text after the destination port");
	if (!whole)
		return PP_MORE;
	if (np < 5)
		return bad(why, "v1: fields missing before the CRLF");
	h->family = af;
	h->src_port = ports[0];
	h->dst_port = ports[1];
	return PP_OK;
}

/* buf[0..len), len >= 6, starts "PROXY ". */
static enum pp_result v1_parse(const uint8_t *buf, size_t len,
			       struct pp_header *h, size_t *used,
			       const char **why)
{
	const char *line = (const char *)buf + V1_SIG_LEN;
	size_t n = len < PP_V1_MAX ? len : PP_V1_MAX, t = V1_SIG_LEN;

	while (t < n && buf[t] != '\r' && buf[t] != '\n')
		t++;
	/* what has arrived, first: a refusal does not wait for the CRLF */
	if (v1_line(line, t - V1_SIG_LEN, false, h, why) == PP_BAD)
		return PP_BAD;
	if (t == n)
		goto no_crlf_yet;
	if (buf[t] == '\n')
		return bad(why, "v1: a line feed without a carriage return");
	if (v1_line(line, t - V1_SIG_LEN, true, h, why) == PP_BAD)
		return PP_BAD;
	if (t + 1 == n)
		goto no_crlf_yet;
	if (buf[t + 1] != '\n')
		return bad(why, "v1: a carriage return without a line feed");
	h->version = 1;
	*used = t + 2;
	return PP_OK;
no_crlf_yet:
	return len >= PP_V1_MAX ? bad(why, "v1: no CRLF within 107 bytes") :
		PP_MORE;
}

/* The address block's length for a v2 family/transport byte (0 for
 * UNSPEC), or -1 with *why set when it is refused. */
static int v2_block(uint8_t fam, const char **why)
{
	switch (fam) {
	case 0x00:
		return 0;	/* UNSPEC */
	case 0x11:
		return 12;	/* TCP over IPv4 */
	case 0x21:
		return 36;	/* TCP over IPv6 */
	case 0x31:
		return 216;	/* UNIX stream */
	case 0x12:
	case 0x22:
		bad(why, "v2: UDP is not a stream");
		return -1;
	case 0x32:
		bad(why, "v2: a UNIX datagram socket is not a stream");
		return -1;
	default:
		bad(why, "v2: unknown address family or transport");
		return -1;
	}
}

/*
 * The TLVs from off to the header's end total, as far as they are in
 * buf[0..avail): each must end within the header; the CRC32c one is 4
 * bytes and comes at most once (*crc_at: its value's offset, or 0).
 */
static enum pp_result v2_tlvs(const uint8_t *buf, size_t avail, size_t off,
			      size_t total, size_t *crc_at, const char **why)
{
	while (off < total) {
		size_t n;

		if (off + 3 > total)
			return bad(why, "v2: a TLV runs past the header's end");
		if (off + 3 > avail)
			return PP_MORE;
		n = be16(buf + off + 1);
		if (off + 3 + n > total)
			return bad(why, "v2: a TLV runs past the header's end");
		if (buf[off] == PP2_TYPE_CRC32C) {
			if (n != 4)
				return bad(why, "v2: the CRC32c TLV is not 4 bytes");
			if (*crc_at != 0)
				return bad(why, "v2: two CRC32c TLVs");
			*crc_at = off + 3;
		}
		off += 3 + n;
	}
	return PP_OK;
}

/* Does the header buf[0..total) match the CRC32c it carries at crc_at? */
static bool v2_crc_ok(const uint8_t *buf, size_t total, size_t crc_at)
{
	static const uint8_t zero[4];
	uint32_t want = (uint32_t)be16(buf + crc_at) << 16 | be16(buf + crc_at + 2);
	uint32_t crc = ~(uint32_t)0;

	crc = crc32c_update(crc, buf, crc_at);
	crc = crc32c_update(crc, zero, 4);
	crc = crc32c_update(crc, buf + crc_at + 4, total - crc_at - 4);
	return ~crc == want;
}

/* The addresses of a v2 PROXY header of family 0x11 or 0x21 into *h. */
static void v2_addrs(const uint8_t *buf, uint8_t fam, struct pp_header *h)
{
	const uint8_t *a = buf + V2_FIXED;
	size_t alen = fam == 0x11 ? 4 : 16;

	h->family = fam == 0x11 ? AF_INET : AF_INET6;
	addr_bytes(h->family, a, h->src);
	addr_bytes(h->family, a + alen, h->dst);
	h->src_port = be16(a + 2 * alen);
	h->dst_port = be16(a + 2 * alen + 2);
}

/* buf[0..len), len >= 12, starts with the v2 signature. */
static enum pp_result v2_parse(const uint8_t *buf, size_t len,
			       struct pp_header *h, size_t *used,
			       const char **why)
{
	size_t total, crc_at = 0;
	int block;
	enum pp_result r;

	if (len > 12 && buf[12] >> 4 != 2)
		return bad(why, "v2: version is not 2");
	if (len > 12 && (buf[12] & 0x0f) > 1)
		return bad(why, "v2: command is neither LOCAL nor PROXY");
	if (len <= 13)
		return PP_MORE;
	block = v2_block(buf[13], why);
	if (block < 0)
		return PP_BAD;
	if (len < V2_FIXED)
		return PP_MORE;
	if (be16(buf + 14) > V2_LEN_MAX)
		return bad(why, "v2: header longer than 4096 bytes");
	if (be16(buf + 14) < block)
		return bad(why, "v2: length shorter than its address block");
	total = V2_FIXED + be16(buf + 14);
	r = v2_tlvs(buf, len, V2_FIXED + (size_t)block, total, &crc_at, why);
	if (r != PP_OK)
		return r;
	if (len < total)
		return PP_MORE;
	if (crc_at != 0 && !v2_crc_ok(buf, total, crc_at))
		return bad(why, "v2: CRC32c mismatch");
	h->version = 2;
	h->crc32c = crc_at != 0;
	/* LOCAL (0x20): the address block, whatever it holds, is not used */
	if (buf[12] == 0x21 && (buf[13] == 0x11 || buf[13] == 0x21))
		v2_addrs(buf, buf[13], h);
	else
		h->local = true;
	*used = total;
	return PP_OK;
}

enum pp_result proxyproto_parse(const uint8_t *buf, size_t len,
				struct pp_header *h, size_t *used,
				const char **why)
{
	struct pp_header got;
	enum pp_result r;

	memset(h, 0, sizeof(*h));
	memset(&got, 0, sizeof(got));
	*used = 0;
	if (why != NULL)
		*why = NULL;
	if (len == 0)
		return PP_MORE;
	if (buf[0] == 'P' ? !starts(buf, len, V1_SIG, V1_SIG_LEN) :
	    !starts(buf, len, V2_SIG, V2_SIG_LEN))
		return bad(why, "not a PROXY protocol header");
	if (len < (buf[0] == 'P' ? V1_SIG_LEN : V2_SIG_LEN))
		return PP_MORE;
	r = buf[0] == 'P' ? v1_parse(buf, len, &got, used, why) :
		v2_parse(buf, len, &got, used, why);
	if (r != PP_OK)
		return r;
	if (!got.local)
		inet_ntop(got.family, got.family == AF_INET ? got.src + 12 : got.src,
			  got.src_str, sizeof(got.src_str));
	*h = got;
	return PP_OK;
}
