/*
 * fuzz_jcs.c - the JSON canonicaliser (common/jcs.c) and the shaped
 * fingerprints built on it (common/fpshape.c).
 *
 * Input: one selector byte, then a body. Invariants:
 * - a body jcs_parse() takes is UTF-8 as RFC 3629 has it (no overlong
 *   form, no encoded surrogate, nothing beyond U+10FFFF), and has a
 *   canonical form that jcs_parse() takes too, which is its own canonical
 *   form (canonicalising is idempotent), and which parses to the same
 *   value: same types, names, strings, and numbers equal as doubles;
 * - fpshape_compute() never fails for want of anything but memory, and
 *   under the default shaping equals fp_compute().
 * The selector picks the shaping: body json/form/raw, query
 * exact/sorted/ignore, an ignore or only list. The target is "/p?" and the
 * body's first bytes (NULs and blanks replaced), so that sorted queries
 * see the same bytes.
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include <event2/buffer.h>
#include <json-c/json.h>

#include "fpshape.h"
#include "fuzz.h"
#include "jcs.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

static double number(struct json_object *v)
{
	if (json_object_is_type(v, json_type_double))
		return json_object_get_double(v);
	return json_object_get_int64(v) < 0 ? (double)json_object_get_int64(v) :
					       (double)json_object_get_uint64(v);
}

static bool is_number(struct json_object *v)
{
	return json_object_is_type(v, json_type_int) ||
	       json_object_is_type(v, json_type_double);
}

/* The same JSON value, numbers compared as JCS sees them. */
static bool same_value(struct json_object *a, struct json_object *b)
{
	if (is_number(a) || is_number(b))
		return is_number(a) && is_number(b) && number(a) == number(b);
	if (json_object_get_type(a) != json_object_get_type(b))
		return false;
	switch (json_object_get_type(a)) {
	case json_type_boolean:
		return json_object_get_boolean(a) == json_object_get_boolean(b);
	case json_type_string:
		return json_object_get_string_len(a) == json_object_get_string_len(b) &&
		       memcmp(json_object_get_string(a), json_object_get_string(b),
			      (size_t)json_object_get_string_len(a)) == 0;
	case json_type_array:
		if (json_object_array_length(a) != json_object_array_length(b))
			return false;
		for (size_t i = 0; i < json_object_array_length(a); i++)
			if (!same_value(json_object_array_get_idx(a, i),
					json_object_array_get_idx(b, i)))
				return false;
		return true;
	case json_type_object: {
		if (json_object_object_length(a) != json_object_object_length(b))
			return false;
		json_object_object_foreach(a, name, va) {
			struct json_object *vb = NULL;

			if (!json_object_object_get_ex(b, name, &vb) ||
			    !same_value(va, vb))
				return false;
		}
		return true;
	}
	default:
		return true;
	}
}

/* Is s[0..n) UTF-8 as RFC 3629 has it? Each sequence decoded and its code
 * point checked (jsontext.c checks the bytes instead). */
static bool utf8_valid(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		/* by the bits of the lead byte: the length, the smallest code
		 * point of that length */
		static const uint32_t min[] = { 0, 0, 0x80, 0x800, 0x10000 };
		size_t k = s[i] < 0x80 ? 1 : (s[i] & 0xe0) == 0xc0 ? 2 :
			   (s[i] & 0xf0) == 0xe0 ? 3 : (s[i] & 0xf8) == 0xf0 ? 4 : 0;
		uint32_t cp = s[i] & (0x7fu >> k);

		if (k == 1) {
			i++;
			continue;
		}
		if (k == 0)
			return false;	/* a continuation byte, F8 and up */
		if (n - i < k)
			return false;
		for (size_t j = 1; j < k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + j] & 0x3fu);
		}
		if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += k;
	}
	return true;
}

static void canonical(const uint8_t *data, size_t size)
{
	struct json_object *v = jcs_parse((const char *)data, size), *v2, *v3;
	struct evbuffer *c1, *c2;
	size_t n;

	if (v == NULL)
		return;
	FUZZ_REQUIRE(utf8_valid(data, size));	/* no other bytes are taken */
	c1 = evbuffer_new();
	c2 = evbuffer_new();
	FUZZ_REQUIRE(c1 != NULL && c2 != NULL);
	FUZZ_REQUIRE(jcs_write(c1, v) == 0);
	n = evbuffer_get_length(c1);
	v2 = jcs_parse((const char *)evbuffer_pullup(c1, -1), n);
	FUZZ_REQUIRE(v2 != NULL);		/* the canonical form is JSON */
	FUZZ_REQUIRE(same_value(v, v2));	/* ... of the same value */
	FUZZ_REQUIRE(jcs_write(c2, v2) == 0);
	FUZZ_REQUIRE(evbuffer_get_length(c2) == n &&	/* ... and canonical */
		     memcmp(evbuffer_pullup(c1, -1), evbuffer_pullup(c2, -1), n) == 0);
	v3 = jcs_parse((const char *)evbuffer_pullup(c2, -1), n);
	FUZZ_REQUIRE(v3 != NULL && same_value(v2, v3));
	json_object_put(v);
	json_object_put(v2);
	json_object_put(v3);
	evbuffer_free(c1);
	evbuffer_free(c2);
}

static void shaped(uint8_t sel, const uint8_t *data, size_t size)
{
	static const char *const lists[] = {
		"/a,/b/0,/c~1d,/e~0", "/a", "a,b,sign", "/x/y/z,/0",
	};
	/* each body shaping's own media type (fuzz_fpshape.c tries others) */
	static const char *const media[] = {
		[FP_BODY_RAW] = NULL, [FP_BODY_JSON] = "application/json",
		[FP_BODY_FORM] = "application/x-www-form-urlencoded",
	};
	struct policy p = {
		.fp_body = (enum fp_body)(sel % 3),
		.fp_query = (enum fp_query)(sel / 3 % 3),
	};
	const char *list = lists[sel / 9 % 4];
	char target[80] = "/p?", why[256];
	uint8_t a[FP_LEN], b[FP_LEN];
	bool fallback;
	size_t t = 3;

	if (p.fp_body != FP_BODY_RAW && (sel & 0x80))
		*(sel & 0x40 ? &p.fp_only : &p.fp_ignore) = (char *)list;
	if (fpshape_check(&p, why, sizeof(why)) < 0)
		return;		/* a config error: never a running shaping */
	for (size_t i = 0; i < size && t < sizeof(target) - 1; i++, t++)
		target[t] = data[i] > 0x20 && data[i] < 0x7f ? (char)data[i] : 'x';
	target[t] = '\0';
	FUZZ_REQUIRE(fpshape_compute(&p, "POST", target, media[p.fp_body],
				     (const char *)data, size, a,
				     &fallback) == 0);
	FUZZ_REQUIRE(!fallback || p.fp_body != FP_BODY_RAW);
	if (fpshape_is_default(&p)) {
		struct iovec v = { (void *)data, size };

		FUZZ_REQUIRE(fp_compute("POST", target, &v, size > 0, b) == 0);
		FUZZ_REQUIRE(memcmp(a, b, FP_LEN) == 0);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *body;

	if (size < 1 || (body = fuzz_copy(data, size, 1)) == NULL)
		return 0;
	canonical(body, size - 1);
	shaped(data[0], body, size - 1);
	free(body);
	return 0;
}
