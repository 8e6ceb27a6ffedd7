/*
 * h1.c - HTTP/1 message heads, keep-alive, fields and chunks (see h1.h).
 */
#include "h1.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <event2/buffer.h>

#include "problem.h"

void h1_head_init(struct h1_head *h, size_t max)
{
	memset(h, 0, sizeof(*h));
	hdrlist_init(&h->fields);
	h->max = max;
}

void h1_head_reset(struct h1_head *h, size_t max)
{
	hdrlist_reset(&h->fields);
	if (h->target_cap > 1024) {
		free(h->target);
		h->target = NULL;
		h->target_cap = 0;
	}
	h->target_len = 0;
	if (h->target != NULL)
		h->target[0] = '\0';
	h->bytes = 0;
	h->max = max;
	h->too_large = false;
}

void h1_head_free(struct h1_head *h)
{
	hdrlist_free(&h->fields);
	free(h->target);
	h->target = NULL;
}

/* Count len more bytes against the cap. */
static bool grow(struct h1_head *h, size_t len)
{
	h->bytes += len;
	if (h->bytes > h->max) {
		h->too_large = true;
		return false;
	}
	return true;
}

int h1_head_target(struct h1_head *h, const char *at, size_t len)
{
	if (!grow(h, len))
		return -1;
	if (h->target_len + len + 1 > h->target_cap) {
		size_t cap = h->target_cap ? h->target_cap : 128;
		char *t;

		while (cap < h->target_len + len + 1)
			cap *= 2;
		t = realloc(h->target, cap);
		if (t == NULL)
			return -1;
		h->target = t;
		h->target_cap = cap;
	}
	memcpy(h->target + h->target_len, at, len);
	h->target_len += len;
	h->target[h->target_len] = '\0';
	return 0;
}

int h1_head_name(struct h1_head *h, const char *at, size_t len)
{
	return grow(h, len) && hdrlist_add_name(&h->fields, at, len) == 0 ? 0 : -1;
}

int h1_head_value(struct h1_head *h, const char *at, size_t len)
{
	return grow(h, len) && hdrlist_add_value(&h->fields, at, len) == 0 ? 0 : -1;
}

int h1_head_end_field(struct h1_head *h)
{
	return hdrlist_end_field(&h->fields);
}

bool h1_keep_alive(const struct hdrlist *h, int major, int minor)
{
	bool keep = major == 1 && minor >= 1;

	for (int i = hdrlist_find(h, "connection", 0); i >= 0;
	     i = hdrlist_find(h, "connection", (uint32_t)i + 1)) {
		const char *v = hdr_value(h, (uint32_t)i);
		size_t n = h->v[i].value_len;

		if (httphdr_list_has(v, n, "close"))
			return false;
		if (httphdr_list_has(v, n, "keep-alive"))
			keep = true;
	}
	return keep;
}

bool h1_only_chunked(const struct hdrlist *h)
{
	int n = 0;

	for (int i = hdrlist_find(h, "transfer-encoding", 0); i >= 0;
	     i = hdrlist_find(h, "transfer-encoding", (uint32_t)i + 1)) {
		const char *v = hdr_value(h, (uint32_t)i), *end;
		size_t len = h->v[i].value_len;

		for (const char *e = v; e < v + len; e = end + 1) {
			const char *a = e, *b;

			end = memchr(e, ',', (size_t)(v + len - e));
			if (end == NULL)
				end = v + len;
			while (a < end && (*a == ' ' || *a == '\t'))
				a++;
			b = end;
			while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
				b--;
			if (a == b)
				continue;	/* empty list element */
			if (b - a != 7 || strncasecmp(a, "chunked", 7) != 0)
				return false;
			n++;
		}
	}
	return n == 1;
}

void h1_out_init(struct h1_out *o, struct evbuffer *to)
{
	o->to = to;
	o->n = 0;
}

void h1_out_flush(struct h1_out *o)
{
	if (o->n > 0)
		evbuffer_add(o->to, o->b, o->n);
	o->n = 0;
}

void h1_out_add(struct h1_out *o, const void *p, size_t len)
{
	if (len > sizeof(o->b) - o->n) {
		h1_out_flush(o);
		if (len >= sizeof(o->b)) {	/* a field of its own size */
			evbuffer_add(o->to, p, len);
			return;
		}
	}
	memcpy(o->b + o->n, p, len);
	o->n += len;
}

void h1_out_str(struct h1_out *o, const char *s)
{
	h1_out_add(o, s, strlen(s));
}

void h1_out_dec(struct h1_out *o, uint64_t v)
{
	char d[20];
	size_t i = sizeof(d);

	do {
		d[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v > 0);
	h1_out_add(o, d + i, sizeof(d) - i);
}

void h1_status_line(struct h1_out *o, int status)
{
	h1_out_add(o, "HTTP/1.1 ", 9);
	h1_out_dec(o, status >= 0 ? (uint64_t)status : 0);
	h1_out_add(o, " ", 1);
	h1_out_str(o, http_reason(status));
	h1_out_add(o, "\r\n", 2);
}

void h1_write_fields(struct h1_out *o, const struct hdrlist *h,
		     h1_field_filter keep, void *arg)
{
	for (uint32_t i = 0; i < h->n; i++) {
		if (keep != NULL && !keep(h, i, arg))
			continue;
		h1_out_add(o, hdr_name(h, i), h->v[i].name_len);
		h1_out_add(o, ": ", 2);
		h1_out_add(o, hdr_value(h, i), h->v[i].value_len);
		h1_out_add(o, "\r\n", 2);
	}
}

void h1_write_connection(struct h1_out *o, bool close, bool http10)
{
	if (close)
		h1_out_add(o, "Connection: close\r\n", 19);
	else if (http10)
		h1_out_add(o, "Connection: keep-alive\r\n", 24);
}

bool h1_socket_readable(int fd)
{
	char b;

	return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) >= 0;
}

void h1_chunk(struct evbuffer *out, const char *at, size_t len)
{
	evbuffer_add_printf(out, "%zx\r\n", len);
	evbuffer_add(out, at, len);
	evbuffer_add(out, "\r\n", 2);
}

void h1_chunk_move(struct evbuffer *out, struct evbuffer *src, size_t len)
{
	evbuffer_add_printf(out, "%zx\r\n", len);
	evbuffer_remove_buffer(src, out, len);
	evbuffer_add(out, "\r\n", 2);
}

void h1_last_chunk(struct evbuffer *out)
{
	evbuffer_add(out, "0\r\n\r\n", 5);
}
