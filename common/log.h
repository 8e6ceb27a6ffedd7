/*
 * log.h - one line per event to stderr, as text or JSON.
 *
 * Lines are assembled in a local buffer and written with a single write(2),
 * so lines from several worker threads never interleave.
 */
#ifndef IDEMPROXY_LOG_H
#define IDEMPROXY_LOG_H

#include <stddef.h>

enum log_level {
	LOG_DEBUG,
	LOG_INFO,
	LOG_WARN,
	LOG_ERROR,
};

enum log_format {
	LOG_FORMAT_TEXT,	/* "2026-12-02T16:35:15.123Z info message" */
	LOG_FORMAT_JSON,	/* {"ts":"...","level":"info","msg":"..."} */
};

/* Set the threshold and format; safe to call again (SIGHUP). */
void log_setup(enum log_level level, enum log_format format);

/* Parse "debug" | "info" | "warn" | "error". Returns 0 or -1. */
int log_level_parse(const char *s, enum log_level *out);
const char *log_level_name(enum log_level level);

void log_msg(enum log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* A line about one request: its request id is a field of the line
 * ("request_id" in JSON, "request_id=ID " before the text's message). */
void log_msg_req(enum log_level level, const char *rid, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_info_req(rid, ...)  log_msg_req(LOG_INFO, rid, __VA_ARGS__)
#define log_warn_req(rid, ...)  log_msg_req(LOG_WARN, rid, __VA_ARGS__)
#define log_error_req(rid, ...) log_msg_req(LOG_ERROR, rid, __VA_ARGS__)

/* A flag word as "name|name" for a log line: bit i is names[i]. */
const char *log_flags(unsigned flags, const char *const *names, size_t n,
		      char *buf, size_t len);

#endif
