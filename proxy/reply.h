/*
 * reply.h - every response head (and small body) the proxy writes to a
 * client itself: its own problems, a relayed upstream head, a replay, an
 * issued key. Only bytes into an evbuffer: what the connection then does
 * (state, closing) is conn.c's.
 */
#ifndef IDEMPROXY_REPLY_H
#define IDEMPROXY_REPLY_H

#include <stdbool.h>
#include <stddef.h>

#include "httphdr.h"
#include "problem.h"
#include "store.h"

struct evbuffer;
struct upstream_resp;

/* How the connection goes on after the response (its Connection field). */
struct reply_conn {
	bool close;		/* the connection ends after this response */
	bool http10;		/* the client speaks HTTP/1.0 */
	const char *rid_name;	/* the request id's field (--request-id-header) */
	const char *rid;	/* ... and value; NULL: none is written */
};

/* The field a replay names the request that executed with. */
#define REPLY_ORIGINAL_ID "Idempotent-Original-Request-Id"

/* A problem document, with Retry-After: 1 where DESIGN §7 wants it. */
void reply_problem(struct evbuffer *out, enum problem p, const char *detail,
		   struct reply_conn rc);

/*
 * An upstream response head as relayed: its end-to-end fields (keep_cl:
 * also its Content-Length, for HEAD and 304 which have no body), then our
 * framing - Content-Length for body BODY_LENGTH, chunked when `chunked` -
 * and our Connection field. An interim (1xx) head carries its fields only;
 * a 101 also its Upgrade field, Connection: upgrade and the request id.
 */
void reply_relay_head(struct evbuffer *out, const struct upstream_resp *r,
		      bool keep_cl, bool chunked, struct reply_conn rc);

/* A stored response, marked Idempotent-Replayed; the body is shared with
 * the store by reference (none for HEAD). The stored head names the
 * request that executed as REPLY_ORIGINAL_ID (idem.c stores it so); this
 * request's id is written as rc.rid_name, in place of a stored field of
 * that name. */
void reply_replay(struct evbuffer *out, struct stored_response *r, bool head,
		  struct reply_conn rc);

/* The request id a stored response keeps (the request that executed, its
 * REPLY_ORIGINAL_ID field) into out (len bytes); false when it has none. */
bool reply_stored_id(const struct stored_response *r, char *out, size_t len);

/* 200 {"key":"..."} for GET /.well-known/idempotency-key. */
void reply_issued_key(struct evbuffer *out, const char *key,
		      struct reply_conn rc);

#endif
