/*
 * accesslog.h - one line per request, text or JSON, written by a thread of
 * its own (docs/operations.md "Logs and traces").
 *
 * A worker formats its line on its own stack and appends it to a bounded
 * buffer shared by every worker (alog_write); the writer thread takes the
 * whole buffer at once and writes it out in line-aligned pieces. A worker
 * never waits on the disk or a pipe: when the buffer is full the line is
 * dropped and counted (idemproxy_access_log_dropped_total), and the event
 * log says so once per episode.
 */
#ifndef IDEMPROXY_ACCESSLOG_H
#define IDEMPROXY_ACCESSLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

enum alog_format {
	ALOG_FORMAT_TEXT,	/* nginx "combined" plus the idempotency fields */
	ALOG_FORMAT_JSON,	/* one object per line, stable names */
};

/* A duration field that did not happen (no claim, no upstream, ...). */
#define ALOG_NONE (-1)

/*
 * One request. Strings are borrowed for the call; NULL means "not there"
 * (text: "-", JSON: the member is null). Durations are microseconds, or
 * ALOG_NONE.
 */
struct alog_entry {
	int64_t time_us;		/* wall clock, the request's first byte
					 * (µs since the epoch) */
	const char *client;		/* the peer's address */
	const char *forwarded;		/* the client's address a trusted proxy
					 * named (X-Forwarded-For); NULL */
	const char *method;
	const char *path;		/* as the caller decided to log it
					 * (query cut unless asked for) */
	const char *protocol;		/* "HTTP/1.1" */
	int status;			/* 0: none was sent */
	uint64_t bytes_in;		/* request head and body */
	uint64_t bytes_out;		/* response head and body */
	int64_t total_us;		/* first byte to the response queued */
	int64_t claim_us;		/* the store's answer to the claim */
	int64_t wait_us;		/* waiting for another request's outcome */
	int64_t upstream_us;		/* request sent to response end */
	int64_t store_us;		/* writing the outcome */
	const char *route;		/* NULL: the global policy */
	const char *outcome;		/* the idemproxy_requests_total label */
	bool replayed;
	const char *key;		/* the idempotency key; NULL: none */
	const char *scope;		/* a short prefix of the scope hash */
	const char *upstream;		/* "host:port"; NULL: not forwarded */
	const char *request_id;
	const char *original_request_id;	/* a replay: the request that
						 * executed; NULL */
	const char *trace_id;		/* 32 hex digits; NULL */
	const char *span_id;		/* 16 hex digits; NULL */
	const char *user_agent;		/* NULL: none sent */
	const char *referer;
	const char *error;		/* why the request ended early (the
					 * client left, ...); NULL */
};

/* The longest line alog_format() writes; longer fields are cut ("..."),
 * the line is never split. */
#define ALOG_LINE_MAX 4096

/*
 * Format one line, with its '\n', into buf (ALOG_LINE_MAX bytes). Every
 * string is escaped (control bytes, quotes, backslash; JSON also gets valid
 * UTF-8 only), so a client cannot forge a line. Returns the length.
 */
size_t alog_format(const struct alog_entry *e, enum alog_format f, char *buf);

/*
 * Where lines go: "stderr", "stdout", a path (opened O_APPEND|O_CREAT,
 * 0640), or "off". Called at start and on SIGHUP with the configured
 * value; a path that cannot be opened is an error (err set) and the
 * running destination stays. Starts the writer thread on first use.
 */
int alog_open(const char *dest, char *err, size_t errlen) MUSTCHECK;

/* SIGUSR1: reopen the path (logrotate moved it); lines already taken are
 * written to the old file, the rest to the new one. Not signal-safe: call
 * it from the main loop. */
void alog_reopen(void);

/* True when lines go somewhere (alog_open with anything but "off"). */
bool alog_enabled(void);

/* Append one line; never blocks on output (a short lock on the buffer). */
void alog_write(const struct alog_entry *e, enum alog_format f);

/* At exit: write what is buffered within flush_ms, stop the thread. */
void alog_close(uint64_t flush_ms);

/* Lines dropped since start (also counted in the metrics). */
uint64_t alog_dropped(void);

#endif
