/*
 * store.c - what every store backend shares: stored responses, owner
 * tokens, record ids and their keyed hash.
 */
#include "store.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/rand.h>

#include "hex.h"
#include "problem.h"
#include "siphash.h"

/* One block: the struct, then head and body, each NUL-terminated. */
struct stored_response *stored_response_new(int status, const char *head,
					    size_t head_len, const char *body,
					    size_t body_len, bool body_stored)
{
	struct stored_response *r;

	if (head_len > SIZE_MAX / 2 - sizeof(*r) || body_len > SIZE_MAX / 2)
		return NULL;
	r = malloc(sizeof(*r) + head_len + 1 + body_len + 1);
	if (r == NULL)
		return NULL;
	atomic_init(&r->refcount, 1);
	r->status = status;
	r->body_stored = body_stored;
	r->head = r->data;
	r->body = r->data + head_len + 1;
	if (head_len > 0)
		memcpy(r->head, head, head_len);
	r->head[head_len] = '\0';
	r->head_len = head_len;
	if (body_len > 0)
		memcpy(r->body, body, body_len);
	r->body[body_len] = '\0';
	r->body_len = body_len;
	r->unknown = false;
	return r;
}

struct stored_response *stored_response_unknown(const char *detail,
						const char *request_id)
{
	static const char head[] = "Content-Type: application/problem+json\r\n";
	struct stored_response *r;
	char body[2048];
	size_t len;

	if (detail == NULL)
		detail = "the request reached the upstream and its outcome is "
			 "unknown: the proxy executing it stopped (killed, "
			 "stalled or cut off from the store) before it recorded "
			 "the response; it may have executed. It is not sent "
			 "again: resolve it through the key API";
	len = problem_render_id(PROBLEM_OUTCOME_UNKNOWN, detail, request_id,
				body, sizeof(body));
	r = stored_response_new(problem_status(PROBLEM_OUTCOME_UNKNOWN), head,
				sizeof(head) - 1, body, len, true);
	if (r != NULL)
		r->unknown = true;
	return r;
}

struct stored_response *stored_response_ref(struct stored_response *r)
{
	atomic_fetch_add_explicit(&r->refcount, 1, memory_order_relaxed);
	return r;
}

void stored_response_unref(struct stored_response *r)
{
	if (r == NULL)
		return;
	if (atomic_fetch_sub_explicit(&r->refcount, 1, memory_order_acq_rel) != 1)
		return;
	free(r);
}

const char *store_status_name(enum store_status s)
{
	static const char *const names[] = {
		[STORE_WON] = "won", [STORE_COMPLETED] = "completed",
		[STORE_UNKNOWN] = "unknown",
		[STORE_IN_FLIGHT] = "in_flight", [STORE_MISMATCH] = "mismatch",
		[STORE_OK] = "ok", [STORE_FENCED] = "fenced",
		[STORE_SETTLED] = "settled", [STORE_FULL] = "full",
		[STORE_ABSENT] = "absent", [STORE_ERROR] = "error",
	};

	return names[s];
}

int64_t store_unix_ms(uint64_t at, uint64_t now)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 +
	       ((int64_t)at - (int64_t)now);
}

size_t store_id(const char *scope, size_t slen, const char *key, size_t klen,
		char buf[STORE_ID_MAX])
{
	memcpy(buf, scope, slen);
	buf[slen] = '\n';
	memcpy(buf + slen + 1, key, klen);
	buf[slen + 1 + klen] = '\0';
	return slen + 1 + klen;
}

size_t store_key_id(const struct store_key *k, char buf[STORE_ID_MAX])
{
	return store_id(k->scope, strlen(k->scope), k->key, strlen(k->key), buf);
}

/* The per-process key of store_id_hash(), drawn once, on first use. */
static uint8_t id_hash_key[SIPHASH_KEY_LEN];
static pthread_once_t id_hash_once = PTHREAD_ONCE_INIT;

static void id_hash_key_init(void)
{
	if (RAND_bytes(id_hash_key, sizeof(id_hash_key)) != 1) {
		/* a predictable key would make every table floodable */
		fputs("idemproxy: no random bytes for the record-id hash key\n",
		      stderr);
		abort();
	}
}

uint64_t store_id_hash(const char *id, size_t len)
{
	pthread_once(&id_hash_once, id_hash_key_init);
	return siphash24(id_hash_key, id, len);
}

/*
 * Owner tokens: 16 bytes no other claim gets and nobody can guess. Each
 * thread draws a SipHash key once and numbers its claims; a token is the
 * SipHash of its number under that key, for each half. RAND_bytes() per
 * claim cost a getpid() system call every time (OpenSSL's fork check),
 * in the memory store under its lock; idemproxy does not fork once running.
 */
struct owner_gen {
	uint8_t key[SIPHASH_KEY_LEN];
	uint64_t n;
	bool seeded;
};
static __thread struct owner_gen owner_gen;

int store_new_owner(char out[STORE_OWNER_LEN + 1])
{
	struct owner_gen *g = &owner_gen;
	unsigned char raw[STORE_OWNER_LEN / 2];

	if (!g->seeded) {
		if (RAND_bytes(g->key, sizeof(g->key)) != 1)
			return -1;
		g->seeded = true;
	}
	for (size_t half = 0; half < sizeof(raw) / 8; half++) {
		uint64_t in[2] = { g->n, half };
		uint64_t h = siphash24(g->key, in, sizeof(in));

		memcpy(raw + 8 * half, &h, 8);
	}
	g->n++;
	hex_encode(raw, sizeof(raw), out);	/* STORE_OWNER_LEN digits */
	return 0;
}
