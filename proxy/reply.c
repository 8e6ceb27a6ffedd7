/*
 * reply.c - the responses the proxy writes itself (see reply.h).
 */
#include "reply.h"

#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "h1.h"
#include "upstream.h"

/* "Content-Length: <n>\r\n" */
static void content_length(struct h1_out *o, uint64_t n)
{
	h1_out_add(o, "Content-Length: ", 16);
	h1_out_dec(o, n);
	h1_out_add(o, "\r\n", 2);
}

/* "<rid_name>: <rid>\r\n" when the response carries a request id. */
static void request_id(struct h1_out *o, struct reply_conn rc)
{
	if (rc.rid == NULL)
		return;
	h1_out_str(o, rc.rid_name);
	h1_out_add(o, ": ", 2);
	h1_out_str(o, rc.rid);
	h1_out_add(o, "\r\n", 2);
}

void reply_problem(struct evbuffer *out, enum problem p, const char *detail,
		   struct reply_conn rc)
{
	/* the longest detail passed is struct keyed_answer's, 320 bytes
	 * (keyed.h); a longer one would be shortened, never cut */
	char body[PROBLEM_BODY_MAX(320) + PROBLEM_REQUEST_ID_EXTRA + 1];
	size_t len = problem_render_id(p, detail, rc.rid, body, sizeof(body));
	int status = problem_status(p);
	struct h1_out o;

	h1_out_init(&o, out);
	h1_status_line(&o, status);
	h1_out_str(&o, "Content-Type: application/problem+json\r\n");
	content_length(&o, len);
	if (status == 503 || p == PROBLEM_IN_PROGRESS ||
	    p == PROBLEM_TOO_MANY_REQUESTS)
		h1_out_add(&o, "Retry-After: 1\r\n", 16);
	if (p == PROBLEM_TOKEN_INVALID)		/* RFC 6750 §3 */
		h1_out_str(&o, "WWW-Authenticate: Bearer "
			   "error=\"invalid_token\"\r\n");
	request_id(&o, rc);
	h1_write_connection(&o, rc.close, rc.http10);
	h1_out_add(&o, "\r\n", 2);
	h1_out_add(&o, body, len);
	h1_out_flush(&o);
}

struct relay_filter {
	bool keep_cl;
	bool upgrade;		/* a 101: its Upgrade field goes on */
	const char *rid_name;	/* the upstream's own is replaced by ours */
	size_t rid_len;
};

/* End-to-end fields of a relayed head; keep_cl keeps Content-Length. */
static bool relayed_field(const struct hdrlist *h, uint32_t i, void *arg)
{
	const struct relay_filter *f = arg;
	bool is_cl = h->v[i].name_len == 14 &&
		     strncasecmp(hdr_name(h, i), "content-length", 14) == 0;

	if (f->rid_name != NULL && hdr_named(h, i, f->rid_name, f->rid_len))
		return false;
	if (f->upgrade && hdr_named(h, i, "upgrade", 7))
		return true;
	return !httphdr_drop_on_forward(h, i) || (is_cl && f->keep_cl);
}

void reply_relay_head(struct evbuffer *out, const struct upstream_resp *r,
		      bool keep_cl, bool chunked, struct reply_conn rc)
{
	bool upgrade = r->status == 101;
	struct relay_filter f = { keep_cl, upgrade, rc.rid ? rc.rid_name : NULL,
				  rc.rid ? strlen(rc.rid_name) : 0 };
	struct h1_out o;

	h1_out_init(&o, out);
	h1_status_line(&o, r->status);
	h1_write_fields(&o, r->headers, relayed_field, &f);
	if (r->status >= 200 || upgrade)
		request_id(&o, rc);
	if (upgrade)
		h1_out_add(&o, "Connection: upgrade\r\n", 21);
	if (r->status >= 200) {
		if (r->body == BODY_LENGTH)
			content_length(&o, r->content_length);
		else if (chunked)
			h1_out_add(&o, "Transfer-Encoding: chunked\r\n", 28);
		h1_write_connection(&o, rc.close, rc.http10);
	}
	h1_out_add(&o, "\r\n", 2);
	h1_out_flush(&o);
}

/* evbuffer_add_reference's cleanup: the replay has been written out. */
static void unref_stored(const void *data, size_t len, void *extra)
{
	stored_response_unref(extra);
}

/*
 * The stored head's field named `name` ("Name: value\r\n" lines, as
 * capture_head() wrote them): *at and *len span the whole line, *val and
 * *vlen its value. False when there is none.
 */
static bool stored_line(const struct stored_response *r, const char *name,
			size_t *at, size_t *len, const char **val, size_t *vlen)
{
	size_t n = name != NULL ? strlen(name) : 0, i = 0;

	while (n > 0 && i < r->head_len) {
		const char *line = r->head + i;
		const char *eol = memchr(line, '\n', r->head_len - i);
		size_t ll = eol ? (size_t)(eol - line) + 1 : r->head_len - i;

		if (ll > n + 1 && line[n] == ':' && strncasecmp(line, name, n) == 0) {
			const char *v = line + n + 1, *e = line + ll;

			while (v < e && (*v == ' ' || *v == '\t'))
				v++;
			while (e > v && (e[-1] == '\n' || e[-1] == '\r' ||
					 e[-1] == ' ' || e[-1] == '\t'))
				e--;
			*at = i;
			*len = ll;
			*val = v;
			*vlen = (size_t)(e - v);
			return true;
		}
		i += ll;
	}
	return false;
}

bool reply_stored_id(const struct stored_response *r, char *out, size_t len)
{
	size_t at, ll, vlen;
	const char *v;

	if (!stored_line(r, REPLY_ORIGINAL_ID, &at, &ll, &v, &vlen) || vlen == 0 ||
	    vlen >= len)
		return false;
	memcpy(out, v, vlen);
	out[vlen] = '\0';
	return true;
}

void reply_replay(struct evbuffer *out, struct stored_response *r, bool head,
		  struct reply_conn rc)
{
	struct h1_out o;
	size_t at, ll, vlen;
	const char *v;

	h1_out_init(&o, out);
	h1_status_line(&o, r->status);
	/* the stored head names the executing request's id as the original's
	 * already; a field of this request's id's name (a record stored
	 * before request ids kept the upstream's) gives way to ours */
	if (rc.rid != NULL && stored_line(r, rc.rid_name, &at, &ll, &v, &vlen)) {
		h1_out_add(&o, r->head, at);
		h1_out_add(&o, r->head + at + ll, r->head_len - at - ll);
	} else {
		h1_out_add(&o, r->head, r->head_len);
	}
	request_id(&o, rc);
	if (!(head || r->status == 204 || r->status == 304 || r->status < 200))
		content_length(&o, r->body_len);
	h1_out_add(&o, "Idempotent-Replayed: true\r\n", 27);
	h1_write_connection(&o, rc.close, rc.http10);
	h1_out_add(&o, "\r\n", 2);
	h1_out_flush(&o);
	/* one stored body, shared by every replay in progress */
	if (r->body_len > 0 && !head &&
	    evbuffer_add_reference(out, r->body, r->body_len, unref_stored,
				   stored_response_ref(r)) < 0)
		stored_response_unref(r);
}

void reply_issued_key(struct evbuffer *out, const char *key,
		      struct reply_conn rc)
{
	struct h1_out o;

	h1_out_init(&o, out);
	h1_status_line(&o, 200);
	h1_out_str(&o, "Content-Type: application/json\r\n"
		   "Cache-Control: no-store\r\n");
	request_id(&o, rc);
	content_length(&o, strlen(key) + 10);
	h1_write_connection(&o, rc.close, rc.http10);
	h1_out_add(&o, "\r\n{\"key\":\"", 10);
	h1_out_str(&o, key);
	h1_out_add(&o, "\"}", 2);
	h1_out_flush(&o);
}
