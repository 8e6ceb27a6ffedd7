/*
 * otel_export.h - the span exporter: a thread of its own that POSTs batches
 * of OTLP/JSON spans to the collector (OTLP/HTTP, http:// or https://).
 *
 * Workers hand over one request's encoded spans (otel_export_spans); a
 * bounded queue (settings' max_queue spans) takes them or drops them,
 * counted. The thread sends a batch when max_batch spans are queued or
 * schedule_delay_ms passed, each POST bounded by timeout_ms; a failure that
 * may pass (a refused or timed-out connection, 429, 502, 503, 504) is
 * retried with a doubling back-off while the batch is younger than
 * OTEL_EXPORT_RETRY_MS, then dropped and counted. A collector that is down
 * costs the proxy nothing but the spans.
 */
#ifndef IDEMPROXY_OTEL_EXPORT_H
#define IDEMPROXY_OTEL_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "compiler.h"
#include "otel.h"

#define OTEL_EXPORT_RETRY_MS 30000

/* Start the thread with a copy of s (s->enabled must be true).
 * 0, or -1 with err set. */
int otel_export_start(const struct otel_settings *s, const char *version,
		      char *err, size_t errlen) MUSTCHECK;

/*
 * Queue n spans of one trace (encoded by otel_encode_span into one buffer,
 * comma-separated; the exporter takes ownership of buf and frees it).
 * Never blocks on the network; drops (counted) when the queue is full or
 * the exporter is not running.
 */
void otel_export_spans(char *buf, size_t len, size_t nspans);

/* At exit: send what is queued within flush_ms, then stop the thread. */
void otel_export_stop(uint64_t flush_ms);

#endif
