/*
 * The problem documents (common/problem.c) as a JSON parser reads them: every
 * row renders to one valid document holding the RFC 9457 members and the
 * "error" member SDKs look for (stripe-node, openai: docs/protocol.md
 * "Problem details"), its type in Stripe's vocabulary, its code the slug and
 * its message the detail. Details with quotes, backslashes, control
 * characters and UTF-8 come back as they went in; PROBLEM_FIXED_MAX and
 * PROBLEM_BODY_MAX bound what callers size their buffers by; a buffer too
 * small shortens the detail and still makes a whole document.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "problem.h"
#include "json_strict.h"
#include "tap.h"

/* The error type a problem must have, decided from its status alone (and
 * the one 502 that a key's state decides), not from the table. */
static const char *want_error_type(enum problem p)
{
	int status = problem_status(p);

	if (status == 409 || status == 422 || p == PROBLEM_OUTCOME_UNKNOWN)
		return "idempotency_error";
	if (status == 401)
		return "authentication_error";
	if (status == 429)
		return "rate_limit_error";
	if (status >= 400 && status < 500)
		return "invalid_request_error";
	if (status >= 500 && status < 600)
		return "api_error";
	return "(no error type)";
}

/* text parsed strictly, UTF-8 validated; NULL when it is not one JSON
 * document. */
static struct json_object *parse(const char *text)
{
	return json_strict(text, strlen(text));
}

/* The string member `name` of o, or NULL. */
static const char *member_str(struct json_object *o, const char *name)
{
	struct json_object *m;

	if (!json_object_object_get_ex(o, name, &m) ||
	    !json_object_is_type(m, json_type_string))
		return NULL;
	return json_object_get_string(m);
}

/*
 * Render p with detail into a buffer of len bytes and check the document:
 * every member there and right, "detail" and error.message equal, and equal
 * to want_detail (NULL: only a prefix of the detail is required, for a
 * shortened one). Returns the body length, 0 on any failure.
 */
static size_t check_doc(enum problem p, const char *detail, size_t len,
			const char *want_detail, const char *what)
{
	char *buf = malloc(len);
	char urn[128];
	struct json_object *doc, *err, *status;
	const char *d, *msg, *full = detail ? detail : problem_title(p);
	size_t n;
	bool good;

	if (buf == NULL)
		abort();
	n = problem_render(p, detail, buf, len);
	snprintf(urn, sizeof(urn), "urn:idemproxy:problem:%s", problem_slug(p));
	doc = parse(buf);
	good = ok(doc != NULL && n == strlen(buf) && n < len,
		  "%s %s: valid JSON, length %zu returned", problem_slug(p),
		  what, n);
	if (!good) {
		printf("#   %s\n", buf);
		goto done;
	}
	d = member_str(doc, "detail");
	good = json_object_object_length(doc) == 5 &&
	       json_object_object_get_ex(doc, "status", &status) &&
	       json_object_is_type(status, json_type_int) &&
	       json_object_get_int(status) == problem_status(p) &&
	       member_str(doc, "type") != NULL &&
	       strcmp(member_str(doc, "type"), urn) == 0 &&
	       member_str(doc, "title") != NULL &&
	       strcmp(member_str(doc, "title"), problem_title(p)) == 0 &&
	       d != NULL && (want_detail ? strcmp(d, want_detail) == 0 :
			     strncmp(d, full, strlen(d)) == 0);
	ok(good, "%s %s: type, title, status, detail", problem_slug(p), what);
	good = json_object_object_get_ex(doc, "error", &err) &&
	       json_object_is_type(err, json_type_object) &&
	       json_object_object_length(err) == 3;
	msg = good ? member_str(err, "message") : NULL;
	good = good && member_str(err, "type") != NULL &&
	       strcmp(member_str(err, "type"), want_error_type(p)) == 0 &&
	       member_str(err, "code") != NULL &&
	       strcmp(member_str(err, "code"), problem_slug(p)) == 0 &&
	       msg != NULL && d != NULL && strcmp(msg, d) == 0;
	if (!ok(good, "%s %s: error {type, code, message}", problem_slug(p),
		what))
		printf("#   %s\n", buf);
done:
	json_object_put(doc);
	free(buf);
	return good ? n : 0;
}

static void test_every_row(void)
{
	static const char nasty[] = "said \"no\" \\ then\n\ttab\x01\x1f "
				    "caf\xc3\xa9 \xe2\x82\xac end";
	size_t fixed_max = 0;

	for (int i = 0; i < PROBLEM_COUNT; i++) {
		enum problem p = (enum problem)i;
		char buf[1024];		/* more than any row: not clamped */
		size_t n;

		is_str(problem_error_type(p), want_error_type(p),
		       "%s: error type %s", problem_slug(p), want_error_type(p));
		check_doc(p, NULL, 1024, problem_title(p), "no detail");
		check_doc(p, "the store did not answer", 1024,
			  "the store did not answer", "plain detail");
		check_doc(p, nasty, 1024, nasty, "escaped detail");
		n = problem_render(p, "", buf, sizeof(buf));
		if (n > fixed_max)
			fixed_max = n;
	}
	is_int(fixed_max, PROBLEM_FIXED_MAX,
	       "PROBLEM_FIXED_MAX is the longest row's body with no detail");
}

/* The table as the SDKs need it, named row by row. */
static void test_types(void)
{
	static const struct {
		enum problem p;
		const char *type;
	} rows[] = {
		{ PROBLEM_IN_PROGRESS, "idempotency_error" },
		{ PROBLEM_RESPONSE_NOT_STORED, "idempotency_error" },
		{ PROBLEM_KEY_MISMATCH, "idempotency_error" },
		{ PROBLEM_OUTCOME_UNKNOWN, "idempotency_error" },
		{ PROBLEM_UPSTREAM_UNAVAILABLE, "api_error" },
		{ PROBLEM_STORE_UNAVAILABLE, "api_error" },
		{ PROBLEM_NOT_IMPLEMENTED, "api_error" },
		{ PROBLEM_TOKEN_INVALID, "authentication_error" },
		{ PROBLEM_TOO_MANY_REQUESTS, "rate_limit_error" },
		{ PROBLEM_HEADERS_TOO_LARGE, "invalid_request_error" },
		{ PROBLEM_REQUEST_TIMEOUT, "invalid_request_error" },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		is_str(problem_error_type(rows[i].p), rows[i].type, "%d %s",
		       problem_status(rows[i].p), problem_slug(rows[i].p));
}

/* The document docs/protocol.md shows, byte for byte. */
static void test_exact(void)
{
	char buf[1024];

	char longid[PROBLEM_REQUEST_ID_MAX + 2];

	problem_render_id(PROBLEM_IN_PROGRESS, "a request with this key is "
			  "still in progress", "3f1c2a9e-8b4d-4e7a-9c21-5d6e7f8a9b0c",
			  buf, sizeof(buf));
	is_str(buf, "{\"type\":\"urn:idemproxy:problem:request-in-progress\","
	       "\"title\":\"Request In Progress\",\"status\":409,"
	       "\"detail\":\"a request with this key is still in progress\","
	       "\"error\":{\"type\":\"idempotency_error\","
	       "\"code\":\"request-in-progress\",\"message\":\"a request with "
	       "this key is still in progress\"},"
	       "\"request_id\":\"3f1c2a9e-8b4d-4e7a-9c21-5d6e7f8a9b0c\"}",
	       "409 in full, with its request id");
	problem_render(PROBLEM_IN_PROGRESS, NULL, buf, sizeof(buf));
	ok(strstr(buf, "request_id") == NULL, "no request id: no member");
	memset(longid, 'a', sizeof(longid) - 1);
	longid[sizeof(longid) - 1] = '\0';
	problem_render_id(PROBLEM_IN_PROGRESS, NULL, longid, buf, sizeof(buf));
	ok(strstr(buf, "request_id") == NULL && buf[strlen(buf) - 1] == '}',
	   "an id longer than PROBLEM_REQUEST_ID_MAX is left out whole");
	longid[PROBLEM_REQUEST_ID_MAX] = '\0';
	problem_render_id(PROBLEM_IN_PROGRESS, NULL, longid, buf, sizeof(buf));
	ok(strstr(buf, longid) != NULL, "an id of PROBLEM_REQUEST_ID_MAX is kept");
}

/* A detail of n control characters (the widest escape) fits
 * PROBLEM_BODY_MAX(n) whole, for the longest row. */
static void test_body_max(void)
{
	enum { N = 319 };
	char detail[N + 1];
	size_t n;

	memset(detail, '\x01', N);
	detail[N] = '\0';
	n = check_doc(PROBLEM_KEY_MISMATCH, detail, PROBLEM_BODY_MAX(N) + 1,
		      detail, "319 control characters");
	is_int(n, PROBLEM_BODY_MAX(N), "the longest row reaches PROBLEM_BODY_MAX");
}

/* Every buffer size from too small to whole: a shorter detail, never a
 * cut escape, UTF-8 sequence or document; below the fixed part, cut but
 * NUL-terminated inside the buffer. */
static void test_small_buffers(void)
{
	static const char detail[] = "\"q\" \\ \n caf\xc3\xa9 \xe2\x82\xac "
				     "\xf0\x9f\x98\x80 and more text after it";
	char whole[1024], label[32];
	size_t full, fixed, bad = 0;

	full = problem_render(PROBLEM_KEY_MISMATCH, detail, whole, sizeof(whole));
	fixed = problem_render(PROBLEM_KEY_MISMATCH, "", whole, sizeof(whole));
	for (size_t len = fixed + 1; len <= full + 1; len++) {
		snprintf(label, sizeof(label), "in %zu bytes", len);
		if (check_doc(PROBLEM_KEY_MISMATCH, detail, len,
			      len == full + 1 ? detail : NULL, label) == 0)
			bad++;
	}
	is_int(bad, 0, "every size from %zu to %zu bytes", fixed + 1, full + 1);
	for (size_t len = 1; len <= fixed; len += 37) {
		char *buf = malloc(len);
		size_t n;

		if (buf == NULL)
			abort();
		n = problem_render(PROBLEM_KEY_MISMATCH, detail, buf, len);
		ok(n == len - 1 && strlen(buf) == n,
		   "%zu bytes: cut to %zu, NUL-terminated", len, n);
		free(buf);
	}
	is_int(problem_render(PROBLEM_KEY_MISMATCH, detail, whole, 0), 0,
	       "no buffer: nothing written");
}

int main(void)
{
	test_every_row();
	test_types();
	test_exact();
	test_body_max();
	test_small_buffers();
	return tap_done();
}
