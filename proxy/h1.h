/*
 * h1.h - what both sides of the proxy do with an HTTP/1 message: collect
 * its head as llhttp delivers it (request-target, header fields, a cap on
 * their size), decide keep-alive, write header fields, frame chunks.
 *
 * A rule that holds on both sides lives here once: a client request and an
 * upstream response are collected, capped and judged for keep-alive alike.
 */
#ifndef IDEMPROXY_H1_H
#define IDEMPROXY_H1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"
#include "httphdr.h"

struct evbuffer;

/* One message head on its way in. */
struct h1_head {
	struct hdrlist fields;
	char *target;			/* requests: NUL-terminated; else NULL */
	size_t target_len, target_cap;
	size_t bytes;			/* target and field bytes so far */
	size_t max;			/* ... at most */
	bool too_large;			/* a callback failed on the cap */
};

void h1_head_init(struct h1_head *h, size_t max);
/* Forget the message (keeping small buffers); a new cap. */
void h1_head_reset(struct h1_head *h, size_t max);
void h1_head_free(struct h1_head *h);

/* The llhttp callbacks' work: append a piece of the target, of a field name
 * or value; end a field. 0, or -1 (too large: h->too_large, or no memory). */
int h1_head_target(struct h1_head *h, const char *at, size_t len) MUSTCHECK;
int h1_head_name(struct h1_head *h, const char *at, size_t len) MUSTCHECK;
int h1_head_value(struct h1_head *h, const char *at, size_t len) MUSTCHECK;
int h1_head_end_field(struct h1_head *h) MUSTCHECK;

/*
 * May the connection carry another message after this one? HTTP/1.1
 * defaults to yes, 1.0 to no; a Connection "close" token in any field
 * wins over everything, a "keep-alive" token turns 1.0 to yes.
 */
bool h1_keep_alive(const struct hdrlist *h, int major, int minor);

/* Do the Transfer-Encoding fields of h say exactly "chunked" (one coding,
 * once, case-insensitive)? */
bool h1_only_chunked(const struct hdrlist *h);

/*
 * A head on its way out. Its pieces are gathered here and reach the
 * evbuffer in one evbuffer_add when the head is done (or whenever the
 * space fills): an evbuffer runs its callbacks on every add, and a
 * connection's output buffer has two (the bufferevent's and the flush at
 * the end of the turn), so a head written field by field paid for them a
 * dozen times. Nothing else may be added to `to` between h1_out_init()
 * and h1_out_flush(), or the bytes would go out of order.
 */
struct h1_out {
	struct evbuffer *to;
	size_t n;
	char b[4096];
};

void h1_out_init(struct h1_out *o, struct evbuffer *to);
void h1_out_add(struct h1_out *o, const void *p, size_t len);
void h1_out_str(struct h1_out *o, const char *s);
void h1_out_dec(struct h1_out *o, uint64_t v);	/* in decimal */
/* Hand what is gathered to the evbuffer; o may be used again. */
void h1_out_flush(struct h1_out *o);

/* A status line, "HTTP/1.1 <status> <reason>\r\n". */
void h1_status_line(struct h1_out *o, int status);

/* Write every field of h that keep() accepts as "Name: value\r\n". */
typedef bool (*h1_field_filter)(const struct hdrlist *h, uint32_t i, void *arg);
void h1_write_fields(struct h1_out *o, const struct hdrlist *h,
		     h1_field_filter keep, void *arg);

/* The Connection field a response of ours carries: "close" when the
 * connection ends after it, "keep-alive" to an HTTP/1.0 client that may
 * keep it, none otherwise. */
void h1_write_connection(struct h1_out *o, bool close, bool http10);

/* Has the peer sent anything (bytes, or its FIN) that waits on fd? For
 * a read timeout that fired late (the process was stalled): then it is not
 * the peer that is slow. */
bool h1_socket_readable(int fd);

/* Chunked framing: len bytes at `at`, or moved from the front of src; the
 * last chunk. */
void h1_chunk(struct evbuffer *out, const char *at, size_t len);
void h1_chunk_move(struct evbuffer *out, struct evbuffer *src, size_t len);
void h1_last_chunk(struct evbuffer *out);

#endif
