/*
 * reqhead.c - the upstream request head (see reqhead.h).
 */
#include "reqhead.h"

#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <llhttp.h>

#include "config.h"
#include "h1.h"

/* X-Forwarded-For: the client's list, comma-joined, then the peer. */
static void write_forwarded_for(struct evbuffer *out, const struct reqhead *r)
{
	const struct hdrlist *h = r->fields;
	bool first = true;

	evbuffer_add(out, "X-Forwarded-For: ", 17);
	for (int i = hdrlist_find(h, "x-forwarded-for", 0); i >= 0;
	     i = hdrlist_find(h, "x-forwarded-for", (uint32_t)i + 1)) {
		if (h->v[i].value_len == 0)
			continue;
		if (!first)
			evbuffer_add(out, ", ", 2);
		evbuffer_add(out, hdr_value(h, (uint32_t)i), h->v[i].value_len);
		first = false;
	}
	evbuffer_add_printf(out, "%s%s\r\n", first ? "" : ", ", r->peer);
}

/* The client's fields that go upstream as they are. */
static bool forwarded_field(const struct hdrlist *h, uint32_t i, void *arg)
{
	const struct reqhead *r = arg;
	uint32_t n = h->v[i].name_len;
	const char *name = hdr_name(h, i);

	if (httphdr_drop_on_forward(h, i))
		return false;
	if (n == 15 && strcasecmp(name, "x-forwarded-for") == 0)
		return false;	/* rewritten below */
	return !(r->drop_expect && n == 6 && strcasecmp(name, "expect") == 0);
}

void reqhead_write(struct evbuffer *out, const struct reqhead *r)
{
	const struct hdrlist *h = r->fields;
	const char *prefix = r->cfg->upstream_prefix;
	int host = hdrlist_find(h, "host", 0);

	evbuffer_add_printf(out, "%s %s%s HTTP/1.1\r\n",
			    llhttp_method_name((llhttp_method_t)r->method), prefix,
			    strcmp(r->target, "*") == 0 && prefix[0] ? "" :
								      r->target);
	h1_write_fields(out, h, forwarded_field, (void *)r);
	if (host < 0)
		evbuffer_add_printf(out, "Host: %s:%s\r\n",
				    r->cfg->upstream_hp.host, r->cfg->upstream_hp.port);
	write_forwarded_for(out, r);
	if (hdrlist_find(h, "x-forwarded-proto", 0) < 0)
		evbuffer_add(out, "X-Forwarded-Proto: http\r\n", 25);
	if (host >= 0 && hdrlist_find(h, "x-forwarded-host", 0) < 0)
		evbuffer_add_printf(out, "X-Forwarded-Host: %s\r\n",
				    hdr_value(h, (uint32_t)host));
	if (r->body == BODY_LENGTH)
		evbuffer_add_printf(out, "Content-Length: %llu\r\n",
				    (unsigned long long)r->length);
	else if (r->body == BODY_CHUNKED)
		evbuffer_add(out, "Transfer-Encoding: chunked\r\n", 28);
	evbuffer_add(out, "\r\n", 2);
}

const char *reqhead_origin_target(const char *t, int method)
{
	if (t == NULL)
		return NULL;
	if (t[0] == '/')
		return t;
	if (strcmp(t, "*") == 0 && method == HTTP_OPTIONS)
		return t;
	if (strncasecmp(t, "http://", 7) == 0) {
		const char *path = strchr(t + 7, '/');

		return path != NULL ? path : "/";
	}
	return NULL;
}
