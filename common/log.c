/*
 * log.c - one line per event on stderr, text or JSON.
 *
 * Every line is built in a stack buffer and handed to a single write(2).
 * Lines of at most PIPE_BUF bytes are written atomically to a pipe, which is
 * what stderr is under systemd, Docker and Kubernetes, so worker threads need
 * no lock and their lines never interleave. Longer messages are cut short
 * (marked with "...") rather than split over two writes.
 *
 * Control characters in messages are escaped in both formats: a message
 * that carries client-controlled bytes (a header value, a key) must not be
 * able to forge a second log line.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "utf8.h"

/* Read by every thread on every call, written on start-up and SIGHUP. */
static atomic_int log_threshold = LOG_INFO;
static atomic_int log_fmt = LOG_FORMAT_TEXT;

#define LOG_LINE_MAX PIPE_BUF
#define LOG_TRUNC "..."

static const char *const level_names[] = {
	[LOG_DEBUG] = "debug",
	[LOG_INFO] = "info",
	[LOG_WARN] = "warn",
	[LOG_ERROR] = "error",
};

void log_setup(enum log_level level, enum log_format format)
{
	atomic_store_explicit(&log_threshold, (int)level, memory_order_relaxed);
	atomic_store_explicit(&log_fmt, (int)format, memory_order_relaxed);
}

int log_level_parse(const char *s, enum log_level *out)
{
	size_t i;

	for (i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (strcasecmp(s, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -1;
}

const char *log_level_name(enum log_level level)
{
	if ((unsigned)level >= sizeof(level_names) / sizeof(level_names[0]))
		return "unknown";
	return level_names[level];
}

/* A bounded output buffer; `full` once anything had to be dropped. */
struct line {
	char buf[LOG_LINE_MAX];
	size_t len;
	size_t cap;		/* room left for the message, before the tail */
	bool full;
};

static void line_put(struct line *l, const char *s, size_t n)
{
	if (l->full || l->len + n > l->cap) {
		l->full = true;
		return;
	}
	memcpy(l->buf + l->len, s, n);
	l->len += n;
}

static void line_puts(struct line *l, const char *s)
{
	line_put(l, s, strlen(s));
}


/*
 * Append msg escaped: JSON string rules when json, else only control
 * characters and backslash (so that text lines stay greppable and single).
 */
static void line_put_escaped(struct line *l, const char *msg, bool json)
{
	const unsigned char *p = (const unsigned char *)msg;
	size_t n = strlen(msg);
	char esc[8];

	while (n > 0 && !l->full) {
		unsigned c = *p;
		size_t seq;

		switch (c) {
		case '"':
			line_puts(l, json ? "\\\"" : "\"");
			break;
		case '\\':
			line_puts(l, "\\\\");
			break;
		case '\n':
			line_puts(l, "\\n");
			break;
		case '\r':
			line_puts(l, "\\r");
			break;
		case '\t':
			line_puts(l, "\\t");
			break;
		default:
			if (c < 0x20 || c == 0x7f) {
				snprintf(esc, sizeof(esc), json ? "\\u%04x" : "\\x%02x", c);
				line_puts(l, esc);
				break;
			}
			if (!json || c < 0x80) {
				line_put(l, (const char *)p, 1);
				break;
			}
			seq = utf8_len(p, n);
			if (seq == 0) {
				line_puts(l, "\\ufffd");
				break;
			}
			line_put(l, (const char *)p, seq);
			p += seq - 1;
			n -= seq - 1;
			break;
		}
		p++;
		n--;
	}
}

/* "2026-12-02T16:35:15.123Z" */
static void format_timestamp(char *buf, size_t len)
{
	struct timespec ts;
	struct tm tm;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
		 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
		 tm.tm_min, tm.tm_sec, (long)(ts.tv_nsec / 1000000) % 1000);
}

static void vlog(enum log_level level, const char *rid, const char *fmt,
		 va_list ap) __attribute__((format(printf, 3, 0)));

void log_msg(enum log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, NULL, fmt, ap);
	va_end(ap);
}

void log_msg_req(enum log_level level, const char *rid, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, rid != NULL && rid[0] != '\0' ? rid : NULL, fmt, ap);
	va_end(ap);
}

/* One line; rid: the request id it is about (a field of its own), or NULL. */
static void vlog(enum log_level level, const char *rid, const char *fmt,
		 va_list ap)
{
	char msg[LOG_LINE_MAX];
	char ts[96];		/* 25 used; sized for any int the compiler imagines */
	struct line l;
	const char *tail;
	bool json;
	ssize_t w;
	size_t off;
	int saved_errno = errno;	/* callers log and then look at errno */

	if ((int)level < atomic_load_explicit(&log_threshold, memory_order_relaxed))
		return;
	json = atomic_load_explicit(&log_fmt, memory_order_relaxed) == LOG_FORMAT_JSON;

	vsnprintf(msg, sizeof(msg), fmt, ap);

	format_timestamp(ts, sizeof(ts));
	tail = json ? "\"}\n" : "\n";
	l.len = 0;
	l.full = false;
	/* keep room for the truncation mark and the closing tail */
	l.cap = sizeof(l.buf) - strlen(tail) - strlen(LOG_TRUNC);

	if (json) {
		line_puts(&l, "{\"ts\":\"");
		line_puts(&l, ts);
		line_puts(&l, "\",\"level\":\"");
		line_puts(&l, log_level_name(level));
		if (rid != NULL) {
			line_puts(&l, "\",\"request_id\":\"");
			line_put_escaped(&l, rid, true);
		}
		line_puts(&l, "\",\"msg\":\"");
	} else {
		line_puts(&l, ts);
		line_puts(&l, " ");
		line_puts(&l, log_level_name(level));
		line_puts(&l, " ");
		if (rid != NULL) {
			line_puts(&l, "request_id=");
			line_put_escaped(&l, rid, false);
			line_puts(&l, " ");
		}
	}
	line_put_escaped(&l, msg, json);
	if (l.full) {
		memcpy(l.buf + l.len, LOG_TRUNC, strlen(LOG_TRUNC));
		l.len += strlen(LOG_TRUNC);
	}
	memcpy(l.buf + l.len, tail, strlen(tail));
	l.len += strlen(tail);

	/* One write; a short write to a full pipe or tty is finished, not lost. */
	for (off = 0; off < l.len; off += (size_t)w) {
		w = write(STDERR_FILENO, l.buf + off, l.len - off);
		if (w < 0 && errno == EINTR) {
			w = 0;
			continue;
		}
		if (w <= 0)
			break;
	}
	errno = saved_errno;
}

const char *log_flags(unsigned flags, const char *const *names, size_t n,
		      char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n; i++)
		if ((flags >> i) & 1)
			used += (size_t)snprintf(buf + used, used < len ? len - used : 0,
						 "%s%s", used ? "|" : "", names[i]);
	return buf;
}
