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

void reply_problem(struct evbuffer *out, enum problem p, const char *detail,
		   struct reply_conn rc)
{
	/* the longest detail passed is struct keyed_answer's, 320 bytes
	 * (keyed.h); a longer one would be shortened, never cut */
	char body[PROBLEM_BODY_MAX(320) + 1];
	size_t len = problem_render(p, detail, body, sizeof(body));
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
	h1_write_connection(&o, rc.close, rc.http10);
	h1_out_add(&o, "\r\n", 2);
	h1_out_add(&o, body, len);
	h1_out_flush(&o);
}

/* End-to-end fields of a relayed head; keep_cl keeps Content-Length. */
static bool relayed_field(const struct hdrlist *h, uint32_t i, void *arg)
{
	bool keep_cl = *(const bool *)arg;
	bool is_cl = h->v[i].name_len == 14 &&
		     strncasecmp(hdr_name(h, i), "content-length", 14) == 0;

	return !httphdr_drop_on_forward(h, i) || (is_cl && keep_cl);
}

void reply_relay_head(struct evbuffer *out, const struct upstream_resp *r,
		      bool keep_cl, bool chunked, struct reply_conn rc)
{
	struct h1_out o;

	h1_out_init(&o, out);
	h1_status_line(&o, r->status);
	h1_write_fields(&o, r->headers, relayed_field, &keep_cl);
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

void reply_replay(struct evbuffer *out, struct stored_response *r, bool head,
		  struct reply_conn rc)
{
	struct h1_out o;

	h1_out_init(&o, out);
	h1_status_line(&o, r->status);
	h1_out_add(&o, r->head, r->head_len);
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
	content_length(&o, strlen(key) + 10);
	h1_write_connection(&o, rc.close, rc.http10);
	h1_out_add(&o, "\r\n{\"key\":\"", 10);
	h1_out_str(&o, key);
	h1_out_add(&o, "\"}", 2);
	h1_out_flush(&o);
}
