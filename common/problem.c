/*
 * problem.c - RFC 9457 bodies for the responses the proxy makes itself.
 */
#include "problem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
	int status;
	const char *slug;
	const char *error_type;
	const char *title;
} problems[PROBLEM_COUNT] = {
#define X(name, status, slug, error_type, title) \
	[PROBLEM_##name] = { status, slug, error_type, title },
	PROBLEM_LIST(X)
#undef X
};

int problem_status(enum problem p)
{
	return problems[p].status;
}

const char *problem_slug(enum problem p)
{
	return problems[p].slug;
}

const char *problem_title(enum problem p)
{
	return problems[p].title;
}

const char *problem_error_type(enum problem p)
{
	return problems[p].error_type;
}

enum problem problem_upstream(enum upstream_error err, const char **detail)
{
	if (err == UPSTREAM_ERROR_TIMEOUT) {
		*detail = "the upstream did not answer in time";
		return PROBLEM_UPSTREAM_TIMEOUT;
	}
	if (err == UPSTREAM_ERROR_TLS) {
		*detail = "TLS with the upstream failed (the proxy's log says why)";
		return PROBLEM_UPSTREAM_TLS;
	}
	*detail = "the upstream connection failed";
	return PROBLEM_UPSTREAM_UNAVAILABLE;
}

const char *http_reason(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 101: return "Switching Protocols";
	case 103: return "Early Hints";
	case 200: return "OK";
	case 201: return "Created";
	case 202: return "Accepted";
	case 204: return "No Content";
	case 206: return "Partial Content";
	case 301: return "Moved Permanently";
	case 302: return "Found";
	case 303: return "See Other";
	case 304: return "Not Modified";
	case 307: return "Temporary Redirect";
	case 308: return "Permanent Redirect";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 409: return "Conflict";
	case 410: return "Gone";
	case 412: return "Precondition Failed";
	case 413: return "Content Too Large";
	case 415: return "Unsupported Media Type";
	case 422: return "Unprocessable Content";
	case 425: return "Too Early";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	default: return "";
	}
}

/* Where problem_render writes: at most len - 1 bytes, then a NUL. */
struct out {
	char *buf;
	size_t len, at;
};

static void out_add(struct out *o, const char *s, size_t n)
{
	size_t room = o->len > o->at + 1 ? o->len - o->at - 1 : 0;

	if (n > room)
		n = room;
	memcpy(o->buf + o->at, s, n);
	o->at += n;
}

/* c as JSON string content into esc (7 bytes); returns its length. */
static size_t escape_char(unsigned char c, char *esc)
{
	if (c == '"' || c == '\\') {
		esc[0] = '\\';
		esc[1] = (char)c;
		return 2;
	}
	if (c < 0x20) {
		snprintf(esc, 7, "\\u%04x", c);
		return 6;
	}
	esc[0] = (char)c;
	return 1;
}

/* The first n bytes of s as JSON string content, escaping what JSON
 * requires. */
static void out_escaped(struct out *o, const char *s, size_t n)
{
	char esc[7];

	for (size_t i = 0; i < n; i++)
		out_add(o, esc, escape_char((unsigned char)s[i], esc));
}

/* How many bytes of s (n long) fit in `room` bytes once escaped, never
 * ending inside a UTF-8 sequence. */
static size_t fitting_prefix(const char *s, size_t n, size_t room)
{
	char esc[7];
	size_t i, w = 0;

	for (i = 0; i < n; i++) {
		w += escape_char((unsigned char)s[i], esc);
		if (w > room)
			break;
	}
	if (i < n)
		while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
			i--;
	return i;
}

size_t problem_render(enum problem p, const char *detail, char *buf, size_t len)
{
	return problem_render_id(p, detail, NULL, buf, len);
}

size_t problem_render_id(enum problem p, const char *detail,
			 const char *request_id, char *buf, size_t len)
{
	const char *d = detail ? detail : problems[p].title;
	size_t n = strlen(d), fixed, rn = request_id ? strlen(request_id) : 0;
	char head[192], mid[128];
	int hn, mn;
	struct out o = { buf, len, 0 };

	if (len == 0)
		return 0;
	hn = snprintf(head, sizeof(head),
		      "{\"type\":\"urn:idemproxy:problem:%s\",\"title\":\"%s\","
		      "\"status\":%d,\"detail\":\"",
		      problems[p].slug, problems[p].title, problems[p].status);
	mn = snprintf(mid, sizeof(mid),
		      "\",\"error\":{\"type\":\"%s\",\"code\":\"%s\","
		      "\"message\":\"",
		      problems[p].error_type, problems[p].slug);
	if (hn < 0 || (size_t)hn >= sizeof(head) || mn < 0 ||
	    (size_t)mn >= sizeof(mid))
		abort();	/* a row longer than the table allows */
	if (rn > PROBLEM_REQUEST_ID_MAX)
		rn = 0;		/* not one of ours: left out */
	fixed = (size_t)hn + (size_t)mn + 3 + (rn ? rn + 16 : 0);
	/* the detail appears twice: each copy gets half of what is left */
	n = fitting_prefix(d, n, len - 1 > fixed ? (len - 1 - fixed) / 2 : 0);
	out_add(&o, head, (size_t)hn);
	out_escaped(&o, d, n);
	out_add(&o, mid, (size_t)mn);
	out_escaped(&o, d, n);
	out_add(&o, "\"}", 2);
	if (rn > 0) {
		out_add(&o, ",\"request_id\":\"", 15);
		out_escaped(&o, request_id, rn);
		out_add(&o, "\"", 1);
	}
	out_add(&o, "}", 1);
	buf[o.at] = '\0';
	return o.at;
}
