/*
 * metrics.h - the process-wide metrics registry, rendered as Prometheus text.
 *
 * Every metric is defined once in the X-macros below. Updates are relaxed
 * atomic adds so that any worker thread may count without a lock; the admin
 * endpoint reads a slightly racy but never torn snapshot.
 */
#ifndef IDEMPROXY_METRICS_H
#define IDEMPROXY_METRICS_H

#include <stddef.h>
#include <stdio.h>

/* One outcome per request (DESIGN.md §5). */
#define OUTCOME_LIST(X) \
	X(PASSTHROUGH,       "passthrough") \
	X(FORWARDED,         "forwarded") \
	X(REPLAYED,          "replayed") \
	X(CONFLICT,          "conflict") \
	X(MISMATCH,          "mismatch") \
	X(MISSING_KEY,       "missing_key") \
	X(INVALID_KEY,       "invalid_key") \
	X(TOO_LARGE,         "too_large") \
	X(STORE_UNAVAILABLE, "store_unavailable") \
	X(FAIL_OPEN,         "fail_open") \
	X(SIGNATURE_INVALID, "signature_invalid") \
	X(IDENTITY_INVALID,  "identity_invalid") \
	X(KEY_ISSUED,        "key_issued") \
	X(BUSY,              "busy")

enum outcome {
#define X(name, label) OUTCOME_##name,
	OUTCOME_LIST(X)
#undef X
	OUTCOME_COUNT
};

/* Requests the proxy refused before they became requests (by reason). */
#define CLIENT_ERROR_LIST(X) \
	X(BAD_REQUEST,       "bad_request") \
	X(HEADERS_TOO_LARGE, "headers_too_large") \
	X(REQUEST_TIMEOUT,   "request_timeout") \
	X(PROXY_PROTOCOL,    "proxy_protocol")

enum client_error {
#define X(name, label) CLIENT_ERROR_##name,
	CLIENT_ERROR_LIST(X)
#undef X
	CLIENT_ERROR_COUNT
};

/* Why an exchange with the upstream failed. */
#define UPSTREAM_ERROR_LIST(X) \
	X(CONNECT,  "connect") \
	X(TIMEOUT,  "timeout") \
	X(RESET,    "reset") \
	X(PROTOCOL, "protocol") \
	X(TLS,      "tls")

enum upstream_error {
#define X(name, label) UPSTREAM_ERROR_##name,
	UPSTREAM_ERROR_LIST(X)
#undef X
	UPSTREAM_ERROR_COUNT
};

/* Why a keyed request's outcome became unknown (idem.c): the connection
 * broke after request bytes left (reset, timeout of a write, a response
 * that is no HTTP, TLS), the exchange reached --upstream-deadline, or the
 * owner stopped extending its lease (a duplicate found it run out). */
#define UNKNOWN_CAUSE_LIST(X) \
	X(RESET,    "reset") \
	X(TIMEOUT,  "timeout") \
	X(PROTOCOL, "protocol") \
	X(TLS,      "tls") \
	X(DEADLINE, "deadline") \
	X(LEASE,    "lease")

enum unknown_cause {
#define X(name, label) UNKNOWN_CAUSE_##name,
	UNKNOWN_CAUSE_LIST(X)
#undef X
	UNKNOWN_CAUSE_COUNT
};

/* What an outcome probe answered (idem.c). */
#define PROBE_RESULT_LIST(X) \
	X(FOUND,   "found") \
	X(ABSENT,  "absent") \
	X(UNKNOWN, "unknown")

enum probe_result {
#define X(name, label) PROBE_RESULT_##name,
	PROBE_RESULT_LIST(X)
#undef X
	PROBE_RESULT_COUNT
};

/* Why a client's TLS handshake failed (tls.c). */
#define TLS_ERROR_LIST(X) \
	X(PLAIN_HTTP, "plain_http") \
	X(TIMEOUT,    "timeout") \
	X(EOF,        "eof") \
	X(PROTOCOL,   "protocol")

enum tls_error {
#define X(name, label) TLS_ERROR_##name,
	TLS_ERROR_LIST(X)
#undef X
	TLS_ERROR_COUNT
};

/* Gauges: name, help. */
#define GAUGE_LIST(X) \
	X(connections,          "Open client connections.") \
	X(upstream_connections, "Open connections to the upstream, busy or idle.") \
	X(in_flight,            "Keyed requests this process is executing upstream.") \
	X(sweep_lag_seconds,    "How late retention is: seconds since the oldest partition still kept ended, or since the oldest record of the last sweep batch expired (an unpartitioned table).") \
	X(store_partitions,     "Partitions of the PostgreSQL table (0: not partitioned, or not known yet).") \
	X(response_cache_bytes, "Bytes held by the in-process response cache.") \
	X(response_cache_entries, "Completed responses held by the in-process response cache.") \
	X(store_up,             "1 while the idempotency store is reachable (what /readyz asks), else 0.") \
	X(tunnels_open,         "Upgraded connections (WebSockets) open: byte tunnels between a client and the upstream.")

/* Plain counters: name, help. */
#define COUNTER_LIST(X) \
	X(redis_hits_total,        "Replays answered from Redis without PostgreSQL.") \
	X(response_cache_hits_total, "Replays answered from the in-process response cache.") \
	X(completion_retries_total, "Completion or release writes retried after a store error.") \
	X(completion_failures_total, "Completions or releases given up; the lease resolves the key.") \
	X(sweep_deleted_total,     "Expired records deleted by the sweeper (an unpartitioned table).") \
	X(sweep_partitions_dropped_total, "Partitions of expired records dropped.") \
	X(store_unacknowledged_commits_total, "Store operations whose commit PostgreSQL made without the synchronous standby's acknowledgement (a cancelled wait); each was written again.") \
	X(fingerprint_fallbacks_total, "Keyed requests on a route with fingerprint = json or form whose body was not JSON or a form, fingerprinted by their raw bytes.") \
	X(tls_handshakes_total,    "Client TLS handshakes completed.") \
	X(tls_resumed_total,       "Client TLS handshakes that resumed a session.") \
	X(upstream_tls_handshakes_total, "TLS handshakes with the upstream completed.") \
	X(upstream_tls_resumed_total, "TLS handshakes with the upstream that resumed a session.") \
	X(late_responses_total,    "Keyed responses that came after --upstream-timeout (the client had its 504) and were stored for the retries.") \
	X(unknown_outcomes_released_total, "Unknown outcomes released for a retry (unknown_outcome = release: at-least-once).") \
	X(access_log_lines_total,  "Access-log lines written out.") \
	X(access_log_dropped_total, "Access-log lines dropped: the writer could not keep up (a full disk, a stalled pipe).") \
	X(trace_spans_exported_total, "Spans the OTLP collector accepted.") \
	X(trace_spans_dropped_total, "Spans dropped: the export queue was full, or the collector refused or was unreachable past the retries.") \
	X(trace_export_failures_total, "OTLP export requests that failed (each retry counts).") \
	X(tunnels_total,           "Connections upgraded by the upstream (101 Switching Protocols) into byte tunnels.") \
	X(tunnel_client_bytes_total, "Bytes tunnels carried from clients to the upstream.") \
	X(tunnel_upstream_bytes_total, "Bytes tunnels carried from the upstream to clients.")

enum counter {
#define X(name, help) COUNTER_##name,
	COUNTER_LIST(X)
#undef X
	COUNTER_COUNT
};

/* Stores whose errors are counted separately. */
#define STORE_KIND_LIST(X) \
	X(MEMORY,   "memory") \
	X(POSTGRES, "postgres") \
	X(REDIS,    "redis")

enum store_kind {
#define X(name, label) STORE_KIND_##name,
	STORE_KIND_LIST(X)
#undef X
	STORE_KIND_COUNT
};

/* Histograms (seconds): name, help. */
#define HISTOGRAM_LIST(X) \
	X(upstream_seconds, "Time from issuing a request upstream to the end of its response.") \
	X(wait_seconds,     "Time duplicates waited for the first request to settle.") \
	X(store_claim_seconds, "Time from a claim sent to the idempotency store to its answer (every layer: response cache, Redis, PostgreSQL).")

enum histogram {
#define X(name, help) HISTOGRAM_##name,
	HISTOGRAM_LIST(X)
#undef X
	HISTOGRAM_COUNT
};

enum gauge {
#define X(name, help) GAUGE_##name,
	GAUGE_LIST(X)
#undef X
	GAUGE_COUNT
};

void metrics_outcome(enum outcome o);
void metrics_client_error(enum client_error e);
void metrics_upstream_error(enum upstream_error e);
void metrics_tls_error(enum tls_error e);
void metrics_unknown_outcome(enum unknown_cause c);
void metrics_probe(enum probe_result r);
void metrics_gauge_add(enum gauge g, long delta);
void metrics_count(enum counter c);
void metrics_count_n(enum counter c, unsigned long n);
void metrics_gauge_set(enum gauge g, long value);
void metrics_store_error(enum store_kind k);
void metrics_observe(enum histogram h, double seconds);

const char *outcome_name(enum outcome o);
const char *client_error_name(enum client_error e);
const char *upstream_error_name(enum upstream_error e);
const char *unknown_cause_name(enum unknown_cause c);

/* Write every metric in Prometheus text exposition format 0.0.4. */
void metrics_render(FILE *out);

#endif
