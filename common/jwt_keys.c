/*
 * jwt_keys.c - the keys of a jwt_keys file (see jwt.h): a JWKS, PEM or DER
 * public keys or certificates (DER also as bare base64, as in a JWKS x5c),
 * or - only when the operator says so, "hmac:FILE" - an HMAC secret. Each
 * is reduced to what verification needs - an EVP_PKEY or a secret, an
 * optional kid, and the mask of algorithms it may verify (its family's,
 * narrowed by a JWK's alg and a secret's size), so that jwt.c never asks a
 * token which key to use beyond its kid.
 *
 * A file's form is found from its content, and a file of no known form is
 * refused: read as a secret, the public certificate an identity provider
 * publishes would let anyone MAC an HS256 token that verifies.
 */
#include "jwt_priv.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/asn1.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#define FILE_MAX (1 << 20)	/* a key file larger than this is a mistake */
#define RSA_BITS_MIN 2048
#define SECRET_MIN 32
#define HMAC_PREFIX "hmac:"	/* jwt_keys = hmac:FILE: FILE is a secret */

/* The EC curves by JWK name and by the name OpenSSL reports. */
static const struct curve {
	const char *jwk, *ossl;
	enum fam fam;
	size_t len;		/* of a coordinate */
} curves[] = {
	{ "P-256", "prime256v1", FAM_P256, 32 },
	{ "P-384", "secp384r1", FAM_P384, 48 },
	{ "P-521", "secp521r1", FAM_P521, 66 },
};

/*
 * Is pkey a public key this module takes? Its family, or -1 and why: RSA
 * below RSA_BITS_MIN bits, EC off the three curves, other kinds, and what
 * fails OpenSSL's public key check (an even RSA modulus or exponent).
 */
static int pkey_family(EVP_PKEY *pkey, char *why, size_t wl)
{
	EVP_PKEY_CTX *ctx;
	char group[64];
	int fam = -1;
	bool ok;

	if (EVP_PKEY_is_a(pkey, "RSA")) {
		if (EVP_PKEY_get_bits(pkey) < RSA_BITS_MIN) {
			jwt_say(why, wl, "an RSA key of %d bits: at least %d are required",
			    EVP_PKEY_get_bits(pkey), RSA_BITS_MIN);
			return -1;
		}
		fam = FAM_RSA;
	} else if (EVP_PKEY_is_a(pkey, "EC")) {
		if (!EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME,
						    group, sizeof(group), NULL))
			strcpy(group, "(explicit parameters)");
		for (size_t i = 0; i < sizeof(curves) / sizeof(curves[0]); i++)
			if (strcmp(group, curves[i].ossl) == 0)
				fam = (int)curves[i].fam;
		if (fam < 0) {
			jwt_say(why, wl, "an EC key on curve %s: P-256, P-384 or P-521 is required",
			    group);
			return -1;
		}
	} else if (EVP_PKEY_is_a(pkey, "ED25519")) {
		fam = FAM_ED25519;
	} else {
		jwt_say(why, wl, "a %s key: RSA, EC or Ed25519 is required",
		    EVP_PKEY_get0_type_name(pkey) ? EVP_PKEY_get0_type_name(pkey) : "unknown");
		return -1;
	}
	ctx = EVP_PKEY_CTX_new_from_pkey(NULL, pkey, NULL);
	ok = ctx != NULL && EVP_PKEY_public_check(ctx) == 1;
	EVP_PKEY_CTX_free(ctx);
	if (!ok) {
		jwt_say(why, wl, "the public key fails OpenSSL's public key check");
		return -1;
	}
	return fam;
}

/* Take pkey (owned from here on) or secret (copied) as a key, its algs
 * narrowed to mask. 0, or -1 with why. */
static int keys_add(struct jwt_keys *k, EVP_PKEY *pkey, const void *secret,
		    size_t secret_len, const char *kid, unsigned mask,
		    char *why, size_t wl)
{
	struct jwt_key *key = &k->v[k->n];
	int fam = FAM_OCT;

	if (pkey != NULL && (fam = pkey_family(pkey, why, wl)) < 0)
		goto fail;
	if (pkey == NULL && secret_len < SECRET_MIN) {
		jwt_say(why, wl, "an HMAC secret of %zu bytes: at least %d are required "
		    "(RFC 7518 section 3.2)", secret_len, SECRET_MIN);
		goto fail;
	}
	if (k->n == JWT_KEYS_MAX) {
		jwt_say(why, wl, "more than %d keys", JWT_KEYS_MAX);
		goto fail;
	}
	key->algs = jwt_fam_algs((enum fam)fam, secret_len) & mask;
	if (key->algs == 0) {		/* e.g. alg ES384 on a P-256 key */
		k->skipped++;
		EVP_PKEY_free(pkey);
		return 0;
	}
	if (kid != NULL && (key->kid = strdup(kid)) == NULL)
		goto nomem;
	if (pkey == NULL && (key->secret = OPENSSL_memdup(secret, secret_len)) == NULL)
		goto nomem;
	key->pkey = pkey;
	key->secret_len = secret_len;
	key->fam = (enum fam)fam;
	k->n++;
	return 0;
nomem:
	jwt_say(why, wl, "out of memory");
	free(key->kid);
	memset(key, 0, sizeof(*key));
fail:
	EVP_PKEY_free(pkey);
	return -1;
}

/* A public key of type from OSSL_PARAMs, or NULL. */
static EVP_PKEY *pkey_fromdata(const char *type, OSSL_PARAM *params)
{
	EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, type, NULL);
	EVP_PKEY *pkey = NULL;

	if (ctx == NULL || EVP_PKEY_fromdata_init(ctx) != 1 ||
	    EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) != 1)
		pkey = NULL;
	EVP_PKEY_CTX_free(ctx);
	return pkey;
}

/* Member name of a JWK, base64url-decoded into a new buffer (free() it),
 * or NULL when missing, not a string, or not base64url. */
static unsigned char *member_b64(struct json_object *jwk, const char *name,
				 size_t *len)
{
	const char *s;
	size_t slen;
	unsigned char *out;
	long n;

	if (jwt_member_string(jwk, name, &s, &slen) < 0 || s == NULL ||
	    (out = malloc(slen * 3 / 4 + 1)) == NULL)
		return NULL;
	n = jwt_b64_decode(s, slen, out);
	if (n <= 0) {
		free(out);
		return NULL;
	}
	*len = (size_t)n;
	return out;
}

static EVP_PKEY *jwk_rsa(struct json_object *jwk)
{
	size_t nlen = 0, elen = 0;
	unsigned char *n = member_b64(jwk, "n", &nlen), *e = member_b64(jwk, "e", &elen);
	BIGNUM *bn = n ? BN_bin2bn(n, (int)nlen, NULL) : NULL;
	BIGNUM *be = e ? BN_bin2bn(e, (int)elen, NULL) : NULL;
	OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
	OSSL_PARAM *params = NULL;
	EVP_PKEY *pkey = NULL;

	if (bn != NULL && be != NULL && bld != NULL &&
	    OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn) &&
	    OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, be) &&
	    (params = OSSL_PARAM_BLD_to_param(bld)) != NULL)
		pkey = pkey_fromdata("RSA", params);
	OSSL_PARAM_free(params);
	OSSL_PARAM_BLD_free(bld);
	BN_free(bn);
	BN_free(be);
	free(n);
	free(e);
	return pkey;
}

/* An EC key (x and y of exactly the curve's size), an Ed25519 key (x of
 * 32 bytes), or NULL. */
static EVP_PKEY *jwk_point(struct json_object *jwk, const struct curve *cv)
{
	size_t xlen = 0, ylen = 0;
	unsigned char *x = member_b64(jwk, "x", &xlen);
	unsigned char *y = cv ? member_b64(jwk, "y", &ylen) : NULL;
	unsigned char pt[1 + 2 * 66];
	EVP_PKEY *pkey = NULL;

	if (cv == NULL && x != NULL && xlen == 32) {
		pkey = EVP_PKEY_new_raw_public_key_ex(NULL, "ED25519", NULL, x, xlen);
	} else if (cv != NULL && x != NULL && y != NULL && xlen == cv->len &&
		   ylen == cv->len) {
		OSSL_PARAM params[] = {
			OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME,
							 (char *)cv->jwk, 0),
			OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY, pt,
							  1 + 2 * cv->len),
			OSSL_PARAM_construct_end(),
		};

		pt[0] = 0x04;		/* uncompressed: x || y */
		memcpy(pt + 1, x, cv->len);
		memcpy(pt + 1 + cv->len, y, cv->len);
		pkey = pkey_fromdata("EC", params);
	}
	free(x);
	free(y);
	return pkey;
}

/* Key i of a JWKS: added, skipped (counted), or -1 with why. */
static int jwk_load(struct jwt_keys *k, struct json_object *jwk, size_t i,
		    char *why, size_t wl)
{
	const char *kty, *use, *alg, *kid, *crv;
	size_t ktylen, uselen, alglen, kidlen, crvlen, klen = 0;
	struct json_object *ops;
	unsigned mask = ~0u;
	unsigned char *secret;
	EVP_PKEY *pkey = NULL;
	char sub[200];
	int a, rc;

	if (!json_object_is_type(jwk, json_type_object) ||
	    jwt_member_string(jwk, "kty", &kty, &ktylen) < 0 || kty == NULL ||
	    jwt_member_string(jwk, "use", &use, &uselen) < 0 ||
	    jwt_member_string(jwk, "alg", &alg, &alglen) < 0 ||
	    jwt_member_string(jwk, "crv", &crv, &crvlen) < 0 ||
	    jwt_member_string(jwk, "kid", &kid, &kidlen) < 0 ||
	    (kid != NULL && strlen(kid) != kidlen)) {
		jwt_say(why, wl, "key %zu: not a JWK (kty, and kid, use, alg, crv as strings)", i);
		return -1;
	}
	if (strcmp(kty, "oct") != 0 && json_object_object_get_ex(jwk, "d", NULL)) {
		jwt_say(why, wl, "key %zu is a private key (\"d\"): give the public JWK", i);
		return -1;
	}
	if (use != NULL && strcmp(use, "sig") != 0)
		goto skip;		/* "enc": not for signatures */
	if (json_object_object_get_ex(jwk, "key_ops", &ops)) {
		bool verify = false;

		for (size_t j = 0; json_object_is_type(ops, json_type_array) &&
				   j < json_object_array_length(ops); j++)
			verify |= jwt_string_is(json_object_array_get_idx(ops, j), "verify");
		if (!verify)
			goto skip;
	}
	if (alg != NULL) {
		if ((a = jwt_alg_find(alg, alglen)) < 0)
			goto skip;	/* RSA-OAEP, none, ... */
		mask = 1u << a;
	}
	if (strcmp(kty, "RSA") == 0) {
		pkey = jwk_rsa(jwk);
	} else if (strcmp(kty, "EC") == 0) {
		const struct curve *cv = NULL;

		for (size_t j = 0; j < sizeof(curves) / sizeof(curves[0]); j++)
			if (crv != NULL && strcmp(crv, curves[j].jwk) == 0)
				cv = &curves[j];
		if (cv == NULL)
			goto skip;	/* secp256k1, ... */
		pkey = jwk_point(jwk, cv);
	} else if (strcmp(kty, "OKP") == 0) {
		if (crv == NULL || strcmp(crv, "Ed25519") != 0)
			goto skip;	/* Ed448, X25519 */
		pkey = jwk_point(jwk, NULL);
	} else if (strcmp(kty, "oct") == 0) {
		if ((secret = member_b64(jwk, "k", &klen)) == NULL) {
			jwt_say(why, wl, "key %zu: \"k\" missing or not base64url", i);
			return -1;
		}
		rc = keys_add(k, NULL, secret, klen, kid, mask, sub, sizeof(sub));
		jwt_wipe_free(secret, klen);
		goto added;
	} else {
		goto skip;
	}
	if (pkey == NULL) {
		jwt_say(why, wl, "key %zu: a key of kty %s whose members are missing or "
		    "wrong (base64url; a point of the curve's size, on it)", i, kty);
		return -1;
	}
	rc = keys_add(k, pkey, NULL, 0, kid, mask, sub, sizeof(sub));
added:
	if (rc < 0)
		jwt_say(why, wl, "key %zu: %s", i, sub);
	return rc;
skip:
	k->skipped++;
	return 0;
}

static int load_jwks(struct jwt_keys *k, const char *s, size_t len, char *why,
		     size_t wl)
{
	struct json_object *root = jwt_json_object(s, len), *list;
	int rc = -1;

	if (root == NULL) {
		jwt_say(why, wl, "not a JSON object (strict JSON, UTF-8, each name once)");
		goto out;
	}
	if (!json_object_object_get_ex(root, "keys", &list)) {
		rc = jwk_load(k, root, 0, why, wl);	/* a single JWK */
		goto out;
	}
	if (!json_object_is_type(list, json_type_array)) {
		jwt_say(why, wl, "\"keys\" is not an array");
		goto out;
	}
	for (size_t i = 0; i < json_object_array_length(list); i++)
		if (jwk_load(k, json_object_array_get_idx(list, i), i, why, wl) < 0)
			goto out;
	rc = 0;
out:
	json_object_put(root);
	return rc;
}

/* What DER bytes are, as far as a key file goes. */
enum der_kind {
	DER_CERT,		/* an X.509 certificate: its key is taken */
	DER_SPKI,		/* a SubjectPublicKeyInfo ("PUBLIC KEY") */
	DER_PKCS1,		/* a PKCS#1 RSAPublicKey ("RSA PUBLIC KEY") */
	DER_PRIVATE,		/* a private key: refused */
	DER_OTHER,		/* one DER SEQUENCE, but none of these */
	DER_NONE,		/* not DER */
};

static const char *const der_names[] = {
	[DER_CERT] = "certificate",
	[DER_SPKI] = "public key",
	[DER_PKCS1] = "RSA public key (PKCS#1)",
	[DER_PRIVATE] = "private key",
	[DER_OTHER] = "structure that is neither a certificate nor a public key",
};

/* The public key of der[0..len) read whole as kind (one of the first
 * three), or NULL. A certificate only lends its key: its dates and issuer
 * are not checked. */
static EVP_PKEY *der_parse(enum der_kind kind, const unsigned char *der,
			   long len)
{
	const unsigned char *p = der;
	EVP_PKEY *pkey = NULL;
	X509 *x;

	if (kind == DER_CERT) {
		x = d2i_X509(NULL, &p, len);
		pkey = x ? X509_get_pubkey(x) : NULL;
		X509_free(x);
	} else if (kind == DER_SPKI) {
		pkey = d2i_PUBKEY(NULL, &p, len);
	} else if (kind == DER_PKCS1) {
		pkey = d2i_PublicKey(EVP_PKEY_RSA, NULL, &p, len);
	}
	if (pkey != NULL && p != der + len) {
		EVP_PKEY_free(pkey);	/* bytes after it */
		pkey = NULL;
	}
	return pkey;
}

/* What der[0..len) is; the key of a certificate or public key in *pkey
 * (the caller owns it). */
static enum der_kind der_key(const unsigned char *der, size_t len,
			     EVP_PKEY **pkey)
{
	const unsigned char *p = der;
	EVP_PKEY *priv;
	long l;
	int tag, cls;

	*pkey = NULL;
	if (len == 0 || len > (size_t)LONG_MAX ||
	    ASN1_get_object(&p, &l, &tag, &cls, (long)len) != V_ASN1_CONSTRUCTED ||
	    tag != V_ASN1_SEQUENCE || cls != V_ASN1_UNIVERSAL ||
	    l != (long)(der + len - p))
		return DER_NONE;	/* not one SEQUENCE, as each form is */
	for (int kind = DER_CERT; kind <= DER_PKCS1; kind++)
		if ((*pkey = der_parse((enum der_kind)kind, der, (long)len)) != NULL)
			return (enum der_kind)kind;
	p = der;
	if ((priv = d2i_AutoPrivateKey(NULL, &p, (long)len)) == NULL)
		return DER_OTHER;
	EVP_PKEY_free(priv);
	return DER_PRIVATE;
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/*
 * s[0..len) as base64 text: RFC 4648 §4's (a JWKS x5c entry's, which is not
 * base64url) or base64url, blanks and line breaks anywhere, '=' only at the
 * end. The bytes in a new buffer (free() it) and their number, or -1.
 */
static long b64_text(const char *s, size_t len, unsigned char **out)
{
	char *t = malloc(len + 1);
	size_t n = 0, pad = 0;
	long got = -1;

	*out = NULL;
	if (t == NULL)
		return -1;
	for (size_t i = 0; i < len; i++) {
		if (is_blank(s[i]))
			continue;
		if (s[i] == '=') {
			pad++;
			continue;
		}
		if (pad > 0)
			goto out;	/* '=' inside */
		t[n++] = s[i] == '+' ? '-' : s[i] == '/' ? '_' : s[i];
	}
	if (n == 0 || pad > 2 || (pad > 0 && (n + pad) % 4 != 0) ||
	    (*out = malloc(n * 3 / 4 + 1)) == NULL)
		goto out;
	if ((got = jwt_b64_decode(t, n, *out)) <= 0) {
		free(*out);
		*out = NULL;
		got = -1;
	}
out:
	free(t);
	return got;
}

/* The file as DER, or else as the base64 of DER (*b64 set): what it is,
 * and the key of a certificate or public key in *pkey. */
static enum der_kind file_der(const char *s, size_t len, EVP_PKEY **pkey,
			      bool *b64)
{
	enum der_kind kind = der_key((const unsigned char *)s, len, pkey);
	unsigned char *bin;
	long n;

	*b64 = false;
	if (kind != DER_NONE || (n = b64_text(s, len, &bin)) < 0)
		return kind;
	*b64 = true;
	kind = der_key(bin, (size_t)n, pkey);
	free(bin);
	return kind;
}

/* How an error says that a secret is an operator's choice. */
#define SECRET_HINT "(a file is an HMAC secret only as " HMAC_PREFIX "FILE)"

/* A file that is neither JSON nor PEM: one DER certificate or public key,
 * or its base64; anything else is refused, saying what it is. */
static int load_der(struct jwt_keys *k, const char *s, size_t len, char *why,
		    size_t wl)
{
	EVP_PKEY *pkey;
	bool b64, text = true;
	enum der_kind kind = file_der(s, len, &pkey, &b64);
	const char *as = b64 ? "base64 of a " : "a ";
	char sub[200];

	switch (kind) {
	case DER_CERT:
	case DER_SPKI:
	case DER_PKCS1:
		if (keys_add(k, pkey, NULL, 0, NULL, ~0u, sub, sizeof(sub)) == 0)
			return 0;
		jwt_say(why, wl, "%sDER %s: %s", as, der_names[kind], sub);
		return -1;
	case DER_PRIVATE:
		jwt_say(why, wl, "%sDER private key: give the public key "
		    "(openssl pkey -pubout)", as);
		return -1;
	case DER_OTHER:
		jwt_say(why, wl, "%sDER %s " SECRET_HINT, as, der_names[kind]);
		return -1;
	case DER_NONE:
		break;
	}
	for (size_t i = 0; i < len; i++)
		text &= (s[i] >= 0x20 && s[i] < 0x7f) || is_blank(s[i]);
	if (b64)
		jwt_say(why, wl, "base64 text whose bytes are not DER, so not a key "
		    SECRET_HINT);
	else
		jwt_say(why, wl, "%s that is neither a JWKS, PEM, DER nor the base64 "
		    "of DER " SECRET_HINT, text ? "text" : "binary data");
	return -1;
}

/* The public key of one PEM block, or NULL with why. */
static EVP_PKEY *pem_block(const char *name, const unsigned char *der,
			   long len, int i, char *why, size_t wl)
{
	EVP_PKEY *pkey;

	if (strstr(name, "PRIVATE KEY") != NULL) {
		jwt_say(why, wl, "PEM block %d is a private key: give the public key "
		    "(openssl pkey -pubout)", i);
		return NULL;
	}
	if (strcmp(name, "PUBLIC KEY") == 0) {
		pkey = der_parse(DER_SPKI, der, len);
	} else if (strcmp(name, "RSA PUBLIC KEY") == 0) {
		pkey = der_parse(DER_PKCS1, der, len);
	} else if (strcmp(name, "CERTIFICATE") == 0) {
		pkey = der_parse(DER_CERT, der, len);
	} else {
		jwt_say(why, wl, "PEM block %d is a \"%.40s\": PUBLIC KEY, RSA PUBLIC KEY "
		    "or CERTIFICATE is required", i, name);
		return NULL;
	}
	if (pkey == NULL)
		jwt_say(why, wl, "PEM block %d (%s) does not parse", i, name);
	return pkey;
}

static int load_pem(struct jwt_keys *k, const char *s, size_t len, char *why,
		    size_t wl)
{
	BIO *bio = BIO_new_mem_buf(s, (int)len);
	char *name = NULL, *header = NULL, sub[200];
	unsigned char *der = NULL;
	long dlen;
	unsigned long e;
	int i = 0, rc = -1;

	if (bio == NULL) {
		jwt_say(why, wl, "out of memory");
		return -1;
	}
	ERR_clear_error();
	while (PEM_read_bio(bio, &name, &header, &der, &dlen) == 1) {
		EVP_PKEY *pkey = pem_block(name, der, dlen, ++i, why, wl);

		OPENSSL_free(name);
		OPENSSL_free(header);
		OPENSSL_free(der);
		if (pkey == NULL)
			goto out;
		if (keys_add(k, pkey, NULL, 0, NULL, ~0u, sub, sizeof(sub)) < 0) {
			jwt_say(why, wl, "PEM block %d: %s", i, sub);
			goto out;
		}
	}
	/* the loop ends at the end of the text, or at a block it cannot read */
	e = ERR_peek_last_error();
	if (ERR_GET_LIB(e) != ERR_LIB_PEM || ERR_GET_REASON(e) != PEM_R_NO_START_LINE) {
		jwt_say(why, wl, "PEM block %d does not parse", i + 1);
		goto out;
	}
	rc = 0;
out:
	BIO_free(bio);
	return rc;
}

/* The whole file read into a NUL-terminated buffer, or -1 with why. */
static int read_file(const char *path, char **data, size_t *len, char *why,
		     size_t wl)
{
	/* not blocking on a FIFO or a device: a key file is a file */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	FILE *f = NULL;
	char *buf = NULL;
	struct stat st;
	size_t n;

	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
	    (f = fdopen(fd, "rb")) == NULL) {
		jwt_say(why, wl, "%s", fd < 0 ? strerror(errno) : "not a regular file");
		if (fd >= 0)
			close(fd);
		return -1;
	}
	if ((buf = malloc(FILE_MAX + 1)) == NULL) {
		jwt_say(why, wl, "out of memory");
		goto fail;
	}
	n = fread(buf, 1, FILE_MAX + 1, f);
	if (ferror(f)) {
		jwt_say(why, wl, "cannot read: %s", strerror(errno));
		goto fail;
	}
	if (n == 0) {
		jwt_say(why, wl, "an empty file");
		goto fail;
	}
	if (n > FILE_MAX) {
		jwt_say(why, wl, "larger than %d bytes", FILE_MAX);
		goto fail;
	}
	fclose(f);
	buf[n] = '\0';
	*data = buf;
	*len = n;
	return 0;
fail:
	jwt_wipe_free(buf, FILE_MAX + 1);
	fclose(f);
	return -1;
}

/*
 * hmac:FILE: the whole file, trailing newlines stripped, is the secret -
 * unless it reads as a key file, which is never one.
 */
static int load_secret(struct jwt_keys *k, const char *s, size_t len,
		       char *why, size_t wl)
{
	struct json_object *json = jwt_json_object(s, len);
	char form[96] = "";
	EVP_PKEY *pkey = NULL;
	enum der_kind kind;
	bool b64;

	if (json != NULL)
		snprintf(form, sizeof(form), "a JWK or JWKS");
	else if (memmem(s, len, "-----BEGIN ", 11) != NULL)
		snprintf(form, sizeof(form), "PEM");
	else if ((kind = file_der(s, len, &pkey, &b64)) <= DER_PRIVATE)
		snprintf(form, sizeof(form), "%sDER %s", b64 ? "base64 of a " : "a ",
			 der_names[kind]);
	json_object_put(json);
	EVP_PKEY_free(pkey);
	if (form[0] != '\0') {
		jwt_say(why, wl, HMAC_PREFIX " names %s, not a shared secret: name "
		    "a key file without " HMAC_PREFIX, form);
		return -1;
	}
	while (len > 0 && (s[len - 1] == '\n' || s[len - 1] == '\r'))
		len--;
	return keys_add(k, NULL, s, len, NULL, ~0u, why, wl);
}

/* A file of public keys (or a JWKS's secrets), its form found from what it
 * holds: a JSON object, PEM blocks, else DER or its base64. */
static int load_keys(struct jwt_keys *k, const char *s, size_t len,
		     char *why, size_t wl)
{
	if (s[strspn(s, " \t\r\n")] == '{')
		return load_jwks(k, s, len, why, wl);
	if (memmem(s, len, "-----BEGIN ", 11) != NULL)
		return load_pem(k, s, len, why, wl);
	return load_der(k, s, len, why, wl);
}

struct jwt_keys *jwt_keys_load(const char *spec, char *err, size_t errlen)
{
	struct jwt_keys *k = calloc(1, sizeof(*k));
	bool hmac = strncmp(spec, HMAC_PREFIX, strlen(HMAC_PREFIX)) == 0;
	const char *path = hmac ? spec + strlen(HMAC_PREFIX) : spec;
	char why[256] = "out of memory", *data = NULL;
	size_t len = 0;
	int rc;

	if (k == NULL || read_file(path, &data, &len, why, sizeof(why)) < 0)
		goto fail;
	if (hmac)
		rc = load_secret(k, data, len, why, sizeof(why));
	else
		rc = load_keys(k, data, len, why, sizeof(why));
	if (rc < 0)
		goto fail;
	if (k->n == 0) {
		jwt_say(why, sizeof(why), "no usable key (%d skipped: other kty, crv, "
		    "use or alg)", k->skipped);
		goto fail;
	}
	jwt_wipe_free(data, FILE_MAX + 1);
	ERR_clear_error();
	return k;
fail:
	if (errlen > 0)
		snprintf(err, errlen, "%s: %s", path, why);
	jwt_wipe_free(data, FILE_MAX + 1);
	jwt_keys_free(k);
	ERR_clear_error();
	return NULL;
}

void jwt_keys_free(struct jwt_keys *k)
{
	if (k == NULL)
		return;
	for (int i = 0; i < k->n; i++) {
		EVP_PKEY_free(k->v[i].pkey);
		OPENSSL_clear_free(k->v[i].secret, k->v[i].secret_len);
		free(k->v[i].kid);
	}
	free(k);
}

int jwt_keys_count(const struct jwt_keys *k)
{
	return k->n;
}

int jwt_keys_skipped(const struct jwt_keys *k)
{
	return k->skipped;
}

unsigned jwt_keys_algs(const struct jwt_keys *k)
{
	unsigned m = 0;

	for (int i = 0; i < k->n; i++)
		m |= k->v[i].algs;
	return m;
}

void jwt_keys_describe(const struct jwt_keys *k, int i, char *buf, size_t len)
{
	static const char *const kinds[] = {
		[FAM_RSA] = "RSA", [FAM_P256] = "EC P-256", [FAM_P384] = "EC P-384",
		[FAM_P521] = "EC P-521", [FAM_ED25519] = "Ed25519", [FAM_OCT] = "HMAC",
	};
	const struct jwt_key *key = &k->v[i];
	char size[32] = "", algs[64], shown[JWT_SHOWN_MAX + 4];

	if (key->fam == FAM_RSA)
		snprintf(size, sizeof(size), " %d", EVP_PKEY_get_bits(key->pkey));
	else if (key->fam == FAM_OCT)
		snprintf(size, sizeof(size), " %zu bytes", key->secret_len);
	jwt_algs_join(key->algs, "/", true, algs, sizeof(algs));
	jwt_say(buf, len, "%s%s %s%s%s%s", kinds[key->fam], size, algs,
		key->kid ? " kid \"" : "",
		key->kid ? jwt_shown(key->kid, strlen(key->kid), shown) : "",
		key->kid ? "\"" : "");
}
