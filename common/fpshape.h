/*
 * fpshape.h - what counts as the same request: the fingerprint of a route
 * that shapes it (DESIGN.md §4; docs/protocol.md "Shaped fingerprints").
 *
 *   fingerprint        = body | json | form
 *   fingerprint_ignore = /sent_at, /meta/nonce	  (json: RFC 6901 pointers;
 *   fingerprint_only   = /amount, /currency	   form: field names)
 *   fingerprint_query  = exact | sorted | ignore
 *
 * The default (body, exact, no list) is fp_compute()'s fingerprint byte
 * for byte. Any other shaping is fingerprinted under its own description
 * (fp_compute_shaped()), so that a record written under one shaping never
 * matches a request fingerprinted under another: a changed setting answers
 * 422 where it could otherwise replay a response to a different request.
 */
#ifndef IDEMPROXY_FPSHAPE_H
#define IDEMPROXY_FPSHAPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"
#include "fingerprint.h"
#include "policy.h"

/* A list as written ("/a, /b ,/c") into *out as "/a,/b,/c" (allocated,
 * the old string freed). -1 with why: an empty item, or out of memory. */
int fpshape_list(const char *v, char **out, char *why, size_t len) MUSTCHECK;

/* p's shaping as a whole: a list needs fingerprint = json or form, not
 * both lists, and with json every item is an RFC 6901 pointer. */
int fpshape_check(const struct policy *p, char *why, size_t len) MUSTCHECK;

/* Is p's fingerprint fp_compute()'s (body, exact, no list)? */
bool fpshape_is_default(const struct policy *p);

/*
 * Is a body whose Content-Type field value is ctype (NULL: the request
 * has none, or more than one) of the media type a route's `fingerprint`
 * shapes? FP_BODY_JSON: application/json or a +json type (RFC 6839:
 * application/problem+json); FP_BODY_FORM:
 * application/x-www-form-urlencoded; either without regard to case,
 * parameters (; charset=utf-8) allowed. FP_BODY_RAW (the bytes): any.
 * Also what a form: or json: key source asks of a body (keyed.c).
 */
bool fpshape_media(enum fp_body body, const char *ctype);

/*
 * The fingerprint of a request under p; ctype is its Content-Type value
 * (NULL: none, or more than one). *fallback is set when p shapes the body
 * as json or form and the body is not that - ctype is not its media type
 * (fpshape_media()), or its bytes do not parse as one; it is then
 * fingerprinted by its raw bytes, under p's description still. json and
 * form lists name places in the body as the client sent it, each whatever
 * the others name. 0 or -1 (out of memory).
 */
int fpshape_compute(const struct policy *p, const char *method,
		    const char *target, const char *ctype, const char *body,
		    size_t len, uint8_t out[FP_LEN], bool *fallback) MUSTCHECK;

/* The words --check-config and the fingerprint use for p's shaping:
 * "body=json;query=sorted;ignore=/a,/b". Cut short to fit buf. */
void fpshape_describe(const struct policy *p, char *buf, size_t len);

#endif
