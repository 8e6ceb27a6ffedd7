/*
 * jwt.c - see jwt.h.
 *
 * jwt_verify() trusts the token a little more at each step, and parses
 * only what the step before allows:
 *
 *   three base64url segments, at most JWT_TOKEN_MAX bytes
 *     -> header JSON: alg, kid, typ, no crit
 *     -> alg on the allow-list
 *     -> keys whose algs hold the alg (so a key verifies only the algs of
 *        its own family: no HS256 "signed" with an RSA public key) and
 *        whose kid is the token's, if it has one
 *     -> the signature, against each such key
 *     -> only now the claims JSON: exp, nbf, iss, aud, then the claim.
 *
 * Every key is reduced at load (jwt_keys.c) to what verification needs:
 * an EVP_PKEY or a secret, an optional kid, and the mask of algs it may
 * verify.
 */
#include "jwt.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <json-c/json.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rsa.h>

#include "jsontext.h"
#include "jwt_priv.h"

const struct jwt_alg_info jwt_algs[JWT_ALG_COUNT] = {
	[JWT_RS256] = { "RS256", FAM_RSA, "SHA256", false, 0 },
	[JWT_RS384] = { "RS384", FAM_RSA, "SHA384", false, 0 },
	[JWT_RS512] = { "RS512", FAM_RSA, "SHA512", false, 0 },
	[JWT_PS256] = { "PS256", FAM_RSA, "SHA256", true, 0 },
	[JWT_PS384] = { "PS384", FAM_RSA, "SHA384", true, 0 },
	[JWT_PS512] = { "PS512", FAM_RSA, "SHA512", true, 0 },
	[JWT_ES256] = { "ES256", FAM_P256, "SHA256", false, 64 },
	[JWT_ES384] = { "ES384", FAM_P384, "SHA384", false, 96 },
	[JWT_ES512] = { "ES512", FAM_P521, "SHA512", false, 132 },
	[JWT_EDDSA] = { "EdDSA", FAM_ED25519, NULL, false, 64 },
	[JWT_HS256] = { "HS256", FAM_OCT, "SHA256", false, 32 },
	[JWT_HS384] = { "HS384", FAM_OCT, "SHA384", false, 48 },
	[JWT_HS512] = { "HS512", FAM_OCT, "SHA512", false, 64 },
};

void jwt_say(char *why, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (len == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
}

/* s[0..len) fit to quote: at most JWT_SHOWN_MAX bytes, only printable ASCII
 * other than quotes and backslashes ('?' for the rest). */
const char *jwt_shown(const char *s, size_t len, char buf[JWT_SHOWN_MAX + 4])
{
	size_t n = len < JWT_SHOWN_MAX ? len : JWT_SHOWN_MAX;

	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];

		buf[i] = ch < 0x20 || ch > 0x7e || ch == '"' || ch == '\\' ?
			 '?' : (char)ch;
	}
	strcpy(buf + n, len > n ? "..." : "");
	return buf;
}

/* The alg named s[0..len), or -1. */
int jwt_alg_find(const char *s, size_t len)
{
	for (int a = 0; a < JWT_ALG_COUNT; a++)
		if (strlen(jwt_algs[a].name) == len && memcmp(jwt_algs[a].name, s, len) == 0)
			return a;
	return -1;
}

/* The algs a key of family fam may verify; a secret only those whose
 * hash is no longer than it (RFC 7518 §3.2). */
unsigned jwt_fam_algs(enum fam fam, size_t secret_len)
{
	unsigned m = 0;

	for (int a = 0; a < JWT_ALG_COUNT; a++)
		if (jwt_algs[a].fam == fam &&
		    (fam != FAM_OCT || secret_len >= jwt_algs[a].siglen))
			m |= 1u << a;
	return m;
}

/* ---- base64url and JSON ----------------------------------------------- */

static int b64_digit(char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	return c == '-' ? 62 : c == '_' ? 63 : -1;
}

/*
 * Base64url without padding (RFC 7515 §2) s[0..len) into out, which has
 * room for len * 3 / 4 bytes; the decoded length, or -1. Only the one
 * spelling of each byte string is taken: no '=', no blanks, and the bits
 * a last partial group leaves over must be zero.
 */
long jwt_b64_decode(const char *s, size_t len, unsigned char *out)
{
	uint32_t acc = 0;
	size_t n = 0;
	int bits = 0;

	if (len % 4 == 1)
		return -1;
	for (size_t i = 0; i < len; i++) {
		int d = b64_digit(s[i]);

		if (d < 0)
			return -1;
		acc = (acc << 6 | (uint32_t)d) & 0xffffff;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			out[n++] = (unsigned char)(acc >> bits);
		}
	}
	if (acc & ((1u << bits) - 1))
		return -1;
	return (long)n;
}

/* s[0..len) as a JSON object (json_object_put() it), or NULL when it is
 * anything else, has trailing bytes, or is not read as written. */
struct json_object *jwt_json_object(const char *s, size_t len)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *v = NULL;
	struct jsontext t = { 0 };

	if (tok == NULL || len > INT32_MAX)
		goto fail;
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
	v = json_tokener_parse_ex(tok, s, (int)len);
	if (v == NULL || json_tokener_get_error(tok) != json_tokener_success ||
	    json_tokener_get_parse_end(tok) != len ||
	    !json_object_is_type(v, json_type_object) ||
	    jsontext_scan(s, len, JSON_TOKENER_DEFAULT_DEPTH, &t) < 0 ||
	    t.nobj == 0 ||
	    t.members[0] != (size_t)json_object_object_length(v))
		goto fail;
	jsontext_free(&t);
	json_tokener_free(tok);
	return v;
fail:
	jsontext_free(&t);
	json_object_put(v);
	json_tokener_free(tok);
	return NULL;
}

/* Member name of o: 0 and *out (NULL when absent), or -1 when it is there
 * but not a string. */
int jwt_member_string(struct json_object *o, const char *name,
			 const char **out, size_t *len)
{
	struct json_object *v;

	*out = NULL;
	*len = 0;
	if (!json_object_object_get_ex(o, name, &v))
		return 0;
	if (!json_object_is_type(v, json_type_string))
		return -1;
	*out = json_object_get_string(v);
	*len = (size_t)json_object_get_string_len(v);
	return 0;
}

/* free() what may hold a secret. */
void jwt_wipe_free(void *p, size_t len)
{
	if (p != NULL)
		OPENSSL_cleanse(p, len);
	free(p);
}

/* Is v the string s? */
bool jwt_string_is(struct json_object *v, const char *s)
{
	return json_object_is_type(v, json_type_string) &&
	       (size_t)json_object_get_string_len(v) == strlen(s) &&
	       memcmp(json_object_get_string(v), s, strlen(s)) == 0;
}

/* ---- the allow-list ---------------------------------------------------- */

int jwt_algs_parse(const char *list, unsigned *mask, char *why, size_t len)
{
	char all[128], buf[JWT_SHOWN_MAX + 4];
	const char *p = list;
	unsigned m = 0;

	for (;;) {
		size_t n = strcspn(p, ","), s = 0, e = n;
		int a;

		while (s < e && (p[s] == ' ' || p[s] == '\t'))
			s++;
		while (e > s && (p[e - 1] == ' ' || p[e - 1] == '\t'))
			e--;
		if (s == e) {
			jwt_say(why, len, p == list && p[n] == '\0' ? "no algorithm given" :
				      "an empty item in the list of algorithms");
			return -1;
		}
		if ((a = jwt_alg_find(p + s, e - s)) < 0) {
			jwt_algs_format((1u << JWT_ALG_COUNT) - 1, all, sizeof(all));
			if (e - s == 4 && memcmp(p + s, "none", 4) == 0)
				jwt_say(why, len, "\"none\" is never accepted");
			else
				jwt_say(why, len, "unknown algorithm \"%s\" (use %s)",
				    jwt_shown(p + s, e - s, buf), all);
			return -1;
		}
		m |= 1u << a;
		if (p[n] == '\0')
			break;
		p += n + 1;
	}
	*mask = m;
	return 0;
}

void jwt_algs_format(unsigned mask, char *buf, size_t len)
{
	jwt_algs_join(mask, ",", false, buf, len);
}

void jwt_algs_join(unsigned mask, const char *sep, bool families, char *buf,
		   size_t len)
{
	size_t n = 0;

	if (len == 0)
		return;
	buf[0] = '\0';
	for (int a = 0; a < JWT_ALG_COUNT; a++) {
		const char *name = jwt_algs[a].name;
		int cut = (int)strlen(name), w;

		if (!(mask & (1u << a)))
			continue;
		if (families && a + 2 < JWT_ALG_COUNT && (mask >> a & 7u) == 7u &&
		    strncmp(name, jwt_algs[a + 2].name, 2) == 0) {
			cut = 2;	/* RS256, RS384 and RS512 as "RS" */
			a += 2;
		}
		w = snprintf(buf + n, len - n, "%s%.*s", n ? sep : "", cut, name);
		if (w < 0 || (size_t)w >= len - n) {
			buf[n] = '\0';	/* cut short at a name */
			return;
		}
		n += (size_t)w;
	}
}

/* ---- verifying --------------------------------------------------------- */

const char *jwt_error_name(enum jwt_error e)
{
	static const char *const names[] = {
		[JWT_OK] = "ok",
		[JWT_MALFORMED] = "malformed",
		[JWT_ALG_REFUSED] = "alg_refused",
		[JWT_NO_KEY] = "no_key",
		[JWT_BAD_SIGNATURE] = "bad_signature",
		[JWT_EXPIRED] = "expired",
		[JWT_NOT_YET] = "not_yet_valid",
		[JWT_BAD_ISSUER] = "bad_issuer",
		[JWT_BAD_AUDIENCE] = "bad_audience",
		[JWT_NO_CLAIM] = "no_claim",
		[JWT_NOMEM] = "no_memory",
	};

	if ((unsigned)e >= sizeof(names) / sizeof(names[0]))
		return "unknown";
	return names[e];
}

/* A token cut at its dots and decoded. */
struct token {
	const char *signed_part;	/* header "." payload, as sent */
	size_t signed_len;
	unsigned char *buf;		/* the three decoded, one after another */
	unsigned char *hdr, *pay, *sig;
	size_t hlen, plen, slen;
};

static enum jwt_error token_split(const char *t, size_t len, struct token *tk,
				  char *why, size_t wl)
{
	const char *d1 = NULL, *d2 = NULL, *ends[3];
	unsigned char **outs[3] = { &tk->hdr, &tk->pay, &tk->sig };
	size_t *lens[3] = { &tk->hlen, &tk->plen, &tk->slen };
	const char *start = t;
	unsigned char *o;

	if (len > JWT_TOKEN_MAX) {
		jwt_say(why, wl, "The token is longer than %d bytes.", JWT_TOKEN_MAX);
		return JWT_MALFORMED;
	}
	if (len > 0)
		d1 = memchr(t, '.', len);
	if (d1 != NULL)
		d2 = memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - t));
	if (d2 == NULL || memchr(d2 + 1, '.', len - (size_t)(d2 + 1 - t)) != NULL) {
		jwt_say(why, wl, "The token is not three base64url segments separated by dots.");
		return JWT_MALFORMED;
	}
	if ((o = tk->buf = malloc(len)) == NULL)
		return JWT_NOMEM;
	ends[0] = d1;
	ends[1] = d2;
	ends[2] = t + len;
	for (int i = 0; i < 3; i++) {
		long n = jwt_b64_decode(start, (size_t)(ends[i] - start), o);

		if (n <= 0) {
			jwt_say(why, wl, "Segment %d of the token is empty or not unpadded base64url.",
			    i + 1);
			return JWT_MALFORMED;
		}
		*outs[i] = o;
		*lens[i] = (size_t)n;
		o += n;
		start = ends[i] + 1;
	}
	tk->signed_part = t;
	tk->signed_len = (size_t)(d2 - t);
	return JWT_OK;
}

/* The header's alg, checked against the allow-list, and its kid. */
static enum jwt_error header_check(const struct jwt_check *c, const struct token *tk,
				   int *alg, const char **kid, size_t *kidlen,
				   struct json_object **hdr, char *why, size_t wl)
{
	const char *name, *typ;
	size_t nlen, tlen;
	char buf[JWT_SHOWN_MAX + 4];

	*hdr = jwt_json_object((const char *)tk->hdr, tk->hlen);
	if (*hdr == NULL || jwt_member_string(*hdr, "alg", &name, &nlen) < 0 ||
	    jwt_member_string(*hdr, "kid", kid, kidlen) < 0 ||
	    jwt_member_string(*hdr, "typ", &typ, &tlen) < 0 || name == NULL) {
		jwt_say(why, wl, "The token's header is not a JSON object with a string \"alg\".");
		return JWT_MALFORMED;
	}
	if (json_object_object_get_ex(*hdr, "crit", NULL)) {
		jwt_say(why, wl, "The token's header lists critical extensions (\"crit\"), "
		    "which are not supported.");
		return JWT_MALFORMED;
	}
	/* RFC 7515 §4.1.9: a typ without '/' stands for "application/" typ */
	if (typ != NULL && tlen > 12 && strncasecmp(typ, "application/", 12) == 0) {
		typ += 12;
		tlen -= 12;
	}
	if (typ != NULL && !(tlen == 3 && strncasecmp(typ, "JWT", 3) == 0) &&
	    !(tlen == 6 && strncasecmp(typ, "at+jwt", 6) == 0)) {
		jwt_say(why, wl, "The token's typ \"%s\" is not JWT.",
		    jwt_shown(typ, tlen, buf));
		return JWT_MALFORMED;
	}
	*alg = jwt_alg_find(name, nlen);
	if (*alg < 0 || !(c->algs & (1u << *alg))) {
		jwt_say(why, wl, "The token's alg \"%s\" is not accepted.",
		    jwt_shown(name, nlen, buf));
		return JWT_ALG_REFUSED;
	}
	return JWT_OK;
}

/* ES* signatures are R || S in JWS, DER in OpenSSL: a new DER buffer
 * (OPENSSL_free() it), or -1. */
static int ecdsa_der(const unsigned char *sig, size_t len, unsigned char **der)
{
	ECDSA_SIG *es = ECDSA_SIG_new();
	BIGNUM *r = BN_bin2bn(sig, (int)(len / 2), NULL);
	BIGNUM *s = BN_bin2bn(sig + len / 2, (int)(len / 2), NULL);
	int n = -1;

	if (es == NULL || r == NULL || s == NULL || !ECDSA_SIG_set0(es, r, s)) {
		BN_free(r);
		BN_free(s);
	} else {
		*der = NULL;
		n = i2d_ECDSA_SIG(es, der);
	}
	ECDSA_SIG_free(es);
	return n > 0 ? n : -1;
}

/* Does key sign tk with alg a? Lengths are checked before: the caller
 * made sure siglen is a's, or the modulus' for RSA. */
static bool signature_ok(const struct jwt_key *key, const struct jwt_alg_info *a,
			 const struct token *tk)
{
	const unsigned char *msg = (const unsigned char *)tk->signed_part;
	unsigned char mac[EVP_MAX_MD_SIZE], *der = NULL;
	const unsigned char *sig = tk->sig;
	size_t slen = tk->slen, maclen = 0;
	EVP_MD_CTX *md = NULL;
	EVP_PKEY_CTX *pctx = NULL;
	bool ok = false;
	int n;

	if (key->pkey == NULL) {
		ok = EVP_Q_mac(NULL, "HMAC", NULL, a->md, NULL, key->secret,
			       key->secret_len, msg, tk->signed_len, mac, sizeof(mac),
			       &maclen) != NULL &&
		     maclen == slen && CRYPTO_memcmp(mac, sig, slen) == 0;
		OPENSSL_cleanse(mac, sizeof(mac));
		return ok;
	}
	if (a->fam >= FAM_P256 && a->fam <= FAM_P521) {
		if ((n = ecdsa_der(sig, slen, &der)) < 0)
			goto out;
		sig = der;
		slen = (size_t)n;
	}
	if ((md = EVP_MD_CTX_new()) == NULL ||
	    EVP_DigestVerifyInit_ex(md, &pctx, a->md, NULL, NULL, key->pkey, NULL) != 1)
		goto out;
	if (a->pss && (EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) != 1 ||
		       EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) != 1))
		goto out;
	ok = EVP_DigestVerify(md, sig, slen, msg, tk->signed_len) == 1;
out:
	EVP_MD_CTX_free(md);
	OPENSSL_free(der);
	return ok;
}

/* Try each key that may verify alg: with a kid in the token, the keys of
 * that kid and those that have none (PEM and DER keys, a secret file, a
 * JWK without kid: identity providers send a kid whatever the key file),
 * never a key of another kid. A key without kid vouches for whatever it
 * signs, so trying it for a token with a kid takes no token it would not
 * take without one. */
static enum jwt_error signature_check(const struct jwt_check *c, int alg,
				      const char *kid, size_t kidlen,
				      const struct token *tk, char *why, size_t wl)
{
	const struct jwt_alg_info *a = &jwt_algs[alg];
	char buf[JWT_SHOWN_MAX + 4];
	size_t want = 0;	/* a signature length that was not the token's */
	int tried = 0, wrong_len = 0;

	for (int i = 0; c->keys != NULL && i < c->keys->n; i++) {
		const struct jwt_key *key = &c->keys->v[i];
		size_t len;

		if (!(key->algs & (1u << alg)))
			continue;
		if (kid != NULL && key->kid != NULL &&
		    (strlen(key->kid) != kidlen ||
		     memcmp(key->kid, kid, kidlen) != 0))
			continue;
		tried++;
		len = a->siglen ? a->siglen : (size_t)EVP_PKEY_get_size(key->pkey);
		if (tk->slen != len) {
			want = len;	/* a DER ECDSA signature, another modulus */
			wrong_len++;
			continue;
		}
		if (signature_ok(key, a, tk)) {
			ERR_clear_error();
			return JWT_OK;
		}
	}
	/* what failed left its reasons on this thread's queue, where TLS code
	 * calling SSL_get_error() would take them for its own */
	ERR_clear_error();
	if (tried > 0 && wrong_len == tried) {
		jwt_say(why, wl, "The token's %s signature is %zu bytes, not %zu.", a->name,
		    tk->slen, want);
		return JWT_BAD_SIGNATURE;
	}
	if (tried > 0) {
		jwt_say(why, wl, "The token's signature does not verify.");
		return JWT_BAD_SIGNATURE;
	}
	if (kid != NULL)
		jwt_say(why, wl, "No %s key has the token's kid \"%s\".", a->name,
		    jwt_shown(kid, kidlen, buf));
	else
		jwt_say(why, wl, "No key verifies %s.", a->name);
	return JWT_NO_KEY;
}

/* A NumericDate claim: 1 and *t in whole seconds, rounded so that a
 * fraction never widens the window (exp down, nbf up); 0 when absent; -1
 * when not a finite number. */
static int date_claim(struct json_object *p, const char *name, bool up, int64_t *t)
{
	struct json_object *v;
	double d;

	if (!json_object_object_get_ex(p, name, &v))
		return 0;
	if (json_object_is_type(v, json_type_int)) {
		*t = json_object_get_int64(v);	/* beyond int64: clamped */
		return 1;
	}
	if (!json_object_is_type(v, json_type_double))
		return -1;
	d = json_object_get_double(v);
	if (d != d || d - d != 0)
		return -1;			/* NaN, Infinity */
	if (d >= 0x1p63 || d < -0x1p63) {
		*t = d > 0 ? INT64_MAX : INT64_MIN;
		return 1;
	}
	*t = (int64_t)d;			/* toward zero */
	if (up ? (double)*t < d : (double)*t > d)
		*t += up ? 1 : -1;
	return 1;
}

/* a > b + leeway, without overflow. */
static bool beyond(int64_t a, int64_t b, uint64_t leeway)
{
	return a > b && (uint64_t)a - (uint64_t)b > leeway;
}

static enum jwt_error claims_check(const struct jwt_check *c, struct json_object *p,
				   char *why, size_t wl)
{
	struct json_object *v;
	int64_t exp, nbf;
	int has_exp = date_claim(p, "exp", false, &exp);
	int has_nbf = date_claim(p, "nbf", true, &nbf);
	bool aud_ok = false;

	if (has_exp < 0 || has_nbf < 0) {
		jwt_say(why, wl, "The token's %s is not a number.", has_exp < 0 ? "exp" : "nbf");
		return JWT_MALFORMED;
	}
	if (has_exp && beyond(c->now, exp, c->leeway_s)) {
		jwt_say(why, wl, "The token expired at %lld.", (long long)exp);
		return JWT_EXPIRED;
	}
	if (has_nbf && beyond(nbf, c->now, c->leeway_s)) {
		jwt_say(why, wl, "The token is not valid before %lld.", (long long)nbf);
		return JWT_NOT_YET;
	}
	if (c->issuer != NULL && (!json_object_object_get_ex(p, "iss", &v) ||
				  !jwt_string_is(v, c->issuer))) {
		jwt_say(why, wl, "The token's issuer (iss) is not the one expected.");
		return JWT_BAD_ISSUER;
	}
	if (c->audience == NULL)
		return JWT_OK;
	if (json_object_object_get_ex(p, "aud", &v)) {
		aud_ok = jwt_string_is(v, c->audience);
		for (size_t i = 0; json_object_is_type(v, json_type_array) &&
				   i < json_object_array_length(v); i++)
			aud_ok |= jwt_string_is(json_object_array_get_idx(v, i), c->audience);
	}
	if (!aud_ok) {
		jwt_say(why, wl, "The token's audience (aud) does not include this service.");
		return JWT_BAD_AUDIENCE;
	}
	return JWT_OK;
}

/* The claim as out: a string, or an integer json-c did not have to clamp. */
static enum jwt_error claim_copy(struct json_object *p, const char *claim,
				 char out[JWT_CLAIM_MAX + 1], char *why, size_t wl)
{
	struct json_object *v;
	const char *s;
	size_t len;

	if (!json_object_object_get_ex(p, claim, &v) || v == NULL) {
		jwt_say(why, wl, "The token has no \"%s\" claim.", claim);
		return JWT_NO_CLAIM;
	}
	if (json_object_is_type(v, json_type_int)) {
		int64_t i = json_object_get_int64(v);
		uint64_t u = json_object_get_uint64(v);

		if (i == INT64_MIN || u == UINT64_MAX) {
			jwt_say(why, wl, "The token's \"%s\" claim is too large a number.", claim);
			return JWT_NO_CLAIM;
		}
		if (i == INT64_MAX)		/* or beyond: json-c keeps a uint64 */
			snprintf(out, JWT_CLAIM_MAX + 1, "%llu", (unsigned long long)u);
		else
			snprintf(out, JWT_CLAIM_MAX + 1, "%lld", (long long)i);
		return JWT_OK;
	}
	if (!json_object_is_type(v, json_type_string)) {
		jwt_say(why, wl, "The token's \"%s\" claim is neither a string nor an integer.",
		    claim);
		return JWT_NO_CLAIM;
	}
	s = json_object_get_string(v);
	len = (size_t)json_object_get_string_len(v);
	if (len == 0 || len > JWT_CLAIM_MAX || memchr(s, '\0', len) != NULL) {
		jwt_say(why, wl, "The token's \"%s\" claim is empty, longer than %d bytes "
		    "or holds a NUL.", claim, JWT_CLAIM_MAX);
		return JWT_NO_CLAIM;
	}
	memcpy(out, s, len);
	out[len] = '\0';
	return JWT_OK;
}

enum jwt_error jwt_verify(const struct jwt_check *c, const char *token,
			  size_t len, const char *claim,
			  char out[JWT_CLAIM_MAX + 1], char *why, size_t whylen)
{
	struct token tk = { 0 };
	struct json_object *hdr = NULL, *pay = NULL;
	const char *kid = NULL;
	size_t kidlen = 0;
	enum jwt_error rc;
	int alg = -1;

	jwt_say(why, whylen, "%s", "");
	out[0] = '\0';
	if ((rc = token_split(token, len, &tk, why, whylen)) != JWT_OK ||
	    (rc = header_check(c, &tk, &alg, &kid, &kidlen, &hdr, why, whylen)) != JWT_OK ||
	    (rc = signature_check(c, alg, kid, kidlen, &tk, why, whylen)) != JWT_OK)
		goto out;
	if ((pay = jwt_json_object((const char *)tk.pay, tk.plen)) == NULL) {
		jwt_say(why, whylen, "The token's claims are not a JSON object.");
		rc = JWT_MALFORMED;
		goto out;
	}
	if ((rc = claims_check(c, pay, why, whylen)) == JWT_OK)
		rc = claim_copy(pay, claim, out, why, whylen);
out:
	if (rc != JWT_OK)
		out[0] = '\0';
	if (rc == JWT_NOMEM)
		jwt_say(why, whylen, "Out of memory.");
	json_object_put(hdr);
	json_object_put(pay);
	free(tk.buf);
	return rc;
}
