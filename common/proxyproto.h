/*
 * proxyproto.h - the PROXY protocol header (haproxy's proxy-protocol.txt,
 * versions 1 and 2) that a load balancer in front of idemproxy sends at the
 * start of a connection to name the client it accepted. Only the parser: the
 * caller reads from its socket and hands over the bytes it has so far.
 *
 * A hostile client is assumed, so the parser is strict and decides early:
 *   - the first bytes must start "PROXY " (v1) or the 12-byte v2 signature
 *     "\r\n\r\n\0\r\nQUIT\n": a plain "GET / HTTP/1.1" is refused at its
 *     first byte, never after waiting for a whole header's worth;
 *   - v1 is "PROXY TCP4|TCP6 SRC DST SPORT DPORT\r\n" with single spaces,
 *     addresses of the named family, ports 0-65535 in at most 5 digits, or
 *     "PROXY UNKNOWN" and anything up to the CRLF; at most 107 bytes;
 *   - v2 is version 2, command LOCAL or PROXY, TCP over IPv4 or IPv6, UNSPEC
 *     or a UNIX stream (datagrams are refused: this is a stream), a length
 *     of at most 4096 (refused as soon as the 16-byte fixed part is in),
 *     then TLVs, each within the header; a CRC32c TLV must match.
 * PP_MORE is returned only while the bytes so far can still begin a valid
 * header, so a caller holding PP_MAX bytes always has its answer.
 */
#ifndef IDEMPROXY_PROXYPROTO_H
#define IDEMPROXY_PROXYPROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

#define PP_V1_MAX 107		/* v1 header, CRLF included (spec) */
#define PP_MAX (16 + 4096)	/* the longest header accepted (v2 with TLVs);
				 * longer is refused */

enum pp_result {
	PP_MORE = 0,		/* a valid prefix so far: read more */
	PP_OK = 1,		/* a whole header, *h filled */
	PP_BAD = -1,		/* not a header we accept: close the connection */
};

struct pp_header {
	int version;		/* 1 or 2 */
	bool local;		/* no address carried (v2 LOCAL, v1 UNKNOWN,
				 * v2 UNSPEC or UNIX): the caller keeps the
				 * socket's peer */
	int family;		/* AF_INET or AF_INET6 when !local, else 0 */
	uint8_t src[16], dst[16];	/* network order; IPv4 as ::ffff:a.b.c.d
					 * (as in cidr.h) */
	uint16_t src_port, dst_port;	/* host order */
	char src_str[46];	/* inet_ntop text of src, IPv4 as a dotted quad
				 * (not mapped); "" when local */
	bool crc32c;		/* v2: a CRC32c TLV was there (and matched) */
};

/*
 * Look at the bytes buf[0..len) a connection started with (never past len).
 * PP_MORE: they may still begin a valid header, read more (never returned
 * once len >= PP_MAX). PP_OK: *h is filled and *used is the header's length;
 * the bytes after it belong to the HTTP stream. PP_BAD: *why (when why is
 * not NULL) is a static sentence saying what is wrong. *h is zeroed and
 * *used is 0 unless PP_OK; the result depends on the bytes alone.
 */
enum pp_result proxyproto_parse(const uint8_t *buf, size_t len,
				struct pp_header *h, size_t *used,
				const char **why) MUSTCHECK;

/* CRC32c (Castagnoli, RFC 4960 appendix B) of buf[0..len), as the v2
 * CRC32c TLV carries it. */
uint32_t proxyproto_crc32c(const uint8_t *buf, size_t len);

#endif
