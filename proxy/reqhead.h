/*
 * reqhead.h - the request head the proxy sends upstream: request line with
 * the upstream's path prefix, the client's end-to-end fields, Host when the
 * client sent none, X-Forwarded-For/-Proto/-Host (DESIGN.md §1, §7), the
 * verified client certificate's names (X-Client-Cert-Subject and -SAN, with
 * --tls-client-ca: the client's own fields of those names are dropped, also
 * spelt with '_' for '-'), the request id and our traceparent (in place of
 * the client's fields of those names), and our own body framing.
 */
#ifndef IDEMPROXY_REQHEAD_H
#define IDEMPROXY_REQHEAD_H

#include <stdbool.h>
#include <stdint.h>

#include "httphdr.h"

struct config;
struct evbuffer;

struct reqhead {
	int method;			/* llhttp method number */
	const char *target;		/* origin form (reqhead_origin_target) */
	const struct hdrlist *fields;	/* as the client sent them */
	const char *peer;		/* the client's address */
	bool tls;			/* the client came over TLS */
	const struct config *cfg;	/* upstream prefix, host and port */
	enum body_kind body;		/* NONE, LENGTH or CHUNKED */
	uint64_t length;		/* BODY_LENGTH: the whole body */
	bool drop_expect;		/* the proxy answered 100-continue */
	const char *client_subject;	/* a verified client certificate's: */
	const char *client_san;		/* X-Client-Cert-Subject / -SAN */
	const char *request_id;		/* as cfg->request_id_header: replaces
					 * the client's field; NULL: none */
	const char *traceparent;	/* ours, replacing the client's; NULL:
					 * the client's goes as it came */
	bool upgrade;			/* an upgrade (reqhead_upgrade): its
					 * Upgrade fields go with Connection:
					 * upgrade */
};

/*
 * Does the request ask to switch protocols - Connection naming "upgrade"
 * and an Upgrade field, HTTP/1.1 (RFC 9110 §7.8)? Not for h2c: the
 * upstream is spoken to in HTTP/1.1, and an Upgrade offering h2c is
 * dropped as hop-by-hop, the request going on as a plain one.
 */
bool reqhead_upgrade(const struct hdrlist *fields, unsigned http_minor);

void reqhead_write(struct evbuffer *out, const struct reqhead *r);

/* The request-target in origin form, or NULL when it cannot be forwarded.
 * An absolute-form target ("http://host/path") is cut to its path. */
const char *reqhead_origin_target(const char *target, int method);

/*
 * The target a request is routed and forwarded by (DESIGN §7: routes match
 * the path that is forwarded, after the same normalisation). From the raw
 * target: the origin form (an absolute form gives its path), percent-
 * encoded unreserved characters decoded, runs of '/' made one. Refused (-1):
 * a form that cannot be forwarded, dot segments ("." or "..", encoded or
 * not), an encoded '/', '\' or NUL, a raw '\'. fwd gets the normalised
 * target (the query as sent); match gets the path routes are matched
 * against: also without ";params" in its segments and without a trailing
 * '/', so that no spelling an upstream may treat as a protected path
 * escapes its route. Both buffers hold strlen(target) + 1 bytes.
 */
int reqhead_normalise(const char *target, int method, char *fwd, char *match);

#endif
