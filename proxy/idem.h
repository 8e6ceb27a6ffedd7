/*
 * idem.h - the idempotency engine: one struct idem per keyed request, from
 * the claim to the last store write (see idem.c for the flow).
 *
 * The client connection hands over a fully buffered request and gets the
 * outcome through struct idem_sink. A winner's exchange with the upstream
 * belongs to the engine, not to the connection, so that it finishes and
 * completes the record when the client disconnects (DESIGN.md §1 item 9).
 */
#ifndef IDEMPROXY_IDEM_H
#define IDEMPROXY_IDEM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <time.h>

#include "config.h"
#include "metrics.h"
#include "problem.h"
#include "store.h"
#include "upstream.h"

struct evbuffer;
struct event_base;
struct idem;
struct reqlog;

TAILQ_HEAD(idem_list, idem);

/* What a worker lends the engine. */
struct idem_env {
	struct event_base *base;
	struct upstream_pool *pool;
	struct store *store;
	/* engines no longer attached to a client but still working
	 * (forwarding or writing the outcome); the worker drains them */
	struct idem_list orphans;
	int norphans;
	int noverdue;		/* of them: writing an outcome past the lease */
	void (*orphans_changed)(void *arg);
	void *orphans_arg;
	/* engines that ended, freed by the next loop turn (idem.c) */
	struct idem_list done;
	struct event *reap;
};

/* Set up an env on the worker's loop (orphans_changed is the worker's to
 * set). 0 or -1. idem_env_free() ends every engine still there. */
int idem_env_init(struct idem_env *env, struct event_base *base,
		  struct upstream_pool *pool, struct store *store) MUSTCHECK;
void idem_env_free(struct idem_env *env);

/*
 * The client side of a keyed request, implemented by conn.c. replay and
 * problem are final: after them the engine never calls the client again.
 * done and failed end the response; settled follows once the outcome is
 * recorded in the store (or given up), and is the last call.
 */
struct idem_sink {
	void (*replay)(void *client, struct stored_response *r);
	void (*problem)(void *client, enum problem p, const char *detail,
			enum outcome o);
	/* the winner is about to be forwarded (or fail-open) */
	void (*forwarding)(void *client, enum outcome o);
	void (*head)(void *client, const struct upstream_resp *r);
	/* returns true when the client's output is full: pause the upstream */
	bool (*body)(void *client, struct evbuffer *src, size_t len);
	void (*done)(void *client);
	/* the exchange failed, or its head is late (504): answer p */
	void (*failed)(void *client, enum problem p, const char *detail);
	void (*settled)(void *client);
};

struct idem_request {
	struct store_claim claim;	/* key, fingerprint, lease, ttl */
	/* the settings the request is handled under: the route's policy (or
	 * the global one) inside cfg, of which the engine holds a reference
	 * for as long as it lives (it may outlive the connection) */
	struct config *cfg;
	const struct policy *policy;
	bool head_method;		/* HEAD: the response has no body */
	bool unprotected;		/* no key to be had: just forward it */
	/* require_issued_key: the key must have been issued by this proxy
	 * (issue.c): its marker, and its issue time */
	char issued_key[IDEMKEY_MAX + 1];	/* the key without key_prefix */
	time_t issued_at;		/* from the key; 0: not one of ours */
	struct evbuffer *request;	/* head + body for the upstream; taken */
	struct reqlog *rl;		/* the client's record (reqlog.h), marked
					 * while the client is attached; NULL */
};

/* Start the claim; the engine takes req->request and a reference to
 * req->cfg. Returns NULL (request freed) when out of memory. */
struct idem *idem_start(struct idem_env *env, struct idem_request *req,
			const struct idem_sink *sink, void *client);
/*
 * The client is gone: the engine stops waiting, or goes on executing as an
 * orphan. Only the engine's pointer to the client is cleared here (the
 * caller clears its own); the engine is never freed inside this call.
 */
void idem_detach(struct idem *ix);
/* The client's output drained: read the upstream again. */
void idem_resume(struct idem *ix);
/* Drain timeout: abandon every orphan of env (their leases run out, and
 * the keys of those that reached the upstream become unknown outcomes). */
void idem_abort_orphans(struct idem_env *env);

#endif
