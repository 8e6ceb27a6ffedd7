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
#include <stdint.h>
#include <string.h>

#include "fingerprint.h"
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

int main(void)
{
	test_vectors();
	test_distinct();
	test_pieces();
	test_hex();
	return tap_done();
}
