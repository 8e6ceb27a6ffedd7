/*
 * body.h - a keyed request's body, buffered in one block of its own, and
 * the process-wide budget of those blocks (--max-buffered).
 *
 * The budget is charged as bytes arrive, never on what a head declares: a
 * client that announces 1 MiB and sends a byte now and then holds a byte
 * of it, not a megabyte. A body whose length is declared gets its block
 * once, at that size (pages the kernel gives only as they are written), and
 * is charged for the bytes written into it; a chunked body's block grows
 * by doubling and is charged for all of it. The charge follows the bytes
 * until they leave the process: body_hand_over() lends the block to an
 * evbuffer (the request for the upstream), and the block is freed and its
 * charge given back only when libevent lets go of it - written to the
 * upstream, or dropped with the exchange - not when the client leaves.
 */
#ifndef IDEMPROXY_BODY_H
#define IDEMPROXY_BODY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

struct evbuffer;

struct body {
	char *data;		/* NULL: nothing buffered yet */
	size_t len, cap;
	bool sized;		/* cap is the declared length, fixed */
	uint64_t charged;	/* of the process-wide budget */
};

enum body_err {
	BODY_OK = 0,
	BODY_BUSY = -1,		/* the budget is spent */
	BODY_NOMEM = -2,
};

/* Get ready for a body of `declared` bytes (0: not known, chunked). The
 * block is made at the first byte. */
void body_start(struct body *b, uint64_t declared);
/* Append n bytes; the budget may hold at most max_buffered bytes. */
enum body_err body_add(struct body *b, const void *p, size_t n,
		       uint64_t max_buffered) MUSTCHECK;
/* Move n bytes from the front of src. */
enum body_err body_add_from(struct body *b, struct evbuffer *src, size_t n,
			    uint64_t max_buffered) MUSTCHECK;

static inline const char *body_data(const struct body *b)
{
	return b->data != NULL ? b->data : "";
}

/* Lend the bytes to out (by reference, no copy); b is empty afterwards.
 * -1 when out of memory (b unchanged). */
int body_hand_over(struct body *b, struct evbuffer *out) MUSTCHECK;
/* Free what is buffered and give its charge back; b is empty, reusable. */
void body_clear(struct body *b);
/* Bytes of the budget charged now, all bodies together (/metrics, tests). */
uint64_t body_buffered(void);

#endif
