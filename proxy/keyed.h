/*
 * keyed.h - a protected request on its way to the engine, without a socket:
 * the route's policy, the request head and (later) its buffered body in;
 * the engine's request, or the answer the proxy gives itself, out.
 *
 *   keyed_start(head)  ──▶ PASS    forward it unprotected, body streamed
 *        │                 ANSWER  400 (invalid or missing key), 413, 401
 *        ▼ BUFFER
 *   (conn.c buffers the body up to max_body)
 *        │
 *   keyed_prepare(head, body) ──▶ ENGINE  the idem_request is filled
 *                                 ANSWER  401 (signature, identity), 400 (key)
 *
 * A route scoped by a verified identity (jwt:, tls:) checks it once the key
 * is known to be there: a request with a key and no valid identity is 401,
 * a request without a key passes as it would have (the upstream does its
 * own authentication).
 *
 * DESIGN.md §1 items 2-5, §4 (key sources, scope, verify, issued keys).
 */
#ifndef IDEMPROXY_KEYED_H
#define IDEMPROXY_KEYED_H

#include <stdbool.h>
#include <stdint.h>

#include "body.h"
#include "httphdr.h"
#include "idem.h"
#include "idemkey.h"
#include "metrics.h"
#include "problem.h"

struct config;
struct evbuffer;
struct policy;

/* What the head of a protected request says. */
struct keyed_head {
	const struct policy *policy;	/* the route's, or the global one */
	struct config *cfg;		/* the engine takes a reference */
	int method;			/* llhttp method number */
	const char *target;		/* raw request-target (fingerprinted) */
	const char *fwd_target;		/* normalised (reqhead_normalise) */
	const char *route;		/* the route's name; NULL: global */
	const struct hdrlist *fields;
	enum body_kind body;		/* NONE, LENGTH or CHUNKED */
	uint64_t length;		/* BODY_LENGTH: declared length */
	const char *peer;		/* for X-Forwarded-For */
	bool tls;			/* for X-Forwarded-Proto */
	const char *tls_subject;	/* the verified client certificate's */
	const char *tls_san;		/* ... (NULL: none, or not verified) */
	const char *request_id;		/* reqhead.h's */
	const char *traceparent;
};

enum keyed_verdict {
	KEYED_PASS,		/* forward unprotected, as a legacy request */
	KEYED_BUFFER,		/* buffer the body, then keyed_prepare() */
	KEYED_ENGINE,		/* hand the request to the engine */
	KEYED_ANSWER,		/* answer with the problem */
};

/* The longest caller a scope names: a JWT claim, a certificate subject. */
#define KEYED_CALLER_MAX 512

/* The key as far as the head tells it. */
struct keyed_key {
	char key[IDEMKEY_MAX + 1];	/* with the route's key_prefix */
	bool pending;			/* it comes from the body */
	char caller[KEYED_CALLER_MAX + 1];  /* jwt: and tls: scopes, verified */
};

/* A problem the proxy answers with instead. */
struct keyed_answer {
	enum problem problem;
	enum outcome outcome;
	bool close;			/* the body was not read: close after */
	char detail[320];
};

/* At the end of the head: PASS, BUFFER or ANSWER. */
enum keyed_verdict keyed_start(const struct keyed_head *h, struct keyed_key *k,
			       struct keyed_answer *a);

/*
 * With the whole body buffered: ENGINE (req filled; the body was lent to
 * req->request behind the upstream head, body_hand_over: its budget goes
 * with it) or ANSWER. A body key that
 * cannot be had without require_key sends the request through unprotected
 * (req->unprotected) - still ENGINE, since the body is buffered.
 */
enum keyed_verdict keyed_prepare(const struct keyed_head *h, struct keyed_key *k,
				 struct body *body, struct idem_request *req,
				 struct keyed_answer *a);

/*
 * The store scope of a key: route is the route's name (NULL: the global
 * policy), p its policy (NULL: not known, value taken as a header's);
 * value the caller (NULL: the policy is not scoped): the scope header's
 * value ("" with len 0 when the header was absent), the verified claim or
 * the certificate's subject or SAN. "" when neither. Also what GET /keys
 * and `idemproxy keys` address.
 */
void keyed_scope(const char *route, const struct policy *p, const char *value,
		 size_t len, char scope[STORE_SCOPE_LEN + 1]);

#endif
