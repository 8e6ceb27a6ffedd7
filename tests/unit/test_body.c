/*
 * test_body.c - proxy/body.c: the budget of buffered keyed bodies is
 * charged as bytes arrive, follows a body lent to an evbuffer, and comes
 * back when libevent lets go of it.
 */
#include <stdint.h>
#include <string.h>

#include <event2/buffer.h>

#include "body.h"
#include "tap.h"

static void test_declared(void)
{
	struct body b = {0};
	char chunk[1000];

	memset(chunk, 'd', sizeof(chunk));
	body_start(&b, 1 << 20);
	is_int((int)body_buffered(), 0, "a declared length charges nothing");
	is_int(body_add(&b, chunk, 10, 4096), BODY_OK, "10 bytes");
	is_int((int)body_buffered(), 10, "... charged as they arrive");
	is_int(body_add(&b, chunk, 1000, 4096), BODY_OK, "1,000 more");
	is_int((int)body_buffered(), 1010, "... charged");
	for (int i = 0; i < 3; i++)
		if (body_add(&b, chunk, 1000, 4096) != BODY_OK)
			break;
	is_int(body_add(&b, chunk, 1000, 4096), BODY_BUSY,
	       "over the budget: busy");
	is_int((int)body_buffered(), 4010, "a refused add charges nothing");
	body_clear(&b);
	is_int((int)body_buffered(), 0, "cleared: given back");
}

static void test_chunked_and_lent(void)
{
	struct body b = {0}, other = {0};
	struct evbuffer *out = evbuffer_new();
	char chunk[3000], flat[6000];

	memset(chunk, 'c', sizeof(chunk));
	body_start(&b, 0);
	is_int(body_add(&b, chunk, 3000, 1 << 20), BODY_OK, "3,000 bytes");
	is_int((int)body_buffered(), 4096, "a chunked block: all of it");
	is_int(body_add(&b, chunk, 3000, 1 << 20), BODY_OK, "3,000 more");
	is_int((int)body_buffered(), 8192, "doubled, charged in full");
	is_int(memcmp(body_data(&b), chunk, 3000), 0, "bytes kept");
	is_int(body_hand_over(&b, out), 0, "lent to an evbuffer");
	is_int((int)b.len, 0, "the body is empty");
	is_int((int)body_buffered(), 8192, "the charge follows the bytes");
	body_start(&other, 0);
	is_int(body_add(&other, chunk, 3000, 10000), BODY_BUSY,
	       "another body does not fit beside the lent one");
	is_int((int)evbuffer_get_length(out), 6000, "the evbuffer has them");
	evbuffer_remove(out, flat, 4000);
	is_int((int)body_buffered(), 8192, "partly written: still charged");
	evbuffer_remove(out, flat + 4000, 2000);
	is_int((int)body_buffered(), 0, "all written: given back");
	is_int(memcmp(flat, chunk, 3000) | memcmp(flat + 3000, chunk, 3000), 0,
	       "the bytes went out as they came");
	is_int(body_add(&b, chunk, 3000, 1 << 20), BODY_OK, "reused");
	is_int(body_hand_over(&b, out), 0, "lent again");
	evbuffer_free(out);
	is_int((int)body_buffered(), 0, "a dropped evbuffer gives it back");
	body_clear(&other);
}

int main(void)
{
	test_declared();
	test_chunked_and_lent();
	return tap_done();
}
