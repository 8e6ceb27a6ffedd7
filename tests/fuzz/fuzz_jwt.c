/*
 * fuzz_jwt.c - JWT bearer tokens (common/jwt.c).
 *
 * Input: one selector byte, then
 * - selector bit 0 clear: a token, checked against keys nobody can sign
 *   for: the public halves of RSA, P-256 (with and without kid), P-384,
 *   P-521 and Ed25519 key pairs made in LLVMFuzzerInitialize() and
 *   thrown away, and a random HMAC secret nobody keeps. Invariant: never
 *   JWT_OK.
 * - bit 0 set: "HEADER\nCLAIMS", which the harness encodes and signs with
 *   HS256/384/512 (bits 1-2) under the secret of a second key set, so
 *   that what lies behind a good signature - the claims parser and checks
 *   - is reached too. Invariants: JWT_OK gives a claim of 1..JWT_CLAIM_MAX
 *   bytes; the same token gives the same answer twice.
 * Always: the result is an enum jwt_error, why is printable ASCII within
 * its buffer, and out is "" unless JWT_OK. Bits 3-7 pick the claim asked
 * for, the issuer, the audience, the leeway and the allow-list.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "fuzz.h"
#include "jwt.h"

static struct jwt_keys *nobody;	/* keys A: no private half anywhere */
static struct jwt_keys *shared;	/* keys B: the secret below */
static const char secret[] =
	"fuzz-jwt-secret-fuzz-jwt-secret-fuzz-jwt-secret-fuzz-jwt-secret!";

static const char b64[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* base64url without padding of d[0..len) at out; returns the end. */
static char *b64url(const unsigned char *d, size_t len, char *out)
{
	for (size_t i = 0; i < len; i += 3) {
		uint32_t v = (uint32_t)d[i] << 16 |
			     (i + 1 < len ? (uint32_t)d[i + 1] << 8 : 0) |
			     (i + 2 < len ? d[i + 2] : 0);

		*out++ = b64[v >> 18];
		*out++ = b64[v >> 12 & 63];
		if (i + 1 < len)
			*out++ = b64[v >> 6 & 63];
		if (i + 2 < len)
			*out++ = b64[v & 63];
	}
	*out = '\0';
	return out;
}

/* A JWK member "name":"base64url of a big number, padded to pad bytes". */
static void bn_member(FILE *f, EVP_PKEY *k, const char *name, const char *param,
		      int pad)
{
	BIGNUM *bn = NULL;
	unsigned char buf[600];
	char out[900];
	int n;

	FUZZ_REQUIRE(EVP_PKEY_get_bn_param(k, param, &bn));
	n = pad ? BN_bn2binpad(bn, buf, pad) : BN_bn2bin(bn, buf);
	FUZZ_REQUIRE(n > 0);
	b64url(buf, (size_t)n, out);
	fprintf(f, ",\"%s\":\"%s\"", name, out);
	BN_free(bn);
}

/* Make a key pair, write its public JWK (with kid, when not NULL), and
 * forget the private half. */
static void jwk(FILE *f, const char *type, const char *curve, const char *kid)
{
	EVP_PKEY *k = curve ? EVP_PKEY_Q_keygen(NULL, NULL, type, curve) :
		      strcmp(type, "RSA") == 0 ?
		      EVP_PKEY_Q_keygen(NULL, NULL, type, (size_t)2048) :
		      EVP_PKEY_Q_keygen(NULL, NULL, type);
	unsigned char raw[32];
	char out[64];
	size_t n = 0;

	FUZZ_REQUIRE(k != NULL);
	if (strcmp(type, "RSA") == 0) {
		fprintf(f, "{\"kty\":\"RSA\"");
		bn_member(f, k, "n", OSSL_PKEY_PARAM_RSA_N, 0);
		bn_member(f, k, "e", OSSL_PKEY_PARAM_RSA_E, 0);
	} else if (strcmp(type, "EC") == 0) {
		int len = (EVP_PKEY_get_bits(k) + 7) / 8;

		fprintf(f, "{\"kty\":\"EC\",\"crv\":\"%s\"", curve);
		bn_member(f, k, "x", OSSL_PKEY_PARAM_EC_PUB_X, len);
		bn_member(f, k, "y", OSSL_PKEY_PARAM_EC_PUB_Y, len);
	} else {
		n = sizeof(raw);
		FUZZ_REQUIRE(EVP_PKEY_get_raw_public_key(k, raw, &n) && n == 32);
		b64url(raw, n, out);
		fprintf(f, "{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"x\":\"%s\"", out);
	}
	if (kid != NULL)
		fprintf(f, ",\"kid\":\"%s\"", kid);
	fprintf(f, "},");
	EVP_PKEY_free(k);
}

/* path as the setting names it: "hmac:" in front for a secret (a file is
 * an HMAC secret only when the operator says so) */
static struct jwt_keys *load(const char *path, const char *form)
{
	char err[512], setting[80];
	struct jwt_keys *k;

	snprintf(setting, sizeof(setting), "%s%s", form, path);
	k = jwt_keys_load(setting, err, sizeof(err));
	if (k == NULL) {
		fprintf(stderr, "fuzz_jwt: %s\n", err);
		abort();
	}
	unlink(path);
	return k;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char dir[] = "/tmp/fuzz_jwt.XXXXXX", path[64];
	unsigned char rnd[64];
	char k[100];
	FILE *f;

	FUZZ_REQUIRE(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/nobody.jwks", dir);
	FUZZ_REQUIRE((f = fopen(path, "w")) != NULL);
	fprintf(f, "{\"keys\":[");
	jwk(f, "RSA", NULL, "r");
	jwk(f, "EC", "P-256", "e1");
	jwk(f, "EC", "P-256", NULL);
	jwk(f, "EC", "P-384", "e3");
	jwk(f, "EC", "P-521", NULL);
	jwk(f, "ED25519", NULL, "ed");
	FUZZ_REQUIRE(RAND_bytes(rnd, sizeof(rnd)) == 1);
	b64url(rnd, sizeof(rnd), k);
	fprintf(f, "{\"kty\":\"oct\",\"kid\":\"h\",\"k\":\"%s\"}]}\n", k);
	FUZZ_REQUIRE(fclose(f) == 0);
	nobody = load(path, "");
	snprintf(path, sizeof(path), "%s/secret", dir);
	FUZZ_REQUIRE((f = fopen(path, "w")) != NULL);
	fprintf(f, "%s\n", secret);
	FUZZ_REQUIRE(fclose(f) == 0);
	shared = load(path, "hmac:");
	rmdir(dir);
	return 0;
}

/* "HEADER\nCLAIMS" as a token signed with HS256/384/512 under secret. */
static char *sign(const uint8_t *data, size_t size, int hs)
{
	static const char *const md[] = { "SHA256", "SHA384", "SHA512", "SHA256" };
	const uint8_t *nl = memchr(data, '\n', size);
	size_t hlen = nl ? (size_t)(nl - data) : size;
	char *tok = malloc(size * 4 / 3 + 100), *p;
	unsigned char mac[64];
	size_t maclen = 0;

	FUZZ_REQUIRE(tok != NULL);
	p = b64url(data, hlen, tok);
	*p++ = '.';
	if (nl != NULL)
		p = b64url(nl + 1, size - hlen - 1, p);
	FUZZ_REQUIRE(EVP_Q_mac(NULL, "HMAC", NULL, md[hs], NULL, secret,
			       strlen(secret), (unsigned char *)tok, (size_t)(p - tok),
			       mac, sizeof(mac), &maclen) != NULL);
	*p++ = '.';
	b64url(mac, maclen, p);
	return tok;
}

static enum jwt_error run(const struct jwt_check *c, const char *tok, size_t len,
			  const char *claim, char out[JWT_CLAIM_MAX + 1])
{
	char why[128];
	enum jwt_error rc;

	memset(why, 'x', sizeof(why));
	memset(out, 'x', JWT_CLAIM_MAX + 1);
	rc = jwt_verify(c, tok, len, claim, out, why, sizeof(why));
	FUZZ_REQUIRE(rc >= JWT_OK && rc <= JWT_NOMEM);
	FUZZ_REQUIRE(memchr(why, '\0', sizeof(why)) != NULL);
	for (const char *w = why; *w; w++)
		FUZZ_REQUIRE(*w >= 0x20 && *w <= 0x7e);
	FUZZ_REQUIRE(memchr(out, '\0', JWT_CLAIM_MAX + 1) != NULL);
	FUZZ_REQUIRE(rc == JWT_OK ? strlen(out) >= 1 : out[0] == '\0');
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const claims[] = { "sub", "email", "aud", "exp" };
	static const uint64_t leeways[] = { 0, 60, UINT64_MAX, 3600 };
	char out[JWT_CLAIM_MAX + 1], again[JWT_CLAIM_MAX + 1];
	struct jwt_check c = { .now = 1700000000 };
	const char *claim;
	uint8_t sel;
	char *tok;
	size_t len;
	enum jwt_error rc;

	if (size < 1)
		return 0;
	sel = data[0];
	claim = claims[sel >> 3 & 3];
	c.issuer = sel & 0x20 ? "https://id.example" : NULL;
	c.audience = sel & 0x40 ? "orders" : NULL;
	c.leeway_s = leeways[sel >> 1 & 3];
	c.algs = sel & 0x80 ? ~0u : (1u << JWT_ALG_COUNT) - 1;
	if (sel & 1) {
		tok = sign(data + 1, size - 1, sel >> 1 & 3);
		len = strlen(tok);
		c.keys = shared;
	} else {
		/* a copy of exactly the token's bytes, so that ASan sees a
		 * read past its end */
		len = size - 1;
		tok = malloc(len ? len : 1);
		FUZZ_REQUIRE(tok != NULL);
		memcpy(tok, data + 1, len);
		c.keys = nobody;
	}
	rc = run(&c, tok, len, claim, out);
	if (!(sel & 1))
		FUZZ_REQUIRE(rc != JWT_OK);	/* nobody can sign for these */
	FUZZ_REQUIRE(run(&c, tok, len, claim, again) == rc);
	FUZZ_REQUIRE(strcmp(out, again) == 0);
	free(tok);
	return 0;
}
