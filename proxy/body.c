/*
 * body.c - a keyed request's body and the budget of buffered bodies (see
 * body.h).
 */
#include "body.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#define BODY_FIRST_CAP 4096	/* a chunked body's first block */

/* What every body together is charged now, in bytes. */
static _Atomic uint64_t charged_total;

uint64_t body_buffered(void)
{
	return atomic_load(&charged_total);
}

/* Charge b up to `want` bytes in all; false when that passes max. */
static bool charge(struct body *b, uint64_t want, uint64_t max)
{
	uint64_t more, cur = atomic_load(&charged_total);

	if (want <= b->charged)
		return true;
	more = want - b->charged;
	do {
		if (cur + more > max || cur + more < cur)
			return false;
	} while (!atomic_compare_exchange_weak(&charged_total, &cur,
					       cur + more));
	b->charged = want;
	return true;
}

static void uncharge(uint64_t n)
{
	if (n > 0)
		atomic_fetch_sub(&charged_total, n);
}

void body_start(struct body *b, uint64_t declared)
{
	body_clear(b);
	b->sized = declared > 0 && declared <= SIZE_MAX;
	b->cap = b->sized ? (size_t)declared : 0;
}

/* Room for n more bytes: the declared block made once, or a chunked
 * body's block doubled (charged for all of it before it is made). */
static enum body_err room(struct body *b, size_t n, uint64_t max)
{
	size_t need = b->len + n, cap;
	char *p;

	if (n == 0)
		return BODY_OK;
	if (need < b->len)
		return BODY_NOMEM;
	if (b->sized) {
		if (need > b->cap)
			return BODY_NOMEM;	/* the parser stops this first */
		if (!charge(b, need, max))
			return BODY_BUSY;
		if (b->data == NULL && (b->data = malloc(b->cap)) == NULL)
			return BODY_NOMEM;
		return BODY_OK;
	}
	if (b->data != NULL && need <= b->cap)
		return BODY_OK;
	cap = b->cap > 0 ? b->cap : BODY_FIRST_CAP;
	while (cap < need) {
		if (cap > SIZE_MAX / 2)
			return BODY_NOMEM;
		cap *= 2;
	}
	if (!charge(b, cap, max))
		return BODY_BUSY;
	p = realloc(b->data, cap);
	if (p == NULL)
		return BODY_NOMEM;	/* the charge goes with body_clear */
	b->data = p;
	b->cap = cap;
	return BODY_OK;
}

enum body_err body_add(struct body *b, const void *p, size_t n,
		       uint64_t max_buffered)
{
	enum body_err e = room(b, n, max_buffered);

	if (e == BODY_OK && n > 0) {
		memcpy(b->data + b->len, p, n);
		b->len += n;
	}
	return e;
}

enum body_err body_add_from(struct body *b, struct evbuffer *src, size_t n,
			    uint64_t max_buffered)
{
	enum body_err e = room(b, n, max_buffered);

	if (e != BODY_OK || n == 0)
		return e;
	if ((size_t)evbuffer_remove(src, b->data + b->len, n) != n)
		return BODY_NOMEM;
	b->len += n;
	return BODY_OK;
}

/* libevent is done with a lent block: it was written, or dropped. */
static void lent_done(const void *data, size_t len, void *charged)
{
	(void)len;
	free((void *)data);
	uncharge((uint64_t)(uintptr_t)charged);
}

int body_hand_over(struct body *b, struct evbuffer *out)
{
	if (b->len == 0) {
		body_clear(b);
		return 0;
	}
	if (evbuffer_add_reference(out, b->data, b->len, lent_done,
				   (void *)(uintptr_t)b->charged) < 0)
		return -1;
	b->data = NULL;
	b->len = b->cap = 0;
	b->charged = 0;
	b->sized = false;
	return 0;
}

void body_clear(struct body *b)
{
	free(b->data);
	uncharge(b->charged);
	memset(b, 0, sizeof(*b));
}
