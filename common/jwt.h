/*
 * jwt.h - verified JWT bearer tokens (RFC 7519, compact JWS of RFC 7515),
 * so that a route can scope its keys by who the caller is (scope =
 * jwt:CLAIM, e.g. jwt:sub) rather than by a header anyone can write.
 *
 * The keys come from a file read at config load: a JWKS, PEM or DER public
 * keys or certificates, or - named "hmac:FILE" - an HMAC secret. A token
 * is taken only when its alg is on the route's allow-list, a key of that
 * alg's own family (RSA for RS and PS, the matching EC curve for ES,
 * Ed25519 for EdDSA, a secret for HS) verifies its signature, and its exp,
 * nbf, iss and aud hold. Nothing in a token ever picks a key beyond its
 * kid, which rules out the keys of another kid (keys without one - PEM,
 * DER, a secret file - vouch for whatever they sign, kid or not): jwk,
 * jku, x5u and x5c are ignored, "none" is never accepted and "crit" is
 * refused.
 */
#ifndef IDEMPROXY_JWT_H
#define IDEMPROXY_JWT_H

#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

/* Longest claim value handed back (bytes, excluding the NUL). */
#define JWT_CLAIM_MAX 256

/* Longest token taken; longer ones are JWT_MALFORMED. */
#define JWT_TOKEN_MAX 16384

/* Most keys one file may hold: a token without kid is tried against each
 * key of its alg, and that must stay cheap. */
#define JWT_KEYS_MAX 64

/* The JWS algorithms of RFC 7518 §3 and RFC 8037 (EdDSA: Ed25519 only). */
enum jwt_alg {
	JWT_RS256, JWT_RS384, JWT_RS512,	/* RSASSA-PKCS1-v1_5 */
	JWT_PS256, JWT_PS384, JWT_PS512,	/* RSASSA-PSS, salt = hash size */
	JWT_ES256, JWT_ES384, JWT_ES512,	/* ECDSA P-256, P-384, P-521 */
	JWT_EDDSA,				/* Ed25519 */
	JWT_HS256, JWT_HS384, JWT_HS512,	/* HMAC with a shared secret */
	JWT_ALG_COUNT
};

/* Opaque; immutable once loaded, so threads may share it read-only. */
struct jwt_keys;

/*
 * "RS256, ES256" (comma-separated, blanks around items allowed, names
 * case-sensitive as JOSE spells them) into a mask of 1u << enum jwt_alg.
 * An empty list or item, "none" and unknown names are errors, with why.
 */
int jwt_algs_parse(const char *list, unsigned *mask, char *why,
		   size_t len) MUSTCHECK;
/* The mask back as "RS256,ES256" (for --check-config). */
void jwt_algs_format(unsigned mask, char *buf, size_t len);

/*
 * The keys of the file spec names, or NULL with err "FILE: why". A path is
 * read by what the file holds:
 * - a JWKS {"keys":[...]} or a single JWK: kty RSA (n, e), EC (crv P-256,
 *   P-384, P-521; x, y), OKP (crv Ed25519; x) and oct (k, a secret);
 *   optional kid, alg (the one algorithm the key may verify), use ("sig";
 *   "enc" keys are skipped), key_ops (skipped without "verify"). Keys of
 *   other kinds, curves or algs are skipped and counted; a malformed key of
 *   a known kind, and a private one (with "d"), is an error.
 * - PEM: "PUBLIC KEY", "RSA PUBLIC KEY" or "CERTIFICATE" blocks (a
 *   certificate only lends its key: its dates and issuer are not checked).
 *   A private key is refused: the file should hold the public key only.
 * - DER: one certificate (a .cer), SubjectPublicKeyInfo or PKCS#1 RSA
 *   public key, or the base64 of one (a JWKS x5c entry; line breaks
 *   allowed).
 * Anything else is an error that says what the file is: a file is an HMAC
 * secret only when spec says so, "hmac:FILE". Then the whole file,
 * trailing newlines stripped, is the secret (its bytes, not decoded), and
 * a file that reads as any of the forms above is refused.
 * RSA keys must have at least 2048 bits, EC points lie on their curve
 * (OpenSSL's public key check); secrets at least 32 bytes, and a secret
 * serves only the HS algorithms whose hash is no longer than it (RFC 7518
 * §3.2: 32 bytes HS256, 48 also HS384, 64 also HS512). At most
 * JWT_KEYS_MAX keys. File I/O: for config load, not the event loop.
 */
struct jwt_keys *jwt_keys_load(const char *spec, char *err, size_t errlen);
void jwt_keys_free(struct jwt_keys *k);
int jwt_keys_count(const struct jwt_keys *k);
/* How many keys of the file were skipped (other kty, crv, use, alg). */
int jwt_keys_skipped(const struct jwt_keys *k);
/* The algorithms these keys can ever verify, so that a config can refuse
 * an allow-list that no key serves. */
unsigned jwt_keys_algs(const struct jwt_keys *k);
/* Key i (0 <= i < jwt_keys_count()) for --check-config: its kind and size,
 * the algorithms it may verify by family, its kid: "RSA 2048 RS/PS",
 * "EC P-256 ES256 kid \"a\"", "HMAC 48 bytes HS256/HS384". */
void jwt_keys_describe(const struct jwt_keys *k, int i, char *buf,
		       size_t len);

enum jwt_error {
	JWT_OK = 0,
	JWT_MALFORMED,		/* not a compact JWS with JSON header and claims */
	JWT_ALG_REFUSED,	/* alg not on the allow-list (or "none") */
	JWT_NO_KEY,		/* no key of the alg's family (and kid, for
				 * keys that have one) */
	JWT_BAD_SIGNATURE,	/* every key that could have signed it says no */
	JWT_EXPIRED,		/* now > exp + leeway */
	JWT_NOT_YET,		/* now + leeway < nbf */
	JWT_BAD_ISSUER,		/* iss missing or not the one configured */
	JWT_BAD_AUDIENCE,	/* aud missing or without the one configured */
	JWT_NO_CLAIM,		/* the claim asked for is missing or unusable */
	JWT_NOMEM,
};

/* One word for logs and metric labels: "malformed", "expired", ... */
const char *jwt_error_name(enum jwt_error e);

struct jwt_check {
	const struct jwt_keys *keys;
	unsigned algs;		/* allow-list, from jwt_algs_parse() */
	const char *issuer;	/* NULL: iss not checked; else equal exactly */
	const char *audience;	/* NULL: aud not checked; else aud (a string
				 * or an array of strings) holds it */
	uint64_t leeway_s;	/* clock skew allowed for exp and nbf */
	int64_t now;		/* unix seconds, the caller's clock */
};

/*
 * Verify the compact JWS token[0..len) (what follows "Bearer ", not
 * necessarily NUL-terminated) and copy its top-level claim `claim` into out:
 * a string of 1..JWT_CLAIM_MAX bytes without NUL, or an integer written in
 * decimal. JWT_OK, or an error and why: one English sentence for a 401
 * problem detail, printable ASCII, quoting at most 60 bytes of the token.
 *
 * exp is optional (a token without one never expires; iat is not looked
 * at). The payload is parsed only once the signature holds. Header and
 * claims are refused when json-c would read them differently from the
 * text: a member named twice, a \u0000 escape, a lone surrogate.
 */
enum jwt_error jwt_verify(const struct jwt_check *c, const char *token,
			  size_t len, const char *claim,
			  char out[JWT_CLAIM_MAX + 1], char *why,
			  size_t whylen) MUSTCHECK;

#endif
