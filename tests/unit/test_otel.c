/*
 * Trace context and OTLP/JSON (common/otel.c) and the span exporter
 * (proxy/otel_export.c).
 *
 * traceparent: W3C Trace Context level 1's rules as vectors (upper case,
 * lengths, version ff, zero ids, later versions with more fields, OWS);
 * formatting round-trips; ids are never zero and do not repeat. Settings:
 * a flag beats its variable, the base endpoint gets /v1/traces, headers
 * and resource attributes are percent-decoded, each error names its
 * variable. Samplers: ratio bounds, a known trace id either side of a
 * ratio, parents deciding. Spans and requests are parsed back by json-c
 * (strict, UTF-8 validated). The exporter runs against a collector this
 * test serves on 127.0.0.1: bodies and headers as sent, 503 twice then a
 * chunked 200, a 400 dropped without retry, a port nobody listens on (the
 * hand-over never blocks, spans beyond the queue are dropped, stop keeps
 * its bound) and a collector that never answers (stop keeps its bound).
 * Conditions are polled with generous bounds; nothing waits on a sleep.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <json-c/json.h>

#include "clock.h"
#include "metrics.h"
#include "otel.h"
#include "otel_export.h"
#include "json_strict.h"
#include "tap.h"

/* ---- helpers ------------------------------------------------------------ */

/* text parsed strictly, UTF-8 validated; NULL unless it is one document */
static struct json_object *parse(const char *text, size_t n)
{
	return json_strict(text, n);
}

/* a member by a dotted path ("status.code"); NULL when absent */
static struct json_object *get(struct json_object *o, const char *path)
{
	char buf[128], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *k = strtok_r(buf, ".", &save); k && o; k = strtok_r(NULL, ".", &save)) {
		struct json_object *next = NULL;

		if (k[0] >= '0' && k[0] <= '9')
			next = json_object_is_type(o, json_type_array) ?
			       json_object_array_get_idx(o, (size_t)atoi(k)) : NULL;
		else if (!json_object_object_get_ex(o, k, &next))
			next = NULL;
		o = next;
	}
	return o;
}

static const char *str(struct json_object *o, const char *path)
{
	struct json_object *v = get(o, path);

	return v && json_object_is_type(v, json_type_string) ?
	       json_object_get_string(v) : NULL;
}

/* the value object of the attribute named key in an attributes array */
static struct json_object *attr(struct json_object *attrs, const char *key)
{
	size_t n = attrs ? json_object_array_length(attrs) : 0;

	for (size_t i = 0; i < n; i++) {
		struct json_object *a = json_object_array_get_idx(attrs, i);
		const char *k = str(a, "key");

		if (k && strcmp(k, key) == 0)
			return get(a, "value");
	}
	return NULL;
}

static int count_attr(struct json_object *attrs, const char *key)
{
	size_t n = attrs ? json_object_array_length(attrs) : 0;
	int c = 0;

	for (size_t i = 0; i < n; i++) {
		const char *k = str(json_object_array_get_idx(attrs, i), "key");

		c += k && strcmp(k, key) == 0;
	}
	return c;
}

static unsigned long counter(const char *name)
{
	char *text = NULL, want[128], *p;
	size_t len = 0;
	unsigned long v = 0;
	FILE *f = open_memstream(&text, &len);

	metrics_render(f);
	fclose(f);
	snprintf(want, sizeof(want), "\nidemproxy_%s ", name);
	p = strstr(text, want);
	if (p != NULL)
		v = strtoul(p + strlen(want), NULL, 10);
	free(text);
	return v;
}

#define EXPORTED() counter("trace_spans_exported_total")
#define DROPPED() counter("trace_spans_dropped_total")
#define FAILURES() counter("trace_export_failures_total")

/* ---- traceparent ----------------------------------------------------------- */

#define TID "4bf92f3577b34da6a3ce929d0e0e4736"
#define SID "00f067aa0ba902b7"

static void test_traceparent(void)
{
	static const struct {
		const char *v;
		bool valid, sampled;
		const char *what;
	} cases[] = {
		{ "00-" TID "-" SID "-01", true, true, "the spec's example" },
		{ "00-" TID "-" SID "-00", true, false, "not sampled" },
		{ "00-" TID "-" SID "-09", true, true, "other flag bits" },
		{ " \t00-" TID "-" SID "-01\t ", true, true, "OWS around" },
		{ "01-" TID "-" SID "-01", true, true, "a later version, 55 bytes" },
		{ "cc-" TID "-" SID "-01-what-the-future-holds", true, true,
		  "a later version with more fields" },
		{ "cc-" TID "-" SID "-01x", false, false,
		  "a later version, no '-' after the 55" },
		{ "00-" TID "-" SID "-01-extra", false, false,
		  "version 00 with more fields" },
		{ "ff-" TID "-" SID "-01", false, false, "version ff" },
		{ "00-4BF92F3577B34DA6A3CE929D0E0E4736-" SID "-01", false, false,
		  "upper-case trace id" },
		{ "00-" TID "-00F067AA0BA902B7-01", false, false, "upper-case span id" },
		{ "0A-" TID "-" SID "-01", false, false, "upper-case version" },
		{ "00-" TID "-" SID "-0A", false, false, "upper-case flags" },
		{ "00-00000000000000000000000000000000-" SID "-01", false, false,
		  "all-zero trace id" },
		{ "00-" TID "-0000000000000000-01", false, false, "all-zero span id" },
		{ "00-" TID "-" SID "-1", false, false, "one flag digit" },
		{ "00-" TID "a-" SID "-01", false, false, "33-digit trace id" },
		{ "00-4bf92f3577b34da6a3ce929d0e0e473-" SID "-01", false, false,
		  "31-digit trace id" },
		{ "00-" TID "-" SID "7-01", false, false, "17-digit span id" },
		{ "00_" TID "_" SID "_01", false, false, "other separators" },
		{ "0-" TID "-" SID "-01", false, false, "one version digit" },
		{ "00-" TID "-" SID "-0g", false, false, "not hex" },
		{ "", false, false, "empty" },
	};
	struct otel_parent p;
	char out[OTEL_TRACEPARENT_LEN + 1];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = otel_parse_traceparent(cases[i].v, strlen(cases[i].v), &p);

		ok((rc == 0) == cases[i].valid && p.valid == cases[i].valid &&
		   (!p.valid || p.sampled == cases[i].sampled),
		   "traceparent: %s %s", cases[i].what,
		   cases[i].valid ? "accepted" : "refused");
	}
	/* a length shorter than the string: only len bytes are read */
	ok(otel_parse_traceparent("00-" TID "-" SID "-01ZZZ", 55, &p) == 0,
	   "traceparent: read only len bytes");
	if (otel_parse_traceparent("00-" TID "-" SID "-01", 55, &p) == 0) {
		otel_hex(p.trace_id, OTEL_TRACE_ID_LEN, out);
		is_str(out, TID, "traceparent: trace id read");
		otel_hex(p.span_id, OTEL_SPAN_ID_LEN, out);
		is_str(out, SID, "traceparent: span id read");
	}
	otel_format_traceparent(p.trace_id, p.span_id, true, out);
	is_str(out, "00-" TID "-" SID "-01", "format: sampled");
	otel_format_traceparent(p.trace_id, p.span_id, false, out);
	is_str(out, "00-" TID "-" SID "-00", "format: not sampled");
	is_int(strlen(out), OTEL_TRACEPARENT_LEN, "format: 55 bytes");
}

static void test_ids(void)
{
	enum { N = 2000 };
	static uint8_t t[N][OTEL_TRACE_ID_LEN], s[N][OTEL_SPAN_ID_LEN];
	static const uint8_t zt[OTEL_TRACE_ID_LEN], zs[OTEL_SPAN_ID_LEN];
	bool nonzero = true, distinct = true, roundtrip = true;
	char tp[OTEL_TRACEPARENT_LEN + 1];
	struct otel_parent p;

	for (int i = 0; i < N; i++) {
		otel_new_trace_id(t[i]);
		otel_new_span_id(s[i]);
		nonzero = nonzero && memcmp(t[i], zt, sizeof(zt)) != 0 &&
			  memcmp(s[i], zs, sizeof(zs)) != 0;
		otel_format_traceparent(t[i], s[i], i & 1, tp);
		roundtrip = roundtrip && otel_parse_traceparent(tp, strlen(tp), &p) == 0 &&
			    memcmp(p.trace_id, t[i], sizeof(zt)) == 0 &&
			    memcmp(p.span_id, s[i], sizeof(zs)) == 0 &&
			    p.sampled == (i & 1);
	}
	for (int i = 0; i < N && distinct; i++)
		for (int j = i + 1; j < N; j++)
			if (memcmp(t[i], t[j], sizeof(zt)) == 0 ||
			    memcmp(s[i], s[j], sizeof(zs)) == 0) {
				distinct = false;
				break;
			}
	ok(nonzero, "ids: %d trace and span ids, none all zero", N);
	ok(distinct, "ids: all distinct");
	ok(roundtrip, "ids: format then parse gives them back");
}

/* ---- settings ----------------------------------------------------------------- */

static char err[256];
static const char *warn;

/* resolve with opts (NULL: none) and envp; 0 or -1 */
static int resolve(struct otel_settings *s, const char *const *opts, char **envp)
{
	const char *none[OTEL_OPT_COUNT] = { 0 };

	err[0] = '\0';
	return otel_settings_resolve(s, opts ? opts : none, envp, &warn, err,
				     sizeof(err));
}

/* envp given makes an error that names name */
static void refused(char **envp, const char *name, const char *what)
{
	struct otel_settings s;

	ok(resolve(&s, NULL, envp) < 0 && strstr(err, name) != NULL,
	   "settings: %s refused, naming %s", what, name);
	if (strstr(err, name) == NULL)
		printf("#   err: %s\n", err);
}

static void test_settings(void)
{
	struct otel_settings s;
	const char *opts[OTEL_OPT_COUNT] = { 0 };

	ok(resolve(&s, NULL, (char *[]){ NULL }) == 0 && !s.enabled &&
	   s.endpoint == NULL, "settings: nothing set, not enabled");
	is_str(s.service_name, "idemproxy", "settings: service name defaults");
	ok(s.sampler == OTEL_SAMPLER_PARENT_ALWAYS_ON && s.ratio == 1.0 &&
	   s.timeout_ms == 10000 && s.schedule_delay_ms == 5000 &&
	   s.max_queue == 2048 && s.max_batch == 512 && s.ca_file == NULL &&
	   warn == NULL, "settings: the spec's defaults");
	otel_settings_free(&s);
	ok(resolve(&s, NULL, NULL) == 0 && !s.enabled, "settings: envp NULL");
	otel_settings_free(&s);

	ok(resolve(&s, NULL, (char *[]){ "OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318",
					 NULL }) == 0 && s.enabled, "settings: enabled");
	is_str(s.endpoint, "http://c:4318/v1/traces", "settings: base + /v1/traces");
	otel_settings_free(&s);
	ok(resolve(&s, NULL, (char *[]){ "OTEL_EXPORTER_OTLP_ENDPOINT=https://c/otlp/",
					 NULL }) == 0, "settings: base with a slash");
	is_str(s.endpoint, "https://c/otlp/v1/traces", "settings: the slash not doubled");
	otel_settings_free(&s);
	ok(resolve(&s, NULL, (char *[]){
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://base:4318",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://c:9999/custom/",
		NULL }) == 0, "settings: traces endpoint");
	is_str(s.endpoint, "http://c:9999/custom/", "settings: traces endpoint as is");
	otel_settings_free(&s);
	opts[OTEL_OPT_ENDPOINT] = "http://flag:1/";
	ok(resolve(&s, opts, (char *[]){
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://env:2/x", NULL }) == 0,
	   "settings: flag and variable");
	is_str(s.endpoint, "http://flag:1/v1/traces", "settings: the flag wins");
	otel_settings_free(&s);
	opts[OTEL_OPT_ENDPOINT] = NULL;

	opts[OTEL_OPT_DISABLED] = "false";
	ok(resolve(&s, opts, (char *[]){ "OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318",
					 "OTEL_SDK_DISABLED=true", NULL }) == 0 &&
	   s.enabled, "settings: --disabled false beats OTEL_SDK_DISABLED=true");
	otel_settings_free(&s);
	opts[OTEL_OPT_DISABLED] = NULL;
	ok(resolve(&s, NULL, (char *[]){ "OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318",
					 "OTEL_SDK_DISABLED=TRUE", NULL }) == 0 &&
	   !s.enabled, "settings: OTEL_SDK_DISABLED=TRUE disables");
	otel_settings_free(&s);
	ok(resolve(&s, NULL, (char *[]){ "OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318",
					 "OTEL_TRACES_EXPORTER=none", NULL }) == 0 &&
	   !s.enabled, "settings: OTEL_TRACES_EXPORTER=none disables");
	otel_settings_free(&s);
	ok(resolve(&s, NULL, (char *[]){ "OTEL_EXPORTER_OTLP_ENDPOINT=",
					 NULL }) == 0 && !s.enabled,
	   "settings: an empty variable is unset");
	otel_settings_free(&s);

	ok(resolve(&s, NULL, (char *[]){
		"OTEL_EXPORTER_OTLP_HEADERS=ignored=1",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS= Authorization = Bearer%20a%3Db ,"
		"x-tenant=t%2C1,,x-tenant=t2",
		"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=prod,"
		"service.name=from-resource,k%3D=v%2C%25",
		NULL }) == 0, "settings: headers and resource");
	ok(s.nheaders == 2 && strcmp(s.headers[0].name, "Authorization") == 0 &&
	   strcmp(s.headers[0].value, "Bearer a=b") == 0 &&
	   strcmp(s.headers[1].name, "x-tenant") == 0 &&
	   strcmp(s.headers[1].value, "t2") == 0,
	   "settings: headers trimmed, decoded, the last of a name kept");
	ok(s.nresource == 3 && strcmp(s.resource[2].name, "k=") == 0 &&
	   strcmp(s.resource[2].value, "v,%") == 0,
	   "settings: resource attributes decoded");
	is_str(s.service_name, "from-resource", "settings: service.name of the resource");
	otel_settings_free(&s);
	opts[OTEL_OPT_SERVICE_NAME] = "flagged";
	ok(resolve(&s, opts, (char *[]){ "OTEL_SERVICE_NAME=env",
		"OTEL_RESOURCE_ATTRIBUTES=service.name=res", NULL }) == 0 &&
	   strcmp(s.service_name, "flagged") == 0, "settings: service name flag wins");
	otel_settings_free(&s);
	opts[OTEL_OPT_SERVICE_NAME] = NULL;
	ok(resolve(&s, NULL, (char *[]){ "OTEL_SERVICE_NAME=env",
		"OTEL_RESOURCE_ATTRIBUTES=service.name=res", NULL }) == 0 &&
	   strcmp(s.service_name, "env") == 0,
	   "settings: OTEL_SERVICE_NAME beats the resource");
	otel_settings_free(&s);

	ok(resolve(&s, NULL, (char *[]){
		"OTEL_EXPORTER_OTLP_TIMEOUT=1", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT=2500",
		"OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_BSP_MAX_QUEUE_SIZE=10",
		"OTEL_BSP_MAX_EXPORT_BATCH_SIZE=5",
		"OTEL_EXPORTER_OTLP_CERTIFICATE=/etc/ca.pem",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json", NULL }) == 0 &&
	   s.timeout_ms == 2500 && s.schedule_delay_ms == 100 &&
	   s.max_queue == 10 && s.max_batch == 5 && warn == NULL &&
	   s.ca_file && strcmp(s.ca_file, "/etc/ca.pem") == 0,
	   "settings: timeouts, BSP, certificate; the traces protocol wins");
	otel_settings_free(&s);
	ok(resolve(&s, NULL, (char *[]){ "OTEL_BSP_MAX_QUEUE_SIZE=100", NULL }) == 0 &&
	   s.max_batch == 100, "settings: the default batch shrinks to the queue");
	otel_settings_free(&s);
	ok(resolve(&s, NULL, (char *[]){ "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
					 NULL }) == 0 && warn != NULL &&
	   strstr(warn, "http/protobuf") != NULL, "settings: http/protobuf warns");
	otel_settings_free(&s);

	static const struct {
		const char *name;
		enum otel_sampler sampler;
	} samplers[] = {
		{ "always_on", OTEL_SAMPLER_ALWAYS_ON },
		{ "always_off", OTEL_SAMPLER_ALWAYS_OFF },
		{ "traceidratio", OTEL_SAMPLER_TRACEIDRATIO },
		{ "parentbased_always_on", OTEL_SAMPLER_PARENT_ALWAYS_ON },
		{ "parentbased_always_off", OTEL_SAMPLER_PARENT_ALWAYS_OFF },
		{ "parentbased_traceidratio", OTEL_SAMPLER_PARENT_TRACEIDRATIO },
	};
	for (size_t i = 0; i < sizeof(samplers) / sizeof(samplers[0]); i++) {
		char var[64];

		snprintf(var, sizeof(var), "OTEL_TRACES_SAMPLER=%s", samplers[i].name);
		ok(resolve(&s, NULL, (char *[]){ var, "OTEL_TRACES_SAMPLER_ARG=0.25",
						 NULL }) == 0 &&
		   s.sampler == samplers[i].sampler &&
		   s.ratio == (samplers[i].sampler == OTEL_SAMPLER_TRACEIDRATIO ||
			       samplers[i].sampler == OTEL_SAMPLER_PARENT_TRACEIDRATIO ?
			       0.25 : 1.0), "settings: sampler %s", samplers[i].name);
		otel_settings_free(&s);
	}
	opts[OTEL_OPT_SAMPLER] = "traceidratio";
	opts[OTEL_OPT_SAMPLER_ARG] = "0";
	ok(resolve(&s, opts, (char *[]){ "OTEL_TRACES_SAMPLER=always_off",
		"OTEL_TRACES_SAMPLER_ARG=0.5", NULL }) == 0 &&
	   s.sampler == OTEL_SAMPLER_TRACEIDRATIO && s.ratio == 0.0,
	   "settings: sampler flags win");
	otel_settings_free(&s);
	opts[OTEL_OPT_SAMPLER_ARG] = "1";
	ok(resolve(&s, opts, NULL) == 0 && s.ratio == 1.0, "settings: ratio 1");
	otel_settings_free(&s);
	opts[OTEL_OPT_SAMPLER] = NULL;
	opts[OTEL_OPT_SAMPLER_ARG] = NULL;
	ok(resolve(&s, NULL, (char *[]){ "OTEL_TRACES_SAMPLER_ARG=banana", NULL }) == 0,
	   "settings: the argument of a sampler that takes none is ignored");
	otel_settings_free(&s);

	refused((char *[]){ "OTEL_EXPORTER_OTLP_ENDPOINT=ftp://c", NULL },
		"OTEL_EXPORTER_OTLP_ENDPOINT", "an ftp:// URL");
	refused((char *[]){ "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=c:4318", NULL },
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "a URL without a scheme");
	refused((char *[]){ "OTEL_EXPORTER_OTLP_ENDPOINT=http://c:99999", NULL },
		"OTEL_EXPORTER_OTLP_ENDPOINT", "a bad port");
	refused((char *[]){ "OTEL_EXPORTER_OTLP_HEADERS=novalue", NULL },
		"OTEL_EXPORTER_OTLP_HEADERS", "a header without '='");
	refused((char *[]){ "OTEL_EXPORTER_OTLP_TRACES_HEADERS=a=%zz", NULL },
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a bad escape");
	refused((char *[]){ "OTEL_EXPORTER_OTLP_HEADERS=a=%0d%0aX-Evil: 1", NULL },
		"OTEL_EXPORTER_OTLP_HEADERS", "CR LF in a header value");
	refused((char *[]){ "OTEL_EXPORTER_OTLP_HEADERS=bad name=1", NULL },
		"OTEL_EXPORTER_OTLP_HEADERS", "a header name with a space");
	refused((char *[]){ "OTEL_EXPORTER_OTLP_HEADERS=Content-Length=5", NULL },
		"OTEL_EXPORTER_OTLP_HEADERS", "a framing header");
	refused((char *[]){ "OTEL_RESOURCE_ATTRIBUTES==v", NULL },
		"OTEL_RESOURCE_ATTRIBUTES", "an empty key");
	refused((char *[]){ "OTEL_RESOURCE_ATTRIBUTES=a=%0", NULL },
		"OTEL_RESOURCE_ATTRIBUTES", "a truncated escape");
	refused((char *[]){ "OTEL_TRACES_SAMPLER=jaeger_remote", NULL },
		"OTEL_TRACES_SAMPLER", "jaeger_remote");
	refused((char *[]){ "OTEL_TRACES_SAMPLER=parentbased_jaeger_remote", NULL },
		"OTEL_TRACES_SAMPLER", "parentbased_jaeger_remote");
	refused((char *[]){ "OTEL_TRACES_SAMPLER=xray", NULL },
		"OTEL_TRACES_SAMPLER", "xray");
	refused((char *[]){ "OTEL_TRACES_SAMPLER=traceidratio",
			    "OTEL_TRACES_SAMPLER_ARG=1.5", NULL },
		"OTEL_TRACES_SAMPLER_ARG", "a ratio above 1");
	refused((char *[]){ "OTEL_TRACES_SAMPLER=parentbased_traceidratio",
			    "OTEL_TRACES_SAMPLER_ARG=-0.1", NULL },
		"OTEL_TRACES_SAMPLER_ARG", "a negative ratio");
	refused((char *[]){ "OTEL_TRACES_SAMPLER=traceidratio",
			    "OTEL_TRACES_SAMPLER_ARG=nan", NULL },
		"OTEL_TRACES_SAMPLER_ARG", "NaN");
	refused((char *[]){ "OTEL_EXPORTER_OTLP_PROTOCOL=grpc", NULL },
		"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
	refused((char *[]){ "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=thrift", NULL },
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "an unknown protocol");
	refused((char *[]){ "OTEL_SDK_DISABLED=maybe", NULL },
		"OTEL_SDK_DISABLED", "a boolean that is neither");
	refused((char *[]){ "OTEL_TRACES_EXPORTER=zipkin", NULL },
		"OTEL_TRACES_EXPORTER", "the zipkin exporter");
	refused((char *[]){ "OTEL_EXPORTER_OTLP_TIMEOUT=10s", NULL },
		"OTEL_EXPORTER_OTLP_TIMEOUT", "a timeout with a unit");
	refused((char *[]){ "OTEL_BSP_SCHEDULE_DELAY=0", NULL },
		"OTEL_BSP_SCHEDULE_DELAY", "a delay of 0");
	refused((char *[]){ "OTEL_BSP_MAX_QUEUE_SIZE=10",
			    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=11", NULL },
		"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "a batch above the queue");
	opts[OTEL_OPT_TRACES_ENDPOINT] = "gopher://x";
	ok(resolve(&s, opts, NULL) < 0 &&
	   strstr(err, "--otel-traces-endpoint") != NULL,
	   "settings: a flag's error names the flag");
	opts[OTEL_OPT_TRACES_ENDPOINT] = NULL;
}

/* ---- sampling ------------------------------------------------------------ */

static void test_sampler(void)
{
	struct otel_settings s = { .ratio = 1.0 };
	struct otel_parent yes = { .valid = true, .sampled = true },
			   no = { .valid = true, .sampled = false }, none = { 0 };
	/* lower 8 bytes 0x4000000000000000: a quarter of 2^64 */
	uint8_t quarter[OTEL_TRACE_ID_LEN] = { [8] = 0x40 };
	uint8_t low[OTEL_TRACE_ID_LEN] = { [0] = 0xff, [15] = 1 };
	uint8_t high[OTEL_TRACE_ID_LEN] = { [8] = 0xff, 0xff, 0xff, 0xff,
					   0xff, 0xff, 0xff, 0xff };

	s.sampler = OTEL_SAMPLER_ALWAYS_ON;
	ok(otel_sample(&s, &no, quarter), "sample: always_on ignores the parent");
	s.sampler = OTEL_SAMPLER_ALWAYS_OFF;
	ok(!otel_sample(&s, &yes, quarter), "sample: always_off ignores the parent");
	s.sampler = OTEL_SAMPLER_TRACEIDRATIO;
	s.ratio = 0.0;
	ok(!otel_sample(&s, &none, low), "sample: ratio 0 never");
	s.ratio = 1.0;
	ok(otel_sample(&s, &none, high), "sample: ratio 1 always");
	s.ratio = 0.25;
	ok(!otel_sample(&s, &none, quarter), "sample: 2^62 is not below 0.25 * 2^64");
	s.ratio = 0.2500001;
	ok(otel_sample(&s, &none, quarter), "sample: 2^62 is below 0.2500001 * 2^64");
	s.ratio = 0.5;
	ok(otel_sample(&s, &none, low) && !otel_sample(&s, &none, high),
	   "sample: the upper 8 bytes do not count");
	ok(otel_sample(&s, &no, low), "sample: traceidratio ignores the parent");
	s.sampler = OTEL_SAMPLER_PARENT_ALWAYS_ON;
	ok(otel_sample(&s, &yes, low) && !otel_sample(&s, &no, low) &&
	   otel_sample(&s, &none, low) && otel_sample(&s, NULL, low),
	   "sample: parentbased_always_on");
	s.sampler = OTEL_SAMPLER_PARENT_ALWAYS_OFF;
	ok(otel_sample(&s, &yes, low) && !otel_sample(&s, &no, low) &&
	   !otel_sample(&s, &none, low), "sample: parentbased_always_off");
	s.sampler = OTEL_SAMPLER_PARENT_TRACEIDRATIO;
	s.ratio = 0.25;
	ok(otel_sample(&s, &yes, high) && !otel_sample(&s, &no, low) &&
	   otel_sample(&s, &none, low) && !otel_sample(&s, &none, quarter),
	   "sample: parentbased_traceidratio");
}

/* ---- encoding --------------------------------------------------------------- */

static const uint8_t trace_id[OTEL_TRACE_ID_LEN] = {
	0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6,
	0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36,
};

static const char hostile[] = "q\"b\\s/\n\r\t\x01\x7f é€😀 bad:\xff"
			      "\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80!";
/* what a decoder makes of it: each of the 10 bad bytes a U+FFFD */
static const char hostile_back[] = "q\"b\\s/\n\r\t\x01\x7f é€😀 bad:"
	"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
	"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd!";

static const struct otel_attr span_attrs[] = {
	{ .key = "http.request.method", .type = OTEL_ATTR_STRING, .s = "POST" },
	{ .key = "absent", .type = OTEL_ATTR_STRING, .s = NULL },
	{ .key = "http.response.status_code", .type = OTEL_ATTR_INT, .i = 201 },
	{ .key = "min", .type = OTEL_ATTR_INT, .i = INT64_MIN },
	{ .key = "replayed", .type = OTEL_ATTR_BOOL, .b = true },
	{ .key = "no", .type = OTEL_ATTR_BOOL, .b = false },
	{ .key = "ratio", .type = OTEL_ATTR_DOUBLE, .d = 1.5 },
	{ .key = "tenth", .type = OTEL_ATTR_DOUBLE, .d = 0.1 },
	{ .key = "hostile", .type = OTEL_ATTR_STRING, .s = hostile },
};

static const struct otel_attr event_attrs[] = {
	{ .key = "store", .type = OTEL_ATTR_STRING, .s = "postgres" },
	{ .key = "gone", .type = OTEL_ATTR_STRING, .s = NULL },
};

static const struct otel_event events[] = {
	{ .name = "claimed", .time_ns = 1700000000000000500ULL,
	  .attrs = event_attrs, .nattrs = 2 },
	{ .name = "bare", .time_ns = 1, .attrs = event_attrs + 1, .nattrs = 1 },
};

static const struct otel_span full_span = {
	.span_id = { 0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7 },
	.parent_id = { 1, 2, 3, 4, 5, 6, 7, 8 },
	.name = "POST /orders",
	.kind = OTEL_KIND_SERVER,
	.start_ns = 1700000000000000000ULL,
	.end_ns = 18446744073709551615ULL,
	.status = OTEL_STATUS_ERROR,
	.status_message = hostile,
	.attrs = span_attrs,
	.nattrs = sizeof(span_attrs) / sizeof(span_attrs[0]),
	.events = events,
	.nevents = 2,
	.sampled = true,
	.tracestate = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
};

static void test_encode_span(void)
{
	struct otel_span root = {
		.span_id = { 9, 9, 9, 9, 9, 9, 9, 9 },
		.name = "idem.claim",
		.kind = OTEL_KIND_INTERNAL,
		.start_ns = 5, .end_ns = 6,
	};
	struct json_object *o, *a, *v;
	char *buf = NULL;
	size_t len = 0, cap = 0;

	ok(otel_encode_span(trace_id, &full_span, &buf, &len, &cap) == 0,
	   "span: encoded");
	o = parse(buf, len);
	ok(o != NULL, "span: one strict, valid UTF-8 JSON document");
	is_str(str(o, "traceId"), TID, "span: traceId in hex");
	is_str(str(o, "spanId"), SID, "span: spanId in hex");
	is_str(str(o, "parentSpanId"), "0102030405060708", "span: parentSpanId");
	is_str(str(o, "traceState"), full_span.tracestate, "span: traceState");
	is_str(str(o, "name"), "POST /orders", "span: name");
	ok((v = get(o, "kind")) && json_object_is_type(v, json_type_int) &&
	   json_object_get_int(v) == 2, "span: kind 2, a number");
	is_str(str(o, "startTimeUnixNano"), "1700000000000000000",
	       "span: start time, a decimal string");
	is_str(str(o, "endTimeUnixNano"), "18446744073709551615",
	       "span: end time, up to 2^64 - 1");
	a = get(o, "attributes");
	is_int(a ? json_object_array_length(a) : 0, 8,
	       "span: 8 attributes (the NULL string left out)");
	ok(attr(a, "absent") == NULL, "span: NULL string omitted");
	is_str(str(attr(a, "http.request.method"), "stringValue"), "POST",
	       "span: stringValue");
	is_str(str(attr(a, "http.response.status_code"), "intValue"), "201",
	       "span: intValue as a string");
	is_str(str(attr(a, "min"), "intValue"), "-9223372036854775808",
	       "span: INT64_MIN");
	ok((v = get(attr(a, "replayed"), "boolValue")) &&
	   json_object_is_type(v, json_type_boolean) && json_object_get_boolean(v),
	   "span: boolValue true");
	ok((v = get(attr(a, "no"), "boolValue")) && !json_object_get_boolean(v),
	   "span: boolValue false");
	ok((v = get(attr(a, "ratio"), "doubleValue")) &&
	   json_object_is_type(v, json_type_double) &&
	   json_object_get_double(v) == 1.5, "span: doubleValue 1.5");
	ok((v = get(attr(a, "tenth"), "doubleValue")) &&
	   json_object_get_double(v) == 0.1, "span: doubleValue 0.1 round-trips");
	is_str(str(attr(a, "hostile"), "stringValue"), hostile_back,
	       "span: a hostile string escaped, bad UTF-8 replaced");
	is_int(json_object_array_length(get(o, "events")), 2, "span: 2 events");
	is_str(str(o, "events.0.timeUnixNano"), "1700000000000000500",
	       "span: event time, a decimal string");
	is_str(str(o, "events.0.name"), "claimed", "span: event name");
	is_int(json_object_array_length(get(o, "events.0.attributes")), 1,
	       "span: event attributes, the NULL one left out");
	is_str(str(attr(get(o, "events.0.attributes"), "store"), "stringValue"),
	       "postgres", "span: event attribute");
	ok(get(o, "events.1.attributes") == NULL,
	   "span: no attributes member when none has a value");
	is_int(json_object_get_int(get(o, "status.code")), 2, "span: status code");
	is_str(str(o, "status.message"), hostile_back, "span: status message");
	is_int(json_object_get_int(get(o, "flags")), 1, "span: flags, sampled");
	json_object_put(o);

	/* a second span appended after a comma, as a request's buffer has it */
	buf[len++] = ',';
	ok(otel_encode_span(trace_id, &root, &buf, &len, &cap) == 0,
	   "span: a root appended");
	{
		char *arr = malloc(len + 3);

		arr[0] = '[';
		memcpy(arr + 1, buf, len);
		arr[len + 1] = ']';
		o = parse(arr, len + 2);
		free(arr);
	}
	ok(o != NULL && json_object_array_length(o) == 2,
	   "span: two spans joined by ',' make a JSON list");
	v = o ? json_object_array_get_idx(o, 1) : NULL;
	ok(v && get(v, "parentSpanId") == NULL, "span: a root has no parentSpanId");
	ok(v && get(v, "traceState") == NULL && get(v, "attributes") == NULL &&
	   get(v, "events") == NULL && get(v, "flags") == NULL &&
	   get(v, "status.message") == NULL &&
	   json_object_get_int(get(v, "status.code")) == 0 &&
	   json_object_get_int(get(v, "kind")) == 1,
	   "span: a bare span has only what it holds");
	json_object_put(o);
	free(buf);
}

static void test_encode_request(void)
{
	struct otel_pair res[] = {
		{ "deployment.environment", "prod" },
		{ "service.name", "shadowed" },
		{ "telemetry.sdk.version", "mine" },
	};
	struct otel_settings s = {
		.service_name = "orders-proxy",
		.resource = res,
		.nresource = 3,
	};
	char *one = NULL, *two = NULL, *body;
	size_t l1 = 0, c1 = 0, l2 = 0, c2 = 0, len;
	struct otel_span sp = full_span;
	struct json_object *o, *attrs;
	int ok1;

	ok1 = otel_encode_span(trace_id, &sp, &one, &l1, &c1) == 0;
	sp.span_id[0] = 0x77;
	ok1 = ok1 && otel_encode_span(trace_id, &sp, &two, &l2, &c2) == 0;
	two[l2++] = ',';
	sp.span_id[0] = 0x78;
	ok1 = ok1 && otel_encode_span(trace_id, &sp, &two, &l2, &c2) == 0;
	ok(ok1, "request: spans encoded");
	body = otel_encode_request(&s, "1.2.3", (const char *const[]){ one, two },
				   (const size_t[]){ l1, l2 }, 2, &len);
	ok(body != NULL && strlen(body) == len, "request: encoded, NUL-terminated");
	o = parse(body, len);
	ok(o != NULL, "request: one strict JSON document");
	attrs = get(o, "resourceSpans.0.resource.attributes");
	is_str(str(attr(attrs, "service.name"), "stringValue"), "orders-proxy",
	       "request: service.name");
	is_int(count_attr(attrs, "service.name"), 1, "request: service.name once");
	is_str(str(attr(attrs, "deployment.environment"), "stringValue"), "prod",
	       "request: a resource attribute");
	is_str(str(attr(attrs, "telemetry.sdk.name"), "stringValue"), "idemproxy",
	       "request: telemetry.sdk.name");
	is_str(str(attr(attrs, "telemetry.sdk.version"), "stringValue"), "mine",
	       "request: the resource's own telemetry.sdk.version kept");
	is_int(count_attr(attrs, "telemetry.sdk.version"), 1,
	       "request: telemetry.sdk.version once");
	is_str(str(o, "resourceSpans.0.scopeSpans.0.scope.name"), "idemproxy",
	       "request: scope name");
	is_str(str(o, "resourceSpans.0.scopeSpans.0.scope.version"), "1.2.3",
	       "request: scope version");
	is_int(json_object_array_length(get(o, "resourceSpans.0.scopeSpans.0.spans")),
	       3, "request: 3 spans from 2 buffers");
	is_str(str(o, "resourceSpans.0.scopeSpans.0.spans.2.spanId"),
	       "78f067aa0ba902b7", "request: spans in order");
	json_object_put(o);
	free(body);
	body = otel_encode_request(&s, "1.2.3", NULL, NULL, 0, &len);
	o = body ? parse(body, len) : NULL;
	ok(o && json_object_array_length(get(o, "resourceSpans.0.scopeSpans.0.spans")) == 0,
	   "request: no spans, an empty list");
	json_object_put(o);
	free(body);
	free(one);
	free(two);
}

/* What one span of a typical request costs to encode, for the report. */
static void bench_encode(void)
{
	enum { N = 200000 };
	static const struct otel_attr attrs[] = {
		{ .key = "http.request.method", .type = OTEL_ATTR_STRING, .s = "POST" },
		{ .key = "url.path", .type = OTEL_ATTR_STRING, .s = "/v1/orders/12345/items" },
		{ .key = "http.route", .type = OTEL_ATTR_STRING, .s = "orders" },
		{ .key = "http.response.status_code", .type = OTEL_ATTR_INT, .i = 201 },
		{ .key = "server.address", .type = OTEL_ATTR_STRING, .s = "api.example.com" },
		{ .key = "client.address", .type = OTEL_ATTR_STRING, .s = "10.1.2.3" },
		{ .key = "user_agent.original", .type = OTEL_ATTR_STRING, .s = "stripe-node/14.0.0" },
		{ .key = "idempotency.key", .type = OTEL_ATTR_STRING, .s = "c0ffee00-1234-4abc-9def-0123456789ab" },
		{ .key = "idempotency.outcome", .type = OTEL_ATTR_STRING, .s = "forwarded" },
		{ .key = "idempotency.replayed", .type = OTEL_ATTR_BOOL, .b = false },
	};
	static const struct otel_event ev[] = {
		{ .name = "store.claimed", .time_ns = 1700000000000100000ULL },
	};
	struct otel_span sp = {
		.span_id = { 1, 2, 3, 4, 5, 6, 7, 8 },
		.parent_id = { 8, 7, 6, 5, 4, 3, 2, 1 },
		.name = "POST orders", .kind = OTEL_KIND_SERVER,
		.start_ns = 1700000000000000000ULL, .end_ns = 1700000000001234567ULL,
		.attrs = attrs, .nattrs = 10, .events = ev, .nevents = 1,
		.sampled = true,
	};
	char *buf = NULL;
	size_t len = 0, cap = 0;
	uint64_t t0 = clock_us();
	bool good = true;

	for (int i = 0; i < N; i++) {
		len = 0;
		good = good && otel_encode_span(trace_id, &sp, &buf, &len, &cap) == 0;
	}
	printf("# encode: %.0f ns per span (%zu bytes, 10 attributes, 1 event)\n",
	       (double)(clock_us() - t0) * 1000.0 / N, len);
	ok(good, "bench: %d spans encoded", N);
	free(buf);
}

/* ---- the collector ------------------------------------------------------- */

enum coll_mode {
	COLL_OK,		/* 200 to every request */
	COLL_503_TWICE,		/* 503, 503, then a chunked 200 */
	COLL_400,		/* 400 */
	COLL_SILENT,		/* reads, never answers */
};

#define COLL_MAX 16

/* The collector thread's view, under mu. */
static struct {
	pthread_mutex_t mu;
	int lfd, quit[2];
	enum coll_mode mode;
	int nreq;
	char *head[COLL_MAX], *body[COLL_MAX];
	size_t body_len[COLL_MAX];
	pthread_t thread;
} coll = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* Wait for fd (or quit) with a bound; false on quit or time up. */
static bool coll_wait(int fd, short ev)
{
	struct pollfd p[2] = { { fd, ev, 0 }, { coll.quit[0], POLLIN, 0 } };

	return poll(p, 2, 20000) > 0 && p[1].revents == 0 && p[0].revents != 0;
}

/* Serve one connection's requests in turn. */
static void coll_serve(int fd)
{
	char buf[1 << 16];
	size_t have = 0;

	for (;;) {
		char *end, *cl;
		size_t hlen, blen;
		ssize_t n;
		int nreq;
		enum coll_mode mode;
		const char *reply;

		while ((end = memmem(buf, have, "\r\n\r\n", 4)) == NULL) {
			if (have == sizeof(buf) || !coll_wait(fd, POLLIN) ||
			    (n = read(fd, buf + have, sizeof(buf) - have)) <= 0)
				return;
			have += (size_t)n;
		}
		hlen = (size_t)(end - buf) + 4;
		buf[hlen - 1] = '\0';
		cl = strcasestr(buf, "\r\nContent-Length:");
		blen = cl ? strtoul(cl + 17, NULL, 10) : 0;
		buf[hlen - 1] = '\n';
		if (hlen + blen > sizeof(buf))
			return;
		while (have < hlen + blen) {
			if (!coll_wait(fd, POLLIN) ||
			    (n = read(fd, buf + have, sizeof(buf) - have)) <= 0)
				return;
			have += (size_t)n;
		}
		pthread_mutex_lock(&coll.mu);
		nreq = coll.nreq;
		mode = coll.mode;
		if (nreq < COLL_MAX) {
			coll.head[nreq] = strndup(buf, hlen);
			coll.body[nreq] = strndup(buf + hlen, blen);
			coll.body_len[nreq] = blen;
			coll.nreq++;
		}
		pthread_mutex_unlock(&coll.mu);
		memmove(buf, buf + hlen + blen, have - hlen - blen);
		have -= hlen + blen;
		if (mode == COLL_SILENT) {
			coll_wait(fd, POLLIN);	/* until the exporter hangs up */
			return;
		}
		if (mode == COLL_400)
			reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nbad request";
		else if (mode == COLL_503_TWICE && nreq < 2)
			reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
		else if (mode == COLL_503_TWICE)
			reply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
				"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
		else
			reply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
				"Content-Length: 2\r\n\r\n{}";
		if (write(fd, reply, strlen(reply)) != (ssize_t)strlen(reply))
			return;
	}
}

static void *coll_main(void *arg)
{
	(void)arg;
	while (coll_wait(coll.lfd, POLLIN)) {
		int fd = accept(coll.lfd, NULL, NULL);

		if (fd < 0)
			continue;
		coll_serve(fd);
		close(fd);
	}
	return NULL;
}

/* A listening socket on 127.0.0.1; its port. */
static int listen_any(int *fd)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t alen = sizeof(a);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	*fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (*fd < 0 || bind(*fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    listen(*fd, 16) < 0 ||
	    getsockname(*fd, (struct sockaddr *)&a, &alen) < 0)
		abort();
	return ntohs(a.sin_port);
}

static int coll_start(enum coll_mode mode)
{
	int port = listen_any(&coll.lfd);

	coll.mode = mode;
	coll.nreq = 0;
	if (pipe(coll.quit) < 0 || pthread_create(&coll.thread, NULL, coll_main, NULL))
		abort();
	return port;
}

static void coll_stop(void)
{
	if (write(coll.quit[1], "q", 1) != 1)
		abort();
	pthread_join(coll.thread, NULL);
	close(coll.lfd);
	close(coll.quit[0]);
	close(coll.quit[1]);
	for (int i = 0; i < coll.nreq; i++) {
		free(coll.head[i]);
		free(coll.body[i]);
	}
	coll.nreq = 0;
}

static int coll_count(void)
{
	int n;

	pthread_mutex_lock(&coll.mu);
	n = coll.nreq;
	pthread_mutex_unlock(&coll.mu);
	return n;
}

/* Poll cond every 5 ms until it holds or ms pass; the caller then looks
 * at cond again. */
#define WAIT_FOR(cond, ms) do { \
	uint64_t end_ = clock_ms() + (ms); \
	while (!(cond) && clock_ms() < end_) \
		nanosleep(&(struct timespec){ 0, 5000000 }, NULL); \
} while (0)

/* Settings for a collector at port, with small batches and timeouts. */
static void exp_settings(struct otel_settings *s, int port, const char *timeout)
{
	char ep[96], to[64];

	snprintf(ep, sizeof(ep), "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:%d/", port);
	snprintf(to, sizeof(to), "OTEL_EXPORTER_OTLP_TIMEOUT=%s", timeout);
	if (resolve(s, NULL, (char *[]){ ep, to,
		"OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_BSP_MAX_QUEUE_SIZE=8",
		"OTEL_BSP_MAX_EXPORT_BATCH_SIZE=4",
		"OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20tok,x-tenant=t1",
		"OTEL_SERVICE_NAME=test-svc", NULL }) < 0) {
		printf("# %s\n", err);
		abort();
	}
}

/* One span with span id byte i, encoded as a worker hands it over. */
static void hand_over(uint8_t i)
{
	struct otel_span sp = full_span;
	char *buf = NULL;
	size_t len = 0, cap = 0;

	sp.span_id[7] = i;
	if (otel_encode_span(trace_id, &sp, &buf, &len, &cap) < 0)
		abort();
	otel_export_spans(buf, len, 1);
}

static void test_export_ok(void)
{
	struct otel_settings s;
	unsigned long exported = EXPORTED();
	struct json_object *o;
	char e[256], want[64];
	int port = coll_start(COLL_OK);

	exp_settings(&s, port, "5000");
	ok(otel_export_start(&s, "9.9.9", e, sizeof(e)) == 0, "export: started");
	ok(otel_export_start(&s, "9.9.9", e, sizeof(e)) < 0,
	   "export: a second start refused (%s)", e);
	otel_settings_free(&s);
	hand_over(1);
	hand_over(2);
	WAIT_FOR(EXPORTED() >= exported + 2, 10000);
	ok(EXPORTED() >= exported + 2, "export: 2 spans exported");
	is_int(coll_count(), 1, "export: in one POST");
	pthread_mutex_lock(&coll.mu);
	ok(strncmp(coll.head[0], "POST /v1/traces HTTP/1.1\r\n", 26) == 0,
	   "export: POST /v1/traces HTTP/1.1");
	snprintf(want, sizeof(want), "\r\nHost: 127.0.0.1:%d\r\n", port);
	ok(strstr(coll.head[0], want) != NULL, "export: Host");
	ok(strstr(coll.head[0], "\r\nContent-Type: application/json\r\n") != NULL,
	   "export: Content-Type");
	ok(strstr(coll.head[0], "\r\nUser-Agent: idemproxy/9.9.9\r\n") != NULL,
	   "export: User-Agent");
	ok(strstr(coll.head[0], "\r\nAuthorization: Bearer tok\r\n") != NULL &&
	   strstr(coll.head[0], "\r\nx-tenant: t1\r\n") != NULL,
	   "export: the configured headers");
	ok(strstr(coll.head[0], "\r\nConnection: keep-alive\r\n") != NULL,
	   "export: keep-alive");
	o = parse(coll.body[0], coll.body_len[0]);
	ok(o != NULL, "export: the body is JSON");
	is_int(json_object_array_length(get(o, "resourceSpans.0.scopeSpans.0.spans")),
	       2, "export: both spans in the body");
	is_str(str(attr(get(o, "resourceSpans.0.resource.attributes"), "service.name"),
		   "stringValue"), "test-svc", "export: service.name");
	is_str(str(o, "resourceSpans.0.scopeSpans.0.spans.1.spanId"), "00f067aa0ba90202",
	       "export: spans in order");
	if (getenv("OTEL_TEST_SHOW_BODY"))
		printf("# body: %s\n", coll.body[0]);
	json_object_put(o);
	pthread_mutex_unlock(&coll.mu);

	hand_over(3);
	WAIT_FOR(EXPORTED() >= exported + 3, 10000);
	ok(EXPORTED() >= exported + 3, "export: a second batch");
	pthread_mutex_lock(&coll.mu);
	ok(coll.nreq == 2, "export: on the kept connection (one accept served both)");
	pthread_mutex_unlock(&coll.mu);
	otel_export_stop(2000);
	coll_stop();
}

static void test_export_retry(void)
{
	struct otel_settings s;
	unsigned long exported = EXPORTED(), failures = FAILURES(),
		      dropped = DROPPED();
	char e[256];
	int port = coll_start(COLL_503_TWICE);

	exp_settings(&s, port, "5000");
	ok(otel_export_start(&s, "1", e, sizeof(e)) == 0, "retry: started");
	otel_settings_free(&s);
	hand_over(1);
	WAIT_FOR(EXPORTED() >= exported + 1, 15000);
	ok(EXPORTED() >= exported + 1,
	   "retry: exported after two 503s");
	is_int(coll_count(), 3, "retry: on the third try");
	is_int(FAILURES() - failures, 2, "retry: two failures counted");
	is_int(DROPPED() - dropped, 0, "retry: nothing dropped");
	otel_export_stop(2000);
	coll_stop();

	port = coll_start(COLL_400);
	exported = EXPORTED();
	failures = FAILURES();
	dropped = DROPPED();
	exp_settings(&s, port, "5000");
	ok(otel_export_start(&s, "1", e, sizeof(e)) == 0, "400: started");
	otel_settings_free(&s);
	hand_over(1);
	hand_over(2);
	WAIT_FOR(DROPPED() >= dropped + 2, 10000);
	ok(DROPPED() >= dropped + 2, "400: the batch dropped");
	is_int(FAILURES() - failures, 1, "400: one failure");
	is_int(EXPORTED() - exported, 0, "400: nothing exported");
	otel_export_stop(2000);
	is_int(coll_count(), 1, "400: not tried again");
	coll_stop();
}

static void test_export_down(void)
{
	struct otel_settings s;
	unsigned long exported = EXPORTED(), dropped = DROPPED();
	uint64_t t0, worst = 0;
	char e[256];
	int fd, port = listen_any(&fd);

	close(fd);	/* a port nobody listens on */
	exp_settings(&s, port, "300");
	ok(otel_export_start(&s, "1", e, sizeof(e)) == 0, "down: started");
	otel_settings_free(&s);
	for (int i = 0; i < 40; i++) {
		t0 = clock_us();
		hand_over((uint8_t)i);
		if (clock_us() - t0 > worst)
			worst = clock_us() - t0;
	}
	ok(worst < 100000, "down: the hand-over never blocks (worst %llu us)",
	   (unsigned long long)worst);
	/* 8 queued and at most 4 in the thread's hands: 28 or more dropped */
	ok(DROPPED() - dropped >= 40 - 8 - 4, "down: spans beyond the queue "
	   "dropped and counted (%lu)", DROPPED() - dropped);
	t0 = clock_ms();
	otel_export_stop(500);
	ok(clock_ms() - t0 < 1500, "down: stop(500) returned in %llu ms",
	   (unsigned long long)(clock_ms() - t0));
	is_int((EXPORTED() - exported) + (DROPPED() - dropped), 40,
	       "down: after stop every span is exported or dropped");
	otel_export_spans(strdup("{}"), 2, 1);
	is_int(DROPPED() - dropped, 41, "down: spans after stop dropped and counted");
}

static void test_export_silent(void)
{
	struct otel_settings s;
	unsigned long dropped = DROPPED();
	uint64_t t0;
	char e[256];
	int port = coll_start(COLL_SILENT);

	exp_settings(&s, port, "20000");
	ok(otel_export_start(&s, "1", e, sizeof(e)) == 0, "silent: started");
	otel_settings_free(&s);
	hand_over(1);
	WAIT_FOR(coll_count() >= 1, 10000);
	ok(coll_count() >= 1, "silent: the request arrived");
	t0 = clock_ms();
	otel_export_stop(300);
	ok(clock_ms() - t0 < 1300, "silent: stop(300) returned in %llu ms "
	   "(the POST's timeout is 20 s)", (unsigned long long)(clock_ms() - t0));
	is_int(DROPPED() - dropped, 1, "silent: the unanswered span dropped");
	coll_stop();
}

static void test_export_idle(void)
{
	struct otel_settings s = { 0 };
	unsigned long dropped = DROPPED();
	char e[256];

	otel_export_stop(0);
	ok(1, "idle: stop before any start");
	otel_export_spans(strdup("{}"), 2, 3);
	is_int(DROPPED() - dropped, 3, "idle: spans before start dropped, counted");
	ok(otel_export_start(&s, "1", e, sizeof(e)) < 0, "idle: no endpoint refused");
	s.endpoint = "ftp://x";
	ok(otel_export_start(&s, "1", e, sizeof(e)) < 0, "idle: a bad endpoint refused");
	s.endpoint = "https://127.0.0.1:1/";
	s.ca_file = "/nonexistent/ca.pem";
	ok(otel_export_start(&s, "1", e, sizeof(e)) < 0 &&
	   strstr(e, "OTEL_EXPORTER_OTLP_CERTIFICATE") != NULL,
	   "idle: an unreadable CA file refused (%s)", e);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	test_traceparent();
	test_ids();
	test_settings();
	test_sampler();
	test_encode_span();
	test_encode_request();
	bench_encode();
	test_export_idle();
	test_export_ok();
	test_export_retry();
	test_export_down();
	test_export_silent();
	return tap_done();
}
