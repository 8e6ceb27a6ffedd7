/*
 * httphdr.h - HTTP/1.1 header rules shared by both sides of the proxy.
 *
 * struct hdrlist collects the header fields of one message as llhttp delivers
 * them: a name or value may arrive in several pieces when it spans two reads,
 * so pieces are appended until the next field starts. Names and values live
 * in one growing arena and are addressed by offset, so growth never leaves a
 * dangling pointer behind.
 */
#ifndef IDEMPROXY_HTTPHDR_H
#define IDEMPROXY_HTTPHDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>

#include "compiler.h"

/* How a message body is delimited on the wire. */
enum body_kind {
	BODY_NONE,		/* no body at all (GET, 204, 304, HEAD response) */
	BODY_LENGTH,		/* Content-Length bytes */
	BODY_CHUNKED,		/* Transfer-Encoding: chunked */
	BODY_EOF,		/* response only: until the connection closes */
};

struct hdr {
	uint32_t name_off, name_len;
	uint32_t value_off, value_len;
};

struct hdrlist {
	char *arena;
	size_t used, cap;
	struct hdr *v;
	uint32_t n, alloc;
	uint8_t open;		/* HDR_OPEN_*: what the next piece continues */
};

void hdrlist_init(struct hdrlist *h);
/* Forget all fields; keep at most a small arena for the next message. */
void hdrlist_reset(struct hdrlist *h);
void hdrlist_free(struct hdrlist *h);

/* Append a piece of a field name or value (llhttp on_header_field/value). */
int hdrlist_add_name(struct hdrlist *h, const char *p, size_t len) MUSTCHECK;
int hdrlist_add_value(struct hdrlist *h, const char *p, size_t len) MUSTCHECK;
/* The current field is complete (llhttp on_header_value_complete); the next
 * name piece starts a new field. A field with no value piece gets "". */
int hdrlist_end_field(struct hdrlist *h) MUSTCHECK;
/* Append a whole field. */
int hdrlist_add(struct hdrlist *h, const char *name, const char *value) MUSTCHECK;

static inline const char *hdr_name(const struct hdrlist *h, uint32_t i)
{
	return h->arena + h->v[i].name_off;
}

/* Is field i named `name` (len bytes, any case)? */
static inline bool hdr_named(const struct hdrlist *h, uint32_t i,
			     const char *name, size_t len)
{
	return h->v[i].name_len == len &&
	       strncasecmp(hdr_name(h, i), name, len) == 0;
}

static inline const char *hdr_value(const struct hdrlist *h, uint32_t i)
{
	return h->arena + h->v[i].value_off;
}

/* Index of the first field named `name` (case-insensitive) at or after
 * `from`, or -1. */
int hdrlist_find(const struct hdrlist *h, const char *name, uint32_t from);

/* Is this field hop-by-hop by RFC 9110 §7.6.1 (Connection, Keep-Alive,
 * Proxy-Connection, TE, Trailer, Transfer-Encoding, Upgrade)? */
bool httphdr_is_hop_by_hop(const char *name, size_t len);

/* Does a comma-separated token list (Connection, Transfer-Encoding) contain
 * `token`, compared case-insensitively? Empty elements are skipped. */
bool httphdr_list_has(const char *list, size_t len, const char *token);

/*
 * Should field i of h be dropped when forwarding: hop-by-hop, named by any
 * Connection field of h, or Content-Length/Transfer-Encoding (the proxy
 * writes its own framing)?
 */
bool httphdr_drop_on_forward(const struct hdrlist *h, uint32_t i);

/*
 * Is the field name s[0..len) the name `name` once every '_' of both is read
 * as '-', letters compared case-insensitively? X_Client_Cert_SAN and
 * X-Client-Cert_SAN are other fields than X-Client-Cert-SAN in HTTP, but
 * the same variable (HTTP_X_CLIENT_CERT_SAN) to CGI, WSGI and Rack servers:
 * a field the proxy vouches for must be dropped in all its spellings.
 */
bool httphdr_name_folds_to(const char *s, size_t len, const char *name);

/* Is the name a valid RFC 9110 token (non-empty, tchar only)? */
bool httphdr_is_token(const char *s, size_t len);

/*
 * Reject what llhttp lets through but a proxy must not forward: a field
 * name with whitespace or a non-token character, a value with a control
 * character other than HTAB. Returns 0 when every field is clean.
 */
int httphdr_validate(const struct hdrlist *h) MUSTCHECK;

#endif
