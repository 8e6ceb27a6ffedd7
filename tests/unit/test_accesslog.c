/*
 * The access log (common/accesslog.c). alog_format(): JSON lines parsed back
 * by json-c and jsontext_scan (strict, UTF-8 checked) with every member in
 * its place, null when not there; text lines parsed by the grammar the top
 * of accesslog.c documents, fields in its order; hostile strings (newlines,
 * quotes, backslashes, control bytes, bytes that are not UTF-8, 10 KiB) and
 * random ones never make a second line, an invalid document or a line past
 * ALOG_LINE_MAX; long fields are cut in the documented order.
 *
 * The writer: threads to a file, every line whole and exactly once; a
 * reopen after a rename while threads write; the same destination again
 * (no reopen), another one, "off", a path that cannot be opened; write
 * errors (/dev/full, a pipe nobody reads any more) dropped and counted; a
 * pipe nobody drains, as a FIFO and as stderr itself: alog_write() never
 * waits, lines are dropped and counted, the event log says so once, and
 * draining lets lines through again; alog_close() keeps its bound.
 *
 * Every wait polls for its condition with a generous bound; none sleeps a
 * guessed time.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "accesslog.h"
#include "clock.h"
#include "jsontext.h"
#include "metrics.h"
#include "json_strict.h"
#include "tap.h"

/* 2026-12-06T23:59:01.123456Z */
#define T_FULL (1796601541LL * 1000000 + 123456)
#define WAIT_MS 30000		/* the bound of every wait for a condition */

static const char *const json_names[] = {
	"time", "client", "forwarded_for", "method", "path", "protocol",
	"status", "bytes_in", "bytes_out", "duration_s", "claim_s", "wait_s",
	"upstream_s", "store_s", "route", "outcome", "replayed", "key",
	"scope", "upstream", "request_id", "original_request_id", "trace_id",
	"span_id", "user_agent", "referer", "error",
};
#define N_JSON (sizeof(json_names) / sizeof(json_names[0]))

static const char *const text_names[] = {
	"rid", "outcome", "replayed", "route", "key", "scope", "in", "total",
	"claim", "wait", "upstream", "store", "up", "trace", "span",
	"orig_rid", "fwd", "err",
};
#define N_TEXT_KV (sizeof(text_names) / sizeof(text_names[0]))
#define N_TEXT (9 + N_TEXT_KV)

static struct alog_entry full_entry(void)
{
	struct alog_entry e = {
		.time_us = T_FULL,
		.client = "192.0.2.10",
		.forwarded = "198.51.100.7",
		.method = "POST",
		.path = "/v1/charges",
		.protocol = "HTTP/1.1",
		.status = 201,
		.bytes_in = 512,
		.bytes_out = 1234,
		.total_us = 1234,
		.claim_us = 250,
		.wait_us = 0,
		.upstream_us = 900,
		.store_us = 1500084,
		.route = "payments",
		.outcome = "executed",
		.replayed = true,
		.key = "order-42",
		.scope = "a1b2c3d4",
		.upstream = "10.0.0.5:8080",
		.request_id = "rid-1",
		.original_request_id = "rid-0",
		.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736",
		.span_id = "00f067aa0ba902b7",
		.user_agent = "curl/8.5.0",
		.referer = "https://example.com/",
		.error = "client_closed",
	};
	return e;
}

static struct alog_entry null_entry(void)
{
	struct alog_entry e = {
		.time_us = 0,
		.total_us = ALOG_NONE,
		.claim_us = ALOG_NONE,
		.wait_us = ALOG_NONE,
		.upstream_us = ALOG_NONE,
		.store_us = ALOG_NONE,
	};
	return e;
}

/* The string fields of an entry, to set one by one. */
static const char **string_field(struct alog_entry *e, int i)
{
	const char **f[] = {
		&e->client, &e->forwarded, &e->method, &e->path, &e->protocol,
		&e->route, &e->outcome, &e->key, &e->scope, &e->upstream,
		&e->request_id, &e->original_request_id, &e->trace_id,
		&e->span_id, &e->user_agent, &e->referer, &e->error,
	};
	return i < (int)(sizeof(f) / sizeof(f[0])) ? f[i] : NULL;
}
#define N_STRINGS 17

/* text parsed strictly, UTF-8 validated, and by jsontext_scan; NULL when
 * it is not one JSON document. */
static struct json_object *parse_json(const char *text, size_t n)
{
	struct json_object *v = json_strict(text, n);
	struct jsontext jt;

	if (v != NULL) {
		if (jsontext_scan(text, n, 4, &jt) < 0) {
			json_object_put(v);
			v = NULL;
		}
		jsontext_free(&jt);
	}
	return v;
}

/* One line: at most ALOG_LINE_MAX, one '\n' at its end, no other control
 * byte. */
static bool one_line(const char *buf, size_t n)
{
	if (n == 0 || n > ALOG_LINE_MAX || buf[n - 1] != '\n')
		return false;
	for (size_t i = 0; i + 1 < n; i++)
		if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f)
			return false;
	return true;
}

/* The JSON line's members are json_names, in order. */
static bool json_names_in_order(struct json_object *v)
{
	size_t i = 0;

	if (!json_object_is_type(v, json_type_object) ||
	    json_object_object_length(v) != (int)N_JSON)
		return false;
	json_object_object_foreach(v, name, val) {
		(void)val;
		if (i >= N_JSON || strcmp(name, json_names[i]) != 0)
			return false;
		i++;
	}
	return i == N_JSON;
}

/* A text line's fields (the grammar of accesslog.c's top comment): bare
 * words, the time in [...], and "..." with backslash escapes (a bare word
 * never starts with a quote, nor holds a space); the last N_TEXT_KV are
 * name=value. Returns how many, each cut out into tok[i] (NUL-terminated,
 * still escaped, quotes kept), or -1 when the line does not parse. */
static int parse_text(const char *line, size_t n, char tok[][ALOG_LINE_MAX],
		      char names[][16])
{
	size_t i = 0;
	int count = 0;

	if (n == 0 || line[n - 1] != '\n')
		return -1;
	n--;
	while (i < n && count < (int)N_TEXT + 1) {
		size_t start = i, t = 0;

		names[count][0] = '\0';
		if (count >= 9) {
			while (i < n && line[i] != '=' && line[i] != ' ')
				i++;
			if (i >= n || line[i] != '=' || i - start >= 16)
				return -1;
			memcpy(names[count], line + start, i - start);
			names[count][i - start] = '\0';
			i++;
			start = i;
		}
		if (count == 3 && line[i] == '[') {
			while (i < n && line[i] != ']')
				i++;
			if (i >= n)
				return -1;
			i++;
		} else if (line[i] == '"') {
			for (i++; i < n && line[i] != '"'; i++)
				if (line[i] == '\\')
					i++;
			if (i >= n)
				return -1;
			i++;
		} else {
			while (i < n && line[i] != ' ')
				i++;
		}
		t = i - start;
		memcpy(tok[count], line + start, t);
		tok[count][t] = '\0';
		count++;
		if (i < n) {
			if (line[i] != ' ')
				return -1;
			i++;
			if (i == n)
				return -1;
		}
	}
	return i == n ? count : -1;
}

static char tok[N_TEXT + 1][ALOG_LINE_MAX];
static char tok_names[N_TEXT + 1][16];

/* A text line parses into the documented fields, in order. */
static bool text_in_order(const char *line, size_t n)
{
	int count = parse_text(line, n, tok, tok_names);

	if (count != (int)N_TEXT)
		return false;
	if (strcmp(tok[1], "-") != 0 || strcmp(tok[2], "-") != 0 ||
	    tok[3][0] != '[' || tok[4][0] != '"' || tok[7][0] != '"' ||
	    tok[8][0] != '"')
		return false;
	for (size_t i = 0; i < N_TEXT_KV; i++)
		if (strcmp(tok_names[9 + i], text_names[i]) != 0)
			return false;
	return true;
}

static const char *jstr(struct json_object *v, const char *name)
{
	struct json_object *m;

	if (!json_object_object_get_ex(v, name, &m) ||
	    !json_object_is_type(m, json_type_string))
		return NULL;
	return json_object_get_string(m);
}

static bool jnull(struct json_object *v, const char *name)
{
	struct json_object *m;

	return json_object_object_get_ex(v, name, &m) && m == NULL;
}

static bool jnum(struct json_object *v, const char *name, double want)
{
	struct json_object *m;
	double got;

	if (!json_object_object_get_ex(v, name, &m) ||
	    (!json_object_is_type(m, json_type_double) &&
	     !json_object_is_type(m, json_type_int)))
		return false;
	got = json_object_get_double(m);
	return got > want - 1e-9 && got < want + 1e-9;
}

static void test_json_full(void)
{
	struct alog_entry e = full_entry();
	char buf[ALOG_LINE_MAX];
	size_t n = alog_format(&e, ALOG_FORMAT_JSON, buf);
	struct json_object *v, *m;

	ok(one_line(buf, n), "json full: one line");
	printf("# %.*s", (int)n, buf);
	v = parse_json(buf, n - 1);
	ok(v != NULL, "json full: parses");
	if (v == NULL)
		return;
	ok(json_names_in_order(v), "json full: every member, in order");
	is_str(jstr(v, "time"), "2026-12-06T23:59:01.123Z", "json: time");
	is_str(jstr(v, "client"), "192.0.2.10", "json: client");
	is_str(jstr(v, "forwarded_for"), "198.51.100.7", "json: forwarded_for");
	is_str(jstr(v, "method"), "POST", "json: method");
	is_str(jstr(v, "path"), "/v1/charges", "json: path");
	is_str(jstr(v, "protocol"), "HTTP/1.1", "json: protocol");
	ok(jnum(v, "status", 201), "json: status");
	ok(jnum(v, "bytes_in", 512), "json: bytes_in");
	ok(jnum(v, "bytes_out", 1234), "json: bytes_out");
	ok(jnum(v, "duration_s", 0.001234), "json: duration_s");
	ok(jnum(v, "claim_s", 0.00025), "json: claim_s");
	ok(jnum(v, "wait_s", 0), "json: wait_s 0 is a number, not null");
	ok(jnum(v, "upstream_s", 0.0009), "json: upstream_s");
	ok(jnum(v, "store_s", 1.500084), "json: store_s");
	ok(strstr(buf, "\"duration_s\":0.001234,") != NULL &&
	   strstr(buf, "\"store_s\":1.500084,") != NULL,
	   "json: seconds with six decimals");
	is_str(jstr(v, "route"), "payments", "json: route");
	is_str(jstr(v, "outcome"), "executed", "json: outcome");
	ok(json_object_object_get_ex(v, "replayed", &m) &&
	   json_object_is_type(m, json_type_boolean) && json_object_get_boolean(m),
	   "json: replayed true");
	is_str(jstr(v, "key"), "order-42", "json: key");
	is_str(jstr(v, "scope"), "a1b2c3d4", "json: scope");
	is_str(jstr(v, "upstream"), "10.0.0.5:8080", "json: upstream");
	is_str(jstr(v, "request_id"), "rid-1", "json: request_id");
	is_str(jstr(v, "original_request_id"), "rid-0", "json: original_request_id");
	is_str(jstr(v, "trace_id"), "4bf92f3577b34da6a3ce929d0e0e4736", "json: trace_id");
	is_str(jstr(v, "span_id"), "00f067aa0ba902b7", "json: span_id");
	is_str(jstr(v, "user_agent"), "curl/8.5.0", "json: user_agent");
	is_str(jstr(v, "referer"), "https://example.com/", "json: referer");
	is_str(jstr(v, "error"), "client_closed", "json: error");
	json_object_put(v);
}

static void test_json_nulls(void)
{
	struct alog_entry e = null_entry();
	char buf[ALOG_LINE_MAX];
	size_t n = alog_format(&e, ALOG_FORMAT_JSON, buf);
	struct json_object *v, *m;
	bool nulls = true;

	ok(one_line(buf, n), "json nulls: one line");
	printf("# %.*s", (int)n, buf);
	v = parse_json(buf, n - 1);
	ok(v != NULL, "json nulls: parses");
	if (v == NULL)
		return;
	ok(json_names_in_order(v), "json nulls: every member still there, in order");
	is_str(jstr(v, "time"), "1970-01-01T00:00:00.000Z", "json nulls: time");
	for (size_t i = 0; i < N_JSON; i++) {
		const char *name = json_names[i];

		if (strcmp(name, "time") == 0 || strcmp(name, "bytes_in") == 0 ||
		    strcmp(name, "bytes_out") == 0 || strcmp(name, "replayed") == 0)
			continue;
		if (!jnull(v, name)) {
			nulls = false;
			printf("#   %s is not null\n", name);
		}
	}
	ok(nulls, "json nulls: strings, durations and status 0 are null");
	ok(jnum(v, "bytes_in", 0) && jnum(v, "bytes_out", 0), "json nulls: bytes 0");
	ok(json_object_object_get_ex(v, "replayed", &m) &&
	   json_object_is_type(m, json_type_boolean) && !json_object_get_boolean(m),
	   "json nulls: replayed false");
	json_object_put(v);
}

static void test_text(void)
{
	struct alog_entry e = full_entry();
	char buf[ALOG_LINE_MAX];
	size_t n;

	n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
	printf("# %.*s", (int)n, buf);
	buf[n] = '\0';		/* n < ALOG_LINE_MAX here */
	is_str(buf,
	       "192.0.2.10 - - [06/Dec/2026:23:59:01.123 +0000] "
	       "\"POST /v1/charges HTTP/1.1\" 201 1234 \"https://example.com/\" "
	       "\"curl/8.5.0\" rid=rid-1 outcome=executed replayed=1 "
	       "route=payments key=\"order-42\" scope=a1b2c3d4 in=512 "
	       "total=0.001234 claim=0.000250 wait=0.000000 upstream=0.000900 "
	       "store=1.500084 up=10.0.0.5:8080 "
	       "trace=4bf92f3577b34da6a3ce929d0e0e4736 span=00f067aa0ba902b7 "
	       "orig_rid=rid-0 fwd=198.51.100.7 err=\"client_closed\"\n",
	       "text full: the documented fields in order");
	ok(text_in_order(buf, n), "text full: parses by the grammar");

	e = null_entry();
	n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
	printf("# %.*s", (int)n, buf);
	buf[n] = '\0';
	is_str(buf,
	       "- - - [01/Jan/1970:00:00:00.000 +0000] \"- - -\" - 0 \"-\" \"-\" "
	       "rid=- outcome=- replayed=0 route=- key=- scope=- in=0 total=- "
	       "claim=- wait=- upstream=- store=- up=- trace=- span=- "
	       "orig_rid=- fwd=- err=-\n",
	       "text nulls: '-' for each");
	ok(text_in_order(buf, n), "text nulls: parses by the grammar");

	/* empty strings: bare and nginx-quoted fields say "-", key and err
	 * keep their quotes */
	e = full_entry();
	e.client = e.route = e.user_agent = e.key = e.error = "";
	e.status = 0;
	e.wait_us = -5;
	n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
	ok(strncmp(buf, "- - - [", 7) == 0 && strstr(buf, "\" - 1234 ") != NULL &&
	   strstr(buf, " \"-\" rid=") != NULL && strstr(buf, " route=- ") != NULL &&
	   strstr(buf, " key=\"\" ") != NULL && strstr(buf, " err=\"\"\n") != NULL &&
	   strstr(buf, " wait=- ") != NULL,
	   "text: empty strings, status 0, a negative duration");
	e.path = "/a b\"c\\d";
	e.user_agent = "Mozilla/5.0 (X11; \"x\")";
	n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
	ok(strstr(buf, "\"POST /a\\x20b\\\"c\\\\d HTTP/1.1\"") != NULL &&
	   strstr(buf, "\"Mozilla/5.0 (X11; \\\"x\\\")\"") != NULL &&
	   text_in_order(buf, n),
	   "text: spaces escaped in bare words only, quotes and backslashes everywhere");
}

static void test_time(void)
{
	struct alog_entry e = null_entry();
	char buf[ALOG_LINE_MAX];

	e.time_us = T_FULL - 123456 + 999999;
	alog_format(&e, ALOG_FORMAT_JSON, buf);
	ok(strncmp(buf, "{\"time\":\"2026-12-06T23:59:01.999Z\"", 34) == 0,
	   "time: milliseconds truncated");
	e.time_us += 1;
	alog_format(&e, ALOG_FORMAT_TEXT, buf);
	ok(strstr(buf, "[06/Dec/2026:23:59:02.000 +0000]") != NULL,
	   "time: the next second (a new cache entry)");
	e.time_us = -1;
	alog_format(&e, ALOG_FORMAT_JSON, buf);
	ok(strncmp(buf, "{\"time\":\"1969-12-31T23:59:59.999Z\"", 34) == 0,
	   "time: before the epoch");
	e.time_us = 951782400LL * 1000000;	/* 2000-02-29 */
	alog_format(&e, ALOG_FORMAT_TEXT, buf);
	ok(strstr(buf, "[29/Feb/2000:00:00:00.000 +0000]") != NULL,
	   "time: a leap day");
}

static const char *const hostile[] = {
	"a\nb", "\r\n{\"time\":\"forged\"}", "\"quoted\"", "back\\slash", "\\",
	"\x01\x1b[31mred\x7f\b\f\t", "\xff\xfe", "\xc3\x28", "\xe2\x82",
	"\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf", "\xc2\x9b" "2J",
	"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", "} {\"x\":1",
	"key=\"x\" rid=forged", "\xe2\x80\xa8", "",
};
#define N_HOSTILE (sizeof(hostile) / sizeof(hostile[0]))

/* valid UTF-8 with nothing the formatter changes: comes back as it went */
static bool round_trips(const char *s)
{
	return strchr(s, '\x01') == NULL && strstr(s, "\xff") == NULL &&
	       strstr(s, "\xc3\x28") == NULL && strstr(s, "\xe2\x82") != s &&
	       strstr(s, "\xed\xa0") == NULL && strstr(s, "\xf4\x90") == NULL &&
	       strstr(s, "\xc0\xaf") == NULL;
}

/* long strings: 10 KiB of one unit */
static char *repeat(const char *unit, size_t total)
{
	size_t u = strlen(unit), n = 0;
	char *s = malloc(total + u + 1);

	if (s == NULL)
		abort();
	while (n + u <= total) {
		memcpy(s + n, unit, u);
		n += u;
	}
	s[n] = '\0';
	return s;
}

static void test_hostile(void)
{
	char buf[ALOG_LINE_MAX];
	bool lines = true, json_ok = true, text_ok = true, back = true;
	int shown = 0;
	char *longs[6];

	longs[0] = repeat("a", 10240);
	longs[1] = repeat("\x01", 10240);
	longs[2] = repeat("\xc3\xa9", 10240);
	longs[3] = repeat("\xff", 10240);
	longs[4] = repeat("\xf0\x9f\x98\x80", 10240);
	longs[5] = repeat("\"\\\n", 10240);

	for (int f = 0; f < N_STRINGS; f++) {
		for (size_t h = 0; h < N_HOSTILE + 6; h++) {
			const char *s = h < N_HOSTILE ? hostile[h] : longs[h - N_HOSTILE];
			struct alog_entry e = full_entry();
			struct json_object *v;
			size_t n;

			*string_field(&e, f) = s;
			n = alog_format(&e, ALOG_FORMAT_JSON, buf);
			if (!one_line(buf, n)) {
				lines = false;
				printf("#   json: field %d, string %zu: not one line\n", f, h);
				continue;
			}
			v = parse_json(buf, n - 1);
			if (v == NULL || !json_names_in_order(v)) {
				json_ok = false;
				if (shown++ < 3)
					printf("#   json: field %d, string %zu: %.*s", f, h, (int)n, buf);
			} else if (h < N_HOSTILE && round_trips(s) &&
				   strcmp(jstr(v, json_names[0]), "2026-12-06T23:59:01.123Z") == 0) {
				/* the member of field f, found by its value */
				bool found = false;

				json_object_object_foreach(v, name, val) {
					(void)name;
					if (json_object_is_type(val, json_type_string) &&
					    strcmp(json_object_get_string(val), s) == 0)
						found = true;
				}
				if (!found) {
					back = false;
					printf("#   json: field %d, string %zu did not come back\n", f, h);
				}
			}
			json_object_put(v);

			n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
			if (!one_line(buf, n)) {
				lines = false;
				printf("#   text: field %d, string %zu: not one line\n", f, h);
			} else if (!text_in_order(buf, n)) {
				text_ok = false;
				if (shown++ < 3)
					printf("#   text: field %d, string %zu: %.*s", f, h, (int)n, buf);
			}
		}
	}
	ok(lines, "hostile strings in every field: one line, <= ALOG_LINE_MAX, no control byte");
	ok(json_ok, "hostile strings: valid JSON (UTF-8 too), every member in order");
	ok(back, "hostile strings that are valid UTF-8 come back unchanged");
	ok(text_ok, "hostile strings: text parses into the documented fields");

	{
		struct alog_entry e = full_entry();
		struct json_object *v;
		size_t n;

		e.path = "\xff/\xc3\x28/\xed\xa0\x80";
		n = alog_format(&e, ALOG_FORMAT_JSON, buf);
		v = parse_json(buf, n - 1);
		is_str(v ? jstr(v, "path") : NULL,
		       "\xef\xbf\xbd/\xef\xbf\xbd(/\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd",
		       "json: each byte that is not UTF-8 is U+FFFD");
		json_object_put(v);
		n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
		ok(strstr(buf, " \\xff/\\xc3(/\\xed\\xa0\\x80 ") != NULL,
		   "text: bytes that are not UTF-8 as \\xHH");
		e.path = "\xc2\x9b" "2J\x1b[0m";
		n = alog_format(&e, ALOG_FORMAT_JSON, buf);
		ok(strstr(buf, "\"path\":\"\\u009b2J\\u001b[0m\"") != NULL,
		   "json: C1 and C0 controls escaped");
		n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
		ok(strstr(buf, " \\xc2\\x9b2J\\x1b[0m ") != NULL,
		   "text: C1 and C0 controls escaped");
	}
	for (int i = 0; i < 6; i++)
		free(longs[i]);
}

/* s ends in the cut mark */
static bool cut_mark(const char *s)
{
	return s != NULL && strlen(s) >= 3 && strcmp(s + strlen(s) - 3, "...") == 0;
}

static void test_cuts(void)
{
	char buf[ALOG_LINE_MAX];
	char *a = repeat("a", 10240), *b = repeat("b", 10240);
	char *e2 = repeat("\xc3\xa9", 10240), *c1 = repeat("\x01", 10240);
	struct alog_entry e;
	struct json_object *v;
	size_t n;

	e = full_entry();
	e.path = a;
	n = alog_format(&e, ALOG_FORMAT_JSON, buf);
	v = parse_json(buf, n - 1);
	ok(n == ALOG_LINE_MAX && v != NULL, "cut: a 10 KiB path fills the line exactly");
	ok(v && cut_mark(jstr(v, "path")) && strncmp(jstr(v, "path"), "aaaa", 4) == 0,
	   "cut: the path ends in \"...\"");
	ok(v && strcmp(jstr(v, "user_agent"), "curl/8.5.0") == 0 &&
	   strcmp(jstr(v, "request_id"), "rid-1") == 0 &&
	   strcmp(jstr(v, "error"), "client_closed") == 0,
	   "cut: the other fields whole");
	json_object_put(v);

	e.user_agent = b;
	n = alog_format(&e, ALOG_FORMAT_JSON, buf);
	v = parse_json(buf, n - 1);
	ok(v && strlen(jstr(v, "path")) == strlen(jstr(v, "user_agent")) &&
	   cut_mark(jstr(v, "user_agent")) && n <= ALOG_LINE_MAX &&
	   n >= ALOG_LINE_MAX - 1,
	   "cut: two long fields share the room equally");
	json_object_put(v);

	e.path = "/short";
	n = alog_format(&e, ALOG_FORMAT_JSON, buf);
	v = parse_json(buf, n - 1);
	ok(v && strcmp(jstr(v, "path"), "/short") == 0 &&
	   cut_mark(jstr(v, "user_agent")),
	   "cut: a short path stays, the long user agent is cut");
	json_object_put(v);

	e = full_entry();
	e.route = a;
	e.path = b;
	n = alog_format(&e, ALOG_FORMAT_JSON, buf);
	v = parse_json(buf, n - 1);
	ok(v && strcmp(jstr(v, "path"), "...") == 0 && cut_mark(jstr(v, "route")) &&
	   strlen(jstr(v, "route")) > 2000,
	   "cut: path first, down to \"...\", then the other strings");
	json_object_put(v);

	e = full_entry();
	e.path = e2;
	n = alog_format(&e, ALOG_FORMAT_JSON, buf);
	v = parse_json(buf, n - 1);
	ok(v != NULL && cut_mark(jstr(v, "path")), "cut: UTF-8 never split (json)");
	json_object_put(v);
	n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
	ok(one_line(buf, n) && text_in_order(buf, n) && strstr(buf, "\xc3\xa9...") != NULL,
	   "cut: UTF-8 never split (text)");

	e.path = c1;
	n = alog_format(&e, ALOG_FORMAT_JSON, buf);
	v = parse_json(buf, n - 1);
	ok(v != NULL && strstr(buf, "\\u0001...\"") != NULL, "cut: escapes never split (json)");
	json_object_put(v);
	n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
	ok(one_line(buf, n) && text_in_order(buf, n) && strstr(buf, "\\x01... ") != NULL,
	   "cut: escapes never split (text)");

	/* every string 10 KiB of the worst escapes */
	e = full_entry();
	for (int f = 0; f < N_STRINGS; f++)
		*string_field(&e, f) = c1;
	n = alog_format(&e, ALOG_FORMAT_JSON, buf);
	v = parse_json(buf, n - 1);
	ok(one_line(buf, n) && v != NULL && json_names_in_order(v),
	   "cut: every field 10 KiB: still one valid line");
	json_object_put(v);
	n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
	ok(one_line(buf, n) && text_in_order(buf, n), "cut: every field 10 KiB (text)");
	free(a);
	free(b);
	free(e2);
	free(c1);
}

/* xorshift64*: the same strings every run */
static uint64_t rnd_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void)
{
	rnd_state ^= rnd_state >> 12;
	rnd_state ^= rnd_state << 25;
	rnd_state ^= rnd_state >> 27;
	return rnd_state * 2685821657736338717ULL;
}

static void test_random(void)
{
	static const char specials[] = "\"\\\n\r\t\x01\x7f\x80\xbf\xc2\xc3\xe2\xed\xf0\xf4\xff %=[]-";
	static char strs[N_STRINGS][6001];
	char buf[ALOG_LINE_MAX];
	int bad_json = 0, bad_text = 0;

	for (int round = 0; round < 1000; round++) {
		struct alog_entry e = full_entry();
		struct json_object *v;
		size_t n;

		for (int f = 0; f < N_STRINGS; f++) {
			size_t len = rnd() % 4 == 0 ? rnd() % 6000 : rnd() % 40;

			if (rnd() % 8 == 0) {
				*string_field(&e, f) = NULL;
				continue;
			}
			for (size_t i = 0; i < len; i++) {
				uint64_t r = rnd();

				strs[f][i] = r % 3 == 0 ? specials[(r >> 8) % (sizeof(specials) - 1)]
					   : r % 3 == 1 ? (char)(0x20 + (r >> 8) % 95)
					   : (char)(1 + (r >> 8) % 255);
			}
			strs[f][len] = '\0';
			*string_field(&e, f) = strs[f];
		}
		e.status = (int)(rnd() % 700) - 50;
		e.bytes_in = rnd();
		e.total_us = (int64_t)(rnd() >> 1);
		e.claim_us = (int64_t)rnd();
		e.time_us = (int64_t)(rnd() % (300LL * 365 * 86400 * 1000000));

		n = alog_format(&e, ALOG_FORMAT_JSON, buf);
		v = one_line(buf, n) ? parse_json(buf, n - 1) : NULL;
		if (v == NULL || !json_names_in_order(v)) {
			if (bad_json++ == 0)
				printf("#   round %d: %.*s", round, (int)n, buf);
		}
		json_object_put(v);
		n = alog_format(&e, ALOG_FORMAT_TEXT, buf);
		if (!one_line(buf, n) || !text_in_order(buf, n)) {
			if (bad_text++ == 0)
				printf("#   round %d: %.*s", round, (int)n, buf);
		}
	}
	is_int(bad_json, 0, "random strings: every JSON line one valid document, in order");
	is_int(bad_text, 0, "random strings: every text line one line of the documented fields");
}

/* ---- the writer ---------------------------------------------------- */

static char dir[64];

static char *path_in(const char *name)
{
	static char paths[8][128];
	static int next;
	char *p = paths[next++ % 8];

	snprintf(p, sizeof(paths[0]), "%s/%s", dir, name);
	return p;
}

/* What a file holds, NUL-terminated (empty when absent). */
static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "r");
	char *text = NULL;
	size_t n = 0, cap = 0, r;

	do {
		if (n + 65536 + 1 > cap) {
			cap = (n + 65536 + 1) * 2;
			text = realloc(text, cap);
			if (text == NULL)
				abort();
		}
		r = f != NULL ? fread(text + n, 1, 65536, f) : 0;
		n += r;
	} while (r > 0);
	if (f != NULL)
		fclose(f);
	text[n] = '\0';
	if (len != NULL)
		*len = n;
	return text;
}

/* Poll until cond(arg) holds, at most WAIT_MS. */
static bool wait_until(bool (*cond)(void *), void *arg)
{
	uint64_t until = clock_ms() + WAIT_MS;

	while (!cond(arg)) {
		if (clock_ms() > until)
			return false;
		poll(NULL, 0, 2);
	}
	return true;
}

/* The line of writer t's line i: its request id says which. */
#define MAX_THREADS 100
#define MARKER 99		/* the test's own lines: "t99-i" */

/* Writer t's line i: its request id says which; rid and path hold its
 * strings. */
static struct alog_entry entry_for(int t, int i, char rid[32], char path[48])
{
	struct alog_entry e = full_entry();

	snprintf(rid, 32, "t%d-%d", t, i);
	snprintf(path, 48, "/v1/things/%d?n=%d", i * 7919 % 100000, t);
	e.request_id = rid;
	e.path = path;
	e.bytes_out = (uint64_t)i * 13;
	e.time_us = T_FULL + (int64_t)i * 1000;
	return e;
}

static size_t line_for(int t, int i, enum alog_format f, char *buf)
{
	char rid[32], path[48];
	struct alog_entry e = entry_for(t, i, rid, path);

	return alog_format(&e, f, buf);
}

static void write_line(int t, int i, enum alog_format f)
{
	char rid[32], path[48];
	struct alog_entry e = entry_for(t, i, rid, path);

	alog_write(&e, f);
}

/* Lines seen: seen[t * per + i] counts line i of writer t. */
struct tally {
	unsigned char *seen;
	int per;
	long lines;		/* whole lines that are ours */
	long bad;		/* split, joined, unknown or twice */
	long events;		/* event-log lines (stderr) */
};

static void tally_init(struct tally *y, int per)
{
	y->seen = calloc((size_t)MAX_THREADS * (size_t)per, 1);
	if (y->seen == NULL)
		abort();
	y->per = per;
	y->lines = y->bad = y->events = 0;
}

/* Count the lines of text[0..n) into y; each must be exactly the line its
 * request id names, in either form. */
static void tally_text(struct tally *y, const char *text, size_t n, bool events_ok)
{
	const char *p = text, *end = text + n;
	char want[ALOG_LINE_MAX];

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = nl != NULL ? (size_t)(nl - p) + 1 : (size_t)(end - p);
		const char *r;
		int t, i;
		enum alog_format f = p[0] == '{' ? ALOG_FORMAT_JSON : ALOG_FORMAT_TEXT;

		r = f == ALOG_FORMAT_JSON ? memmem(p, len, "\"request_id\":\"t", 15)
					  : memmem(p, len, " rid=t", 6);
		if (r != NULL && sscanf(r + (f == ALOG_FORMAT_JSON ? 15 : 6), "%d-%d", &t, &i) == 2 &&
		    t >= 0 && t < MAX_THREADS && i >= 0 && i < y->per &&
		    line_for(t, i, f, want) == len && memcmp(want, p, len) == 0 &&
		    y->seen[t * y->per + i] == 0) {
			y->seen[t * y->per + i] = 1;
			y->lines++;
		} else if (events_ok && nl != NULL && len > 25 && p[4] == '-' &&
			   p[23] == 'Z' && memmem(p, len, "access log: ", 12) != NULL) {
			y->events++;
		} else {
			if (y->bad++ < 3)
				printf("#   bad line: %.*s\n", (int)(len > 200 ? 200 : len), p);
		}
		p += len;
	}
}

static bool tally_has(const struct tally *y, int t, int i)
{
	return y->seen[t * y->per + i] != 0;
}

static unsigned long metric(const char *name)
{
	char *text = NULL, want[128];
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	unsigned long v = 0;
	const char *p;

	metrics_render(f);
	fclose(f);
	snprintf(want, sizeof(want), "\nidemproxy_%s ", name);
	p = strstr(text, want);
	if (p != NULL)
		v = strtoul(p + strlen(want), NULL, 10);
	free(text);
	return v;
}

struct job {
	int t, lines;
	enum alog_format f;
};

static void *writer_job(void *arg)
{
	struct job *j = arg;

	for (int i = 0; i < j->lines; i++)
		write_line(j->t, i, (i + j->t) % 2 ? ALOG_FORMAT_JSON : j->f);
	return NULL;
}

/* Start n writer threads of lines each. */
static void start_jobs(pthread_t *th, struct job *jobs, int n, int lines)
{
	for (int t = 0; t < n; t++) {
		jobs[t] = (struct job){ t, lines, t % 2 ? ALOG_FORMAT_TEXT : ALOG_FORMAT_JSON };
		if (pthread_create(&th[t], NULL, writer_job, &jobs[t]) != 0)
			abort();
	}
}

static void join_jobs(pthread_t *th, int n)
{
	for (int t = 0; t < n; t++)
		pthread_join(th[t], NULL);
}

static void test_never_opened(void)
{
	char err[256];

	alog_close(0);
	ok(!alog_enabled() && alog_dropped() == 0, "close when never opened: nothing happens");
	ok(alog_open("off", err, sizeof(err)) == 0 && !alog_enabled(), "off: not enabled");
	alog_reopen();
	alog_close(0);
	ok(alog_open("", err, sizeof(err)) < 0 && strstr(err, "empty") != NULL,
	   "an empty destination is refused: %s", err);
}

static void test_threads(void)
{
	enum { THREADS = 8, FEW = 150, MANY = 2000 };
	pthread_t th[THREADS];
	struct job jobs[THREADS];
	struct tally y;
	char err[256], *text;
	const char *path = path_in("threads.log");
	unsigned long lines0 = metric("access_log_lines_total");
	uint64_t dropped0;
	size_t n;

	/* 8 x 150 lines of at most 650 bytes fit the buffer even if the writer
	 * never ran: every one must arrive */
	ok(alog_open(path, err, sizeof(err)) == 0 && alog_enabled(), "open a file");
	start_jobs(th, jobs, THREADS, FEW);
	join_jobs(th, THREADS);
	alog_close(10000);
	text = slurp(path, &n);
	tally_init(&y, FEW);
	tally_text(&y, text, n, false);
	is_int(y.lines, THREADS * FEW, "threads: every line arrived, once");
	is_int(y.bad, 0, "threads: no line split, joined or twice");
	is_int(alog_dropped(), 0, "threads: none dropped");
	is_int(metric("access_log_lines_total") - lines0, THREADS * FEW,
	       "threads: the lines metric counts them");
	free(text);
	free(y.seen);
	unlink(path);

	/* many more: whatever is not written is counted as dropped */
	ok(alog_open(path, err, sizeof(err)) == 0, "open again after close");
	dropped0 = alog_dropped();
	start_jobs(th, jobs, THREADS, MANY);
	join_jobs(th, THREADS);
	alog_close(30000);
	text = slurp(path, &n);
	tally_init(&y, MANY);
	tally_text(&y, text, n, false);
	is_int(y.bad, 0, "threads, many: no line split, joined or twice");
	is_int(y.lines + (long)(alog_dropped() - dropped0), THREADS * MANY,
	       "threads, many: written + dropped = sent (%ld written)", y.lines);
	free(text);
	free(y.seen);
}

struct grep {
	const char *path;
	const char *needle;
};

static bool file_has(void *arg)
{
	struct grep *g = arg;
	char *text = slurp(g->path, NULL);
	bool found = strstr(text, g->needle) != NULL;

	free(text);
	return found;
}

static void test_reopen(void)
{
	enum { THREADS = 4, LINES = 250 };
	pthread_t th[THREADS];
	struct job jobs[THREADS];
	struct tally y;
	char err[256], *text;
	const char *path = path_in("rotate.log"), *moved = path_in("rotate.log.1");
	struct grep g = { path, "rid=t99-0 " };
	size_t n;

	ok(alog_open(path, err, sizeof(err)) == 0, "reopen: open");
	start_jobs(th, jobs, THREADS, LINES);
	write_line(MARKER, 0, ALOG_FORMAT_TEXT);
	ok(wait_until(file_has, &g), "reopen: the first marker is in the file");
	ok(rename(path, moved) == 0, "reopen: logrotate renames the file");
	alog_reopen();
	write_line(MARKER, 1, ALOG_FORMAT_TEXT);
	join_jobs(th, THREADS);
	alog_close(10000);

	tally_init(&y, LINES);
	text = slurp(moved, &n);
	tally_text(&y, text, n, false);
	ok(tally_has(&y, MARKER, 0) && !tally_has(&y, MARKER, 1),
	   "reopen: what came before is in the old file");
	free(text);
	text = slurp(path, &n);
	ok(n > 0, "reopen: a new file at the path");
	tally_text(&y, text, n, false);
	ok(tally_has(&y, MARKER, 1), "reopen: what came after is in the new file");
	free(text);
	is_int(y.lines, THREADS * LINES + 2, "reopen: every line in one of the two files, once");
	is_int(y.bad, 0, "reopen: none split");
	free(y.seen);
}

/* A reopen that fails keeps the file open before. */
static void test_reopen_fails(void)
{
	char sub[128], err[256], *text;
	const char *path, *moved = path_in("lost.moved");
	struct grep g;

	snprintf(sub, sizeof(sub), "%s/sub", dir);
	ok(mkdir(sub, 0700) == 0, "reopen fails: a directory");
	path = path_in("sub/lost.log");
	ok(alog_open(path, err, sizeof(err)) == 0, "reopen fails: open a file in it");
	ok(rename(path, moved) == 0 && rmdir(sub) == 0, "reopen fails: the file moved, the directory gone");
	alog_reopen();
	write_line(MARKER, 0, ALOG_FORMAT_TEXT);
	g = (struct grep){ moved, "rid=t99-0 " };
	ok(wait_until(file_has, &g), "reopen fails: lines go on to the file open before");
	alog_close(10000);
	text = slurp(moved, NULL);
	ok(strstr(text, "rid=t99-0 ") != NULL, "reopen fails: nothing lost");
	free(text);
}

static void test_changes(void)
{
	const char *a = path_in("a.log"), *b = path_in("b.log"), *a2 = path_in("a.moved");
	struct grep g = { a, "rid=t99-0 " };
	struct tally y;
	char err[256], *text;
	size_t n;

	/* the same destination again: nothing changes, no reopen */
	ok(alog_open(a, err, sizeof(err)) == 0, "changes: open a");
	write_line(MARKER, 0, ALOG_FORMAT_TEXT);
	ok(wait_until(file_has, &g), "changes: a line in a");
	ok(rename(a, a2) == 0, "changes: a moved away");
	ok(alog_open(a, err, sizeof(err)) == 0, "changes: open a again");
	write_line(MARKER, 1, ALOG_FORMAT_TEXT);

	/* a path that cannot be opened: an error, the destination stays */
	ok(alog_open("/nonexistent/dir/x.log", err, sizeof(err)) < 0 &&
	   strstr(err, "/nonexistent/dir/x.log") != NULL,
	   "changes: a bad path is an error: %s", err);
	ok(alog_enabled(), "changes: still on after the bad path");
	write_line(MARKER, 2, ALOG_FORMAT_TEXT);

	/* another destination: lines before to the old one, after to b */
	ok(alog_open(b, err, sizeof(err)) == 0, "changes: switch to b");
	write_line(MARKER, 3, ALOG_FORMAT_TEXT);

	/* off: flushed, no longer taken; on again */
	ok(alog_open("off", err, sizeof(err)) == 0 && !alog_enabled(), "changes: off");
	write_line(MARKER, 4, ALOG_FORMAT_TEXT);
	ok(alog_open(b, err, sizeof(err)) == 0 && alog_enabled(), "changes: b again");
	write_line(MARKER, 5, ALOG_FORMAT_TEXT);
	alog_close(10000);

	tally_init(&y, 8);
	text = slurp(a2, &n);
	tally_text(&y, text, n, false);
	free(text);
	ok(tally_has(&y, MARKER, 0) && tally_has(&y, MARKER, 1) && tally_has(&y, MARKER, 2) &&
	   y.lines == 3, "changes: the same path again kept the open file; a bad path changed nothing");
	ok(access(a, F_OK) != 0, "changes: no new file at a");
	text = slurp(b, &n);
	tally_text(&y, text, n, false);
	free(text);
	ok(tally_has(&y, MARKER, 3) && tally_has(&y, MARKER, 5) && !tally_has(&y, MARKER, 4),
	   "changes: b has the lines after the switch, none from while off");
	is_int(y.bad, 0, "changes: no bad lines");
	free(y.seen);
}

static bool dropped_reaches(void *arg)
{
	return alog_dropped() >= *(uint64_t *)arg;
}

static void test_write_errors(void)
{
	char err[256];
	uint64_t want;

	/* /dev/full: ENOSPC on every write */
	ok(alog_open("/dev/full", err, sizeof(err)) == 0, "errors: open /dev/full");
	want = alog_dropped() + 100;
	for (int i = 0; i < 100; i++)
		write_line(0, i, ALOG_FORMAT_JSON);
	ok(wait_until(dropped_reaches, &want), "errors: ENOSPC: the lines are dropped and counted");
	alog_close(1000);
	is_int(alog_dropped(), want, "errors: each line counted once");

	/* a FIFO whose reader went away: EPIPE, and SIGPIPE must not kill us */
	{
		const char *fifo = path_in("gone.fifo");
		int r;

		ok(mkfifo(fifo, 0600) == 0, "errors: a FIFO");
		r = open(fifo, O_RDONLY | O_NONBLOCK);
		ok(alog_open(fifo, err, sizeof(err)) == 0, "errors: open the FIFO");
		close(r);
		want = alog_dropped() + 50;
		for (int i = 0; i < 50; i++)
			write_line(0, i, ALOG_FORMAT_TEXT);
		ok(wait_until(dropped_reaches, &want), "errors: EPIPE: dropped and counted, no SIGPIPE");
		alog_close(1000);
	}
	is_int(metric("access_log_dropped_total"), alog_dropped(),
	       "errors: the dropped metric agrees with alog_dropped()");
}

/* A reader draining a pipe into memory until EOF. */
struct drain {
	int fd;
	pthread_mutex_t lock;
	char *text;
	size_t len, cap;
	bool go;		/* start reading */
	pthread_cond_t cv;
};

static void *drain_main(void *arg)
{
	struct drain *d = arg;
	char chunk[65536];
	ssize_t r;

	pthread_mutex_lock(&d->lock);
	while (!d->go)
		pthread_cond_wait(&d->cv, &d->lock);
	pthread_mutex_unlock(&d->lock);
	while ((r = read(d->fd, chunk, sizeof(chunk))) != 0) {
		if (r < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		pthread_mutex_lock(&d->lock);
		if (d->len + (size_t)r + 1 > d->cap) {
			d->cap = (d->len + (size_t)r + 1) * 2;
			d->text = realloc(d->text, d->cap);
			if (d->text == NULL)
				abort();
		}
		memcpy(d->text + d->len, chunk, (size_t)r);
		d->len += (size_t)r;
		d->text[d->len] = '\0';
		pthread_mutex_unlock(&d->lock);
	}
	return NULL;
}

static void drain_start(struct drain *d, pthread_t *th, int fd)
{
	memset(d, 0, sizeof(*d));
	d->fd = fd;
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cv, NULL);
	if (pthread_create(th, NULL, drain_main, d) != 0)
		abort();
}

static void drain_go(struct drain *d)
{
	pthread_mutex_lock(&d->lock);
	d->go = true;
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->lock);
}

static bool drained_has(struct drain *d, const char *needle)
{
	bool found;

	pthread_mutex_lock(&d->lock);
	found = d->text != NULL && strstr(d->text, needle) != NULL;
	pthread_mutex_unlock(&d->lock);
	return found;
}

/*
 * Write 200k lines into the pipe nobody reads: each call returns at once,
 * lines are dropped and counted. Then drain it, write markers until one
 * comes through. Returns the marker that did.
 */
static int stall_then_drain(struct drain *d, const char *what)
{
	enum { LINES = 200000 };
	uint64_t dropped0 = alog_dropped(), worst = 0, t0, t, until;
	char needle[32];
	int marker = -1;

	t0 = clock_us();
	for (int i = 0; i < LINES; i++) {
		t = clock_us();
		write_line(0, i, ALOG_FORMAT_JSON);
		t = clock_us() - t;
		if (t > worst)
			worst = t;
	}
	t0 = clock_us() - t0;
	printf("# %s: %d writes to a stalled pipe in %" PRIu64 " ms, the slowest %" PRIu64 " us\n",
	       what, LINES, t0 / 1000, worst);
	ok(worst < 1000000, "%s: alog_write never waits on the stalled pipe", what);
	ok(alog_dropped() > dropped0, "%s: lines dropped and counted (%" PRIu64 ")",
	   what, alog_dropped() - dropped0);

	drain_go(d);
	until = clock_ms() + WAIT_MS;
	for (int m = 0; m < 200000 && clock_ms() < until; m++) {
		write_line(MARKER, m, ALOG_FORMAT_TEXT);
		for (int k = 0; k < 5; k++) {
			for (int j = m; j >= 0 && j > m - 10; j--) {
				snprintf(needle, sizeof(needle), "rid=t99-%d ", j);
				if (drained_has(d, needle))
					marker = j;
			}
			if (marker >= 0)
				break;
			poll(NULL, 0, 1);
		}
		if (marker >= 0)
			break;
	}
	ok(marker >= 0, "%s: once drained, lines come through again", what);
	return marker;
}

static void test_stalled_fifo(void)
{
	const char *fifo = path_in("stalled.fifo");
	struct drain d;
	struct tally y;
	pthread_t th;
	char err[256];
	uint64_t t;
	int r;

	/* a FIFO path with a reader that does not read yet */
	ok(mkfifo(fifo, 0600) == 0, "stalled: a FIFO");
	r = open(fifo, O_RDONLY | O_NONBLOCK);
	fcntl(r, F_SETFL, 0);
	fcntl(r, F_SETPIPE_SZ, 4096);
	drain_start(&d, &th, r);
	ok(alog_open(fifo, err, sizeof(err)) == 0, "stalled: open the FIFO");
	stall_then_drain(&d, "stalled FIFO");
	alog_close(10000);
	pthread_join(th, NULL);	/* EOF: the writer's end closed */
	close(r);

	tally_init(&y, 200000);
	tally_text(&y, d.text, d.len, false);
	is_int(y.bad, 0, "stalled FIFO: what came through is whole, once (%ld lines)", y.lines);
	free(y.seen);
	free(d.text);

	/* alog_close() keeps its bound with the pipe stalled */
	fifo = path_in("stuck.fifo");
	ok(mkfifo(fifo, 0600) == 0, "close bound: a FIFO");
	r = open(fifo, O_RDONLY | O_NONBLOCK);
	fcntl(r, F_SETPIPE_SZ, 4096);
	ok(alog_open(fifo, err, sizeof(err)) == 0, "close bound: open it");
	for (int i = 0; i < 20000; i++)
		write_line(0, i, ALOG_FORMAT_JSON);
	t = clock_ms();
	alog_close(300);
	t = clock_ms() - t;
	printf("# alog_close(300) with a stalled pipe took %" PRIu64 " ms\n", t);
	ok(t < 300 + 1500, "close bound: alog_close(300) returned in %" PRIu64 " ms", t);
	ok(!alog_enabled(), "close bound: disabled");
	close(r);
}

/* stderr itself a pipe nobody reads: the access lines and the event log's
 * lines share it, never split, and the event log says what happened. */
static void test_stalled_stderr(void)
{
	struct drain d;
	struct tally y;
	pthread_t th;
	char err[256];
	int p[2], saved;

	fflush(stderr);
	saved = dup(STDERR_FILENO);
	ok(saved >= 0 && pipe(p) == 0, "stderr: a pipe");
	fcntl(p[1], F_SETPIPE_SZ, 4096);
	dup2(p[1], STDERR_FILENO);
	close(p[1]);
	drain_start(&d, &th, p[0]);

	ok(alog_open("stderr", err, sizeof(err)) == 0, "stderr: open");
	stall_then_drain(&d, "stalled stderr");
	{
		uint64_t until = clock_ms() + WAIT_MS;

		/* a turn without a drop ends the episode */
		for (int m = 199000; m < 200000 && clock_ms() < until &&
		     !drained_has(&d, "caught up (stderr)"); m++) {
			write_line(MARKER, m, ALOG_FORMAT_TEXT);
			poll(NULL, 0, 20);
		}
	}
	alog_close(10000);
	dup2(saved, STDERR_FILENO);
	close(saved);
	pthread_join(th, NULL);
	close(p[0]);

	ok(drained_has(&d, "warn access log: the writer cannot keep up (stderr); dropping lines\n"),
	   "stderr: the event log said the writer cannot keep up");
	ok(drained_has(&d, "info access log: the writer caught up (stderr); "),
	   "stderr: ... and that it caught up, with the count");
	tally_init(&y, 200000);
	tally_text(&y, d.text, d.len, true);
	is_int(y.bad, 0, "stderr: access and event lines whole (%ld and %ld)", y.lines, y.events);
	free(y.seen);
	free(d.text);
}

/* The cost of a line: alog_format and alog_write to /dev/null. */
static void measure(void)
{
	char err[256], buf[ALOG_LINE_MAX];
	struct alog_entry e = full_entry();
	enum { N = 20000 };
	uint64_t t;
	volatile size_t sink = 0;

	for (int f = 0; f < 2; f++) {
		t = clock_us();
		for (int i = 0; i < N; i++) {
			e.time_us = T_FULL + i * 50;
			sink += alog_format(&e, (enum alog_format)f, buf);
		}
		t = clock_us() - t;
		printf("# alog_format %s: %.0f ns/line\n", f ? "json" : "text",
		       (double)t * 1000 / N);
	}
	if (alog_open("/dev/null", err, sizeof(err)) != 0)
		return;
	for (int f = 0; f < 2; f++) {
		t = clock_us();
		for (int i = 0; i < N; i++) {
			e.time_us = T_FULL + i * 50;
			alog_write(&e, (enum alog_format)f);
		}
		t = clock_us() - t;
		printf("# alog_format+alog_write %s: %.0f ns/line\n", f ? "json" : "text",
		       (double)t * 1000 / N);
	}
	alog_close(10000);
	(void)sink;
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/test_accesslog.XXXXXX");
	if (mkdtemp(dir) == NULL)
		abort();

	test_json_full();
	test_json_nulls();
	test_text();
	test_time();
	test_hostile();
	test_cuts();
	test_random();

	test_never_opened();
	test_threads();
	test_reopen();
	test_reopen_fails();
	test_changes();
	test_write_errors();
	test_stalled_fifo();
	test_stalled_stderr();
	measure();

	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			printf("# could not remove %s\n", dir);
	}
	return tap_done();
}
