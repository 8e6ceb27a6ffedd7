/*
 * test_h1.c - proxy/h1.c's head writer: pieces gathered and handed to the
 * evbuffer in one add, in order, whatever their sizes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "h1.h"
#include "tap.h"

static int adds;

static void count_adds(struct evbuffer *b, const struct evbuffer_cb_info *info,
		       void *arg)
{
	if (info->n_added > 0)
		adds++;
}

/* The bytes of b, NUL-terminated, freed by the caller; b is emptied. */
static char *drain(struct evbuffer *b, size_t *len)
{
	char *s = malloc(evbuffer_get_length(b) + 1);

	*len = evbuffer_get_length(b);
	evbuffer_remove(b, s, *len);
	s[*len] = '\0';
	return s;
}

static void test_one_add(struct evbuffer *b)
{
	struct h1_out o;
	size_t len;
	char *s;

	adds = 0;
	h1_out_init(&o, b);
	h1_status_line(&o, 201);
	h1_out_str(&o, "Content-Length: ");
	h1_out_dec(&o, 0);
	h1_out_add(&o, "\r\n\r\n", 4);
	is_int(adds, 0, "nothing reaches the buffer before the flush");
	h1_out_flush(&o);
	is_int(adds, 1, "a head reaches it in one add");
	s = drain(b, &len);
	is_str(s, "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
	       "status line, field, decimal zero, in order");
	free(s);
	adds = 0;
	h1_out_flush(&o);
	is_int(adds, 0, "an empty flush adds nothing");
}

static void test_decimal(struct evbuffer *b)
{
	struct h1_out o;
	size_t len;
	char *s;

	h1_out_init(&o, b);
	h1_out_dec(&o, UINT64_MAX);
	h1_out_add(&o, " ", 1);
	h1_out_dec(&o, 1024);
	h1_out_flush(&o);
	s = drain(b, &len);
	is_str(s, "18446744073709551615 1024", "the largest length and another");
	free(s);
}

/* Pieces around and beyond the writer's own space keep their order. */
static void test_sizes(struct evbuffer *b)
{
	static const size_t sizes[] = { 1, 4095, 4096, 4097, 9000, 3, 4094, 2 };
	size_t total = 0, len;
	struct h1_out o;
	char *want = malloc(40000), *piece = malloc(10000), *s;
	int bad = 0;

	h1_out_init(&o, b);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		memset(piece, 'a' + (int)i, sizes[i]);
		h1_out_add(&o, piece, sizes[i]);
		memcpy(want + total, piece, sizes[i]);
		total += sizes[i];
	}
	h1_out_flush(&o);
	s = drain(b, &len);
	is_int((int)len, (int)total, "every byte arrives");
	for (size_t i = 0; i < len && i < total; i++)
		bad += s[i] != want[i];
	is_int(bad, 0, "... in the order written");
	free(s);
	free(piece);
	free(want);
}

int main(void)
{
	struct evbuffer *b = evbuffer_new();

	evbuffer_add_cb(b, count_adds, NULL);
	test_one_add(b);
	test_decimal(b);
	test_sizes(b);
	evbuffer_free(b);
	return tap_done();
}
