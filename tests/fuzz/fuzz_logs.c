/*
 * fuzz_logs.c - what a client's bytes become in idemproxy's logs and
 * traces: the access-log line (common/accesslog.c) of a request whose
 * path, user agent, referer, key, request id and error are the input, and
 * the W3C traceparent parser (common/otel.c) with the span it encodes.
 *
 * Input: NUL-separated fields; the first is also parsed as a traceparent.
 * Invariants:
 *   - both line forms: at most ALOG_LINE_MAX bytes, one '\n', at the end,
 *     and no '\r' (a client cannot forge or split a line);
 *   - the JSON form parses (json-c, strict, valid UTF-8) into an object of
 *     the 27 documented members, and a string field that was neither cut
 *     nor held invalid UTF-8 or controls reads back as it was (the error
 *     too is the input's here, though the proxy's own are short);
 *   - an accepted traceparent is formatted back to the same 55 bytes (its
 *     lowercase form), and a span with hostile strings encodes to one JSON
 *     object json-c parses.
 */
#include <stdbool.h>
#include <string.h>

#include <json.h>

#include "accesslog.h"
#include "fuzz.h"
#include "otel.h"

#define NFIELDS 7

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

/* Is s plain printable ASCII without quote or backslash (kept as is)? */
static bool plain(const char *s)
{
	for (; *s != '\0'; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e ||
		    *s == '"' || *s == '\\')
			return false;
	return true;
}

static void check_line(const char *line, size_t n)
{
	FUZZ_REQUIRE(n > 0 && n <= ALOG_LINE_MAX);
	FUZZ_REQUIRE(line[n - 1] == '\n');
	FUZZ_REQUIRE(memchr(line, '\n', n - 1) == NULL);
	FUZZ_REQUIRE(memchr(line, '\r', n) == NULL);
	FUZZ_REQUIRE(memchr(line, '\0', n) == NULL);
}

static struct json_object *parse_json(const char *line, size_t n)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *o;

	FUZZ_REQUIRE(tok != NULL);
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT |
			       JSON_TOKENER_VALIDATE_UTF8);
	o = json_tokener_parse_ex(tok, line, (int)n - 1);
	FUZZ_REQUIRE(o != NULL &&
		     json_tokener_get_error(tok) == json_tokener_success);
	FUZZ_REQUIRE(json_object_is_type(o, json_type_object));
	json_tokener_free(tok);
	return o;
}

static void check_member(struct json_object *o, const char *name,
			 const char *want, bool cut)
{
	struct json_object *v;

	FUZZ_REQUIRE(json_object_object_get_ex(o, name, &v));
	if (want == NULL || want[0] == '\0' || !plain(want) || cut)
		return;		/* null, escaped, replaced or cut: not compared */
	FUZZ_REQUIRE(json_object_is_type(v, json_type_string));
	FUZZ_REQUIRE(strcmp(json_object_get_string(v), want) == 0);
}

static void check_traceparent(const char *v, size_t len)
{
	struct otel_parent p;
	char again[OTEL_TRACEPARENT_LEN + 1];
	uint8_t span[OTEL_SPAN_ID_LEN] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	struct otel_attr attr = { "hostile", OTEL_ATTR_STRING, .s = v };
	struct otel_span sp = {
		.name = v, .kind = OTEL_KIND_SERVER, .attrs = &attr, .nattrs = 1,
		.status_message = v, .tracestate = v, .sampled = true,
	};
	char *buf = NULL;
	size_t blen = 0, cap = 0;
	struct json_object *o;

	if (otel_parse_traceparent(v, len, &p) == 0) {
		FUZZ_REQUIRE(p.valid);
		otel_format_traceparent(p.trace_id, p.span_id, p.sampled, again);
		FUZZ_REQUIRE(otel_parse_traceparent(again, strlen(again), &p) == 0);
		FUZZ_REQUIRE(strlen(again) == OTEL_TRACEPARENT_LEN);
	} else {
		FUZZ_REQUIRE(!p.valid);
		memset(p.trace_id, 0xab, sizeof(p.trace_id));
	}
	memcpy(sp.span_id, span, sizeof(span));
	FUZZ_REQUIRE(otel_encode_span(p.trace_id, &sp, &buf, &blen, &cap) == 0);
	o = parse_json(buf, blen + 1);
	json_object_put(o);
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *copy = (char *)fuzz_copy(data, size, 0), *p, *f[NFIELDS];
	char text[ALOG_LINE_MAX], json[ALOG_LINE_MAX];
	struct json_object *o;
	size_t i, nt, nj, first, total;
	bool cut;

	if (copy == NULL)
		return 0;
	/* the fields: NUL-separated, the last one ends the input */
	copy = realloc(copy, size + 1);
	FUZZ_REQUIRE(copy != NULL);
	copy[size] = '\0';
	first = strlen(copy);
	for (i = 0, p = copy; i < NFIELDS; i++) {
		f[i] = p;		/* past the input: "" (its last NUL) */
		p += strlen(p);
		if (p < copy + size)
			p++;
	}
	check_traceparent(copy, first);

	struct alog_entry e = {
		.time_us = 1765065541123456, .client = "192.0.2.1",
		.forwarded = "198.51.100.7", .method = "POST", .path = f[0],
		.protocol = "HTTP/1.1", .status = 201, .bytes_in = 512,
		.bytes_out = 1234, .total_us = 1234, .claim_us = 250,
		.wait_us = ALOG_NONE, .upstream_us = 900, .store_us = 10,
		.route = "orders", .outcome = "forwarded", .key = f[1],
		.scope = "a1b2c3d4e5f6", .upstream = "10.0.0.5:8080",
		.request_id = f[2], .original_request_id = NULL,
		.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736",
		.span_id = "00f067aa0ba902b7", .user_agent = f[3],
		.referer = f[4], .error = f[5][0] ? f[5] : NULL,
	};

	nt = alog_format(&e, ALOG_FORMAT_TEXT, text);
	check_line(text, nt);
	nj = alog_format(&e, ALOG_FORMAT_JSON, json);
	check_line(json, nj);
	o = parse_json(json, nj);
	FUZZ_REQUIRE(json_object_object_length(o) == 27);
	/* a line whose fields are longer than it may be was cut (any of them:
	 * path, user agent, referer and key first, all to one length) */
	for (i = 0, total = 0; i < NFIELDS; i++)
		total += strlen(f[i]);
	cut = 6 * total > ALOG_LINE_MAX / 2;	/* a byte escapes to 6 at most */
	check_member(o, "path", f[0], cut);
	check_member(o, "key", f[1], cut);
	check_member(o, "request_id", f[2], cut);
	check_member(o, "user_agent", f[3], cut);
	check_member(o, "referer", f[4], cut);
	json_object_put(o);
	free(copy);
	return 0;
}
