/*
 * json_strict.h - the unit tests' reading of a JSON document the code
 * wrote (problem documents, access-log lines, OTLP bodies): json-c in its
 * strict mode, UTF-8 validated, the whole text one document.
 */
#ifndef IDEMPROXY_JSON_STRICT_H
#define IDEMPROXY_JSON_STRICT_H

#include <stdlib.h>

#include <json-c/json.h>

/* text[0..n) as one JSON document, or NULL when it is not one. */
static inline struct json_object *json_strict(const char *text, size_t n)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *v;

	if (tok == NULL)
		abort();
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT |
			       JSON_TOKENER_VALIDATE_UTF8);
	v = json_tokener_parse_ex(tok, text, (int)n);
	if (v != NULL && (json_tokener_get_error(tok) != json_tokener_success ||
			  json_tokener_get_parse_end(tok) != n)) {
		json_object_put(v);
		v = NULL;
	}
	json_tokener_free(tok);
	return v;
}

#endif
