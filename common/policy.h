/*
 * policy.h - what one request is held to (DESIGN.md §3, §4): the modes and
 * limits of the engine, where the key comes from, how it is scoped, and
 * whether the body must be signed.
 *
 * A struct policy is built by route.c, once for the [idemproxy] options
 * (the global policy) and once per [route NAME]; config.h and route.h both
 * include this header. policy.c has the words of its modes and its copy
 * and free.
 */
#ifndef IDEMPROXY_POLICY_H
#define IDEMPROXY_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"
#include "setting.h"

enum in_flight_mode {
	IN_FLIGHT_WAIT,		/* hold duplicates until the winner settles */
	IN_FLIGHT_REJECT,	/* answer duplicates 409 at once */
};

enum store_down_mode {
	STORE_DOWN_FAIL_CLOSED,	/* keyed requests get 503 */
	STORE_DOWN_FAIL_OPEN,	/* keyed requests are forwarded unprotected */
};

/* --on-upstream-error: a shorthand over release_statuses. */
enum upstream_error_mode {
	UPSTREAM_ERROR_RELEASE,	/* the 5xx of release_statuses release */
	UPSTREAM_ERROR_KEEP,	/* no 5xx releases: all are stored */
};

/* What becomes of an exchange whose outcome is unknown (the request may
 * have reached the upstream and no answer says what it did). */
enum unknown_mode {
	UNKNOWN_KEEP,		/* recorded as unknown, replayed, never sent
				 * again (default) */
	UNKNOWN_RELEASE,	/* at-least-once: released, a retry executes */
};

enum key_source {
	KEY_SRC_HEADER,		/* header:NAME */
	KEY_SRC_QUERY,		/* query:NAME (percent-decoded) */
	KEY_SRC_FORM,		/* form:FIELD (urlencoded body) */
	KEY_SRC_JSON,		/* json:/pointer (RFC 6901; string or integer) */
	KEY_SRC_AUTO,		/* the request fingerprint itself */
	KEY_SRC_NONE,		/* not protected: pass through */
};

enum verify_format {
	VERIFY_NONE,
	VERIFY_GITHUB,		/* "sha256=<hex>" of HMAC(secret, body) */
	VERIFY_STRIPE,		/* "t=<unix>,v1=<hex>[,v1=...]" over "<t>.<body>" */
};

/* Who is asking: the namespace of a route's keys (DESIGN.md §4). */
enum scope_source {
	SCOPE_NONE,		/* none: one namespace for the route */
	SCOPE_HEADER,		/* header:NAME - that header's value */
	SCOPE_JWT,		/* jwt:CLAIM - a claim of a verified bearer token */
	SCOPE_TLS_SUBJECT,	/* tls:subject - the verified client certificate */
	SCOPE_TLS_SAN,		/* tls:san - its first subject alternative name */
};

struct jwt_keys;

/* What of the body a fingerprint covers (fpshape.h). */
enum fp_body {
	FP_BODY_RAW,		/* body: the bytes as received */
	FP_BODY_JSON,		/* json: RFC 8785 canonical form */
	FP_BODY_FORM,		/* form: urlencoded fields, decoded and sorted */
};

/* What of the query string a fingerprint covers. */
enum fp_query {
	FP_QUERY_EXACT,		/* exact: the raw request-target */
	FP_QUERY_SORTED,	/* sorted: parameters decoded, sorted, re-encoded */
	FP_QUERY_IGNORE,	/* ignore: the path alone */
};

/* The words of each mode, as both settings tables take and print them. */
extern const struct setting_word policy_in_flight_words[];
extern const struct setting_word policy_store_down_words[];
extern const struct setting_word policy_upstream_error_words[];
extern const struct setting_word policy_unknown_words[];
extern const struct setting_word policy_verify_format_words[];	/* not none */
extern const struct setting_word policy_fp_body_words[];
extern const struct setting_word policy_fp_query_words[];

/* The settings tables (setting.h) store a word of an enum as an int. */
_Static_assert(sizeof(enum in_flight_mode) == sizeof(int) &&
	       sizeof(enum store_down_mode) == sizeof(int) &&
	       sizeof(enum upstream_error_mode) == sizeof(int) &&
	       sizeof(enum unknown_mode) == sizeof(int) &&
	       sizeof(enum verify_format) == sizeof(int) &&
	       sizeof(enum fp_body) == sizeof(int) &&
	       sizeof(enum fp_query) == sizeof(int),
	       "a settings table writes enums as int");

struct policy {
	enum key_source key_source;
	char *key_name;		/* header/query/form name, or JSON pointer */
	char *key_prefix;	/* "" when none */
	bool require_key;
	enum in_flight_mode in_flight;
	uint64_t wait_timeout_ms;
	uint64_t ttl_ms;
	uint64_t lease_ms;
	uint64_t max_body;
	uint64_t max_cached_response;
	enum store_down_mode store_down;
	enum upstream_error_mode on_upstream_error;
	struct status_set release_statuses;	/* upstream statuses that
						 * release the key */
	uint64_t upstream_deadline_ms;	/* a late response is awaited this
					 * long after the request was sent */
	enum unknown_mode unknown_outcome;
	/* outcome_probe = METHOD /path/{key}: asked on an unknown outcome;
	 * NULL: none */
	char *probe_method;
	char *probe_target;	/* with "{key}" where the key goes */
	enum scope_source scope;
	char *scope_name;	/* the header's name or the claim's; else NULL */
	enum verify_format verify;
	char *verify_header;
	char *verify_secret;	/* read from verify_secret_env at load */
	size_t verify_secret_len;
	uint64_t verify_tolerance_ms;
	bool require_issued_key;
	uint64_t issued_key_ttl_ms;
	enum fp_body fp_body;
	enum fp_query fp_query;
	/* fingerprint_ignore / _only: JSON pointers or form field names, one
	 * comma between items and no blanks (fpshape_list()); NULL: unset */
	char *fp_ignore;
	char *fp_only;
	/* scope = jwt:CLAIM (jwt.h) */
	char *jwt_keys_file;
	struct jwt_keys *jwt_keys;	/* loaded by routes_build(); never copied */
	unsigned jwt_algs;		/* allow-list, 1 << enum jwt_alg */
	char *jwt_issuer;		/* NULL: not checked */
	char *jwt_audience;		/* NULL: not checked */
	uint64_t jwt_leeway_ms;		/* for exp and nbf */
};

/* Does this upstream status release the key (the app said it did not or
 * could not act), rather than being stored and replayed? */
static inline bool policy_status_releases(const struct policy *p, int status)
{
	if (status >= 500 && p->on_upstream_error == UPSTREAM_ERROR_KEEP)
		return false;
	return status_set_has(&p->release_statuses, status);
}

/* Are a route's keys namespaced per caller? */
static inline bool policy_scoped(const struct policy *p)
{
	return p->scope != SCOPE_NONE;
}

/* A deep copy of src into dst, but for the loaded JWT keys (dst has none:
 * routes_build() loads a route's own). On -1 (out of memory) dst holds
 * what was copied so far, for policy_free(). */
int policy_copy(struct policy *dst, const struct policy *src) MUSTCHECK;

/* Replace the secret, the old one wiped. -1 when out of memory. */
int policy_set_secret(struct policy *p, const char *secret) MUSTCHECK;

/* Free every string, the secret wiped first, and zero p. */
void policy_free(struct policy *p);

#endif
