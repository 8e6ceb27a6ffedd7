/*
 * otel.h - OpenTelemetry traces without an SDK: W3C trace context
 * (traceparent, tracestate), ids, the standard samplers, the exporter's
 * settings from the standard OTEL_* variables, and spans encoded as OTLP/JSON
 * (opentelemetry-proto's JSON mapping: ids as hex, times as decimal
 * strings). Socket-less; proxy/otel_export.c sends what is encoded here.
 */
#ifndef IDEMPROXY_OTEL_H
#define IDEMPROXY_OTEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

#define OTEL_TRACE_ID_LEN 16
#define OTEL_SPAN_ID_LEN 8
#define OTEL_TRACEPARENT_LEN 55		/* "00-<32>-<16>-<2>" */
#define OTEL_TRACESTATE_MAX 512		/* W3C: 32 members x 256 chars; we keep
					 * the first 512 bytes' whole members */

/* A parent from the client's traceparent (or none). */
struct otel_parent {
	bool valid;			/* a well-formed traceparent was sent */
	uint8_t trace_id[OTEL_TRACE_ID_LEN];
	uint8_t span_id[OTEL_SPAN_ID_LEN];
	bool sampled;			/* trace-flags bit 0 */
};

/*
 * Parse a traceparent value (W3C Trace Context level 1 §3.2): version 00
 * exactly "00-<32 lowercase hex>-<16 lowercase hex>-<2 hex>"; a higher
 * version is read by its first 55 bytes when a '-' or the end follows;
 * version ff, all-zero ids, upper case or any other shape: invalid
 * (out->valid false, -1). Whitespace around the value is allowed.
 */
int otel_parse_traceparent(const char *v, size_t len, struct otel_parent *out);

/* "00-<trace>-<span>-0s" into out (OTEL_TRACEPARENT_LEN + 1 bytes). */
void otel_format_traceparent(const uint8_t trace_id[OTEL_TRACE_ID_LEN],
			     const uint8_t span_id[OTEL_SPAN_ID_LEN],
			     bool sampled, char *out);

/* Lower-case hex of n bytes into out (2n + 1 bytes). */
void otel_hex(const uint8_t *id, size_t n, char *out);

/* Random, never all-zero ids (a per-thread generator seeded from the
 * kernel; no syscall per id). */
void otel_new_trace_id(uint8_t id[OTEL_TRACE_ID_LEN]);
void otel_new_span_id(uint8_t id[OTEL_SPAN_ID_LEN]);

/* OTEL_TRACES_SAMPLER */
enum otel_sampler {
	OTEL_SAMPLER_ALWAYS_ON,
	OTEL_SAMPLER_ALWAYS_OFF,
	OTEL_SAMPLER_TRACEIDRATIO,
	OTEL_SAMPLER_PARENT_ALWAYS_ON,		/* parentbased_always_on (default) */
	OTEL_SAMPLER_PARENT_ALWAYS_OFF,
	OTEL_SAMPLER_PARENT_TRACEIDRATIO,
};

/* Name/value pairs of OTEL_EXPORTER_OTLP_HEADERS and
 * OTEL_RESOURCE_ATTRIBUTES, percent-decoded. */
struct otel_pair {
	char *name;
	char *value;
};

/* What the exporter runs with, resolved by otel_settings_resolve(). */
struct otel_settings {
	bool enabled;			/* an endpoint, and not disabled */
	char *endpoint;			/* the full URL POSTed to (.../v1/traces) */
	struct otel_pair *headers;
	size_t nheaders;
	char *service_name;		/* OTEL_SERVICE_NAME, else the resource's
					 * service.name, else "idemproxy" */
	struct otel_pair *resource;	/* OTEL_RESOURCE_ATTRIBUTES */
	size_t nresource;
	enum otel_sampler sampler;
	double ratio;			/* OTEL_TRACES_SAMPLER_ARG, [0, 1] */
	uint64_t timeout_ms;		/* one export, OTEL_EXPORTER_OTLP_TIMEOUT */
	uint64_t schedule_delay_ms;	/* OTEL_BSP_SCHEDULE_DELAY */
	uint64_t max_queue;		/* spans, OTEL_BSP_MAX_QUEUE_SIZE */
	uint64_t max_batch;		/* spans per POST, OTEL_BSP_MAX_EXPORT_BATCH_SIZE */
	char *ca_file;			/* OTEL_EXPORTER_OTLP_CERTIFICATE; NULL */
};

/* The settings' names, as the flags give them (otel_settings_resolve's
 * `opts`, NULL for a flag not given). Each falls back to its standard
 * variable(s) in envp. */
enum otel_opt {
	OTEL_OPT_ENDPOINT,		/* OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/traces) */
	OTEL_OPT_TRACES_ENDPOINT,	/* OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, as is */
	OTEL_OPT_HEADERS,		/* ..._TRACES_HEADERS, then ..._HEADERS */
	OTEL_OPT_SERVICE_NAME,		/* OTEL_SERVICE_NAME */
	OTEL_OPT_RESOURCE_ATTRIBUTES,	/* OTEL_RESOURCE_ATTRIBUTES */
	OTEL_OPT_SAMPLER,		/* OTEL_TRACES_SAMPLER */
	OTEL_OPT_SAMPLER_ARG,		/* OTEL_TRACES_SAMPLER_ARG */
	OTEL_OPT_DISABLED,		/* OTEL_SDK_DISABLED ("true") */
	OTEL_OPT_COUNT,
};

/*
 * Resolve the settings: a flag's value in opts[] wins over the standard
 * variable in envp (NULL-terminated "NAME=value"). Also read from envp
 * only: OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT, _PROTOCOL (http/json; also
 * http/protobuf, sent as JSON with a warning the caller logs; grpc is an
 * error), _CERTIFICATE, OTEL_TRACES_EXPORTER (otlp | none), OTEL_BSP_*.
 * Returns 0, or -1 with a one-line message naming the setting in err.
 * *warn gets a static message for the caller to log, or NULL.
 */
int otel_settings_resolve(struct otel_settings *out,
			  const char *const opts[OTEL_OPT_COUNT], char **envp,
			  const char **warn, char *err, size_t errlen) MUSTCHECK;
void otel_settings_free(struct otel_settings *s);

/*
 * The sampling decision for a new server span: parent is the client's
 * (valid or not), trace_id the span's (the parent's when valid).
 */
bool otel_sample(const struct otel_settings *s, const struct otel_parent *parent,
		 const uint8_t trace_id[OTEL_TRACE_ID_LEN]);

/* ---- spans ------------------------------------------------------------ */

enum otel_kind {		/* opentelemetry-proto SpanKind */
	OTEL_KIND_INTERNAL = 1,
	OTEL_KIND_SERVER = 2,
	OTEL_KIND_CLIENT = 3,
};

enum otel_status {		/* Status.StatusCode */
	OTEL_STATUS_UNSET = 0,
	OTEL_STATUS_OK = 1,
	OTEL_STATUS_ERROR = 2,
};

enum otel_attr_type {
	OTEL_ATTR_STRING,
	OTEL_ATTR_INT,
	OTEL_ATTR_BOOL,
	OTEL_ATTR_DOUBLE,
};

struct otel_attr {
	const char *key;
	enum otel_attr_type type;
	const char *s;		/* STRING; NULL: the attribute is left out */
	int64_t i;		/* INT */
	bool b;			/* BOOL */
	double d;		/* DOUBLE */
};

struct otel_event {
	const char *name;
	uint64_t time_ns;	/* since the epoch */
	const struct otel_attr *attrs;
	size_t nattrs;
};

struct otel_span {
	uint8_t span_id[OTEL_SPAN_ID_LEN];
	uint8_t parent_id[OTEL_SPAN_ID_LEN];	/* all zero: a root span */
	const char *name;
	enum otel_kind kind;
	uint64_t start_ns, end_ns;		/* since the epoch */
	enum otel_status status;
	const char *status_message;		/* NULL: none */
	const struct otel_attr *attrs;
	size_t nattrs;
	const struct otel_event *events;
	size_t nevents;
	bool sampled;				/* flags: 0x01 */
	const char *tracestate;			/* the parent's; NULL */
};

/*
 * Append one span as an OTLP/JSON Span object (no separators) to buf
 * (malloc'd, grown as needed; *len and *cap updated). Strings are escaped
 * as JSON, invalid UTF-8 replaced. 0, or -1 out of memory.
 */
int otel_encode_span(const uint8_t trace_id[OTEL_TRACE_ID_LEN],
		     const struct otel_span *sp, char **buf, size_t *len,
		     size_t *cap) MUSTCHECK;

/*
 * The body of one export: {"resourceSpans":[{"resource":{...},
 * "scopeSpans":[{"scope":{"name":"idemproxy","version":...},
 * "spans":[ <spans joined by ','> ]}]}]}. spans[i] are what
 * otel_encode_span() made. Returns a malloc'd string (*len set), or NULL.
 */
char *otel_encode_request(const struct otel_settings *s, const char *version,
			  const char *const *spans, const size_t *lens,
			  size_t n, size_t *len);

#endif
