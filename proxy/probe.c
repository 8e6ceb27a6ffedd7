/*
 * probe.c - the outcome probe (see probe.h).
 *
 *   probe_start ──▶ GET <prefix><target with the key> on a pooled or new
 *                   connection ──head──▶ 2xx: fields and body captured
 *                                        ──done──▶ cb(status, response)
 *                               ──error──▶ cb(0, NULL)
 *
 * The probe owns its upstream handle and what it captured; the caller owns
 * the probe until the callback has run (then it is gone) or it cancels it.
 */
#include "probe.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "h1.h"
#include "httphdr.h"

struct probe {
	struct upstream *up;
	probe_cb cb;
	void *arg;
	int status;		/* the final status; 0 before it */
	uint64_t max_body;
	bool overflow;		/* the body is too large to store */
	struct evbuffer *head;	/* a 2xx's end-to-end fields */
	struct evbuffer *body;
};

static void probe_free(struct probe *pr)
{
	if (pr->up != NULL)
		upstream_abort(pr->up);
	if (pr->head != NULL)
		evbuffer_free(pr->head);
	if (pr->body != NULL)
		evbuffer_free(pr->body);
	free(pr);
}

/* The fields a probe's answer keeps: end-to-end ones, and never a cookie
 * (a lookup made by the proxy hands nobody a session). */
static bool kept_field(const struct hdrlist *h, uint32_t i, void *arg)
{
	(void)arg;
	if (httphdr_drop_on_forward(h, i))
		return false;
	return h->v[i].name_len != 10 ||
	       strcasecmp(hdr_name(h, i), "set-cookie") != 0;
}

static bool success(int status)
{
	return status >= 200 && status < 300;
}

static void on_head(void *arg, const struct upstream_resp *r)
{
	struct probe *pr = arg;
	struct h1_out o;

	if (r->status < 200)
		return;		/* an interim head */
	pr->status = r->status;
	if (!success(r->status))
		return;
	h1_out_init(&o, pr->head);
	h1_write_fields(&o, r->headers, kept_field, NULL);
	h1_out_flush(&o);
}

static void on_body(void *arg, struct evbuffer *src, size_t len)
{
	struct probe *pr = arg;

	if (!success(pr->status) || pr->overflow ||
	    evbuffer_get_length(pr->body) + len > pr->max_body) {
		pr->overflow = pr->overflow || success(pr->status);
		evbuffer_drain(src, len);
		return;
	}
	if (evbuffer_remove_buffer(src, pr->body, len) != (int)len)
		pr->overflow = true;
}

static void on_done(void *arg)
{
	struct probe *pr = arg;
	struct stored_response *resp = NULL;
	size_t hlen = evbuffer_get_length(pr->head);
	size_t blen = evbuffer_get_length(pr->body);

	upstream_release(pr->up);
	pr->up = NULL;
	if (success(pr->status) && !pr->overflow)
		resp = stored_response_new(pr->status,
			hlen ? (const char *)evbuffer_pullup(pr->head, -1) : "",
			hlen,
			blen ? (const char *)evbuffer_pullup(pr->body, -1) : "",
			blen, true);
	pr->cb(pr->arg, pr->status, resp);
	stored_response_unref(resp);
	probe_free(pr);
}

static void on_error(void *arg, enum upstream_error err, unsigned how)
{
	struct probe *pr = arg;

	(void)err;
	(void)how;
	pr->up = NULL;
	pr->cb(pr->arg, 0, NULL);
	probe_free(pr);
}

static const struct upstream_cbs probe_cbs = {
	.on_head = on_head,
	.on_body = on_body,
	.on_done = on_done,
	.on_error = on_error,
	.on_drain = NULL,
	.on_slow = NULL,
};

static bool unreserved(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
	       (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
	       c == '~';
}

size_t probe_target(const char *target, const char *key, char *out, size_t len)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t at = 0;

	for (const char *p = target; *p != '\0';) {
		if (strncmp(p, "{key}", 5) != 0) {
			if (at + 1 >= len)
				return 0;
			out[at++] = *p++;
			continue;
		}
		for (const unsigned char *k = (const unsigned char *)key;
		     *k != '\0'; k++) {
			if (at + 4 >= len)
				return 0;
			if (unreserved(*k)) {
				out[at++] = (char)*k;
				continue;
			}
			out[at++] = '%';
			out[at++] = hex[*k >> 4];
			out[at++] = hex[*k & 15];
		}
		p += 5;
	}
	if (at >= len)
		return 0;
	out[at] = '\0';
	return at;
}

/* The request: the route's target under the upstream's prefix, the
 * upstream's own Host, nothing of the client's. */
static int write_request(struct evbuffer *out, const struct config *cfg,
			 const char *target)
{
	const char *host = cfg->upstream_hp.host;
	bool v6 = strchr(host, ':') != NULL;

	return evbuffer_add_printf(out, "GET %s%s HTTP/1.1\r\n"
				   "Host: %s%s%s:%s\r\n"
				   "Accept: application/json, */*\r\n"
				   "User-Agent: idemproxy-outcome-probe\r\n\r\n",
				   cfg->upstream_prefix, target, v6 ? "[" : "",
				   host, v6 ? "]" : "",
				   cfg->upstream_hp.port) < 0 ? -1 : 0;
}

struct probe *probe_start(struct upstream_pool *pool, const struct config *cfg,
			  const struct policy *p, const char *key,
			  probe_cb cb, void *arg)
{
	struct probe *pr = calloc(1, sizeof(*pr));
	char target[4096];

	if (pr == NULL)
		return NULL;
	pr->cb = cb;
	pr->arg = arg;
	pr->max_body = p->max_cached_response;
	pr->head = evbuffer_new();
	pr->body = evbuffer_new();
	if (pr->head == NULL || pr->body == NULL || p->probe_target == NULL ||
	    probe_target(p->probe_target, key, target, sizeof(target)) == 0)
		goto fail;
	pr->up = upstream_acquire(pool, &probe_cbs, pr, cfg->upstream_timeout_ms,
				  false, UPSTREAM_CHECK);
	if (pr->up == NULL)
		goto fail;
	if (write_request(upstream_output(pr->up), cfg, target) < 0)
		goto fail;
	upstream_request_sent(pr->up);
	return pr;
fail:
	probe_free(pr);
	return NULL;
}

void probe_cancel(struct probe *pr)
{
	if (pr != NULL)
		probe_free(pr);
}
