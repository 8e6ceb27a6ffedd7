/*
 * problem.c - RFC 9457 bodies for the responses the proxy makes itself.
 */
#include "problem.h"

#include <stdio.h>

static const struct {
	int status;
	const char *slug;
	const char *title;
} problems[PROBLEM_COUNT] = {
#define X(name, status, slug, title) [PROBLEM_##name] = { status, slug, title },
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

/* Append s as JSON string content, escaping what JSON requires. */
static size_t json_escape(char *buf, size_t len, size_t at, const char *s)
{
	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[8];
		const char *out = esc;
		int n;

		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			esc[2] = '\0';
		} else if (c < 0x20) {
			n = snprintf(esc, sizeof(esc), "\\u%04x", c);
			(void)n;
		} else {
			esc[0] = (char)c;
			esc[1] = '\0';
		}
		for (; *out != '\0'; out++) {
			if (at + 1 < len)
				buf[at] = *out;
			at++;
		}
	}
	return at;
}

size_t problem_render(enum problem p, const char *detail, char *buf, size_t len)
{
	size_t at;
	int n;

	n = snprintf(buf, len,
		     "{\"type\":\"urn:idemproxy:problem:%s\",\"title\":\"%s\","
		     "\"status\":%d,\"detail\":\"",
		     problems[p].slug, problems[p].title, problems[p].status);
	at = n > 0 ? (size_t)n : 0;
	at = json_escape(buf, len, at, detail ? detail : problems[p].title);
	if (at + 3 <= len) {
		buf[at++] = '"';
		buf[at++] = '}';
		buf[at] = '\0';
	} else if (len > 0) {
		buf[len - 1] = '\0';
		at = len - 1;
	}
	return at;
}
