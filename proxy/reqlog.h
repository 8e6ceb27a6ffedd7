/*
 * reqlog.h - what one request did, kept while it runs and written once it
 * ends: its access-log line (accesslog.h) and its spans (otel.h), its
 * request id and trace context.
 *
 * The connection owns a struct reqlog per request; the engine (idem.c)
 * marks the phases it runs - the claim, the wait for another request, the
 * upstream exchange, the store write - through a pointer it drops when the
 * connection lets go (idem_detach). Every function takes NULL and does
 * nothing, so that a detached engine needs no test.
 */
#ifndef IDEMPROXY_REQLOG_H
#define IDEMPROXY_REQLOG_H

#include <stdbool.h>
#include <stdint.h>

#include "httphdr.h"
#include "metrics.h"
#include "otel.h"

struct config;
struct policy;

/* The longest request id taken from a client (longer: one is made). */
#define REQLOG_ID_MAX 128

enum reqlog_phase {
	REQLOG_CLAIM,		/* claims sent to the store, to their answers */
	REQLOG_WAIT,		/* watching another request's outcome */
	REQLOG_UPSTREAM,	/* the request sent, to the response's end */
	REQLOG_STORE,		/* writing the outcome */
	REQLOG_PHASES,
};

struct reqlog {
	bool active;			/* a request began (its first byte) */
	int64_t wall_us;		/* CLOCK_REALTIME at the first byte */
	uint64_t start_us;		/* CLOCK_MONOTONIC at the first byte */
	uint64_t done_us;		/* ... its response queued whole; 0:
					 * not yet (the end of the line) */
	struct reqlog_time {		/* monotonic µs; 0: not (yet) */
		uint64_t first, first_end;	/* the first time: the span */
		uint64_t last;		/* the last end */
		uint64_t open;		/* the begin of the one under way */
		uint64_t total;		/* every begin-to-end, added up: the
					 * access log's duration */
	} phase[REQLOG_PHASES];
	uint64_t bytes_in;		/* through the parser */
	uint64_t bytes_out;		/* queued for the client */
	int status;			/* the response's; 0: none */
	bool forwarded;			/* sent upstream (some byte of it) */
	const char *upstream_error;	/* error.type of a failed exchange */
	char request_id[REQLOG_ID_MAX + 1];
	char original_id[REQLOG_ID_MAX + 1];	/* a replay's: "" none */
	/* trace context (traced: spans are made for this request) */
	struct otel_parent parent;	/* the client's traceparent */
	bool traced;			/* tracing is on: our ids go upstream */
	bool sampled;
	uint8_t trace_id[OTEL_TRACE_ID_LEN];
	uint8_t span_id[OTEL_SPAN_ID_LEN];	/* the server span */
	uint8_t up_span_id[OTEL_SPAN_ID_LEN];	/* the upstream exchange */
	char traceparent[OTEL_TRACEPARENT_LEN + 1];	/* ... its parent */
	char scope[13];			/* the scope hash's first 12 digits */
	/* fields the line and the spans show, found in one pass over the
	 * head (reqlog_head); -1: none */
	int user_agent, referer, host;
	/* a span event */
	uint64_t unknown_us;		/* the outcome became unknown */
	int unknown_cause;		/* enum unknown_cause; -1: none */
};

/* The first byte of a request: start the clock. */
void reqlog_begin(struct reqlog *rl);

/*
 * The head is in: take the client's request id when well-formed (else make
 * one) and its traceparent; decide sampling. fields are the client's.
 */
void reqlog_head(struct reqlog *rl, const struct config *cfg,
		 const struct hdrlist *fields);

/* A request answered before its head was in (400, 408, 431) has its id
 * made here: call it before anything shows the id. */
void reqlog_need_id(struct reqlog *rl);

/* A phase begins or ends. It may happen more than once (a duplicate
 * claims again after its wait): the log adds the times up, the span is
 * the first (the claim that found the key in flight, before the wait). */
void reqlog_phase_begin(struct reqlog *rl, enum reqlog_phase ph);
void reqlog_phase_end(struct reqlog *rl, enum reqlog_phase ph);

/* The response is queued whole: the request's duration ends here, also
 * for a keyed one whose connection then waits for the outcome's write. */
void reqlog_responded(struct reqlog *rl);

/* The outcome became unknown (a span event). */
void reqlog_unknown(struct reqlog *rl, enum unknown_cause cause);

/* The request id for the upstream's field, in place of the client's; NULL
 * when the client's field goes as it came: it is the key's header of the
 * policy p (NULL: the global one), which goes upstream exactly as sent. */
const char *reqlog_upstream_id(const struct reqlog *rl,
			       const struct config *cfg,
			       const struct policy *p);

/* The traceparent for the upstream; NULL when the client's (if any) goes
 * through as it came (tracing off). */
const char *reqlog_traceparent(const struct reqlog *rl);

/* Is v a request id we pass on (1..REQLOG_ID_MAX of [A-Za-z0-9-_.:+/=@])? */
bool reqlog_id_ok(const char *v, size_t len);

/* What the connection knows at the end, for reqlog_finish(). */
struct reqlog_end {
	const struct config *cfg;
	const struct hdrlist *fields;	/* the request's; NULL: no head */
	const char *peer;
	bool tls;
	const char *method;		/* NULL: not known */
	const char *target;		/* the raw target; NULL: none */
	const char *protocol;		/* "HTTP/1.1" */
	const char *route;		/* NULL: the global policy */
	const char *outcome;
	const char *key;		/* NULL or "": none */
	const char *error;		/* why it ended early; NULL */
};

/* The request is over: write its access-log line, export its spans. */
void reqlog_finish(struct reqlog *rl, const struct reqlog_end *e);

#endif
