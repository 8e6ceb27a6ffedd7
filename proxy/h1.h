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

/* Write every field of h that keep() accepts as "Name: value\r\n". */
typedef bool (*h1_field_filter)(const struct hdrlist *h, uint32_t i, void *arg);
void h1_write_fields(struct evbuffer *out, const struct hdrlist *h,
		     h1_field_filter keep, void *arg);

/* The Connection field a response of ours carries: "close" when the
 * connection ends after it, "keep-alive" to an HTTP/1.0 client that may
 * keep it, none otherwise. */
void h1_write_connection(struct evbuffer *out, bool close, bool http10);

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
