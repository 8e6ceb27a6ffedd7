/*
 * problem.h - the responses idemproxy makes itself: RFC 9457 problem details
 * (application/problem+json), one row per problem type.
 *
 * Each document also carries an "error" member in the shape of Stripe's error
 * object, {"type": <error type>, "code": <slug>, "message": <detail>}: SDKs
 * such as stripe-node and openai find an error by that member, not by the
 * status, and without it report a 409 or 422 as a success or as "no body"
 * (docs/protocol.md "Problem details"). The error type is Stripe's
 * vocabulary: idempotency_error for what a key's state decides (409, 422,
 * the 502 outcome-unknown), authentication_error for 401, rate_limit_error
 * for 429, invalid_request_error for the other 4xx, api_error for the other
 * 5xx.
 */
#ifndef IDEMPROXY_PROBLEM_H
#define IDEMPROXY_PROBLEM_H

#include <stddef.h>

#include "metrics.h"

/*        name                  status slug                           error type               title */
#define PROBLEM_LIST(X) \
	X(BAD_REQUEST,           400, "bad-request",                 "invalid_request_error", "Bad Request") \
	X(MISSING_KEY,           400, "missing-idempotency-key",     "invalid_request_error", "Idempotency-Key Required") \
	X(INVALID_KEY,           400, "invalid-idempotency-key",     "invalid_request_error", "Invalid Idempotency-Key") \
	X(SIGNATURE_INVALID,     401, "signature-invalid",           "authentication_error",  "Signature Invalid") \
	X(TOKEN_INVALID,         401, "invalid-token",               "authentication_error",  "Verified Bearer Token Required") \
	X(CERT_REQUIRED,         401, "client-certificate-required", "authentication_error",  "Verified Client Certificate Required") \
	X(REQUEST_TIMEOUT,       408, "request-timeout",             "invalid_request_error", "Request Timeout") \
	X(IN_PROGRESS,           409, "request-in-progress",         "idempotency_error",     "Request In Progress") \
	X(RESPONSE_NOT_STORED,   409, "response-not-stored",         "idempotency_error",     "Response Not Stored") \
	X(BODY_TOO_LARGE,        413, "body-too-large",              "invalid_request_error", "Content Too Large") \
	X(KEY_MISMATCH,          422, "idempotency-key-mismatch",    "idempotency_error",     "Idempotency-Key Reused With A Different Request") \
	X(HEADERS_TOO_LARGE,     431, "headers-too-large",           "invalid_request_error", "Request Header Fields Too Large") \
	X(NOT_IMPLEMENTED,       501, "not-implemented",             "api_error",             "Not Implemented") \
	X(TOO_MANY_REQUESTS,     429, "too-many-requests",           "rate_limit_error",      "Too Many Requests") \
	X(UPSTREAM_UNAVAILABLE,  502, "upstream-unavailable",        "api_error",             "Bad Gateway") \
	X(UPSTREAM_TLS,          502, "upstream-tls",                "api_error",             "Bad Gateway") \
	X(OUTCOME_UNKNOWN,       502, "outcome-unknown",             "idempotency_error",     "Outcome Unknown") \
	X(SERVER_BUSY,           503, "server-busy",                 "api_error",             "Server Busy") \
	X(STORE_UNAVAILABLE,     503, "store-unavailable",           "api_error",             "Idempotency Store Unavailable") \
	X(UPSTREAM_TIMEOUT,      504, "upstream-timeout",            "api_error",             "Gateway Timeout")

enum problem {
#define X(name, status, slug, error_type, title) PROBLEM_##name,
	PROBLEM_LIST(X)
#undef X
	PROBLEM_COUNT
};

int problem_status(enum problem p);
const char *problem_slug(enum problem p);
const char *problem_title(enum problem p);
/* The error.type member: "idempotency_error", "api_error", ... */
const char *problem_error_type(enum problem p);
/* The reason phrase for a status line ("Not Found"); "" when unknown. */
const char *http_reason(int status);

/*
 * The longest body problem_render() makes for a detail of n bytes: the
 * members of the longest row with an empty detail (PROBLEM_FIXED_MAX, checked
 * by tests/unit/test_problem.c), plus the detail twice ("detail" and
 * error.message), each byte escaped to at most 6 ("\u001f"). A buffer of
 * PROBLEM_BODY_MAX(n) + 1 bytes holds any body with its NUL.
 */
#define PROBLEM_FIXED_MAX	224
#define PROBLEM_BODY_MAX(n)	(PROBLEM_FIXED_MAX + 2 * 6 * (size_t)(n))

/*
 * Render the JSON body into buf (NUL-terminated). detail may be NULL: the
 * title stands in for it. A body that does not fit in len bytes has its
 * detail shortened, in both places and never inside an escape or a UTF-8
 * sequence, so that it is still one JSON document with every member; only a
 * buffer too small for even that is cut anywhere. Returns the body length.
 */
size_t problem_render(enum problem p, const char *detail, char *buf, size_t len);

/* The longest request id a document carries (a longer one is left out). */
#define PROBLEM_REQUEST_ID_MAX 128

/* The same with a "request_id" member after "error" (request_id NULL: none,
 * as problem_render). Room for it: PROBLEM_BODY_MAX(n) +
 * PROBLEM_REQUEST_ID_EXTRA. The id is never shortened: it is left out
 * whole when longer than PROBLEM_REQUEST_ID_MAX. */
#define PROBLEM_REQUEST_ID_EXTRA (16 + 6 * PROBLEM_REQUEST_ID_MAX)
size_t problem_render_id(enum problem p, const char *detail,
			 const char *request_id, char *buf, size_t len);

/*
 * The problem (502 or 504) and detail for a failed upstream exchange: one
 * mapping, so that a stored 502 is byte for byte the live one.
 */
enum problem problem_upstream(enum upstream_error err, const char **detail);

#endif
