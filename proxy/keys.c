/*
 * keys.c - a key as an operator addresses and sees it (see keys.h).
 */
#include "keys.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <json-c/json.h>
#include <openssl/evp.h>

#include "config.h"
#include "fingerprint.h"
#include "keyed.h"
#include "keysrc.h"

int keys_address(const struct config *cfg, const struct keys_query *q,
		 struct store_key *k, char *err, size_t errlen)
{
	const struct policy *p = cfg != NULL ? &cfg->routing.global : NULL;
	const char *prefix = "";
	const char *scope = q->scope;
	int i;

	if (q->route != NULL && cfg == NULL) {
		/* its key prefix and namespace are in the config: without
		 * them the name would address another record */
		snprintf(err, errlen, "--route needs --config FILE, the config "
			 "that defines the route");
		return -1;
	}
	if (q->route != NULL) {
		for (i = 0; i < cfg->routing.nroutes; i++)
			if (strcmp(cfg->routing.routes[i].name, q->route) == 0)
				break;
		if (i == cfg->routing.nroutes) {
			snprintf(err, errlen, "no route named \"%.100s\"", q->route);
			return -1;
		}
		p = &cfg->routing.routes[i].policy;
	}
	if (p != NULL) {
		prefix = p->key_prefix != NULL ? p->key_prefix : "";
		if (!policy_scoped(p) && scope != NULL) {
			snprintf(err, errlen, "%s%s has no scope (scope = "
				 "header:NAME, jwt:CLAIM, tls:...): leave out scope",
				 q->route != NULL ? "route " : "the global policy",
				 q->route != NULL ? q->route : "");
			return -1;
		}
		if (p->scope == SCOPE_HEADER && scope == NULL)
			scope = "";	/* the requests that came without it */
		if (policy_scoped(p) && p->scope != SCOPE_HEADER && scope == NULL) {
			snprintf(err, errlen, "route %s is scoped by %s: name the "
				 "caller with scope", q->route != NULL ? q->route :
				 "(global)", p->scope == SCOPE_JWT ? "a token's claim" :
				 "a client certificate");
			return -1;
		}
	}
	if (keysrc_finish_quoted(prefix, q->key, strlen(q->key), k->key) < 0) {
		snprintf(err, errlen, "not a valid key: 1 to %d printable ASCII "
			 "characters, with the route's prefix", IDEMKEY_MAX);
		return -1;
	}
	keyed_scope(q->route, p, scope, scope != NULL ? strlen(scope) : 0,
		    k->scope);
	return 0;
}

/* ---- JSON ---------------------------------------------------------------- */

static void add(json_object *o, const char *name, json_object *v)
{
	json_object_object_add(o, name, v);
}

static json_object *time_or_null(int64_t ms)
{
	char buf[40];
	time_t t = (time_t)(ms / 1000);
	struct tm tm;

	if (ms <= 0 || gmtime_r(&t, &tm) == NULL)
		return NULL;
	strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), ".%03dZ",
		 (int)(ms % 1000));
	return json_object_new_string(buf);
}

static json_object *places(unsigned bits)
{
	json_object *a = json_object_new_array();

	if (bits & STORE_IN_POSTGRES)
		json_object_array_add(a, json_object_new_string("postgres"));
	if (bits & STORE_IN_REDIS)
		json_object_array_add(a, json_object_new_string("redis"));
	if (bits & STORE_IN_MEMORY)
		json_object_array_add(a, json_object_new_string("memory"));
	return a;
}

/* Is s[0..len) UTF-8 that JSON can carry as a string? */
static bool utf8(const unsigned char *s, size_t len)
{
	size_t i = 0;

	while (i < len) {
		unsigned char c = s[i];
		size_t n;
		uint32_t cp;

		if (c == 0)
			return false;
		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			n = 1;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			n = 2;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			n = 3;
			cp = c & 0x07;
		} else {
			return false;
		}
		for (size_t j = 1; j <= n; j++) {
			if (i + j >= len || (s[i + j] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + j] & 0x3f);
		}
		if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
		    (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
			return false;
		i += n + 1;
	}
	return true;
}

/* The stored body as text when it is, else base64. */
static void add_body(json_object *o, const struct stored_response *r)
{
	unsigned char *b64;
	int n;

	if (utf8((const unsigned char *)r->body, r->body_len)) {
		add(o, "body", json_object_new_string_len(r->body,
							  (int)r->body_len));
		return;
	}
	b64 = malloc(4 * (r->body_len / 3 + 1) + 1);
	if (b64 == NULL)
		return;
	n = EVP_EncodeBlock(b64, (const unsigned char *)r->body,
			    (int)r->body_len);
	add(o, "body_base64", json_object_new_string_len((char *)b64, n));
	free(b64);
}

void keys_render(FILE *out, const struct keys_query *q,
		 const struct store_key *k, bool purge,
		 const struct store_result *res)
{
	const struct store_record *rec = &res->rec;
	json_object *o = json_object_new_object();
	char fp[2 * FP_LEN + 1];
	bool found = res->status == STORE_OK;

	add(o, "key", json_object_new_string(k->key));
	add(o, "scope", json_object_new_string(k->scope));
	add(o, "route", q->route != NULL ? json_object_new_string(q->route) : NULL);
	if (purge)
		add(o, "purged", json_object_new_boolean(found));
	if (found) {
		fp_hex(rec->fp, fp);
		add(o, "state", json_object_new_string(rec->unknown ? "unknown" :
						       rec->completed ? "completed" :
						       "in_flight"));
		add(o, "fingerprint", json_object_new_string(fp));
		add(o, "status", rec->completed && rec->status > 0 ?
				 json_object_new_int(rec->status) : NULL);
		add(o, "owner", rec->completed || rec->owner[0] == '\0' ? NULL :
				json_object_new_string(rec->owner));
		if (!purge) {
			add(o, "head_bytes", json_object_new_int64(
				(int64_t)rec->head_len));
			add(o, "body_bytes", json_object_new_int64(
				(int64_t)rec->body_len));
			add(o, "body_stored", json_object_new_boolean(
				rec->body_stored));
			add(o, "created", time_or_null(rec->created_ms));
			add(o, "expires", time_or_null(rec->expires_ms));
			add(o, "lease_until", rec->completed ? NULL :
					      time_or_null(rec->lease_until_ms));
		}
	}
	add(o, "found_in", places(found ? rec->found : 0));
	if (rec->unreached != 0)
		add(o, "unreachable", places(rec->unreached));
	if (found && q->body && !purge && res->resp != NULL) {
		add(o, "head", json_object_new_string_len(res->resp->head,
							  (int)res->resp->head_len));
		if (res->resp->body_stored)
			add_body(o, res->resp);
	}
	fputs(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY |
					     JSON_C_TO_STRING_SPACED |
					     JSON_C_TO_STRING_NOSLASHESCAPE), out);
	fputc('\n', out);
	json_object_put(o);
}
