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

/* A self-signed certificate of pkey (X509_free() it). */
static X509 *self_signed(EVP_PKEY *pkey)
{
	X509 *x = X509_new();

	if (!(x && X509_set_version(x, 2) &&
	      ASN1_INTEGER_set(X509_get_serialNumber(x), 1) &&
	      X509_gmtime_adj(X509_getm_notBefore(x), 0) &&
	      X509_gmtime_adj(X509_getm_notAfter(x), 3600) &&
	      X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN",
					 MBSTRING_ASC, (const unsigned char *)"jwt",
					 -1, -1, 0) &&
	      X509_set_issuer_name(x, X509_get_subject_name(x)) &&
	      X509_set_pubkey(x, pkey) && X509_sign(x, pkey, EVP_sha256())))
		abort();
	return x;
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
		x = self_signed(pkey);
		ok = PEM_write_bio_X509(b, x);
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

/* The DER of pkey as a .cer holds it (a self-signed certificate), as a
 * SubjectPublicKeyInfo, a PKCS#1 RSAPublicKey, or its private key. */
enum der_kind { DER_CERT, DER_SPKI, DER_PKCS1, DER_PRIVATE };

static unsigned char *der(EVP_PKEY *pkey, enum der_kind kind, size_t *len)
{
	unsigned char *buf = NULL, *out;
	X509 *x = NULL;
	int n = -1;

	switch (kind) {
	case DER_CERT:
		x = self_signed(pkey);
		n = i2d_X509(x, &buf);
		X509_free(x);
		break;
	case DER_SPKI:
		n = i2d_PUBKEY(pkey, &buf);
		break;
	case DER_PKCS1:
		n = i2d_PublicKey(pkey, &buf);
		break;
	case DER_PRIVATE:
		n = i2d_PrivateKey(pkey, &buf);
		break;
	}
	if (n <= 0 || (out = malloc((size_t)n)) == NULL)
		abort();
	memcpy(out, buf, (size_t)n);
	OPENSSL_free(buf);
	*len = (size_t)n;
	return (unsigned char *)keep((char *)out);
}

/* data as RFC 4648 base64 (a JWKS x5c entry's), a line break after every
 * wrap characters (0: one line, no break). */
static char *b64std(const void *data, size_t len, size_t wrap)
{
	char *flat = keep(malloc(4 * ((len + 2) / 3) + 1));
	char *out = keep(malloc(8 * ((len + 2) / 3) + 2)), *o = out;
	int n = EVP_EncodeBlock((unsigned char *)flat, data, (int)len);

	for (int i = 0; i < n; i++) {
		*o++ = flat[i];
		if (wrap && (size_t)(i + 1) % wrap == 0)
			*o++ = '\n';
	}
	*o = '\0';
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

/* What jwt_keys names for the file name of the test directory, which may
 * be "hmac:name" (a shared secret). */
static const char *spec(const char *name)
{
	if (strncmp(name, "hmac:", 5) == 0)
		return fmt("hmac:%s", path(name + 5));
	return path(name);
}

static struct jwt_keys *load(const char *name)
{
	char err[512];
	struct jwt_keys *k = jwt_keys_load(spec(name), err, sizeof(err));

	if (k == NULL)
		printf("# %s\n", err);
	return k;
}

/* Does loading name fail with an error that names the file (without
 * "hmac:") and says what? */
static void load_fails(const char *name, const char *what, const char *test)
{
	const char *file = path(strncmp(name, "hmac:", 5) == 0 ? name + 5 : name);
	char err[512] = "";
	struct jwt_keys *k = jwt_keys_load(spec(name), err, sizeof(err));

	if (!ok(k == NULL && strstr(err, what) != NULL &&
		strncmp(err, file, strlen(file)) == 0 && err[strlen(file)] == ':',
		"%s", test))
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
	write_file("secret48", secret, 48);
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
	k = load("hmac:secret");
	ok(k != NULL && jwt_keys_algs(k) == hs_algs, "secret of 64 bytes: HS256/384/512");
	jwt_keys_free(k);
	k = load("hmac:secret32");
	ok(k != NULL && jwt_keys_algs(k) == 1u << JWT_HS256, "secret of 32 bytes: HS256 only");
	jwt_keys_free(k);

	load_fails("private.pem", "private key", "a PEM private key is refused");
	load_fails("hmac:secret31", "at least 32", "a secret of 31 bytes is refused");
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

#define RSA_ALGS (1u << JWT_RS256 | 1u << JWT_RS384 | 1u << JWT_RS512 | \
		  1u << JWT_PS256 | 1u << JWT_PS384 | 1u << JWT_PS512)

/* Does name load as one key that verifies exactly algs? */
static struct jwt_keys *load_one(const char *name, unsigned algs, const char *test)
{
	struct jwt_keys *k = load(name);

	ok(k != NULL && jwt_keys_count(k) == 1 && jwt_keys_algs(k) == algs, "%s", test);
	return k;
}

/*
 * Issue 44: a certificate as an identity provider publishes it (DER, a
 * .cer) or the bare base64 of a JWKS x5c entry was neither JSON nor PEM,
 * so it became an HMAC secret, and an HS256 token MAC'ed with those public
 * bytes verified. They are read as what they are; a secret needs
 * "hmac:FILE", and what is no known form is refused, saying what it is.
 */
static void test_der(void)
{
	size_t n, pn, kn;
	unsigned char *cer = der(rsa, DER_CERT, &n), *spki, *priv;
	char *x5c = b64std(cer, n, 0), *t;
	struct jwt_keys *k;
	struct jwt_check c;

	write_file("rsa.cer", cer, n);
	k = load_one("rsa.cer", RSA_ALGS, "DER certificate: its RSA key, RS* and PS*");
	c = check(k);
	is_rc(verify(&c, mk("RS256", rsa, hdr("RS256"), PAY)), JWT_OK,
	      "... which verifies RS256");
	t = mk_("HS256", NULL, cer, n, hdr("HS256"), PAY, false);
	is_rc(verify(&c, t), JWT_NO_KEY, "HS256 MAC'ed with the certificate's bytes: no key");
	jwt_keys_free(k);

	put("rsa.x5c", fmt("%s\n", x5c));
	k = load_one("rsa.x5c", RSA_ALGS, "bare base64 of the certificate (an x5c entry)");
	c = check(k);
	is_rc(verify(&c, mk("PS256", rsa, hdr("PS256"), PAY)), JWT_OK, "... verifies PS256");
	t = mk_("HS256", NULL, x5c, strlen(x5c), hdr("HS256"), PAY, false);
	is_rc(verify(&c, t), JWT_NO_KEY, "HS256 MAC'ed with the x5c text: no key");
	t = mk_("HS256", NULL, cer, n, hdr("HS256"), PAY, false);
	is_rc(verify(&c, t), JWT_NO_KEY, "... nor with its bytes");
	jwt_keys_free(k);
	put("rsa.b64", b64std(cer, n, 64));
	jwt_keys_free(load_one("rsa.b64", RSA_ALGS, "base64 in lines of 64, no PEM armour"));

	spki = der(ec256, DER_SPKI, &pn);
	write_file("ec256.der", spki, pn);
	k = load_one("ec256.der", 1u << JWT_ES256, "DER SubjectPublicKeyInfo (EC P-256): ES256");
	c = check(k);
	is_rc(verify(&c, mk("ES256", ec256, hdr("ES256"), PAY)), JWT_OK, "... verifies ES256");
	jwt_keys_free(k);
	put("ec256.b64", b64std(spki, pn, 76));
	jwt_keys_free(load_one("ec256.b64", 1u << JWT_ES256, "... and as base64"));
	spki = der(ed, DER_SPKI, &pn);
	write_file("ed.der", spki, pn);
	jwt_keys_free(load_one("ed.der", 1u << JWT_EDDSA, "DER Ed25519 public key: EdDSA"));
	spki = der(rsa, DER_PKCS1, &pn);
	write_file("rsa1.der", spki, pn);
	jwt_keys_free(load_one("rsa1.der", RSA_ALGS, "DER PKCS#1 RSAPublicKey"));

	priv = der(ec256, DER_PRIVATE, &kn);
	write_file("ec256.key.der", priv, kn);
	load_fails("ec256.key.der", "a DER private key: give the public key",
		   "a DER private key is refused");
	put("ec256.key.b64", b64std(priv, kn, 64));
	load_fails("ec256.key.b64", "base64 of a DER private key", "... and as base64");
	{
		EVP_PKEY *small = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
		unsigned char *d = der(small, DER_CERT, &pn);

		write_file("rsa1024.cer", d, pn);
		load_fails("rsa1024.cer", "a DER certificate: an RSA key of 1024 bits",
			   "a DER certificate of an RSA key of 1024 bits");
		EVP_PKEY_free(small);
	}
	{
		unsigned char *more = (unsigned char *)keep(malloc(n + 1));

		memcpy(more, cer, n);
		more[n] = 0;
		write_file("trailing.cer", more, n + 1);
		load_fails("trailing.cer", "binary data that is neither a JWKS, PEM, DER",
			   "a DER certificate with a byte after it");
	}
	write_file("seq.der", "\x30\x03\x02\x01\x05", 5);
	load_fails("seq.der", "a DER structure that is neither a certificate nor a public key",
		   "DER of something else");
	put("words", "this is not a key: it is a sentence of some length\n");
	load_fails("words", "text that is neither a JWKS, PEM, DER nor the base64 of DER "
		   "(a file is an HMAC secret only as hmac:FILE)", "text of no known form");
	{
		unsigned char bin[48];

		for (size_t i = 0; i < sizeof(bin); i++)
			bin[i] = (unsigned char)(i * 37 + 1);
		write_file("blob", bin, sizeof(bin));
		load_fails("blob", "binary data that is neither", "binary data of no known form");
		put("blob.b64", b64std(bin, sizeof(bin), 0));
		load_fails("blob.b64", "base64 text whose bytes are not DER",
			   "base64 of what is not DER");
	}
	load_fails("secret", "hmac:FILE", "a secret file without hmac: is no secret");
	load_fails("secret32", "hmac:FILE", "... nor one without a newline");

	load_fails("hmac:rsa.cer", "hmac: names a DER certificate, not a shared secret",
		   "hmac: with a DER certificate is refused");
	load_fails("hmac:rsa.x5c", "hmac: names base64 of a DER certificate",
		   "... with an x5c entry");
	load_fails("hmac:ec256.der", "hmac: names a DER public key", "... with a DER public key");
	load_fails("hmac:rsa.pem", "hmac: names PEM", "... with a PEM public key");
	load_fails("hmac:keys.jwks", "hmac: names a JWK or JWKS", "... with a JWKS");
	load_fails("hmac:ec256.key.der", "hmac: names a DER private key",
		   "... with a DER private key");
	load_fails("hmac:missing", "No such file", "hmac: with a missing file");
	jwt_keys_free(load_one("hmac:blob", 1u << JWT_HS256 | 1u << JWT_HS384,
			       "hmac: with 48 bytes of binary data: HS256 and HS384"));
}

/* What --check-config prints of each key. */
static void test_describe(void)
{
	static const char *const want[] = {
		"RSA 2048 RS/PS kid \"rsa\"", "EC P-256 ES256 kid \"a\"",
		"EC P-256 ES256 kid \"b\"", "EC P-384 ES384 kid \"p384\"",
		"EC P-521 ES512 kid \"p521\"", "Ed25519 EdDSA kid \"ed\"",
		"HMAC 64 bytes HS kid \"hmac\"",
	};
	struct jwt_keys *k = load("keys.jwks");
	char buf[160];

	for (int i = 0; k != NULL && i < jwt_keys_count(k) && i < 7; i++) {
		jwt_keys_describe(k, i, buf, sizeof(buf));
		is_str(buf, want[i], "describe: JWKS key %d", i);
	}
	jwt_keys_free(k);
	k = load("hmac:secret32");
	jwt_keys_describe(k, 0, buf, sizeof(buf));
	is_str(buf, "HMAC 32 bytes HS256", "describe: a secret of 32 bytes");
	jwt_keys_free(k);
	k = load("hmac:secret48");
	jwt_keys_describe(k, 0, buf, sizeof(buf));
	is_str(buf, "HMAC 48 bytes HS256/HS384", "describe: a secret of 48 bytes");
	jwt_keys_free(k);
	k = load("rsa.cer");
	jwt_keys_describe(k, 0, buf, sizeof(buf));
	is_str(buf, "RSA 2048 RS/PS", "describe: a DER certificate");
	jwt_keys_free(k);
	put("narrow.jwks", fmt("{\"keys\":[%s,%s]}", jwk(rsa, ",\"alg\":\"PS384\""),
			       jwk(ec384, ",\"kid\":\"a \\\"quoted\\\" kid\"")));
	k = load("narrow.jwks");
	jwt_keys_describe(k, 0, buf, sizeof(buf));
	is_str(buf, "RSA 2048 PS384", "describe: an RSA JWK of alg PS384");
	jwt_keys_describe(k, 1, buf, sizeof(buf));
	is_str(buf, "EC P-384 ES384 kid \"a ?quoted? kid\"", "describe: quotes in a kid");
	jwt_keys_describe(k, 1, buf, 12);
	is_str(buf, "EC P-384 ES", "describe: cut to the buffer");
	jwt_keys_free(k);
}

static void test_each_alg(void)
{
	struct jwt_keys *jwks = load("keys.jwks"), *pemk = load("all.pem");
	struct jwt_keys *sec = load("hmac:secret"), *crt = load("ec384.crt");
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
	struct jwt_keys *k = load("hmac:secret");
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
	static const struct {
		bool b;			/* signed by the key without kid */
		const char *kid;
		enum jwt_error want;
		const char *test;
	} mixed[] = {
		{ false, "a", JWT_OK, "kid a, key a" },
		{ true, "a", JWT_OK, "kid a, signed by the key without kid: tried" },
		{ true, "zzz", JWT_OK, "an unknown kid, the key without kid" },
		{ false, "zzz", JWT_BAD_SIGNATURE, "an unknown kid never reaches key a" },
	};
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

	/* a JWKS of a key with kid a and one without: a kid rules out only
	 * the keys of another kid (docs/configuration.md) */
	put("mixed.jwks", fmt("{\"keys\":[%s,%s]}", jwk(ec256, ",\"kid\":\"a\""),
			      jwk(ec256b, "")));
	k = load("mixed.jwks");
	c = check(k);
	for (size_t i = 0; i < sizeof(mixed) / sizeof(mixed[0]); i++) {
		const char *h = fmt("{\"alg\":\"ES256\",\"kid\":\"%s\"}", mixed[i].kid);

		is_rc(verify(&c, mk("ES256", mixed[i].b ? ec256b : ec256, h, pay)),
		      mixed[i].want, "mixed: %s", mixed[i].test);
	}
	jwt_keys_free(k);
}

static void test_refused(void)
{
	struct jwt_keys *k = load("keys.jwks"), *rp = load("rsa.pem"), *s32 = load("hmac:secret32");
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
	test_der();
	test_describe();
	test_each_alg();
	test_claims();
	test_kid();
	test_refused();
	test_names();

	for (const char *const *f = (const char *const[]){ "rsa.pem", "rsa1.pem",
		"ec256.pem", "ec384.crt", "ed.pem", "all.pem", "secret", "secret32",
		"secret31", "private.pem", "keys.jwks", "empty", "bad.json", "dup.json",
		"none.json", "notarray.json", "badec.json", "shortk.json", "badpem",
		"rsa1024.pem", "rsa1024.jwk", "offcurve.jwk", "even.jwk", "private.jwk", "many.jwks",
		"secret48", "rsa.cer", "rsa.x5c", "rsa.b64", "ec256.der", "ec256.b64", "ed.der",
		"rsa1.der", "ec256.key.der", "ec256.key.b64", "rsa1024.cer", "trailing.cer",
		"seq.der", "words", "blob", "blob.b64", "narrow.jwks", "mixed.jwks", NULL }; *f; f++)
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
