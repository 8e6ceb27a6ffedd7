/*
 * The request fingerprint (common/fingerprint.c): distinct requests get
 * distinct fingerprints, the body's split into pieces does not matter, and
 * fixed vectors computed independently (Python hashlib, from the definition
 * in fingerprint.c / docs) pin the encoding byte for byte:
 *
 *   SHA-256( "idemproxy-fingerprint-v1" NUL
 *            be64(len method) method  be64(len target) target
 *            be64(len body) body )
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"
#include "fpshape.h"
#include "tap.h"

static void fp_str(const char *method, const char *target, const char *body,
		   size_t body_len, char hex[2 * FP_LEN + 1])
{
	uint8_t fp[FP_LEN];
	struct iovec iov = { (void *)body, body_len };

	if (fp_compute(method, target, &iov, body_len ? 1 : 0, fp) != 0) {
		strcpy(hex, "error");
		return;
	}
	fp_hex(fp, hex);
}

static void test_vectors(void)
{
	char hex[2 * FP_LEN + 1];
	const char *body = "{\"amount\":100}";

	fp_str("POST", "/orders?x=1", body, strlen(body), hex);
	is_str(hex, "371edc5672745cc0c509ff1274634c85ddde80e3b068a2d1e4c6e4cbe2ac3dfa",
	       "vector: POST /orders?x=1 {\"amount\":100}");
	/* the vectors of docs/protocol.md */
	fp_str("POST", "/orders?x=1", "{\"item\":42}", 11, hex);
	is_str(hex, "6eaaefde9ff81f3a571323aba830e64a5835d9f1d4a4518058d3556f88873e25",
	       "docs/protocol.md vector 1");
	fp_str("POST", "/orders", "", 0, hex);
	is_str(hex, "74da9b5b838f0001c4db8a33d2a6b49d91f8d9df1e21fde8ab356fa7421ec359",
	       "docs/protocol.md vector 2");
	fp_str("POST", "/", "", 0, hex);
	is_str(hex, "a0ba47661caaebc61dfd26b0953ac84e16698a221a4038b074d3d49d2806338a",
	       "vector: POST / with an empty body");
}

static void test_distinct(void)
{
	char a[2 * FP_LEN + 1], b[2 * FP_LEN + 1];

	fp_str("POST", "/pay", "amount=1", 8, a);
	fp_str("PATCH", "/pay", "amount=1", 8, b);
	ok(strcmp(a, b) != 0, "different method, different fp");
	fp_str("POST", "/pay?x", "amount=1", 8, b);
	ok(strcmp(a, b) != 0, "different target, different fp");
	fp_str("POST", "/Pay", "amount=1", 8, b);
	ok(strcmp(a, b) != 0, "target is case-sensitive (raw)");
	fp_str("POST", "/pay", "amount=2", 8, b);
	ok(strcmp(a, b) != 0, "different body, different fp");
	fp_str("POST", "/pay", "amount=1 ", 9, b);
	ok(strcmp(a, b) != 0, "one more body byte, different fp");
	fp_str("POST", "/pay", "amount=1", 8, b);
	is_str(a, b, "same request, same fp");

	/* length prefixes: moving bytes across field boundaries changes it */
	fp_str("POST", "/ab", "", 0, a);
	fp_str("POST", "/a", "b", 1, b);
	ok(strcmp(a, b) != 0, "target/body boundary is encoded");
	fp_str("POS", "T/a", "", 0, a);
	fp_str("POST", "/a", "", 0, b);
	ok(strcmp(a, b) != 0, "method/target boundary is encoded");

	/* a body holding NUL bytes counts all of them */
	fp_str("POST", "/b", "a\0b", 3, a);
	fp_str("POST", "/b", "a\0c", 3, b);
	ok(strcmp(a, b) != 0, "bytes after a NUL in the body count");
	fp_str("POST", "/b", "a", 1, b);
	ok(strcmp(a, b) != 0, "body is not a C string");
}

static void test_pieces(void)
{
	static char body[10000];
	uint8_t one[FP_LEN], many[FP_LEN], empty_pieces[FP_LEN], none[FP_LEN];
	struct iovec whole = { body, sizeof(body) };
	struct iovec parts[7];
	size_t cuts[] = { 0, 1, 100, 4096, 4097, 9000, 9999, 10000 };
	struct iovec empties[2] = { { body, 0 }, { body, 0 } };

	for (size_t i = 0; i < sizeof(body); i++)
		body[i] = (char)(i * 7 + 3);
	ok(fp_compute("POST", "/p", &whole, 1, one) == 0, "whole body");
	for (int i = 0; i < 7; i++) {
		parts[i].iov_base = body + cuts[i];
		parts[i].iov_len = cuts[i + 1] - cuts[i];
	}
	ok(fp_compute("POST", "/p", parts, 7, many) == 0, "body in 7 pieces");
	ok(memcmp(one, many, FP_LEN) == 0, "pieces give the same fp as the whole");
	ok(fp_compute("POST", "/p", empties, 2, empty_pieces) == 0 &&
	   fp_compute("POST", "/p", NULL, 0, none) == 0, "empty bodies");
	ok(memcmp(empty_pieces, none, FP_LEN) == 0,
	   "zero-length pieces = no body at all");
}

static void test_hex(void)
{
	uint8_t fp[FP_LEN];
	char hex[2 * FP_LEN + 1];

	for (int i = 0; i < FP_LEN; i++)
		fp[i] = (uint8_t)(i * 8 + 0x0f);
	fp_hex(fp, hex);
	is_int(strlen(hex), 64, "hex is 64 characters");
	ok(strncmp(hex, "0f171f27", 8) == 0 && strcmp(hex + 60, "ff07") == 0,
	   "lower-case hex, in order: %s", hex);
}


/* ---- shaped fingerprints (common/fpshape.c) -------------------------------- */

/* A policy shaping as given; lists as fpshape_list() leaves them. */
static struct policy shape(enum fp_body b, enum fp_query q, const char *ignore,
			   const char *only)
{
	struct policy p = { .fp_body = b, .fp_query = q,
			    .fp_ignore = (char *)ignore, .fp_only = (char *)only };

	return p;
}

/* The fingerprint of a request with Content-Type ctype (NULL: none). */
static void shaped_ct(const struct policy *p, const char *ctype,
		      const char *target, const char *body,
		      char hex[2 * FP_LEN + 1], bool *fallback)
{
	uint8_t fp[FP_LEN];
	bool fb = false;

	if (fpshape_compute(p, "POST", target, ctype, body, strlen(body), fp,
			    &fb) != 0) {
		strcpy(hex, "error");
		return;
	}
	fp_hex(fp, hex);
	if (fallback != NULL)
		*fallback = fb;
}

/* ... with the Content-Type of p's body shaping. */
static void shaped(const struct policy *p, const char *target, const char *body,
		   char hex[2 * FP_LEN + 1], bool *fallback)
{
	shaped_ct(p, p->fp_body == FP_BODY_JSON ? "application/json" :
		     p->fp_body == FP_BODY_FORM ?
		     "application/x-www-form-urlencoded" : NULL,
		  target, body, hex, fallback);
}

/* Do two requests fingerprint alike under p? */
static bool same(const struct policy *p, const char *t1, const char *b1,
		 const char *t2, const char *b2)
{
	char x[2 * FP_LEN + 1], y[2 * FP_LEN + 1];

	shaped(p, t1, b1, x, NULL);
	shaped(p, t2, b2, y, NULL);
	return strcmp(x, "error") != 0 && strcmp(x, y) == 0;
}

/* ... with Content-Type ctype for both. */
static bool same_ct(const struct policy *p, const char *ctype, const char *b1,
		    const char *b2)
{
	char x[2 * FP_LEN + 1], y[2 * FP_LEN + 1];

	shaped_ct(p, ctype, "/p", b1, x, NULL);
	shaped_ct(p, ctype, "/p", b2, y, NULL);
	return strcmp(x, "error") != 0 && strcmp(x, y) == 0;
}

static void test_shaped_vectors(void)
{
	struct policy def = shape(FP_BODY_RAW, FP_QUERY_EXACT, NULL, NULL);
	struct policy js = shape(FP_BODY_JSON, FP_QUERY_SORTED, NULL, NULL);
	struct policy ali = shape(FP_BODY_FORM, FP_QUERY_EXACT,
				  "notify_time,notify_id,sign,sign_type", NULL);
	char hex[2 * FP_LEN + 1];

	shaped(&def, "/orders?x=1", "{\"item\":42}", hex, NULL);
	is_str(hex, "6eaaefde9ff81f3a571323aba830e64a5835d9f1d4a4518058d3556f88873e25",
	       "the default shaping is fp_compute's: docs/protocol.md vector 1");
	/* docs/protocol.md "Shaped fingerprints", from Python's hashlib */
	shaped(&js, "/orders?b=2&a=1", "{ \"b\": 2, \"a\": 1.0 }", hex, NULL);
	is_str(hex, "4131c3ddbf635abab641339722e57465a199359d3115b8c01653b68e6afe14ce",
	       "shaped vector 1: json, sorted query");
	shaped(&ali, "/alipay/notify", "notify_time=2026-12-05+10%3A00%3A00&"
	       "total_amount=9.90&sign_type=RSA2&out_trade_no=T1&sign=abc%2B%3D&"
	       "notify_id=n1", hex, NULL);
	is_str(hex, "09730dd3b999f2c20dedaa08e45e86c26085afc5d713d43493a22f3b6a9255a2",
	       "shaped vector 2: an Alipay notification, form, ignore");
}

static void test_shaped_json(void)
{
	struct policy js = shape(FP_BODY_JSON, FP_QUERY_EXACT, NULL, NULL);
	struct policy ig = shape(FP_BODY_JSON, FP_QUERY_EXACT,
				 "/sent_at,/meta/nonce,/items/0/tmp,/a~1b", NULL);
	struct policy only = shape(FP_BODY_JSON, FP_QUERY_EXACT, NULL,
				   "/amount,/currency");
	char hex[2 * FP_LEN + 1];
	bool fb;

	ok(same(&js, "/o", "{\"a\":1,\"b\":[1,2]}", "/o",
		"{ \"b\" : [1, 2.0], \"a\" : 1 }"),
	   "json: member order, spacing and number spelling do not count");
	ok(!same(&js, "/o", "{\"a\":1,\"b\":[1,2]}", "/o", "{\"a\":1,\"b\":[2,1]}"),
	   "json: array order counts");
	ok(!same(&js, "/o", "{\"a\":1}", "/o", "{\"a\":\"1\"}"),
	   "json: 1 and \"1\" differ");
	ok(!same(&js, "/o?x=1", "{}", "/o?x=2", "{}"),
	   "json: the target still counts");
	ok(same(&ig, "/o", "{\"amount\":5,\"sent_at\":1,\"meta\":{\"nonce\":\"a\",\"k\":1}}",
		"/o", "{\"meta\":{\"k\":1,\"nonce\":\"b\"},\"amount\":5,\"sent_at\":2}"),
	   "json ignore: /sent_at and /meta/nonce left out");
	ok(same(&ig, "/o", "{\"amount\":5}", "/o", "{\"amount\":5,\"sent_at\":9}"),
	   "json ignore: a missing member is the same as an ignored one");
	ok(!same(&ig, "/o", "{\"amount\":5,\"sent_at\":1}", "/o",
		 "{\"amount\":6,\"sent_at\":1}"),
	   "json ignore: a changed amount still counts");
	ok(!same(&ig, "/o", "{\"meta\":{\"k\":1}}", "/o", "{\"meta\":{\"k\":2}}"),
	   "json ignore: a sibling of an ignored member still counts");
	ok(same(&ig, "/o", "{\"items\":[{\"tmp\":1,\"n\":2}],\"a/b\":1}", "/o",
		"{\"items\":[{\"tmp\":7,\"n\":2}],\"a/b\":2}"),
	   "json ignore: array elements and ~1 escapes");
	ok(same(&only, "/o", "{\"amount\":5,\"currency\":\"EUR\",\"note\":\"x\"}", "/o",
		"{\"note\":\"y\",\"currency\":\"EUR\",\"amount\":5.0}"),
	   "json only: other members do not count");
	ok(!same(&only, "/o", "{\"amount\":5,\"currency\":\"EUR\"}", "/o",
		 "{\"amount\":5,\"currency\":\"USD\"}"),
	   "json only: a listed member counts");
	ok(!same(&only, "/o", "{\"amount\":5}", "/o", "{\"amount\":5,\"currency\":null}"),
	   "json only: missing and null differ");
	ok(!same(&only, "/o", "{\"amount\":{\"v\":1}}", "/o", "{\"amount\":{\"v\":2}}"),
	   "json only: the whole value under a pointer counts");
	shaped(&js, "/o", "{not json", hex, &fb);
	ok(fb, "json: a body that is not JSON falls back to its bytes");
	ok(!same(&js, "/o", "{not json", "/o", "{not  json"),
	   "json fallback: different bytes differ");
	ok(same(&js, "/o", "{not json", "/o", "{not json"),
	   "json fallback: the same bytes are the same request");
	ok(!same(&js, "/o", "{\"a\":1,\"a\":2}", "/o", "{\"a\":2}"),
	   "json: a member named twice falls back, never matches its last value");
	shaped(&js, "/o", "{\"a\":1}", hex, &fb);
	ok(!fb, "json: valid JSON is no fallback");
}

/* {"items":[{"amount":a},{"amount":b},{"amount":c}]} into buf. */
static const char *items3(char buf[128], int a, int b, int c)
{
	snprintf(buf, 128, "{\"items\":[{\"amount\":%d},{\"amount\":%d},"
		 "{\"amount\":%d}]}", a, b, c);
	return buf;
}

/* Two lines, each with its sent_at stamp and its sku, into buf. */
static const char *lines2(char buf[128], int stamp0, const char *sku0,
			  int stamp1, const char *sku1)
{
	snprintf(buf, 128, "{\"lines\":[{\"sent_at\":%d,\"sku\":\"%s\"},"
		 "{\"sent_at\":%d,\"sku\":\"%s\"}]}", stamp0, sku0, stamp1, sku1);
	return buf;
}

/*
 * Issue 44: every pointer of a list names a place in the body as the
 * client sent it, whatever the others name. d99a8fe removed them one at a
 * time from the tree it was changing: after /items/0, /items/1 named what
 * had been items[2].
 */
static void test_shaped_json_places(void)
{
	struct policy two = shape(FP_BODY_JSON, FP_QUERY_EXACT, "/items/0,/items/1",
				  NULL);
	struct policy rev = shape(FP_BODY_JSON, FP_QUERY_EXACT, "/items/1,/items/0",
				  NULL);
	struct policy twice = shape(FP_BODY_JSON, FP_QUERY_EXACT,
				    "/items/0,/items/0", NULL);
	struct policy under = shape(FP_BODY_JSON, FP_QUERY_EXACT,
				    "/lines/0,/lines/1/sent_at", NULL);
	struct policy stamps = shape(FP_BODY_JSON, FP_QUERY_EXACT,
				     "/lines/0/sent_at,/lines/1/sent_at", NULL);
	struct policy inside = shape(FP_BODY_JSON, FP_QUERY_EXACT,
				     "/items/0,/items/0/amount", NULL);
	struct policy over = shape(FP_BODY_JSON, FP_QUERY_EXACT,
				   "/items/0/amount,/items", NULL);
	struct policy none = shape(FP_BODY_JSON, FP_QUERY_EXACT,
				   "/items/-,/items/01,/items/3,/items/x,/no/0",
				   NULL);
	struct policy esc = shape(FP_BODY_JSON, FP_QUERY_EXACT,
				  "/a~1b/0,/a~1b/1,/~01", NULL);
	struct policy nest = shape(FP_BODY_JSON, FP_QUERY_EXACT,
				   "/m/0/0,/m/0/1,/m/1", NULL);
	struct policy only = shape(FP_BODY_JSON, FP_QUERY_EXACT, NULL,
				   "/items/0,/items/2");
	char x[128], y[128];

	ok(!same(&two, "/o", items3(x, 1, 2, 1), "/o", items3(y, 1, 2, 1000)),
	   "ignore /items/0,/items/1: items[2] still counts (issue 44)");
	ok(same(&two, "/o", items3(x, 1, 2, 1), "/o", items3(y, 1, 99, 1)),
	   "ignore /items/0,/items/1: items[1] does not count (issue 44)");
	ok(!same(&rev, "/o", items3(x, 1, 2, 1), "/o", items3(y, 1, 2, 1000)) &&
	   same(&rev, "/o", items3(x, 1, 2, 1), "/o", items3(y, 7, 99, 1)),
	   "ignore /items/1,/items/0: the order of the list does not matter");
	ok(!same(&two, "/o", "[1,2,3]", "/o", "[1,2,4]") &&
	   same(&two, "/o", "{\"items\":[1,2]}", "/o", "{\"items\":[3,4]}") &&
	   !same(&two, "/o", "{\"items\":[1,2]}", "/o", "{\"items\":[3,4,5]}"),
	   "ignore /items/0,/items/1: what is left is what was after them");
	ok(!same(&twice, "/o", items3(x, 1, 2, 1), "/o", items3(y, 1, 3, 1)),
	   "a pointer listed twice removes its place once");
	ok(same(&under, "/o", lines2(x, 1, "a", 1, "b"), "/o",
		lines2(y, 2, "a", 2, "b")),
	   "ignore /lines/0,/lines/1/sent_at: a re-stamped lines[1] replays "
	   "(issue 44)");
	ok(!same(&under, "/o", lines2(x, 1, "a", 1, "b"), "/o",
		 lines2(y, 1, "a", 1, "c")),
	   "ignore /lines/0,/lines/1/sent_at: lines[1].sku counts");
	ok(same(&stamps, "/o", lines2(x, 1, "a", 1, "b"), "/o",
		lines2(y, 1, "a", 5, "b")) &&
	   !same(&stamps, "/o", lines2(x, 1, "a", 1, "b"), "/o",
		 lines2(y, 1, "x", 1, "b")),
	   "ignore /lines/0/sent_at,/lines/1/sent_at: the stamps, not the skus");
	ok(!same(&inside, "/o", items3(x, 1, 2, 1), "/o", items3(y, 5, 3, 1)) &&
	   same(&inside, "/o", items3(x, 1, 2, 1), "/o", items3(y, 5, 2, 1)),
	   "a pointer under a removed element names nothing else (items[1] "
	   "counts)");
	ok(same(&over, "/o", "{\"items\":[{\"amount\":1}],\"n\":1}", "/o",
		"{\"n\":1}") &&
	   !same(&over, "/o", "{\"items\":[],\"n\":1}", "/o", "{\"n\":2}"),
	   "a pointer under another that is removed: both go, nothing else");
	ok(!same(&none, "/o", items3(x, 1, 2, 1), "/o", items3(y, 1, 2, 2)) &&
	   !same(&none, "/o", items3(x, 1, 2, 1), "/o", items3(y, 0, 2, 1)) &&
	   !same(&none, "/o", items3(x, 1, 2, 1), "/o", items3(y, 1, 0, 1)),
	   "\"-\", a leading zero, an index past the end, a member of an "
	   "array name no element");
	ok(same(&none, "/o", "{\"items\":{\"-\":1,\"01\":1,\"x\":1,\"y\":1}}",
		"/o", "{\"items\":{\"-\":2,\"01\":2,\"x\":2,\"y\":1}}") &&
	   !same(&none, "/o", "{\"items\":{\"y\":1}}", "/o",
		 "{\"items\":{\"y\":2}}"),
	   "in an object \"-\" and \"01\" are names like any other");
	ok(same(&esc, "/o", "{\"a/b\":[1,2,3],\"~1\":1}", "/o",
		"{\"a/b\":[7,8,3],\"~1\":2}") &&
	   !same(&esc, "/o", "{\"a/b\":[1,2,3]}", "/o", "{\"a/b\":[1,2,4]}"),
	   "~1 and ~0: /a~1b/0,/a~1b/1 and the member \"~1\" (/~01)");
	ok(same(&nest, "/o", "{\"m\":[[1,2,3],[4],[5]]}", "/o",
		"{\"m\":[[0,0,3],[9],[5]]}") &&
	   !same(&nest, "/o", "{\"m\":[[1,2,3],[4],[5]]}", "/o",
		 "{\"m\":[[1,2,0],[4],[5]]}") &&
	   !same(&nest, "/o", "{\"m\":[[1,2,3],[4],[5]]}", "/o",
		 "{\"m\":[[1,2,3],[4],[6]]}"),
	   "nested arrays: /m/0/0,/m/0/1,/m/1 leave m[0][2] and m[2]");
	ok(same(&only, "/o", items3(x, 1, 2, 1), "/o", items3(y, 1, 50, 1)) &&
	   !same(&only, "/o", items3(x, 1, 2, 1), "/o", items3(y, 1, 2, 1000)),
	   "only /items/0,/items/2: items[1] does not count, items[2] does");
}

/*
 * Issue 44: a json or form route shapes only a body whose Content-Type is
 * that; any other falls back to the raw bytes. d99a8fe read every body of
 * a form route as a form, so '+' and ' ' were alike in JSON and text.
 */
static void test_shaped_media(void)
{
	struct policy form = shape(FP_BODY_FORM, FP_QUERY_EXACT, NULL, NULL);
	struct policy js = shape(FP_BODY_JSON, FP_QUERY_EXACT, NULL, NULL);
	static const char multi_a[] = "--x\r\nContent-Disposition: form-data; "
		"name=\"f\"; filename=\"a.txt\"\r\n\r\nx+y\r\n--x--\r\n";
	static const char multi_b[] = "--x\r\nContent-Disposition: form-data; "
		"name=\"f\"; filename=\"a.txt\"\r\n\r\nx y\r\n--x--\r\n";
	char hex[2 * FP_LEN + 1];
	bool fb = false;

	ok(!same_ct(&form, "application/json", "{\"to\":\"a+b\"}",
		    "{\"to\":\"a b\"}"),
	   "form route: JSON {\"to\":\"a+b\"} and {\"to\":\"a b\"} differ "
	   "(issue 44)");
	ok(!same_ct(&form, "text/plain", "pay 10&to bob", "to bob&pay 10"),
	   "form route: text \"pay 10&to bob\" and \"to bob&pay 10\" differ");
	ok(!same_ct(&form, "multipart/form-data; boundary=x", multi_a, multi_b),
	   "form route: a multipart file with x+y and x y differ");
	ok(!same_ct(&form, NULL, "a=1&b=2", "b=2&a=1"),
	   "form route: no Content-Type, the bytes");
	shaped_ct(&form, "text/plain", "/p", "a=1", hex, &fb);
	ok(fb, "form route: another media type is a fallback (counted)");
	ok(same_ct(&form, "application/x-www-form-urlencoded", "a=1&b=x+y",
		   "b=x%20y&a=1") &&
	   same_ct(&form, "Application/X-WWW-Form-Urlencoded; charset=UTF-8",
		   "a=1&b=x+y", "b=x%20y&a=1") &&
	   same_ct(&form, " application/x-www-form-urlencoded ;charset=utf-8",
		   "a=1&b=x+y", "b=x%20y&a=1"),
	   "form route: the form type in any case, with parameters, is shaped");
	shaped_ct(&form, "application/x-www-form-urlencoded", "/p", "a=1", hex,
		  &fb);
	ok(!fb, "form route: a form is no fallback");
	ok(!same_ct(&js, "application/x-www-form-urlencoded", "{\"a\":1,\"b\":2}",
		    "{\"b\":2,\"a\":1}") &&
	   !same_ct(&js, "text/plain", "{\"a\":1}", "{ \"a\": 1 }") &&
	   !same_ct(&js, NULL, "{\"a\":1}", "{ \"a\": 1 }") &&
	   !same_ct(&js, "application/jsonx", "{\"a\":1}", "{ \"a\": 1 }") &&
	   !same_ct(&js, "application/+json", "{\"a\":1}", "{ \"a\": 1 }"),
	   "json route: a body that is not said to be JSON is its bytes");
	shaped_ct(&js, "text/plain", "/p", "{\"a\":1}", hex, &fb);
	ok(fb, "json route: another media type is a fallback (counted)");
	ok(same_ct(&js, "application/json", "{\"a\":1,\"b\":2}",
		   "{\"b\":2,\"a\":1}") &&
	   same_ct(&js, "APPLICATION/JSON; charset=utf-8", "{\"a\":1,\"b\":2}",
		   "{\"b\":2,\"a\":1}") &&
	   same_ct(&js, "application/problem+json", "{\"a\":1,\"b\":2}",
		   "{\"b\":2,\"a\":1}") &&
	   same_ct(&js, "application/vnd.api+JSON;ext=x", "{\"a\":1,\"b\":2}",
		   "{\"b\":2,\"a\":1}"),
	   "json route: application/json and +json types, any case, are shaped");
	ok(fpshape_media(FP_BODY_RAW, NULL) && fpshape_media(FP_BODY_RAW, "x") &&
	   !fpshape_media(FP_BODY_JSON, NULL) && !fpshape_media(FP_BODY_FORM, "") &&
	   !fpshape_media(FP_BODY_JSON, "application/json x") &&
	   !fpshape_media(FP_BODY_JSON, "json") &&
	   !fpshape_media(FP_BODY_JSON, "/+json") &&
	   !fpshape_media(FP_BODY_FORM, "application/json") &&
	   !fpshape_media(FP_BODY_JSON, "application/x-www-form-urlencoded") &&
	   !fpshape_media(FP_BODY_FORM, "multipart/form-data") &&
	   fpshape_media(FP_BODY_JSON, "\tapplication/json\t") &&
	   fpshape_media(FP_BODY_JSON, "model/gltf+json"),
	   "fpshape_media: raw takes any; the others their own types only");
}

static void test_shaped_form_query(void)
{
	struct policy form = shape(FP_BODY_FORM, FP_QUERY_EXACT, NULL, NULL);
	struct policy only = shape(FP_BODY_FORM, FP_QUERY_EXACT, NULL, "out_trade_no,total_amount");
	struct policy sorted = shape(FP_BODY_RAW, FP_QUERY_SORTED, NULL, NULL);
	struct policy noq = shape(FP_BODY_RAW, FP_QUERY_IGNORE, NULL, NULL);
	char hex[2 * FP_LEN + 1];
	bool fb;

	ok(same(&form, "/p", "a=1&b=x+y&c=%41", "/p", "c=A&a=1&&b=x%20y"),
	   "form: fields sorted and decoded, empty pieces skipped");
	ok(!same(&form, "/p", "a=1&a=2", "/p", "a=2&a=1"),
	   "form: a repeated field keeps its order");
	ok(!same(&form, "/p", "a=1", "/p", "a=2"), "form: values count");
	ok(!same(&form, "/p", "a=1&b=2", "/p", "a=1&b=2&c=3"), "form: fields count");
	ok(same(&form, "/p", "a", "/p", "a="), "form: a field without '=' is empty");
	ok(!same(&form, "/p", "a=b%3Dc", "/p", "a%3Db=c"),
	   "form: an encoded '=' stays in its name or value");
	ok(same(&only, "/p", "out_trade_no=T1&total_amount=1&sign=x", "/p",
		"sign=y&total_amount=1&out_trade_no=T1&notify_time=z"),
	   "form only: other fields do not count");
	shaped(&form, "/p", "a=%zz", hex, &fb);
	ok(fb, "form: a malformed escape falls back to the bytes");
	ok(same(&sorted, "/p?b=2&a=1&a=0", "", "/p?a=1&a=0&b=%32", ""),
	   "query sorted: order of names and encoding do not count");
	ok(!same(&sorted, "/p?a=1&a=0", "", "/p?a=0&a=1", ""),
	   "query sorted: a repeated parameter keeps its order");
	ok(!same(&sorted, "/p?a=1", "", "/q?a=1", ""), "query sorted: the path counts");
	ok(same(&sorted, "/p?a=%7e+", "", "/p?a=~%20", ""),
	   "query sorted: ~ and + decoded and encoded alike");
	ok(!same(&sorted, "/p?a=%zz", "", "/p?a=%ZZ", ""),
	   "query sorted: a malformed query counts as sent");
	ok(same(&noq, "/p?x=1", "b", "/p", "b"), "query ignore: the query does not count");
	ok(!same(&noq, "/p?x=1", "b", "/p", "c"), "query ignore: the body counts");
}

static void test_shaped_domains(void)
{
	struct policy def = shape(FP_BODY_RAW, FP_QUERY_EXACT, NULL, NULL);
	struct policy js = shape(FP_BODY_JSON, FP_QUERY_EXACT, NULL, NULL);
	struct policy form = shape(FP_BODY_FORM, FP_QUERY_EXACT, NULL, NULL);
	struct policy js_ig = shape(FP_BODY_JSON, FP_QUERY_EXACT, "/x", NULL);
	struct policy js_ig2 = shape(FP_BODY_JSON, FP_QUERY_EXACT, "/y", NULL);
	struct policy raw_sorted = shape(FP_BODY_RAW, FP_QUERY_SORTED, NULL, NULL);
	const struct policy *all[] = { &def, &js, &form, &js_ig, &js_ig2, &raw_sorted };
	char hex[6][2 * FP_LEN + 1];
	int clash = 0;

	/* a request that every shaping leaves as it is */
	for (int i = 0; i < 6; i++)
		shaped(all[i], "/p", "not json, not a form %", hex[i], NULL);
	for (int i = 0; i < 6; i++)
		for (int j = i + 1; j < 6; j++)
			clash += strcmp(hex[i], hex[j]) == 0;
	is_int(clash, 0, "each shaping has its own fingerprints, even for "
	       "bytes none of them changes");
}

static void test_shaped_settings(void)
{
	struct policy p = shape(FP_BODY_RAW, FP_QUERY_EXACT, "/a", NULL);
	char why[256], *list = NULL;

	ok(fpshape_check(&p, why, sizeof(why)) < 0 && strstr(why, "json or form"),
	   "a list needs json or form: %s", why);
	p = shape(FP_BODY_JSON, FP_QUERY_EXACT, "/a", "/b");
	ok(fpshape_check(&p, why, sizeof(why)) < 0 && strstr(why, "exclude"),
	   "ignore and only together: %s", why);
	p = shape(FP_BODY_JSON, FP_QUERY_EXACT, "/a,b", NULL);
	ok(fpshape_check(&p, why, sizeof(why)) < 0 && strstr(why, "\"b\""),
	   "json items are pointers: %s", why);
	p = shape(FP_BODY_JSON, FP_QUERY_EXACT, "/a~2", NULL);
	ok(fpshape_check(&p, why, sizeof(why)) < 0, "~ only before 0 or 1");
	p = shape(FP_BODY_JSON, FP_QUERY_EXACT, "/", NULL);
	ok(fpshape_check(&p, why, sizeof(why)) < 0, "not the whole body");
	p = shape(FP_BODY_FORM, FP_QUERY_EXACT, "sign,sign_type", NULL);
	ok(fpshape_check(&p, why, sizeof(why)) == 0, "form items are names");
	ok(fpshape_list(" /a , /b~1c,/d ", &list, why, sizeof(why)) == 0 &&
	   strcmp(list, "/a,/b~1c,/d") == 0, "a list without its blanks");
	ok(fpshape_list("/a,,/b", &list, why, sizeof(why)) < 0 &&
	   strcmp(list, "/a,/b~1c,/d") == 0, "an empty item: %s (list kept)", why);
	free(list);
}

int main(void)
{
	test_vectors();
	test_distinct();
	test_pieces();
	test_hex();
	test_shaped_vectors();
	test_shaped_json();
	test_shaped_json_places();
	test_shaped_media();
	test_shaped_form_query();
	test_shaped_domains();
	test_shaped_settings();
	return tap_done();
}
