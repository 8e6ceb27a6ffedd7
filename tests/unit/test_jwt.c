/*
 * JWT bearer tokens (common/jwt.c): keys made here with OpenSSL (RSA 2048,
 * EC P-256, P-384, P-521, Ed25519, HMAC secrets), written to a temporary
 * directory as PEM, a certificate, a JWKS and a secret file; tokens signed
 * here by a small signer of the test's own (mk()), and what jwt_verify()
 * makes of them: every algorithm, kid, the time and audience claims, and
 * the tokens it must refuse - alg "none", an alg off the allow-list, HS256
 * keyed with the RSA public key, flipped bytes, malformed text, an ES256
 * signature in DER.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/encoder.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>

#include "jwt.h"
#include "tap.h"

#define NOW 1700000000LL

static char dir[64];
static EVP_PKEY *rsa, *ec256, *ec256b, *ec384, *ec521, *ed;
/* 64 bytes: serves HS256, HS384 and HS512 */
static const char secret[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/* What the test allocates, freed at the end. */
static void *kept[8192];
static int nkept;

static char *keep(char *s)
{
	if (s == NULL || nkept == (int)(sizeof(kept) / sizeof(kept[0])))
		abort();
	kept[nkept++] = s;
	return s;
}

static __attribute__((format(printf, 1, 2))) char *fmt(const char *f, ...)
{
	va_list ap;
	char *s = NULL;

	va_start(ap, f);
	if (vasprintf(&s, f, ap) < 0)
		abort();
	va_end(ap);
	return keep(s);
}

static char *b64url(const void *data, size_t len)
{
	static const char a[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
	const unsigned char *d = data;
	char *out = keep(malloc(len * 4 / 3 + 4)), *o = out;

	for (size_t i = 0; i < len; i += 3) {
		uint32_t v = (uint32_t)d[i] << 16 |
			     (i + 1 < len ? (uint32_t)d[i + 1] << 8 : 0) |
			     (i + 2 < len ? d[i + 2] : 0);

		*o++ = a[v >> 18];
		*o++ = a[v >> 12 & 63];
		if (i + 1 < len)
			*o++ = a[v >> 6 & 63];
		if (i + 2 < len)
			*o++ = a[v & 63];
	}
	*o = '\0';
	return out;
}

static char *path(const char *name)
{
	return fmt("%s/%s", dir, name);
}

static void write_file(const char *name, const void *data, size_t len)
{
	FILE *f = fopen(path(name), "wb");

	if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0)
		abort();
}

static void put(const char *name, const char *s)
{
	write_file(name, s, strlen(s));
}

/* The PEM of pkey: its public key, its private key, or a self-signed
 * certificate of it. */
enum pem_kind { PEM_PUBLIC, PEM_PRIVATE, PEM_CERT, PEM_PKCS1 };

static char *pem(EVP_PKEY *pkey, enum pem_kind kind)
{
	BIO *b = BIO_new(BIO_s_mem());
	X509 *x = NULL;
	OSSL_ENCODER_CTX *enc = NULL;
	char *data, *out;
	long n;
	bool ok = false;

	switch (kind) {
	case PEM_PUBLIC:
		ok = PEM_write_bio_PUBKEY(b, pkey);
		break;
	case PEM_PRIVATE:
		ok = PEM_write_bio_PrivateKey(b, pkey, NULL, NULL, 0, NULL, NULL);
		break;
	case PEM_PKCS1:
		enc = OSSL_ENCODER_CTX_new_for_pkey(pkey, EVP_PKEY_PUBLIC_KEY, "PEM",
						    "type-specific", NULL);
		ok = enc != NULL && OSSL_ENCODER_to_bio(enc, b);
		OSSL_ENCODER_CTX_free(enc);
		break;
	case PEM_CERT:
		x = X509_new();
		ok = x && X509_set_version(x, 2) &&
		     ASN1_INTEGER_set(X509_get_serialNumber(x), 1) &&
		     X509_gmtime_adj(X509_getm_notBefore(x), 0) &&
		     X509_gmtime_adj(X509_getm_notAfter(x), 3600) &&
		     X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN",
						MBSTRING_ASC, (const unsigned char *)"jwt",
						-1, -1, 0) &&
		     X509_set_issuer_name(x, X509_get_subject_name(x)) &&
		     X509_set_pubkey(x, pkey) && X509_sign(x, pkey, EVP_sha256()) &&
		     PEM_write_bio_X509(b, x);
		X509_free(x);
		break;
	}
	n = BIO_get_mem_data(b, &data);
	if (!ok || n <= 0)
		abort();
	out = keep(strndup(data, (size_t)n));
	BIO_free(b);
	return out;
}

static char *bn_b64(EVP_PKEY *pkey, const char *param, int pad)
{
	BIGNUM *bn = NULL;
	unsigned char buf[600];
	int n;

	if (!EVP_PKEY_get_bn_param(pkey, param, &bn))
		abort();
	n = pad ? BN_bn2binpad(bn, buf, pad) : BN_bn2bin(bn, buf);
	BN_free(bn);
	return b64url(buf, (size_t)n);
}

/* The JWK of pkey's public key, with extra members ("" or ",\"kid\":..."). */
static char *jwk(EVP_PKEY *pkey, const char *extra)
{
	unsigned char raw[32];
	size_t n = 0;

	if (EVP_PKEY_is_a(pkey, "RSA"))
		return fmt("{\"kty\":\"RSA\",\"n\":\"%s\",\"e\":\"%s\"%s}",
			   bn_b64(pkey, OSSL_PKEY_PARAM_RSA_N, 0),
			   bn_b64(pkey, OSSL_PKEY_PARAM_RSA_E, 0), extra);
	if (EVP_PKEY_is_a(pkey, "EC")) {
		int bits = EVP_PKEY_get_bits(pkey), len = (bits + 7) / 8;

		return fmt("{\"kty\":\"EC\",\"crv\":\"P-%d\",\"x\":\"%s\",\"y\":\"%s\"%s}",
			   bits, bn_b64(pkey, OSSL_PKEY_PARAM_EC_PUB_X, len),
			   bn_b64(pkey, OSSL_PKEY_PARAM_EC_PUB_Y, len), extra);
	}
	if (!EVP_PKEY_get_octet_string_param(pkey, OSSL_PKEY_PARAM_PUB_KEY, raw,
					     sizeof(raw), &n) || n != 32)
		abort();
	return fmt("{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"x\":\"%s\"%s}",
		   b64url(raw, n), extra);
}

/*
 * A token of header hdr and claims pay, signed as alg (which need not be
 * the header's) with key, or with the secret sec when key is NULL. der:
 * an ECDSA signature left as OpenSSL writes it instead of R || S.
 */
static char *mk_(const char *alg, EVP_PKEY *key, const void *sec, size_t seclen,
		 const char *hdr, const char *pay, bool der)
{
	char *input = fmt("%s.%s", b64url(hdr, strlen(hdr)), b64url(pay, strlen(pay)));
	char md[8];
	unsigned char sig[1024];
	size_t slen = sizeof(sig);
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	EVP_PKEY_CTX *pctx = NULL;
	bool ok;

	snprintf(md, sizeof(md), "SHA%s", alg + 2);
	if (key == NULL) {
		ok = EVP_Q_mac(NULL, "HMAC", NULL, md, NULL, sec, seclen,
			       (unsigned char *)input, strlen(input), sig, sizeof(sig),
			       &slen) != NULL;
	} else {
		ok = EVP_DigestSignInit_ex(ctx, &pctx, strcmp(alg, "EdDSA") ? md : NULL,
					   NULL, NULL, key, NULL) == 1;
		if (ok && alg[0] == 'P')
			ok = EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) == 1 &&
			     EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) == 1;
		ok = ok && EVP_DigestSign(ctx, sig, &slen, (unsigned char *)input,
					  strlen(input)) == 1;
	}
	EVP_MD_CTX_free(ctx);
	if (!ok)
		abort();
	if (alg[0] == 'E' && alg[1] == 'S' && !der) {
		const unsigned char *p = sig;
		ECDSA_SIG *es = d2i_ECDSA_SIG(NULL, &p, (long)slen);
		int half = (EVP_PKEY_get_bits(key) + 7) / 8;

		if (es == NULL ||
		    BN_bn2binpad(ECDSA_SIG_get0_r(es), sig, half) != half ||
		    BN_bn2binpad(ECDSA_SIG_get0_s(es), sig + half, half) != half)
			abort();
		ECDSA_SIG_free(es);
		slen = (size_t)(2 * half);
	}
	return fmt("%s.%s", input, b64url(sig, slen));
}

static char *mk(const char *alg, EVP_PKEY *key, const char *hdr, const char *pay)
{
	return mk_(alg, key, secret, strlen(secret), hdr, pay, false);
}

/* A header {"alg":alg} and a claim set that holds at NOW. */
static char *hdr(const char *alg)
{
	return fmt("{\"alg\":\"%s\",\"typ\":\"JWT\"}", alg);
}

#define PAY "{\"sub\":\"user-1\",\"exp\":1700003600,\"iat\":1700000000}"

static struct jwt_check check(const struct jwt_keys *k)
{
	struct jwt_check c = { .keys = k, .algs = (1u << JWT_ALG_COUNT) - 1,
			       .leeway_s = 60, .now = NOW };

	return c;
}

static char out[JWT_CLAIM_MAX + 1], why[256];

/* jwt_verify() of a NUL-terminated token, asking for claim. */
static enum jwt_error verify_claim(const struct jwt_check *c, const char *tok,
				   const char *claim)
{
	enum jwt_error rc = jwt_verify(c, tok, strlen(tok), claim, out, why,
				       sizeof(why));

	for (const char *p = why; *p; p++)
		if (*p < 0x20 || *p > 0x7e) {
			printf("# why is not printable ASCII: %s\n", why);
			abort();
		}
	return rc;
}

static enum jwt_error verify(const struct jwt_check *c, const char *tok)
{
	return verify_claim(c, tok, "sub");
}

#define is_rc(got, want, ...) do { \
	enum jwt_error g2_ = (got), w2_ = (want); \
	if (!ok(g2_ == w2_, __VA_ARGS__)) \
		printf("#   got %s (%s), want %s\n", jwt_error_name(g2_), why, \
		       jwt_error_name(w2_)); \
} while (0)

static struct jwt_keys *load(const char *name)
{
	char err[512];
	struct jwt_keys *k = jwt_keys_load(path(name), err, sizeof(err));

	if (k == NULL)
		printf("# %s\n", err);
	return k;
}

/* Does loading name fail with an error that says what? */
static void load_fails(const char *name, const char *what, const char *test)
{
	char err[512] = "";
	struct jwt_keys *k = jwt_keys_load(path(name), err, sizeof(err));

	if (!ok(k == NULL && strstr(err, what) != NULL &&
		strncmp(err, path(name), strlen(path(name))) == 0, "%s", test))
		printf("#   error \"%s\", want it to say \"%s\"\n", err, what);
	jwt_keys_free(k);
}

static void test_algs(void)
{
	unsigned m = 0;
	char buf[128];

	ok(jwt_algs_parse("RS256, ES256", &m, why, sizeof(why)) == 0 &&
	   m == (1u << JWT_RS256 | 1u << JWT_ES256), "algs: RS256, ES256");
	jwt_algs_format(m, buf, sizeof(buf));
	is_str(buf, "RS256,ES256", "algs: formatted back");
	ok(jwt_algs_parse("\tEdDSA ,PS512,HS384 ", &m, why, sizeof(why)) == 0 &&
	   m == (1u << JWT_EDDSA | 1u << JWT_PS512 | 1u << JWT_HS384),
	   "algs: blanks around items");
	ok(jwt_algs_parse("RS256,none", &m, why, sizeof(why)) < 0 &&
	   strcmp(why, "\"none\" is never accepted") == 0, "algs: none refused: %s", why);
	ok(jwt_algs_parse("XS1", &m, why, sizeof(why)) < 0 &&
	   strstr(why, "unknown algorithm \"XS1\" (use RS256,") != NULL,
	   "algs: unknown name: %s", why);
	ok(jwt_algs_parse("rs256", &m, why, sizeof(why)) < 0, "algs: case-sensitive");
	ok(jwt_algs_parse("", &m, why, sizeof(why)) < 0 &&
	   strcmp(why, "no algorithm given") == 0, "algs: empty list: %s", why);
	ok(jwt_algs_parse("RS256,,ES256", &m, why, sizeof(why)) < 0 &&
	   jwt_algs_parse("RS256,", &m, why, sizeof(why)) < 0, "algs: empty item");
	jwt_algs_format((1u << JWT_ALG_COUNT) - 1, buf, 20);
	is_str(buf, "RS256,RS384,RS512", "algs: format cut short at a name");
}

static void write_keys(void)
{
	char *keys;

	put("rsa.pem", pem(rsa, PEM_PUBLIC));
	put("rsa1.pem", pem(rsa, PEM_PKCS1));
	put("ec256.pem", pem(ec256, PEM_PUBLIC));
	put("ec384.crt", pem(ec384, PEM_CERT));
	put("ed.pem", pem(ed, PEM_PUBLIC));
	put("all.pem", fmt("# keys\n%s\n%s%s%s", pem(rsa, PEM_PUBLIC),
			   pem(ec256, PEM_PUBLIC), pem(ec521, PEM_PUBLIC),
			   pem(ed, PEM_PUBLIC)));
	write_file("secret", fmt("%s\r\n\n", secret), strlen(secret) + 3);
	write_file("secret32", secret, 32);
	write_file("secret31", fmt("%.31s\n", secret), 32);
	put("private.pem", pem(ec256, PEM_PRIVATE));
	keys = fmt("{\"keys\":[%s,%s,%s,%s,%s,%s,"
		   "{\"kty\":\"oct\",\"k\":\"%s\",\"kid\":\"hmac\"},"
		   "{\"kty\":\"RSA\",\"use\":\"enc\",\"n\":\"AQAB\",\"e\":\"AQAB\"},"
		   "{\"kty\":\"OKP\",\"crv\":\"X25519\",\"x\":\"AAAA\"},"
		   "{\"kty\":\"EC\",\"crv\":\"secp256k1\",\"x\":\"AAAA\",\"y\":\"AAAA\"},"
		   "{\"kty\":\"PQ\",\"kid\":\"future\"},"
		   "{\"kty\":\"EC\",\"crv\":\"P-256\",\"key_ops\":[\"sign\"]},"
		   "{\"kty\":\"RSA\",\"alg\":\"RSA-OAEP\",\"n\":\"AQAB\",\"e\":\"AQAB\"}]}\n",
		   jwk(rsa, ",\"kid\":\"rsa\",\"use\":\"sig\""),
		   jwk(ec256, ",\"kid\":\"a\""), jwk(ec256b, ",\"kid\":\"b\",\"alg\":\"ES256\""),
		   jwk(ec384, ",\"kid\":\"p384\",\"key_ops\":[\"verify\"]"),
		   jwk(ec521, ",\"kid\":\"p521\""), jwk(ed, ",\"kid\":\"ed\""),
		   b64url(secret, strlen(secret)));
	put("keys.jwks", keys);
}

static void test_load(void)
{
	struct jwt_keys *k;
	unsigned rsa_algs = 1u << JWT_RS256 | 1u << JWT_RS384 | 1u << JWT_RS512 |
			    1u << JWT_PS256 | 1u << JWT_PS384 | 1u << JWT_PS512;
	unsigned hs_algs = 1u << JWT_HS256 | 1u << JWT_HS384 | 1u << JWT_HS512;

	k = load("keys.jwks");
	ok(k != NULL && jwt_keys_count(k) == 7 && jwt_keys_skipped(k) == 6,
	   "jwks: 7 keys, 6 skipped (enc, X25519, secp256k1, unknown kty, "
	   "key_ops without verify, RSA-OAEP)");
	ok(k != NULL && jwt_keys_algs(k) == (1u << JWT_ALG_COUNT) - 1,
	   "jwks: every algorithm served");
	jwt_keys_free(k);
	k = load("rsa.pem");
	ok(k != NULL && jwt_keys_count(k) == 1 && jwt_keys_algs(k) == rsa_algs,
	   "PEM RSA public key: RS* and PS*");
	jwt_keys_free(k);
	k = load("rsa1.pem");
	ok(k != NULL && jwt_keys_algs(k) == rsa_algs, "PEM \"RSA PUBLIC KEY\" (PKCS#1)");
	jwt_keys_free(k);
	k = load("ec384.crt");
	ok(k != NULL && jwt_keys_algs(k) == 1u << JWT_ES384, "certificate: its P-384 key");
	jwt_keys_free(k);
	k = load("all.pem");
	ok(k != NULL && jwt_keys_count(k) == 4 &&
	   jwt_keys_algs(k) == (rsa_algs | 1u << JWT_ES256 | 1u << JWT_ES512 | 1u << JWT_EDDSA),
	   "PEM: four blocks, text around them");
	jwt_keys_free(k);
	k = load("secret");
	ok(k != NULL && jwt_keys_algs(k) == hs_algs, "secret of 64 bytes: HS256/384/512");
	jwt_keys_free(k);
	k = load("secret32");
	ok(k != NULL && jwt_keys_algs(k) == 1u << JWT_HS256, "secret of 32 bytes: HS256 only");
	jwt_keys_free(k);

	load_fails("private.pem", "private key", "a PEM private key is refused");
	load_fails("secret31", "at least 32", "a secret of 31 bytes is refused");
	load_fails("missing", "No such file", "a missing file");
	write_file("empty", "", 0);
	load_fails("empty", "empty", "an empty file");
	put("bad.json", "{\"keys\":[}");
	load_fails("bad.json", "not a JSON object", "malformed JSON");
	put("dup.json", "{\"keys\":[],\"keys\":[]}");
	load_fails("dup.json", "not a JSON object", "a JWKS with a member twice");
	put("none.json", "{\"keys\":[{\"kty\":\"RSA\",\"use\":\"enc\"}]}");
	load_fails("none.json", "no usable key (1 skipped", "a JWKS with no usable key");
	put("private.jwk", "{\"kty\":\"EC\",\"crv\":\"P-256\",\"x\":\"AAAA\",\"y\":\"AAAA\","
	    "\"d\":\"AAAA\"}");
	load_fails("private.jwk", "key 0 is a private key", "a private JWK is refused");
	{
		char many[JWT_KEYS_MAX * 80] = "{\"keys\":[", *p = many + strlen(many);

		for (int i = 0; i <= JWT_KEYS_MAX; i++)
			p += sprintf(p, "%s{\"kty\":\"oct\",\"k\":\"%s\"}", i ? "," : "",
				     b64url(secret, 32));
		strcpy(p, "]}");
		put("many.jwks", many);
		load_fails("many.jwks", "more than 64 keys", "65 keys");
	}
	put("notarray.json", "{\"keys\":{}}");
	load_fails("notarray.json", "not an array", "\"keys\" not an array");
	put("badec.json", "{\"kty\":\"EC\",\"crv\":\"P-256\",\"x\":\"AAAA\",\"y\":\"AAAA\"}");
	load_fails("badec.json", "key 0: a key of kty EC whose members", "an EC JWK of short coordinates");
	put("shortk.json", "{\"kty\":\"oct\",\"k\":\"c2hvcnQ\"}");
	load_fails("shortk.json", "at least 32", "an oct JWK of 5 bytes");
	put("badpem", "-----BEGIN PUBLIC KEY-----\nAAAA\n");
	load_fails("badpem", "does not parse", "a PEM block without its end");
	{
		EVP_PKEY *small = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
		char *p = pem(small, PEM_PUBLIC);

		put("rsa1024.pem", p);
		load_fails("rsa1024.pem", "at least 2048", "an RSA key of 1024 bits is refused");
		p = jwk(small, "");
		put("rsa1024.jwk", p);
		load_fails("rsa1024.jwk", "at least 2048", "... and as a JWK");
		EVP_PKEY_free(small);
	}
	{
		/* an even modulus: the low bit of n's last byte, which is bit 4
		 * of its last base64url character (2048 bits: 4 bits left over) */
		static const char b64[] =
			"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
		char *j = jwk(rsa, ""), *n = strstr(j, "\",\"e\"") - 1;

		*n = b64[(strchr(b64, *n) - b64) ^ 0x10];
		put("even.jwk", j);
		load_fails("even.jwk", "fails OpenSSL's public key check",
			   "an RSA JWK with an even modulus");
	}
	{
		/* a point off the curve: y + 1 */
		char *j = jwk(ec256, ""), *y = strstr(j, "\"y\":\"") + 5;

		y[10] = y[10] == 'A' ? 'B' : 'A';
		put("offcurve.jwk", j);
		load_fails("offcurve.jwk", "key 0: a key of kty EC", "an EC point off its curve");
	}
}

static void test_each_alg(void)
{
	struct jwt_keys *jwks = load("keys.jwks"), *pemk = load("all.pem");
	struct jwt_keys *sec = load("secret"), *crt = load("ec384.crt");
	struct jwt_check c = check(jwks), p = check(pemk), s = check(sec), x = check(crt);
	static const char *const rsa_algs[] = { "RS256", "RS384", "RS512",
						"PS256", "PS384", "PS512" };

	for (int i = 0; i < 6; i++) {
		const char *t = mk(rsa_algs[i], rsa, hdr(rsa_algs[i]), PAY);

		is_rc(verify(&c, t), JWT_OK, "%s with the JWKS", rsa_algs[i]);
		is_str(out, "user-1", "%s: sub", rsa_algs[i]);
		is_rc(verify(&p, t), JWT_OK, "%s with the PEM", rsa_algs[i]);
	}
	is_rc(verify(&c, mk("ES256", ec256, hdr("ES256"), PAY)), JWT_OK, "ES256 with the JWKS");
	is_rc(verify(&p, mk("ES256", ec256, hdr("ES256"), PAY)), JWT_OK, "ES256 with the PEM");
	is_rc(verify(&c, mk("ES384", ec384, hdr("ES384"), PAY)), JWT_OK, "ES384 with the JWKS");
	is_rc(verify(&x, mk("ES384", ec384, hdr("ES384"), PAY)), JWT_OK,
	      "ES384 with the certificate");
	is_rc(verify(&c, mk("ES512", ec521, hdr("ES512"), PAY)), JWT_OK, "ES512 with the JWKS");
	is_rc(verify(&p, mk("ES512", ec521, hdr("ES512"), PAY)), JWT_OK, "ES512 with the PEM");
	is_rc(verify(&c, mk("EdDSA", ed, hdr("EdDSA"), PAY)), JWT_OK, "EdDSA with the JWKS");
	is_rc(verify(&p, mk("EdDSA", ed, hdr("EdDSA"), PAY)), JWT_OK, "EdDSA with the PEM");
	is_str(out, "user-1", "EdDSA: sub");
	for (int i = 256; i <= 512; i += 128) {
		const char *alg = fmt("HS%d", i);

		is_rc(verify(&c, mk(alg, NULL, hdr(alg), PAY)), JWT_OK, "%s with the JWKS", alg);
		is_rc(verify(&s, mk(alg, NULL, hdr(alg), PAY)), JWT_OK,
		      "%s with the secret file", alg);
		is_str(out, "user-1", "%s: sub", alg);
	}
	/* ES384 signed by the P-256 key's curve mate: the wrong curve */
	is_rc(verify(&c, mk("ES256", ec256, hdr("ES384"), PAY)), JWT_BAD_SIGNATURE,
	      "an ES256 signature under alg ES384");
	jwt_keys_free(jwks);
	jwt_keys_free(pemk);
	jwt_keys_free(sec);
	jwt_keys_free(crt);
}

static void test_claims(void)
{
	struct jwt_keys *k = load("secret");
	struct jwt_check c = check(k);
	const char *h = hdr("HS256");
	char long_sub[JWT_CLAIM_MAX + 2];

	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":42}")), JWT_OK, "integer sub");
	is_str(out, "42", "integer sub in decimal");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":-7}")), JWT_OK, "negative sub");
	is_str(out, "-7", "negative sub in decimal");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":18446744073709551614}")), JWT_OK,
	      "sub beyond int64");
	is_str(out, "18446744073709551614", "... in decimal");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":99999999999999999999}")),
	      JWT_NO_CLAIM, "sub beyond uint64 (json-c would clamp it)");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":-99999999999999999999}")),
	      JWT_NO_CLAIM, "sub below int64");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":1.0}")), JWT_NO_CLAIM, "float sub");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":true}")), JWT_NO_CLAIM, "boolean sub");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":null}")), JWT_NO_CLAIM, "null sub");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"\"}")), JWT_NO_CLAIM, "empty sub");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"iss\":\"x\"}")), JWT_NO_CLAIM, "no sub");
	ok(strstr(why, "no \"sub\" claim") != NULL, "why names the claim: %s", why);
	memset(long_sub, 'u', sizeof(long_sub) - 1);
	long_sub[JWT_CLAIM_MAX] = '\0';
	is_rc(verify(&c, mk("HS256", NULL, h, fmt("{\"sub\":\"%s\"}", long_sub))), JWT_OK,
	      "sub of %d bytes", JWT_CLAIM_MAX);
	is_int(strlen(out), JWT_CLAIM_MAX, "... copied whole");
	long_sub[JWT_CLAIM_MAX] = 'u';
	long_sub[JWT_CLAIM_MAX + 1] = '\0';
	is_rc(verify(&c, mk("HS256", NULL, h, fmt("{\"sub\":\"%s\"}", long_sub))),
	      JWT_NO_CLAIM, "sub of %d bytes", JWT_CLAIM_MAX + 1);
	is_rc(verify_claim(&c, mk("HS256", NULL, h, "{\"sub\":\"u\",\"email\":\"a@b.c\"}"),
			   "email"), JWT_OK, "another claim");
	is_str(out, "a@b.c", "... its value");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\\u00e9\"}")), JWT_OK,
	      "escaped sub");
	is_str(out, "a\xc3\xa9", "... unescaped, UTF-8");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"sub\":\"b\"}")),
	      JWT_MALFORMED, "sub given twice");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\\u0000b\"}")), JWT_MALFORMED,
	      "a \\u0000 escape");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"\\ud800\"}")), JWT_MALFORMED,
	      "a lone surrogate");
	is_rc(verify(&c, mk("HS256", NULL, h, "{'sub':'a'}")), JWT_MALFORMED,
	      "single quotes (json-c takes them)");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"exp\":NaN}")), JWT_MALFORMED,
	      "exp NaN (json-c takes it)");
	is_rc(verify(&c, mk("HS256", NULL, h, "[\"sub\"]")), JWT_MALFORMED, "claims an array");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\"} x")), JWT_MALFORMED,
	      "claims with trailing bytes");

	/* exp and nbf around NOW, leeway 60 */
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\"}")), JWT_OK, "no exp: taken");
	is_rc(verify(&c, mk("HS256", NULL, h, fmt("{\"sub\":\"a\",\"exp\":%lld}", NOW - 61))),
	      JWT_EXPIRED, "expired 61 s ago, leeway 60");
	is_rc(verify(&c, mk("HS256", NULL, h, fmt("{\"sub\":\"a\",\"exp\":%lld}", NOW - 60))),
	      JWT_OK, "expired 60 s ago: within leeway");
	is_rc(verify(&c, mk("HS256", NULL, h, fmt("{\"sub\":\"a\",\"exp\":%lld.5}", NOW - 61))),
	      JWT_EXPIRED, "exp with a fraction");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"exp\":\"1700003600\"}")),
	      JWT_MALFORMED, "exp a string");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"exp\":-9223372036854775808}")),
	      JWT_EXPIRED, "exp at INT64_MIN, no overflow");
	c.leeway_s = UINT64_MAX;
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"exp\":-9223372036854775808}")),
	      JWT_OK, "... taken with a leeway of UINT64_MAX");
	c.leeway_s = 60;
	is_rc(verify(&c, mk("HS256", NULL, h, fmt("{\"sub\":\"a\",\"nbf\":%lld}", NOW + 61))),
	      JWT_NOT_YET, "nbf 61 s ahead");
	is_rc(verify(&c, mk("HS256", NULL, h, fmt("{\"sub\":\"a\",\"nbf\":%lld}", NOW + 60))),
	      JWT_OK, "nbf 60 s ahead: within leeway");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"nbf\":null}")), JWT_MALFORMED,
	      "nbf null");
	c.leeway_s = 0;
	is_rc(verify(&c, mk("HS256", NULL, h, fmt("{\"sub\":\"a\",\"exp\":%lld}", NOW))),
	      JWT_OK, "exp = now: still valid");
	is_rc(verify(&c, mk("HS256", NULL, h, fmt("{\"sub\":\"a\",\"nbf\":%lld.5}", NOW))),
	      JWT_NOT_YET, "nbf half a second ahead, no leeway");
	c.leeway_s = 60;

	/* iss and aud */
	c.issuer = "https://id.example";
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"iss\":\"https://id.example\"}")),
	      JWT_OK, "iss as configured");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"iss\":\"https://id.example/\"}")),
	      JWT_BAD_ISSUER, "iss differs");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\"}")), JWT_BAD_ISSUER, "iss missing");
	c.issuer = NULL;
	c.audience = "orders";
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"aud\":\"orders\"}")), JWT_OK,
	      "aud a string");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"aud\":[\"x\",1,\"orders\"]}")),
	      JWT_OK, "aud an array holding it");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"aud\":[\"x\",\"orders2\"]}")),
	      JWT_BAD_AUDIENCE, "aud an array without it");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\",\"aud\":\"Orders\"}")),
	      JWT_BAD_AUDIENCE, "aud differs in case");
	is_rc(verify(&c, mk("HS256", NULL, h, "{\"sub\":\"a\"}")), JWT_BAD_AUDIENCE,
	      "aud missing");
	jwt_keys_free(k);
}

static void test_kid(void)
{
	struct jwt_keys *k = load("keys.jwks"), *p = load("ec256.pem");
	struct jwt_check c = check(k), cp = check(p);
	const char *pay = PAY;

	is_rc(verify(&c, mk("ES256", ec256b, "{\"alg\":\"ES256\",\"kid\":\"b\"}", pay)), JWT_OK,
	      "kid b: key b");
	is_rc(verify(&c, mk("ES256", ec256b, "{\"alg\":\"ES256\",\"kid\":\"a\"}", pay)),
	      JWT_BAD_SIGNATURE, "signed by b, kid a: only a is tried");
	is_rc(verify(&c, mk("ES256", ec256b, "{\"alg\":\"ES256\"}", pay)), JWT_OK,
	      "no kid: every P-256 key is tried");
	is_rc(verify(&c, mk("ES256", ec256b, "{\"alg\":\"ES256\",\"kid\":\"zzz\"}", pay)),
	      JWT_NO_KEY, "an unknown kid");
	is_rc(verify(&c, mk("ES256", ec256b, "{\"alg\":\"ES256\",\"kid\":\"rsa\"}", pay)),
	      JWT_NO_KEY, "the kid of a key of another family");
	is_rc(verify(&c, mk("ES256", ec256b, "{\"alg\":\"ES256\",\"kid\":7}", pay)),
	      JWT_MALFORMED, "kid not a string");
	is_rc(verify(&cp, mk("ES256", ec256, "{\"alg\":\"ES256\",\"kid\":\"a\"}", pay)),
	      JWT_OK, "a kid, and PEM keys (which have none): tried");
	is_rc(verify(&cp, mk("ES256", ec256b, "{\"alg\":\"ES256\",\"kid\":\"a\"}", pay)),
	      JWT_BAD_SIGNATURE, "a kid, PEM keys, another key's signature");
	is_rc(verify(&cp, mk("ES256", ec256, "{\"alg\":\"ES256\"}", pay)), JWT_OK,
	      "no kid, PEM keys");
	jwt_keys_free(k);
	jwt_keys_free(p);
}

static void test_refused(void)
{
	struct jwt_keys *k = load("keys.jwks"), *rp = load("rsa.pem"), *s32 = load("secret32");
	struct jwt_check c = check(k), r = check(rp), c32 = check(s32);
	static const char b64[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
	char *rsa_pem = pem(rsa, PEM_PUBLIC), *t, *p;
	char long_alg[100];

	c.algs = ~0u;		/* every bit, "none" or not: no bit for it */
	t = fmt("%s.%s.", b64url("{\"alg\":\"none\"}", 14), b64url(PAY, strlen(PAY)));
	is_rc(verify(&c, t), JWT_MALFORMED, "alg none, no signature");
	t = fmt("%s.%s.AAAA", b64url("{\"alg\":\"none\"}", 14), b64url(PAY, strlen(PAY)));
	is_rc(verify(&c, t), JWT_ALG_REFUSED, "alg none, all bits allowed");
	is_rc(verify(&c, mk("HS256", NULL, "{\"alg\":\"None\"}", PAY)), JWT_ALG_REFUSED,
	      "alg None");
	c.algs = 1u << JWT_ES256;
	is_rc(verify(&c, mk("RS256", rsa, hdr("RS256"), PAY)), JWT_ALG_REFUSED,
	      "RS256 not on the allow-list");
	ok(strstr(why, "\"RS256\" is not accepted") != NULL, "why: %s", why);

	/* the RSA public key as an HMAC secret */
	r.algs = 1u << JWT_RS256 | 1u << JWT_HS256;
	t = mk_("HS256", NULL, rsa_pem, strlen(rsa_pem), hdr("HS256"), PAY, false);
	is_rc(verify(&r, t), JWT_NO_KEY, "HS256 keyed with the RSA public key PEM");
	c.algs = r.algs;
	is_rc(verify(&c, t), JWT_BAD_SIGNATURE, "... against a JWKS with a secret too");
	t = mk_("HS256", NULL, rsa_pem, strlen(rsa_pem), "{\"alg\":\"HS256\",\"kid\":\"rsa\"}",
		PAY, false);
	is_rc(verify(&c, t), JWT_NO_KEY, "... naming the RSA key's kid");
	is_rc(verify(&c32, mk("HS384", NULL, hdr("HS384"), PAY)), JWT_NO_KEY,
	      "HS384 with a 32-byte secret");
	c.algs = ~0u;
	is_rc(verify(&c, mk("ES384", ec256b, "{\"alg\":\"ES384\",\"kid\":\"b\"}", PAY)),
	      JWT_NO_KEY, "a key whose JWK alg is ES256 never verifies ES384");

	/* flipped bytes */
	t = mk("RS256", rsa, hdr("RS256"), PAY);
	t[strlen(t) - 10] = t[strlen(t) - 10] == 'A' ? 'B' : 'A';
	is_rc(verify(&c, t), JWT_BAD_SIGNATURE, "RS256, a signature byte flipped");
	t = mk("ES256", ec256, hdr("ES256"), PAY);
	t[strlen(t) - 10] = t[strlen(t) - 10] == 'A' ? 'B' : 'A';
	is_rc(verify(&c, t), JWT_BAD_SIGNATURE, "ES256, a signature byte flipped");
	t = mk("HS256", NULL, hdr("HS256"), PAY);
	*(strchr(t, '.') + 5) ^= 1;	/* a letter into its neighbour */
	is_rc(verify(&c, t), JWT_BAD_SIGNATURE, "HS256, a payload byte flipped");
	t = mk("EdDSA", ed, hdr("EdDSA"), PAY);
	*(strchr(t, '.') + 5) ^= 1;
	is_rc(verify(&c, t), JWT_BAD_SIGNATURE, "EdDSA, a payload byte flipped");
	is_rc(verify(&c, mk_("ES256", ec256, NULL, 0, hdr("ES256"), PAY, true)),
	      JWT_BAD_SIGNATURE, "ES256 with a DER signature");
	ok(strstr(why, "is 71 bytes, not 64") != NULL || strstr(why, "is 70 bytes, not 64") != NULL ||
	   strstr(why, "is 72 bytes, not 64") != NULL, "why: %s", why);
	is_rc(verify(&c, mk("RS256", rsa, hdr("PS256"), PAY)), JWT_BAD_SIGNATURE,
	      "an RS256 signature under PS256");

	/* malformed text */
	t = mk("HS256", NULL, hdr("HS256"), PAY);
	is_rc(jwt_verify(&c, t, strlen(t), "sub", out, why, sizeof(why)), JWT_OK,
	      "a well-formed HS256 token");
	is_rc(jwt_verify(&c, fmt("%s.AAAA\n", t), strlen(t), "sub", out, why, sizeof(why)),
	      JWT_OK, "... ended by its length, not by a NUL");
	is_rc(verify(&c, fmt("%s=", t)), JWT_MALFORMED, "padding");
	is_rc(verify(&c, fmt("%s*", t)), JWT_MALFORMED, "a character outside base64url");
	is_rc(verify(&c, fmt(" %s", t)), JWT_MALFORMED, "a leading blank");
	is_rc(verify(&c, fmt("%s.", t)), JWT_MALFORMED, "four segments");
	*strrchr(t, '.') = '\0';
	is_rc(verify(&c, t), JWT_MALFORMED, "two segments");
	is_rc(verify(&c, ""), JWT_MALFORMED, "empty");
	is_rc(verify(&c, ".."), JWT_MALFORMED, "empty segments");
	is_rc(jwt_verify(&c, NULL, 0, "sub", out, why, sizeof(why)), JWT_MALFORMED,
	      "NULL, 0");
	t = keep(malloc(JWT_TOKEN_MAX + 2));
	memset(t, 'A', JWT_TOKEN_MAX + 1);
	t[10] = t[20] = '.';
	t[JWT_TOKEN_MAX + 1] = '\0';
	is_rc(verify(&c, t), JWT_MALFORMED, "a token of %d bytes", JWT_TOKEN_MAX + 1);
	t = mk("HS256", NULL, "{\"alg\":\"HS256\"} ", PAY);	/* 16 bytes */
	is_rc(verify(&c, t), JWT_OK, "a header of 16 bytes (4 bits left over)");
	p = strchr(t, '.') - 1;
	*p = b64[(strchr(b64, *p) - b64) | 1];	/* ... not zero */
	is_rc(verify(&c, t), JWT_MALFORMED, "a non-canonical last base64url character");
	is_rc(verify(&c, mk("HS256", NULL, "{\"alg\":\"HS256\",\"crit\":[\"b64\"],\"b64\":false}",
			    PAY)), JWT_MALFORMED, "crit");
	is_rc(verify(&c, mk("HS256", NULL, "{\"alg\":\"HS256\",\"typ\":\"JOSE\"}", PAY)),
	      JWT_MALFORMED, "typ JOSE");
	is_rc(verify(&c, mk("HS256", NULL, "{\"alg\":\"HS256\",\"typ\":\"at+jwt\"}", PAY)),
	      JWT_OK, "typ at+jwt");
	is_rc(verify(&c, mk("HS256", NULL, "{\"alg\":\"HS256\",\"typ\":\"application/jwt\"}",
			    PAY)), JWT_OK, "typ application/jwt");
	is_rc(verify(&c, mk("HS256", NULL, "{\"alg\":\"HS256\",\"typ\":\"jwt\"}", PAY)),
	      JWT_OK, "typ jwt");
	is_rc(verify(&c, mk("HS256", NULL, "{\"alg\":\"HS256\",\"alg\":\"HS256\"}", PAY)),
	      JWT_MALFORMED, "alg given twice");
	is_rc(verify(&c, mk("HS256", NULL, "{\"typ\":\"JWT\"}", PAY)), JWT_MALFORMED, "no alg");
	is_rc(verify(&c, mk("HS256", NULL, "[1]", PAY)), JWT_MALFORMED, "header an array");
	is_rc(verify(&c, mk("HS256", NULL, "{\"alg\":\"HS256\"}\n", PAY)), JWT_OK,
	      "header with a trailing newline (JSON whitespace)");
	is_rc(verify(&c, mk("HS256", NULL, "{\"alg\":\"HS\\n256\"}", PAY)), JWT_ALG_REFUSED,
	      "alg with a newline");
	ok(strstr(why, "\"HS?256\"") != NULL, "... shown with '?': %s", why);
	memset(long_alg, 'X', sizeof(long_alg) - 1);
	long_alg[sizeof(long_alg) - 1] = '\0';
	is_rc(verify(&c, mk("HS256", NULL, fmt("{\"alg\":\"%s\"}", long_alg), PAY)),
	      JWT_ALG_REFUSED, "a long alg");
	ok(strstr(why, "XXX...\"") != NULL && strlen(why) < 120, "... cut short: %s", why);
	is_rc(verify(&c, mk("HS256", NULL, hdr("HS256"), "{\"sub\":\"a\"")), JWT_MALFORMED,
	      "signed claims that are not JSON");
	jwt_keys_free(k);
	jwt_keys_free(rp);
	jwt_keys_free(s32);
}

static void test_names(void)
{
	is_str(jwt_error_name(JWT_OK), "ok", "error name: ok");
	is_str(jwt_error_name(JWT_EXPIRED), "expired", "error name: expired");
	is_str(jwt_error_name(JWT_NOMEM), "no_memory", "error name: no_memory");
	is_str(jwt_error_name((enum jwt_error)99), "unknown", "error name: out of range");
}

int main(void)
{
	strcpy(dir, "/tmp/test_jwt.XXXXXX");
	if (mkdtemp(dir) == NULL)
		return 1;
	rsa = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
	ec256 = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
	ec256b = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
	ec384 = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-384");
	ec521 = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-521");
	ed = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	if (!rsa || !ec256 || !ec256b || !ec384 || !ec521 || !ed)
		return 1;
	write_keys();
	test_algs();
	test_load();
	test_each_alg();
	test_claims();
	test_kid();
	test_refused();
	test_names();

	for (const char *const *f = (const char *const[]){ "rsa.pem", "rsa1.pem",
		"ec256.pem", "ec384.crt", "ed.pem", "all.pem", "secret", "secret32",
		"secret31", "private.pem", "keys.jwks", "empty", "bad.json", "dup.json",
		"none.json", "notarray.json", "badec.json", "shortk.json", "badpem",
		"rsa1024.pem", "rsa1024.jwk", "offcurve.jwk", "even.jwk", "private.jwk", "many.jwks", NULL }; *f; f++)
		unlink(path(*f));
	rmdir(dir);
	EVP_PKEY_free(rsa);
	EVP_PKEY_free(ec256);
	EVP_PKEY_free(ec256b);
	EVP_PKEY_free(ec384);
	EVP_PKEY_free(ec521);
	EVP_PKEY_free(ed);
	for (int i = 0; i < nkept; i++)
		free(kept[i]);
	return tap_done();
}
