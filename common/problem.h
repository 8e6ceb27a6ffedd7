/*
 * problem.h - the responses idemproxy makes itself: RFC 9457 problem details
 * (application/problem+json), one row per problem type.
 */
#ifndef IDEMPROXY_PROBLEM_H
#define IDEMPROXY_PROBLEM_H

#include <stddef.h>

#include "metrics.h"

/*        name                  status slug                        title */
#define PROBLEM_LIST(X) \
	X(BAD_REQUEST,           400, "bad-request",              "Bad Request") \
	X(MISSING_KEY,           400, "missing-idempotency-key",  "Idempotency-Key Required") \
	X(INVALID_KEY,           400, "invalid-idempotency-key",  "Invalid Idempotency-Key") \
	X(SIGNATURE_INVALID,     401, "signature-invalid",        "Signature Invalid") \
	X(TOKEN_INVALID,         401, "invalid-token",            "Verified Bearer Token Required") \
	X(CERT_REQUIRED,         401, "client-certificate-required", "Verified Client Certificate Required") \
	X(REQUEST_TIMEOUT,       408, "request-timeout",          "Request Timeout") \
	X(IN_PROGRESS,           409, "request-in-progress",      "Request In Progress") \
	X(RESPONSE_NOT_STORED,   409, "response-not-stored",      "Response Not Stored") \
	X(BODY_TOO_LARGE,        413, "body-too-large",           "Content Too Large") \
	X(KEY_MISMATCH,          422, "idempotency-key-mismatch", "Idempotency-Key Reused With A Different Request") \
	X(HEADERS_TOO_LARGE,     431, "headers-too-large",        "Request Header Fields Too Large") \
	X(NOT_IMPLEMENTED,       501, "not-implemented",          "Not Implemented") \
	X(TOO_MANY_REQUESTS,     429, "too-many-requests",        "Too Many Requests") \
	X(UPSTREAM_UNAVAILABLE,  502, "upstream-unavailable",     "Bad Gateway") \
	X(UPSTREAM_TLS,          502, "upstream-tls",             "Bad Gateway") \
	X(SERVER_BUSY,           503, "server-busy",              "Server Busy") \
	X(STORE_UNAVAILABLE,     503, "store-unavailable",        "Idempotency Store Unavailable") \
	X(UPSTREAM_TIMEOUT,      504, "upstream-timeout",         "Gateway Timeout")

enum problem {
#define X(name, status, slug, title) PROBLEM_##name,
	PROBLEM_LIST(X)
#undef X
	PROBLEM_COUNT
};

int problem_status(enum problem p);
const char *problem_slug(enum problem p);
const char *problem_title(enum problem p);
/* The reason phrase for a status line ("Not Found"); "" when unknown. */
const char *http_reason(int status);

/*
 * Render the JSON body into buf (NUL-terminated, truncated to len). detail
 * may be NULL. Returns the body length.
 */
size_t problem_render(enum problem p, const char *detail, char *buf, size_t len);

/*
 * The problem (502 or 504) and detail for a failed upstream exchange: one
 * mapping, so that a stored 502 is byte for byte the live one.
 */
enum problem problem_upstream(enum upstream_error err, const char **detail);

#endif
