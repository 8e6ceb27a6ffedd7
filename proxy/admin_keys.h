/*
 * admin_keys.h - GET and DELETE /keys/{key} on the admin listener.
 *
 *   GET    /keys/{key}[?route=R][&scope=S][&body=1]  the record (keys.h)
 *   DELETE /keys/{key}[?route=R][&scope=S]           purge it everywhere
 *
 * DELETE, and GET with body=1 (stored responses can be private), need
 * "Authorization: Bearer <token>" with the token of --admin-token-file
 * (compared in constant time); without that option they are off (403).
 * Every DELETE, and every refused one, is logged as an audit line. The
 * store call is cancelled if the admin connection closes first.
 */
#ifndef IDEMPROXY_ADMIN_KEYS_H
#define IDEMPROXY_ADMIN_KEYS_H

#include <stddef.h>

#include "compiler.h"

struct admin_keys;
struct config;
struct event_base;
struct evhttp_request;
struct store;

struct admin_keys *admin_keys_new(struct event_base *base, struct store *store);

/* Take cfg (a reference) for routes, and read its token file. On -1 (the
 * file cannot be read or is empty; message in err) the running config
 * and token stay. */
int admin_keys_set_config(struct admin_keys *ak, struct config *cfg, char *err,
			  size_t errlen) MUSTCHECK;

/* The token of --admin-token-file: its first line, surrounding blanks
 * removed, as a SHA-256 digest. 0, or -1 with a message in err. */
int admin_token_read(const char *path, unsigned char md[32], char *err,
		     size_t errlen) MUSTCHECK;

/* A request for /keys/<rest> (rest: the path after "/keys/", raw). */
void admin_keys_handle(struct admin_keys *ak, struct evhttp_request *req,
		       const char *rest);

/* Cancels the store calls still pending (their requests are answered
 * 503 by no one: the listener is going away with them). */
void admin_keys_free(struct admin_keys *ak);

#endif
