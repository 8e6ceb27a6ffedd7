/*
 * fuzz_fpshape.c - what a shaped fingerprint counts (common/fpshape.c): the
 * places a route's list names in a JSON body, and the media types a json or
 * form route shapes. fuzz_jcs.c checks the canonical form itself.
 *
 * Input: a mode byte, four pick bytes, then a body.
 *
 * Modes 0 and 1 (mode & 2 clear): fingerprint = json, and a
 * fingerprint_ignore (0) or fingerprint_only (1) list of up to three of the
 * body's own places (picks 0-2, by their number in a walk of the body; 0xff
 * picks none; mode & 4 adds pointers that name nothing: "-" and a leading
 * zero after an array). The place of pick 3 is given another value, and
 * - ignore: at or under a listed place the fingerprint stays, at a place
 *   neither under nor above one it changes;
 * - only: the other way round.
 * So every pointer names a place in the body as the client sent it,
 * whatever the others name (issue 44: removing /items/0 first made /items/1
 * remove what had been items[2], and items[1] still counted).
 *
 * Modes 2 and 3: fingerprint = json (2) or form (3), a Content-Type from
 * the table below (pick 0), and one byte of the body (at pick 1) replaced by
 * pick 2. A Content-Type that is not the shaping's media type falls back to
 * the raw bytes, so other bytes are another fingerprint (issue 44: a JSON or
 * text body on a form route had '+' and ' ' alike); the shaping's own type,
 * in any spelling, is no fallback for a JSON body jcs_parse() takes.
 */
#include <stdbool.h>
#include <string.h>

#include <event2/buffer.h>
#include <json-c/json.h>

#include "fpshape.h"
#include "fuzz.h"
#include "jcs.h"

#define PLACES_MAX 64
#define POINTER_MAX 120

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

/* The body's places in the order of a walk: each one's pointer, and where
 * it is, to give it another value. */
struct places {
	size_t n;
	struct {
		char pointer[POINTER_MAX];
		struct json_object *in;		/* object or array */
		const char *name;		/* a member's (json-c's key) */
		size_t index;			/* an element's */
		bool array;			/* its value is an array */
	} p[PLACES_MAX];
};

/* path + "/" + token escaped (RFC 6901: ~0 '~', ~1 '/') into out; false
 * when it does not fit or holds a comma (a list cannot name it). */
static bool pointer_join(char out[POINTER_MAX], const char *path,
			 const char *token)
{
	size_t n = strlen(path);

	if (n + 2 > POINTER_MAX)
		return false;
	memcpy(out, path, n);
	out[n++] = '/';
	for (const char *t = token; *t != '\0'; t++) {
		if (*t == ',' || n + 3 > POINTER_MAX)
			return false;
		if (*t == '~' || *t == '/') {
			out[n++] = '~';
			out[n++] = *t == '~' ? '0' : '1';
		} else {
			out[n++] = *t;
		}
	}
	out[n] = '\0';
	return true;
}

static void walk(struct places *ps, struct json_object *v, const char *path)
{
	char at[POINTER_MAX], num[24];

	if (json_object_is_type(v, json_type_object)) {
		json_object_object_foreach(v, name, member) {
			if (ps->n == PLACES_MAX || !pointer_join(at, path, name))
				continue;
			memcpy(ps->p[ps->n].pointer, at, sizeof(at));
			ps->p[ps->n].in = v;
			ps->p[ps->n].name = name;
			ps->p[ps->n++].array = json_object_is_type(member,
							 json_type_array);
			walk(ps, member, at);
		}
	} else if (json_object_is_type(v, json_type_array)) {
		for (size_t i = 0; i < json_object_array_length(v); i++) {
			struct json_object *e = json_object_array_get_idx(v, i);

			snprintf(num, sizeof(num), "%zu", i);
			if (ps->n == PLACES_MAX || !pointer_join(at, path, num))
				continue;
			memcpy(ps->p[ps->n].pointer, at, sizeof(at));
			ps->p[ps->n].in = v;
			ps->p[ps->n].name = NULL;
			ps->p[ps->n].index = i;
			ps->p[ps->n++].array = json_object_is_type(e,
							 json_type_array);
			walk(ps, e, at);
		}
	}
}

/* Is place q at place p or inside it? Tokens hold no '/', so a prefix
 * ending at a '/' is an ancestor. */
static bool within(const char *q, const char *p)
{
	size_t n = strlen(p);

	return strncmp(q, p, n) == 0 && (q[n] == '\0' || q[n] == '/');
}

static void fingerprint(const struct policy *p, const char *ctype,
			const char *body, size_t len, uint8_t fp[FP_LEN],
			bool *fallback)
{
	FUZZ_REQUIRE(fpshape_compute(p, "POST", "/p", ctype, body, len, fp,
				     fallback) == 0);
}

static void lists(uint8_t mode, const uint8_t pick[4], const uint8_t *data,
		  size_t size)
{
	struct json_object *root = jcs_parse((const char *)data, size);
	struct places *ps = NULL;
	struct evbuffer *text = NULL;
	struct policy p = { .fp_body = FP_BODY_JSON };
	const char *named[3], *q;
	char list[4 * POINTER_MAX + 16] = "", why[256];
	size_t nnamed = 0, qi;
	uint8_t a[FP_LEN], b[FP_LEN];
	bool fallback, in_named = false, above_named = false;
	struct json_object *other;

	if (root == NULL)
		return;
	ps = calloc(1, sizeof(*ps));
	FUZZ_REQUIRE(ps != NULL);
	walk(ps, root, "");
	if (ps->n == 0)
		goto out;
	for (int i = 0; i < 3; i++) {
		const char *ptr;

		if (pick[i] == 0xff)
			continue;
		ptr = ps->p[pick[i] % ps->n].pointer;
		if (strcmp(ptr, "/") == 0)
			continue;	/* the member "" of the body: not listable */
		named[nnamed++] = ptr;
		strcat(list, list[0] ? "," : "");
		strcat(list, ptr);
	}
	for (size_t i = 0; (mode & 4) && i < ps->n; i++) {
		if (!ps->p[i].array || strlen(ps->p[i].pointer) > 2 * POINTER_MAX / 3)
			continue;	/* names nothing: after an array */
		strcat(list, list[0] ? "," : "");
		strcat(list, ps->p[i].pointer);
		strcat(list, pick[0] & 1 ? "/-" : "/00");
		break;
	}
	if (list[0] == '\0')
		goto out;
	*(mode & 1 ? &p.fp_only : &p.fp_ignore) = list;
	if (fpshape_check(&p, why, sizeof(why)) < 0)
		goto out;
	fingerprint(&p, "application/json", (const char *)data, size, a,
		    &fallback);
	FUZZ_REQUIRE(!fallback);
	/* give q another value, then fingerprint the canonical text of that */
	qi = pick[3] % ps->n;
	q = ps->p[qi].pointer;
	for (size_t i = 0; i < nnamed; i++) {
		in_named = in_named || within(q, named[i]);
		above_named = above_named || within(named[i], q);
	}
	if (!in_named && above_named)
		goto out;	/* changes what is named and what is not */
	other = json_object_new_string("\x01q");
	FUZZ_REQUIRE(other != NULL);
	if (ps->p[qi].name != NULL) {
		struct json_object *was = NULL;

		(void)json_object_object_get_ex(ps->p[qi].in, ps->p[qi].name, &was);
		if (json_object_is_type(was, json_type_string) &&
		    strcmp(json_object_get_string(was), "\x01q") == 0)
			json_object_set_string(other, "\x01r");
		FUZZ_REQUIRE(json_object_object_add(ps->p[qi].in, ps->p[qi].name,
						    other) == 0);
	} else {
		struct json_object *was = json_object_array_get_idx(ps->p[qi].in,
								   ps->p[qi].index);

		if (json_object_is_type(was, json_type_string) &&
		    strcmp(json_object_get_string(was), "\x01q") == 0)
			json_object_set_string(other, "\x01r");
		FUZZ_REQUIRE(json_object_array_put_idx(ps->p[qi].in,
						       ps->p[qi].index, other) == 0);
	}
	text = evbuffer_new();
	FUZZ_REQUIRE(text != NULL && jcs_write(text, root) == 0);
	fingerprint(&p, "application/json",
		    (const char *)evbuffer_pullup(text, -1),
		    evbuffer_get_length(text), b, &fallback);
	FUZZ_REQUIRE(!fallback);
	if (in_named == !(mode & 1)) {
		/* ignore: a changed place that is ignored; only: one that is
		 * not listed */
		FUZZ_REQUIRE(memcmp(a, b, FP_LEN) == 0);
	} else {
		FUZZ_REQUIRE(memcmp(a, b, FP_LEN) != 0);
	}
out:
	if (text != NULL)
		evbuffer_free(text);
	free(ps);
	json_object_put(root);
}

static void media(uint8_t mode, const uint8_t pick[4], const uint8_t *data,
		  size_t size)
{
	static const struct {
		const char *type;
		bool json, form;	/* is it that media type? */
	} types[] = {
		{ NULL, false, false },
		{ "", false, false },
		{ "application/json", true, false },
		{ "Application/JSON ; charset=utf-8", true, false },
		{ "application/problem+json", true, false },
		{ "application/vnd.api+json;ext=x", true, false },
		{ "application/x-www-form-urlencoded", false, true },
		{ "APPLICATION/X-WWW-FORM-URLENCODED;charset=UTF-8", false, true },
		{ "\tapplication/x-www-form-urlencoded ", false, true },
		{ "text/plain", false, false },
		{ "text/plain; charset=utf-8", false, false },
		{ "multipart/form-data; boundary=x", false, false },
		{ "application/octet-stream", false, false },
		{ "application/jsonx", false, false },
		{ "application/json x", false, false },
		{ "application/+json", false, false },
		{ "application/x-www-form-urlencodedx", false, false },
		{ "json", false, false },
	};
	size_t t = pick[0] % (sizeof(types) / sizeof(types[0]));
	struct policy p = {
		.fp_body = mode & 1 ? FP_BODY_FORM : FP_BODY_JSON,
	};
	bool is = mode & 1 ? types[t].form : types[t].json, fallback;
	uint8_t a[FP_LEN], b[FP_LEN], *other;
	struct json_object *v;

	fingerprint(&p, types[t].type, (const char *)data, size, a, &fallback);
	if (is) {
		v = p.fp_body == FP_BODY_JSON ?
		    jcs_parse((const char *)data, size) : NULL;
		FUZZ_REQUIRE(v == NULL || !fallback);
		json_object_put(v);
		return;
	}
	FUZZ_REQUIRE(fallback);		/* not its media type: the bytes */
	if (size == 0 || data[pick[1] % size] == pick[2])
		return;
	other = malloc(size);
	FUZZ_REQUIRE(other != NULL);
	memcpy(other, data, size);
	other[pick[1] % size] = pick[2];
	fingerprint(&p, types[t].type, (const char *)other, size, b, &fallback);
	FUZZ_REQUIRE(fallback && memcmp(a, b, FP_LEN) != 0);
	free(other);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *body;

	if (size < 5 || (body = fuzz_copy(data, size, 5)) == NULL)
		return 0;
	if (data[0] & 2)
		media(data[0], data + 1, body, size - 5);
	else
		lists(data[0], data + 1, body, size - 5);
	free(body);
	return 0;
}
