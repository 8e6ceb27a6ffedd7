/*
 * accesslog.c - the access log: one line per request, formatted by the
 * worker that served it, written out by a thread of its own.
 *
 *   workers: alog_write()                 the writer: writer_main()
 *     alog_format() into a stack line       sleep until a quarter full, 100 ms,
 *     lock                                    or a change (new dest, reopen,
 *     memcpy onto the fill buffer             close); idle with nothing to do
 *       (no room: drop and count it)        lock, swap fill and out, unlock
 *     wake the writer if it waits for us    write out in pieces that end on
 *     unlock                                  '\n' (poll() first, but to a
 *                                             regular file)
 *
 * A worker holds the lock for one memcpy and signals only a writer that is
 * asleep waiting for it, so a line costs no syscall. The writer never holds
 * the lock while it writes: a stalled pipe fills the buffer, and then lines
 * are dropped and counted (idemproxy_access_log_dropped_total), never waited
 * for. Workers do not log the drops themselves (stderr may be the very pipe
 * that stalled, and log.c's write would block them); the writer says so once
 * per episode: "access log: the writer cannot keep up (DEST); dropping
 * lines", then "... caught up (DEST); N lines were dropped" once no line was
 * dropped for ALOG_QUIET_MS (or "... closed; N lines were dropped ..." at
 * exit). Every event-log line of this file waits until poll() says stderr
 * takes it at once (the drop warning), or is left out (the others).
 *
 * Pieces: to a pipe, a tty or a socket at most PIPE_BUF bytes, so that they
 * are written whole and never interleave with the event log's lines (log.c
 * writes one line of at most PIPE_BUF with one write(2) to the same stderr);
 * to a regular file up to 64 KiB. stdout and stderr stay blocking (other
 * processes share them); a path's own descriptor is opened O_NONBLOCK, which
 * changes nothing for a file and lets a FIFO be one.
 *
 * A change of destination (alog_open on SIGHUP) or a reopen (SIGUSR1, after
 * logrotate renamed the file) marks the fill buffer where it happened: the
 * lines before the mark go to the old descriptor, the rest to the new one,
 * and the old one is closed after. Up to ALOG_CHANGES_MAX changes wait for
 * one turn, each with its mark. A destination that takes nothing for a
 * whole tick while a change waits gives up its lines (dropped, counted). A
 * write error (ENOSPC, EPIPE, EIO) drops the rest of what was taken, says so
 * once, and backs off 100 ms. alog_close() stops within its bound whatever
 * the destination does, but for one race: a pipe another writer fills
 * between our poll() and our write(2) blocks that write until it drains.
 *
 * The text form: nginx "combined", then the idempotency fields as key=value,
 * in this order:
 *
 *   CLIENT - - [06/Dec/2026:23:59:01.123 +0000] "METHOD PATH PROTOCOL"
 *   STATUS BYTES_OUT "REFERER" "USER_AGENT" rid=REQUEST_ID outcome=OUTCOME
 *   replayed=0|1 route=ROUTE key="KEY" scope=SCOPE in=BYTES_IN total=S
 *   claim=S wait=S upstream=S store=S up=HOST:PORT trace=TRACE_ID
 *   span=SPAN_ID orig_rid=ORIGINAL_REQUEST_ID fwd=FORWARDED_FOR err="ERROR"
 *
 *   - The time is nginx's $time_local with milliseconds, always in UTC.
 *   - Durations (S) are seconds with six decimals (0.001234); "-" when the
 *     step did not happen (ALOG_NONE, or any negative value).
 *   - STATUS is "-" when no response was sent (status 0 or less).
 *   - A bare field that is NULL or empty is "-". Bare fields escape the
 *     space (\x20), so a line splits on spaces.
 *   - REFERER and USER_AGENT are quoted, "-" when NULL or empty (nginx).
 *   - KEY and ERROR are quoted when present (they are free text; the key is
 *     the client's), and a bare "-" when NULL.
 *   - Escapes: \" \\ \n \r \t, every other control byte, DEL, C1 controls
 *     and bytes that are not UTF-8 as \xHH; valid UTF-8 is kept.
 *
 * The JSON form: one object per line, every member always present (null
 * when not there), in this order:
 *
 *   time (RFC 3339, UTC, milliseconds: "2026-12-06T23:59:01.123Z"), client,
 *   forwarded_for, method, path, protocol, status (null: none sent),
 *   bytes_in, bytes_out, duration_s (the total), claim_s, wait_s,
 *   upstream_s, store_s (seconds as numbers with six decimals, or null),
 *   route, outcome, replayed (a boolean), key, scope, upstream, request_id,
 *   original_request_id, trace_id, span_id, user_agent, referer, error
 *
 *   Strings are JSON escaped (\" \\ \n \r \t \b \f, other controls, DEL and
 *   C1 controls as \u00XX), and valid UTF-8: a byte that is not becomes
 *   \ufffd.
 *
 * Both forms: a line is at most ALOG_LINE_MAX bytes with its '\n'. When the
 * fields do not fit, path, user_agent, referer and key are cut first, the
 * longest first, down to a common length, each ending in "..."; only if that
 * is not enough are the other strings cut the same way. A cut never splits
 * an escape or a UTF-8 sequence.
 *
 * Formatting allocates nothing and calls no printf: one pass writes the
 * line and measures each string; only a line too long takes a second pass,
 * with each field held to its share. gmtime_r runs once a second per
 * thread (a thread-local cache of the seconds, in both forms).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "accesslog.h"
#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "utf8.h"

_Static_assert(ALOG_LINE_MAX <= PIPE_BUF,
	       "a line must fit in one atomic write to a pipe");

/* ---- formatting ---------------------------------------------------- */

#define LINE_ROOM (ALOG_LINE_MAX - 1)	/* the line without its '\n' */
#define CUT_MARK "..."
#define CUT_LEN (sizeof(CUT_MARK) - 1)
#define NO_CAP SIZE_MAX

/* The string fields, each measured and cut on its own. */
enum field {
	F_CLIENT,
	F_FORWARDED,
	F_METHOD,
	F_PATH,
	F_PROTOCOL,
	F_ROUTE,
	F_OUTCOME,
	F_KEY,
	F_SCOPE,
	F_UPSTREAM,
	F_REQUEST_ID,
	F_ORIGINAL_ID,
	F_TRACE_ID,
	F_SPAN_ID,
	F_USER_AGENT,
	F_REFERER,
	F_ERROR,
	F_COUNT
};

/* How a string is escaped (see the top comment). */
enum esc {
	ESC_QUOTED,		/* text, inside "..." */
	ESC_BARE,		/* text, a bare word: the space escaped too */
	ESC_JSON,		/* a JSON string's contents */
};

/*
 * A line being formatted. The first pass writes what fits and counts the
 * rest, measuring every string field; when the line is too long a second
 * pass writes it again with each field held to cap[].
 */
struct out {
	char *buf;		/* ALOG_LINE_MAX bytes */
	size_t len;		/* the line's length so far, written or not */
	bool measuring;		/* the first pass */
	size_t measured[F_COUNT];	/* escaped lengths, at most LINE_ROOM + 1 */
	size_t cap[F_COUNT];	/* the most a field may take, "..." included */
};

/* Append n bytes if the whole line still fits; count them anyway. Once one
 * piece did not fit, len stays beyond LINE_ROOM and nothing more is
 * written. */
static inline void put(struct out *o, const void *s, size_t n)
{
	if (o->len + n <= LINE_ROOM)
		memcpy(o->buf + o->len, s, n);
	o->len += n;
}

#define put_lit(o, lit) put((o), (lit), sizeof(lit) - 1)

static inline void put_char(struct out *o, char c)
{
	put(o, &c, 1);
}

static inline size_t count_digits(uint64_t v)
{
	size_t n = 1;

	while (v >= 10) {
		v /= 10;
		n++;
	}
	return n;
}

/* v's decimal digits, right-aligned before end. */
static inline void digits(char *end, uint64_t v)
{
	do {
		*--end = (char)('0' + v % 10);
		v /= 10;
	} while (v > 0);
}

/* Numbers are written in place, with put()'s rule: all of it or none. */
static void put_u64(struct out *o, uint64_t v)
{
	size_t n = count_digits(v);

	if (o->len + n <= LINE_ROOM)
		digits(o->buf + o->len + n, v);
	o->len += n;
}

/* Microseconds as seconds with six decimals: "0.001234". */
static void put_seconds(struct out *o, int64_t us)
{
	uint64_t sec = (uint64_t)us / 1000000, frac = (uint64_t)us % 1000000;
	size_t n = count_digits(sec) + 7;

	if (o->len + n <= LINE_ROOM) {
		char *end = o->buf + o->len + n;

		for (int i = 0; i < 6; i++) {
			*--end = (char)('0' + frac % 10);
			frac /= 10;
		}
		*--end = '.';
		digits(end, sec);
	}
	o->len += n;
}


/*
 * The bytes copied as they are: printable ASCII but the quote and the
 * backslash (bit 0), and of those all but the space (bit 1, a bare word).
 */
#define PLAIN_Q(c) ((c) >= 0x20 && (c) < 0x7f && (c) != '"' && (c) != '\\')
#define CLASS(c) (PLAIN_Q(c) | (PLAIN_Q(c) && (c) != ' ') << 1)
#define CLASS4(c) CLASS(c), CLASS((c) + 1), CLASS((c) + 2), CLASS((c) + 3)
#define CLASS16(c) CLASS4(c), CLASS4((c) + 4), CLASS4((c) + 8), CLASS4((c) + 12)
#define CLASS64(c) CLASS16(c), CLASS16((c) + 16), CLASS16((c) + 32), CLASS16((c) + 48)

static const unsigned char byte_class[256] = {
	CLASS64(0), CLASS64(64), CLASS64(128), CLASS64(192),
};

static const unsigned char plain_mask[] = {
	[ESC_QUOTED] = 1,
	[ESC_BARE] = 2,
	[ESC_JSON] = 1,
};

static inline bool plain(unsigned char c, enum esc m)
{
	return byte_class[c] & plain_mask[m];
}

/*
 * Are the 8 bytes at s all plain (m's class)? Eight at a time, the way
 * strlen() looks for a NUL: a byte below 0x20 or from 0x7f up, a quote, a
 * backslash (and for a bare word the space) is found without a branch per
 * byte. Only called where 8 bytes are known to be there.
 */
static inline bool plain8(const unsigned char *s, enum esc m)
{
	const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
	uint64_t x, bad;

	memcpy(&x, s, 8);
#define HAS_ZERO(v) (((v) - ones) & ~(v) & high)
	bad = ((x - 0x20 * ones) | x | (x + 0x01 * ones)) & high;	/* < 0x20, >= 0x7f */
	bad |= HAS_ZERO(x ^ (0x22 * ones)) | HAS_ZERO(x ^ (0x5c * ones));
	if (m == ESC_BARE)
		bad |= HAS_ZERO(x ^ (0x20 * ones));
#undef HAS_ZERO
	return bad == 0;
}

/* The escape of one byte: \n, \x1b or \u001b. Returns its length. */
static size_t escape_byte(unsigned char c, enum esc m, char *e)
{
	static const char hex[] = "0123456789abcdef";
	char s = 0;

	switch (c) {
	case '"': s = '"'; break;
	case '\\': s = '\\'; break;
	case '\n': s = 'n'; break;
	case '\r': s = 'r'; break;
	case '\t': s = 't'; break;
	case '\b': s = m == ESC_JSON ? 'b' : 0; break;
	case '\f': s = m == ESC_JSON ? 'f' : 0; break;
	default: break;
	}
	e[0] = '\\';
	if (s != 0) {
		e[1] = s;
		return 2;
	}
	if (m == ESC_JSON) {
		memcpy(e + 1, "u00", 3);
		e[4] = hex[c >> 4];
		e[5] = hex[c & 15];
		return 6;
	}
	e[1] = 'x';
	e[2] = hex[c >> 4];
	e[3] = hex[c & 15];
	return 4;
}

/*
 * Append str escaped, as long as it takes no more than most bytes; whole
 * escapes and whole characters only. Returns the bytes appended, or
 * most + 1 or more when the rest did not fit (then the caller stops there).
 */
static size_t put_escaped(struct out *o, const char *str, enum esc m,
			  size_t most)
{
	const unsigned char *s = (const unsigned char *)str;
	const unsigned char *end = s + strlen(str);
	unsigned char mask = plain_mask[m];
	size_t used = 0, n, seq;
	char e[12];

	while (*s != '\0') {
		/* a run of plain bytes, copied as it is scanned */
		size_t cap = most - used;
		size_t room = o->len < LINE_ROOM ? LINE_ROOM - o->len : 0;
		size_t lim = cap < room ? cap : room, k = 0;

		if (lim > 0) {
			char *d = o->buf + o->len;
			size_t left = (size_t)(end - s);
			size_t words = (lim < left ? lim : left) & ~(size_t)7;

			while (k < words && plain8(s + k, m)) {
				memcpy(d + k, s + k, 8);
				k += 8;
			}
			while (k < lim && (byte_class[s[k]] & mask)) {
				d[k] = (char)s[k];
				k++;
			}
		}
		if (k == lim && plain(s[k], m)) {
			/* out of room: count the rest of the run; or cut here */
			while (k < cap && plain(s[k], m))
				k++;
			if (k == cap && plain(s[k], m)) {
				o->len += k;
				return most + 1;
			}
		}
		o->len += k;
		used += k;
		s += k;
		if (*s == '\0')
			break;
		/* NUL-terminated: a NUL ends any sequence before it is over */
		seq = *s < 0x80 ? 0 : utf8_len(s, 4);
		if (seq == 2 && s[0] == 0xc2 && s[1] < 0xa0) {
			/* a C1 control (U+0080-U+009F): terminals act on it */
			if (m == ESC_JSON) {
				n = escape_byte(s[1], m, e);
			} else {
				n = escape_byte(s[0], m, e);
				n += escape_byte(s[1], m, e + n);
			}
		} else if (seq > 0) {
			if (used + seq > most)
				return most + 1;
			put(o, s, seq);
			used += seq;
			s += seq;
			continue;
		} else if (*s >= 0x80 && m == ESC_JSON) {
			memcpy(e, "\\ufffd", 6);
			n = 6;
			seq = 1;
		} else {
			n = escape_byte(*s, m, e);
			seq = 1;
		}
		if (used + n > most)
			return most + 1;
		put(o, e, n);
		used += n;
		s += seq;
	}
	return used;
}

/*
 * Append string field f. Measuring, it is written whole (or up to the
 * line's end) and its escaped length noted; otherwise it is held to its
 * cap, cut with "..." when longer.
 */
static inline void put_field(struct out *o, enum field f, const char *s, enum esc m)
{
	size_t start = o->len, n;

	if (o->measuring) {
		n = put_escaped(o, s, m, LINE_ROOM);
		o->measured[f] = n;
		o->len = start + n;
		return;
	}
	if (o->measured[f] <= o->cap[f]) {
		put_escaped(o, s, m, NO_CAP);
		return;
	}
	put_escaped(o, s, m, o->cap[f] - CUT_LEN);
	put_lit(o, CUT_MARK);
}

/*
 * Wall-clock seconds as text, cached per thread: gmtime_r once a second.
 * text: "06/Dec/2026:23:59:01", json: "2026-12-06T23:59:01".
 */
struct time_cache {
	int64_t sec;
	bool valid;
	char text[40];
	size_t text_len;
	char json[40];
	size_t json_len;
};

static _Thread_local struct time_cache time_cache;

static const struct time_cache *time_seconds(int64_t sec)
{
	static const char months[12][4] = {
		"Jan", "Feb", "Mar", "Apr", "May", "Jun",
		"Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
	};
	struct time_cache *c = &time_cache;
	time_t t = (time_t)sec;
	struct tm tm;
	int n;

	if (c->valid && c->sec == sec)
		return c;
	if (gmtime_r(&t, &tm) == NULL) {
		t = 0;
		gmtime_r(&t, &tm);
	}
	n = snprintf(c->text, sizeof(c->text), "%02d/%s/%04d:%02d:%02d:%02d",
		     tm.tm_mday, months[tm.tm_mon % 12], tm.tm_year + 1900,
		     tm.tm_hour, tm.tm_min, tm.tm_sec);
	c->text_len = n > 0 ? (size_t)n : 0;
	n = snprintf(c->json, sizeof(c->json), "%04d-%02d-%02dT%02d:%02d:%02d",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
		     tm.tm_hour, tm.tm_min, tm.tm_sec);
	c->json_len = n > 0 ? (size_t)n : 0;
	c->sec = sec;
	c->valid = true;
	return c;
}

/* "06/Dec/2026:23:59:01.123" or "2026-12-06T23:59:01.123" */
static void put_time(struct out *o, int64_t time_us, bool json)
{
	int64_t sec = time_us / 1000000, us = time_us % 1000000;
	const struct time_cache *c;
	unsigned ms;
	char frac[4];

	if (us < 0) {
		sec--;
		us += 1000000;
	}
	c = time_seconds(sec);
	if (json)
		put(o, c->json, c->json_len);
	else
		put(o, c->text, c->text_len);
	ms = (unsigned)(us / 1000);
	frac[0] = '.';
	frac[1] = (char)('0' + ms / 100);
	frac[2] = (char)('0' + ms / 10 % 10);
	frac[3] = (char)('0' + ms % 10);
	put(o, frac, sizeof(frac));
}

/* Text: a bare word, "-" when NULL or empty. */
static inline void text_bare(struct out *o, enum field f, const char *s)
{
	if (s == NULL || *s == '\0')
		put_char(o, '-');
	else
		put_field(o, f, s, ESC_BARE);
}

/* Text: "..." always, "-" inside the quotes when NULL or empty (nginx's
 * referer and user agent). */
static inline void text_quoted_dash(struct out *o, enum field f, const char *s)
{
	put_char(o, '"');
	if (s == NULL || *s == '\0')
		put_char(o, '-');
	else
		put_field(o, f, s, ESC_QUOTED);
	put_char(o, '"');
}

/* Text: "..." when there, a bare - when NULL. */
static inline void text_quoted(struct out *o, enum field f, const char *s)
{
	if (s == NULL) {
		put_char(o, '-');
		return;
	}
	put_char(o, '"');
	put_field(o, f, s, ESC_QUOTED);
	put_char(o, '"');
}

static void text_seconds(struct out *o, int64_t us)
{
	if (us < 0)
		put_char(o, '-');
	else
		put_seconds(o, us);
}

static void format_text(struct out *o, const struct alog_entry *e)
{
	text_bare(o, F_CLIENT, e->client);
	put_lit(o, " - - [");
	put_time(o, e->time_us, false);
	put_lit(o, " +0000] \"");
	text_bare(o, F_METHOD, e->method);
	put_char(o, ' ');
	text_bare(o, F_PATH, e->path);
	put_char(o, ' ');
	text_bare(o, F_PROTOCOL, e->protocol);
	put_lit(o, "\" ");
	if (e->status > 0)
		put_u64(o, (uint64_t)e->status);
	else
		put_char(o, '-');
	put_char(o, ' ');
	put_u64(o, e->bytes_out);
	put_char(o, ' ');
	text_quoted_dash(o, F_REFERER, e->referer);
	put_char(o, ' ');
	text_quoted_dash(o, F_USER_AGENT, e->user_agent);
	put_lit(o, " rid=");
	text_bare(o, F_REQUEST_ID, e->request_id);
	put_lit(o, " outcome=");
	text_bare(o, F_OUTCOME, e->outcome);
	put_lit(o, " replayed=");
	put_char(o, e->replayed ? '1' : '0');
	put_lit(o, " route=");
	text_bare(o, F_ROUTE, e->route);
	put_lit(o, " key=");
	text_quoted(o, F_KEY, e->key);
	put_lit(o, " scope=");
	text_bare(o, F_SCOPE, e->scope);
	put_lit(o, " in=");
	put_u64(o, e->bytes_in);
	put_lit(o, " total=");
	text_seconds(o, e->total_us);
	put_lit(o, " claim=");
	text_seconds(o, e->claim_us);
	put_lit(o, " wait=");
	text_seconds(o, e->wait_us);
	put_lit(o, " upstream=");
	text_seconds(o, e->upstream_us);
	put_lit(o, " store=");
	text_seconds(o, e->store_us);
	put_lit(o, " up=");
	text_bare(o, F_UPSTREAM, e->upstream);
	put_lit(o, " trace=");
	text_bare(o, F_TRACE_ID, e->trace_id);
	put_lit(o, " span=");
	text_bare(o, F_SPAN_ID, e->span_id);
	put_lit(o, " orig_rid=");
	text_bare(o, F_ORIGINAL_ID, e->original_request_id);
	put_lit(o, " fwd=");
	text_bare(o, F_FORWARDED, e->forwarded);
	put_lit(o, " err=");
	text_quoted(o, F_ERROR, e->error);
}

/* JSON: a member's value, a string or null. name is ",\"name\":\"", its
 * opening quote copied with it (the null drops it). */
static inline void json_str(struct out *o, const char *name, size_t name_len,
		     enum field f, const char *s)
{
	if (s == NULL) {
		put(o, name, name_len - 1);
		put_lit(o, "null");
		return;
	}
	put(o, name, name_len);
	put_field(o, f, s, ESC_JSON);
	put_char(o, '"');
}

#define JSON_STR(o, name, f, s) \
	json_str((o), ",\"" name "\":\"", sizeof(",\"" name "\":\"") - 1, (f), (s))

static inline void json_seconds(struct out *o, const char *name, size_t name_len,
			 int64_t us)
{
	put(o, name, name_len);
	if (us < 0)
		put_lit(o, "null");
	else
		put_seconds(o, us);
}

#define JSON_SECONDS(o, name, us) \
	json_seconds((o), ",\"" name "\":", sizeof(",\"" name "\":") - 1, (us))

static void format_json(struct out *o, const struct alog_entry *e)
{
	put_lit(o, "{\"time\":\"");
	put_time(o, e->time_us, true);
	put_lit(o, "Z\"");
	JSON_STR(o, "client", F_CLIENT, e->client);
	JSON_STR(o, "forwarded_for", F_FORWARDED, e->forwarded);
	JSON_STR(o, "method", F_METHOD, e->method);
	JSON_STR(o, "path", F_PATH, e->path);
	JSON_STR(o, "protocol", F_PROTOCOL, e->protocol);
	put_lit(o, ",\"status\":");
	if (e->status > 0)
		put_u64(o, (uint64_t)e->status);
	else
		put_lit(o, "null");
	put_lit(o, ",\"bytes_in\":");
	put_u64(o, e->bytes_in);
	put_lit(o, ",\"bytes_out\":");
	put_u64(o, e->bytes_out);
	JSON_SECONDS(o, "duration_s", e->total_us);
	JSON_SECONDS(o, "claim_s", e->claim_us);
	JSON_SECONDS(o, "wait_s", e->wait_us);
	JSON_SECONDS(o, "upstream_s", e->upstream_us);
	JSON_SECONDS(o, "store_s", e->store_us);
	JSON_STR(o, "route", F_ROUTE, e->route);
	JSON_STR(o, "outcome", F_OUTCOME, e->outcome);
	if (e->replayed)
		put_lit(o, ",\"replayed\":true");
	else
		put_lit(o, ",\"replayed\":false");
	JSON_STR(o, "key", F_KEY, e->key);
	JSON_STR(o, "scope", F_SCOPE, e->scope);
	JSON_STR(o, "upstream", F_UPSTREAM, e->upstream);
	JSON_STR(o, "request_id", F_REQUEST_ID, e->request_id);
	JSON_STR(o, "original_request_id", F_ORIGINAL_ID, e->original_request_id);
	JSON_STR(o, "trace_id", F_TRACE_ID, e->trace_id);
	JSON_STR(o, "span_id", F_SPAN_ID, e->span_id);
	JSON_STR(o, "user_agent", F_USER_AGENT, e->user_agent);
	JSON_STR(o, "referer", F_REFERER, e->referer);
	JSON_STR(o, "error", F_ERROR, e->error);
	put_char(o, '}');
}

/* Bytes the line loses when every field in fields[] longer than t is held
 * to t. */
static size_t cut_gain(const struct out *o, const enum field *fields,
		       size_t n, size_t t)
{
	size_t gain = 0;

	for (size_t i = 0; i < n; i++)
		if (o->measured[fields[i]] > t)
			gain += o->measured[fields[i]] - t;
	return gain;
}

/*
 * Hold the fields in fields[] to the longest common length that takes
 * excess bytes off the line (none shorter than "..."). Returns what is
 * still to take off when even that is not enough.
 */
static size_t plan_cut(struct out *o, const enum field *fields, size_t n,
		       size_t excess)
{
	size_t lo = CUT_LEN, hi = LINE_ROOM + 1, t, gain;

	gain = cut_gain(o, fields, n, lo);
	if (gain < excess) {
		t = lo;
		excess -= gain;
	} else {
		/* the largest t in [lo, hi) whose gain is still enough */
		while (hi - lo > 1) {
			size_t mid = lo + (hi - lo) / 2;

			if (cut_gain(o, fields, n, mid) >= excess)
				lo = mid;
			else
				hi = mid;
		}
		t = lo;
		excess = 0;
	}
	for (size_t i = 0; i < n; i++)
		if (o->measured[fields[i]] > t)
			o->cap[fields[i]] = t;
	return excess;
}

size_t alog_format(const struct alog_entry *e, enum alog_format f, char *buf)
{
	static const enum field first[] = {
		F_PATH, F_USER_AGENT, F_REFERER, F_KEY,
	};
	static const enum field rest[] = {
		F_CLIENT, F_FORWARDED, F_METHOD, F_PROTOCOL, F_ROUTE, F_OUTCOME,
		F_SCOPE, F_UPSTREAM, F_REQUEST_ID, F_ORIGINAL_ID, F_TRACE_ID,
		F_SPAN_ID, F_ERROR,
	};
	struct out o;
	size_t excess;

	_Static_assert(sizeof(first) / sizeof(first[0]) +
		       sizeof(rest) / sizeof(rest[0]) == F_COUNT,
		       "every string field is cut in one group or the other");

	o.buf = buf;
	o.len = 0;
	o.measuring = true;
	memset(o.measured, 0, sizeof(o.measured));
	if (f == ALOG_FORMAT_JSON)
		format_json(&o, e);
	else
		format_text(&o, e);
	if (o.len > LINE_ROOM) {
		for (size_t i = 0; i < F_COUNT; i++)
			o.cap[i] = NO_CAP;
		excess = o.len - LINE_ROOM;
		excess = plan_cut(&o, first, sizeof(first) / sizeof(first[0]), excess);
		if (excess > 0)
			plan_cut(&o, rest, sizeof(rest) / sizeof(rest[0]), excess);
		/* every field at "..." leaves well under 1 KiB: it fits now */
		o.len = 0;
		o.measuring = false;
		if (f == ALOG_FORMAT_JSON)
			format_json(&o, e);
		else
			format_text(&o, e);
	}
	buf[o.len] = '\n';
	return o.len + 1;
}

/* ---- the writer ---------------------------------------------------- */

#define ALOG_BUF_SIZE (1024 * 1024)	/* each of the two buffers */
#define ALOG_WAKE_AT (ALOG_BUF_SIZE / 4)	/* the writer's wake-up call */
#define ALOG_TICK_MS 100		/* its longest nap, its poll, its back-off */
#define ALOG_QUIET_MS 2000		/* no drop for this long ends an episode */
#define ALOG_FILE_PIECE (64 * 1024)	/* a write to a regular file */
#define ALOG_DEST_MAX PATH_MAX
#define ALOG_CHANGES_MAX 4		/* changes waiting for one turn */

/* Where lines go. */
struct sink {
	int fd;			/* -1: nowhere ("off") */
	bool own;		/* a path's: ours to close */
	bool pollable;		/* not a regular file: poll before writing */
	size_t piece;		/* the longest write: PIPE_BUF but to a file */
	char name[ALOG_DEST_MAX];	/* as alog_open() was given it */
};

/* A change waiting for the writer's next turn, and where it happened. */
enum change_kind {
	CHANGE_REOPEN,		/* open the path again (SIGUSR1) */
	CHANGE_SWITCH,		/* go to next (alog_open on SIGHUP) */
};

struct change {
	enum change_kind kind;
	size_t at;		/* fill's length when it was asked */
	struct sink next;	/* CHANGE_SWITCH's destination */
};

/* How the writer waits, which says when a worker must wake it. */
enum nap {
	NAP_AWAKE,		/* writing, or about to */
	NAP_TICK,		/* until a tick is over or the buffer a quarter full */
	NAP_IDLE,		/* nothing buffered: until the first line */
};

/* Shared by the workers, the writer and the main thread; under lock. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t wake;	/* the writer waits on it (CLOCK_MONOTONIC) */
	char *buf[2];		/* ALOG_BUF_SIZE each */
	size_t len[2];
	int fill;		/* the buffer workers append to */
	bool accepting;		/* lines are taken (on, and not closing) */
	enum nap nap;
	uint64_t dropped;	/* by workers since the writer last looked */
	struct change changes[ALOG_CHANGES_MAX];	/* in the order asked */
	size_t nchanges;
	bool stopping;		/* alog_close(): flush, then end */
	uint64_t stop_at_ms;	/* ... by then (clock_ms()) */
} w = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
};

/* The writer thread's own; set before it starts, read after it ends. */
static struct {
	struct sink sink;
	uint64_t turn_dropped;	/* workers' drops seen during this turn */
	bool dropping;		/* a drop episode is on */
	uint64_t last_drop_ms;	/* when drops were last seen (clock_ms) */
	uint64_t episode_dropped;
	bool warn_due, info_due;	/* the episode's lines, not said yet */
	bool failing;		/* a write error episode is on */
	bool broken_line;	/* a write stopped mid-line: end it first */
	uint64_t exit_dropped;	/* given up at alog_close()'s deadline */
	struct change todo[ALOG_CHANGES_MAX];	/* this turn's changes */
} wr;

/* The main thread's: alog_open(), alog_reopen(), alog_close(). */
static struct {
	bool started;
	pthread_t thread;
	char dest[ALOG_DEST_MAX];	/* the last alog_open() that worked */
} m;

static atomic_bool alog_on;
/* w.stopping or w.change set: the writer looks at them without the lock
 * between two pieces (set and cleared with the lock held) */
static atomic_bool attention;
static atomic_uint_fast64_t alog_dropped_total;

bool alog_enabled(void)
{
	return atomic_load_explicit(&alog_on, memory_order_relaxed);
}

uint64_t alog_dropped(void)
{
	return atomic_load_explicit(&alog_dropped_total, memory_order_relaxed);
}

static void count_dropped(uint64_t n)
{
	if (n == 0)
		return;
	atomic_fetch_add_explicit(&alog_dropped_total, n, memory_order_relaxed);
	metrics_count_n(COUNTER_access_log_dropped_total, (unsigned long)n);
}

static uint64_t count_lines(const char *p, size_t n)
{
	const char *end = p + n;
	uint64_t lines = 0;

	while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
		lines++;
		p++;
	}
	return lines;
}

void alog_write(const struct alog_entry *e, enum alog_format f)
{
	char line[ALOG_LINE_MAX];
	bool wake = false, dropped = false;
	size_t n, *len;

	if (!alog_enabled())
		return;
	n = alog_format(e, f, line);

	pthread_mutex_lock(&w.lock);
	if (!w.accepting)
		goto unlock;
	len = &w.len[w.fill];
	if (*len + n > ALOG_BUF_SIZE) {
		w.dropped++;
		dropped = true;
		goto unlock;
	}
	memcpy(w.buf[w.fill] + *len, line, n);
	*len += n;
	if (w.nap == NAP_IDLE || (w.nap == NAP_TICK && *len >= ALOG_WAKE_AT)) {
		w.nap = NAP_AWAKE;
		wake = true;
	}
unlock:
	pthread_mutex_unlock(&w.lock);
	if (wake)
		pthread_cond_signal(&w.wake);
	if (dropped)
		count_dropped(1);
}

/* A path's descriptor, or -1 with errno. */
static int open_path(const char *path)
{
	return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK,
		    0640);
}

/* How to write to s->fd: a regular file takes large pieces and is always
 * ready; anything else (a pipe, a tty, a socket) PIPE_BUF, after poll(). */
static void sink_kind(struct sink *s)
{
	struct stat st;
	bool file = s->fd >= 0 && fstat(s->fd, &st) == 0 && S_ISREG(st.st_mode);

	s->piece = file ? ALOG_FILE_PIECE : PIPE_BUF;
	s->pollable = !file;
}

/* dest as a sink: "stderr", "stdout", "off" or a path opened now. */
static int sink_init(struct sink *s, const char *dest, char *err, size_t errlen)
{
	size_t n = strlen(dest);

	if (n == 0 || n >= sizeof(s->name)) {
		snprintf(err, errlen, "access log: %s destination",
			 n == 0 ? "an empty" : "too long a");
		return -1;
	}
	memcpy(s->name, dest, n + 1);
	s->own = false;
	if (strcmp(dest, "off") == 0) {
		s->fd = -1;
	} else if (strcmp(dest, "stderr") == 0) {
		s->fd = STDERR_FILENO;
	} else if (strcmp(dest, "stdout") == 0) {
		s->fd = STDOUT_FILENO;
	} else {
		s->fd = open_path(dest);
		if (s->fd < 0) {
			snprintf(err, errlen, "access log: cannot open %s: %s",
				 dest, strerror(errno));
			return -1;
		}
		s->own = true;
	}
	sink_kind(s);
	return 0;
}

static void sink_release(struct sink *s)
{
	if (s->own && s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	s->own = false;
}

/* stderr takes an event-log line without blocking (or fails at once). */
static bool stderr_ready(void)
{
	struct pollfd pfd = { .fd = STDERR_FILENO, .events = POLLOUT };

	return poll(&pfd, 1, 0) != 0;
}

/*
 * An event-log line from the access log's side: said only if stderr takes
 * it at once, else left out. stderr may be the very pipe that stalled, and
 * log.c's write(2) would block the writer there, and alog_close() with it.
 */
static __attribute__((format(printf, 2, 3)))
void say(enum log_level level, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!stderr_ready())
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_msg(level, "%s", msg);
}

/*
 * The drop episode. Workers count their drops in w.dropped; the writer
 * moves them here (with the lock) while it waits on its destination and at
 * each turn. It ends at a turn ALOG_QUIET_MS after the last drop, so that
 * a writer that keeps falling behind says so once, not at every turn.
 */
static void take_drops(void)
{
	wr.turn_dropped += w.dropped;
	w.dropped = 0;
}

static void note_drops(bool turn_over)
{
	if (wr.turn_dropped > 0) {
		if (!wr.dropping) {
			wr.dropping = true;
			wr.warn_due = true;
		}
		wr.episode_dropped += wr.turn_dropped;
		wr.turn_dropped = 0;
		wr.last_drop_ms = clock_ms();
	} else if (turn_over && wr.dropping &&
		   clock_ms() - wr.last_drop_ms >= ALOG_QUIET_MS) {
		wr.dropping = false;
		wr.info_due = true;
	}
}

/* Say what the episode has not said yet, if stderr takes it now. */
static void announce(void)
{
	if ((!wr.warn_due && !wr.info_due) || !stderr_ready())
		return;
	if (wr.warn_due)
		say(LOG_WARN, "access log: the writer cannot keep up (%s); dropping lines",
		    wr.sink.name);
	if (wr.info_due) {
		say(LOG_INFO, "access log: the writer caught up (%s); %" PRIu64
		    " lines were dropped", wr.sink.name, wr.episode_dropped);
		wr.episode_dropped = 0;
	}
	wr.warn_due = wr.info_due = false;
}

enum ready {
	READY,			/* write now */
	NOT_YET,		/* nothing for a tick: look again */
	PAST_DEADLINE,		/* alog_close()'s time is up */
	REPLACED,		/* stuck, and a change waits: let it go */
};

/* Wait up to a tick for the destination to take a write. */
static enum ready sink_wait(void)
{
	struct pollfd pfd = { .fd = wr.sink.fd, .events = POLLOUT };
	int timeout = ALOG_TICK_MS;
	bool stopping = false, replaced = false;
	uint64_t stop_at = 0, now;

	if (atomic_load_explicit(&attention, memory_order_acquire)) {
		pthread_mutex_lock(&w.lock);
		stopping = w.stopping;
		stop_at = w.stop_at_ms;
		replaced = w.nchanges > 0;
		pthread_mutex_unlock(&w.lock);
	}
	if (stopping) {
		now = clock_ms();
		if (now >= stop_at)
			return PAST_DEADLINE;
		if (stop_at - now < (uint64_t)timeout)
			timeout = (int)(stop_at - now);
	}
	if (!wr.sink.pollable || poll(&pfd, 1, timeout) != 0)
		return READY;	/* POLLOUT, or an error write(2) will tell */

	/* stuck for a tick: say what the drops have not said yet */
	pthread_mutex_lock(&w.lock);
	take_drops();
	pthread_mutex_unlock(&w.lock);
	note_drops(false);
	announce();
	return replaced ? REPLACED : NOT_YET;
}

/* Back off after an error, for a tick or until the stop's deadline. */
static void back_off(void)
{
	uint64_t stop_at, now, ms = ALOG_TICK_MS;
	bool stopping;

	pthread_mutex_lock(&w.lock);
	stopping = w.stopping;
	stop_at = w.stop_at_ms;
	pthread_mutex_unlock(&w.lock);
	if (stopping) {
		now = clock_ms();
		ms = now >= stop_at ? 0 : stop_at - now < ms ? stop_at - now : ms;
	}
	if (ms > 0)
		poll(NULL, 0, (int)ms);
}

/* Where the next piece of p[0..n) ends: whole lines, at most max bytes. */
static size_t piece_len(const char *p, size_t n, size_t max)
{
	const char *nl;

	if (n <= max)
		return n;
	nl = memrchr(p, '\n', max);
	/* a line is at most ALOG_LINE_MAX <= PIPE_BUF <= max: there is one */
	return nl != NULL ? (size_t)(nl - p) + 1 : max;
}

/*
 * Write the whole lines p[0..n) to the current destination. What cannot be
 * written (an error, the stop's deadline, a stuck destination being
 * replaced, "off") is dropped and counted, by its '\n's.
 */
static void write_out(const char *p, size_t n)
{
	size_t off = 0, len;
	ssize_t done = -1;
	int fd = wr.sink.fd;

	while (off < n) {
		if (fd < 0)
			goto drop;
		switch (sink_wait()) {
		case READY:
			break;
		case NOT_YET:
			continue;
		case PAST_DEADLINE:
			wr.exit_dropped += count_lines(p + off, n - off);
			goto drop;
		case REPLACED:
			say(LOG_WARN, "access log: %s takes nothing; dropping its lines for the new destination",
			    wr.sink.name);
			goto drop;
		}
		if (wr.broken_line) {
			/* end the line a failed write left half written */
			done = write(fd, "\n", 1);
			if (done < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			if (done != 1)
				goto fail;
			wr.broken_line = false;
		}
		len = piece_len(p + off, n - off, wr.sink.piece);
		done = write(fd, p + off, len);
		if (done < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (done <= 0)
			goto fail;
		metrics_count_n(COUNTER_access_log_lines_total,
				(unsigned long)count_lines(p + off, (size_t)done));
		off += (size_t)done;
		if (wr.failing) {
			say(LOG_INFO, "access log: writing to %s again", wr.sink.name);
			wr.failing = false;
		}
	}
	return;
fail:
	if (!wr.failing)
		say(LOG_WARN, "access log: cannot write to %s: %s; dropping lines",
		    wr.sink.name, done == 0 ? "nothing written" : strerror(errno));
	wr.failing = true;
	back_off();
drop:
	if (off > 0 && p[off - 1] != '\n')
		wr.broken_line = true;
	count_dropped(count_lines(p + off, n - off));
}

/* CHANGE_REOPEN: the same path again, a new file if logrotate moved it. */
static void sink_reopen(void)
{
	int fd;

	if (!wr.sink.own)
		return;		/* stderr, stdout, off: nothing to reopen */
	fd = open_path(wr.sink.name);
	if (fd < 0) {
		say(LOG_ERROR, "access log: cannot reopen %s: %s; writing on to the file open before",
		    wr.sink.name, strerror(errno));
		return;
	}
	close(wr.sink.fd);
	wr.sink.fd = fd;
	sink_kind(&wr.sink);
	wr.broken_line = false;
}

/* The writer's wait, with the lock: returns at once for a change or a
 * stop, else after a tick or once the buffer is a quarter full; with
 * nothing buffered and nothing to say it sleeps until the first line. */
static void writer_wait(void)
{
	struct timespec until;

#define URGENT (w.stopping || w.nchanges > 0)
	if (URGENT)
		return;
	if (w.len[w.fill] == 0 && !wr.dropping && !wr.warn_due && !wr.info_due) {
		w.nap = NAP_IDLE;
		while (w.nap == NAP_IDLE && !URGENT)
			pthread_cond_wait(&w.wake, &w.lock);
	}
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_nsec += ALOG_TICK_MS * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	w.nap = NAP_TICK;
	while (w.nap == NAP_TICK && !URGENT && w.len[w.fill] < ALOG_WAKE_AT)
		if (pthread_cond_timedwait(&w.wake, &w.lock, &until) == ETIMEDOUT)
			break;
	w.nap = NAP_AWAKE;
#undef URGENT
}

/* A change, between the lines before its mark and those after. */
static void apply(struct change *c)
{
	if (c->kind == CHANGE_REOPEN) {
		sink_reopen();
		return;
	}
	sink_release(&wr.sink);
	wr.sink = c->next;
	wr.broken_line = false;
	wr.failing = false;
}

/* One turn: take the fill buffer (and the changes asked for), write it out
 * without the lock, the lines before each change's mark to the destination
 * before it and the rest to the one after. */
static void *writer_main(void *arg)
{
	size_t len, from, ntodo;
	char *out;

	(void)arg;
	pthread_mutex_lock(&w.lock);
	for (;;) {
		writer_wait();
		out = w.buf[w.fill];
		len = w.len[w.fill];
		w.fill ^= 1;
		w.len[w.fill] = 0;
		ntodo = w.nchanges;
		memcpy(wr.todo, w.changes, ntodo * sizeof(w.changes[0]));
		w.nchanges = 0;
		atomic_store_explicit(&attention, w.stopping, memory_order_release);
		take_drops();
		pthread_mutex_unlock(&w.lock);

		/* stderr is likeliest to take a line now, after the nap (the
		 * writes below may fill it, when it is the destination) */
		note_drops(false);
		announce();
		from = 0;
		for (size_t i = 0; i < ntodo; i++) {
			write_out(out + from, wr.todo[i].at - from);
			apply(&wr.todo[i]);
			from = wr.todo[i].at;
		}
		write_out(out + from, len - from);

		pthread_mutex_lock(&w.lock);
		take_drops();
		if (w.stopping && w.len[w.fill] == 0)
			break;
		note_drops(true);
		announce();
	}
	pthread_mutex_unlock(&w.lock);
	return NULL;
}

/* The buffers, the condition variable and the thread, going to first. */
static int writer_start(const struct sink *first, char *err, size_t errlen)
{
	pthread_condattr_t ca;
	sigset_t all, old;
	char *bufs;
	int rc;

	bufs = malloc(2 * (size_t)ALOG_BUF_SIZE);
	if (bufs == NULL) {
		snprintf(err, errlen, "access log: out of memory");
		return -1;
	}
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w.wake, &ca);
	pthread_condattr_destroy(&ca);

	memset(&wr, 0, sizeof(wr));
	wr.sink = *first;
	pthread_mutex_lock(&w.lock);
	w.buf[0] = bufs;
	w.buf[1] = bufs + ALOG_BUF_SIZE;
	w.len[0] = w.len[1] = 0;
	w.fill = 0;
	w.accepting = true;
	w.nap = NAP_AWAKE;
	w.dropped = 0;
	w.nchanges = 0;
	w.stopping = false;
	pthread_mutex_unlock(&w.lock);

	/* signals go to the other threads; SIGPIPE becomes EPIPE here */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&m.thread, NULL, writer_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		snprintf(err, errlen, "access log: cannot start the writer: %s",
			 strerror(rc));
		goto fail;
	}
	m.started = true;
	return 0;
fail:
	pthread_mutex_lock(&w.lock);
	w.accepting = false;
	w.buf[0] = w.buf[1] = NULL;
	pthread_mutex_unlock(&w.lock);
	pthread_cond_destroy(&w.wake);
	free(bufs);
	return -1;
}

/*
 * With the lock: queue a change at fill's current length. When the queue
 * is full the last change gives way to this one (the lines between the two
 * go where this one says).
 */
static void ask(enum change_kind kind, const struct sink *next)
{
	struct change *c;

	if (w.nchanges == ALOG_CHANGES_MAX) {
		c = &w.changes[--w.nchanges];
		if (c->kind == CHANGE_SWITCH)
			sink_release(&c->next);	/* never taken */
	} else {
		c = &w.changes[w.nchanges];
		c->at = w.len[w.fill];
	}
	c->kind = kind;
	if (next != NULL)
		c->next = *next;
	w.nchanges++;
	atomic_store_explicit(&attention, true, memory_order_release);
}

int alog_open(const char *dest, char *err, size_t errlen)
{
	struct sink next;
	bool on;

	if (m.started && strcmp(dest, m.dest) == 0)
		return 0;
	if (sink_init(&next, dest, err, errlen) < 0)
		return -1;
	on = next.fd >= 0;
	if (!m.started) {
		if (on && writer_start(&next, err, errlen) < 0) {
			sink_release(&next);
			return -1;
		}
	} else {
		pthread_mutex_lock(&w.lock);
		ask(CHANGE_SWITCH, &next);
		w.accepting = on;
		pthread_mutex_unlock(&w.lock);
		pthread_cond_signal(&w.wake);
	}
	atomic_store_explicit(&alog_on, on, memory_order_relaxed);
	memcpy(m.dest, next.name, sizeof(m.dest));
	return 0;
}

void alog_reopen(void)
{
	if (!m.started)
		return;
	pthread_mutex_lock(&w.lock);
	/* a reopen already waiting, or no room: the turn reopens anyway or
	 * switches to a file opened afresh */
	if (w.nchanges < ALOG_CHANGES_MAX &&
	    (w.nchanges == 0 || w.changes[w.nchanges - 1].kind != CHANGE_REOPEN))
		ask(CHANGE_REOPEN, NULL);
	pthread_mutex_unlock(&w.lock);
	pthread_cond_signal(&w.wake);
}

void alog_close(uint64_t flush_ms)
{
	uint64_t now;

	atomic_store_explicit(&alog_on, false, memory_order_relaxed);
	m.dest[0] = '\0';
	if (!m.started)
		return;
	now = clock_ms();
	pthread_mutex_lock(&w.lock);
	w.accepting = false;
	w.stopping = true;
	w.stop_at_ms = flush_ms > UINT64_MAX - now ? UINT64_MAX : now + flush_ms;
	atomic_store_explicit(&attention, true, memory_order_release);
	pthread_mutex_unlock(&w.lock);
	pthread_cond_signal(&w.wake);
	pthread_join(m.thread, NULL);
	m.started = false;

	if (wr.exit_dropped > 0)
		say(LOG_WARN, "access log: %s did not take the last %" PRIu64
		    " lines within %" PRIu64 " ms; dropped",
		    wr.sink.name, wr.exit_dropped, flush_ms);
	if (wr.dropping)
		say(LOG_INFO, "access log: %s closed; %" PRIu64
		    " lines were dropped since the writer fell behind",
		    wr.sink.name, wr.episode_dropped);
	sink_release(&wr.sink);
	pthread_mutex_lock(&w.lock);
	for (size_t i = 0; i < w.nchanges; i++)
		if (w.changes[i].kind == CHANGE_SWITCH)
			sink_release(&w.changes[i].next);
	w.nchanges = 0;
	w.stopping = false;
	atomic_store_explicit(&attention, false, memory_order_release);
	free(w.buf[0]);
	w.buf[0] = w.buf[1] = NULL;
	pthread_mutex_unlock(&w.lock);
	pthread_cond_destroy(&w.wake);
}
