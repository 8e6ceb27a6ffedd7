/*
 * jwt_priv.h - what jwt.c (tokens) and jwt_keys.c (key files) share: the
 * algorithms, the loaded keys, and the helpers both parse with. Not for
 * other modules: they use jwt.h.
 */
#ifndef IDEMPROXY_JWT_PRIV_H
#define IDEMPROXY_JWT_PRIV_H

#include <stdbool.h>
#include <stddef.h>

#include <json-c/json.h>
#include <openssl/evp.h>

#include "jwt.h"

/* Which keys an alg needs. */
enum fam { FAM_RSA, FAM_P256, FAM_P384, FAM_P521, FAM_ED25519, FAM_OCT };

/* One algorithm of enum jwt_alg. */
struct jwt_alg_info {
	const char *name;
	enum fam fam;
	const char *md;		/* NULL: EdDSA hashes by itself */
	bool pss;
	size_t siglen;		/* fixed signature size; 0: the RSA modulus' */
};

extern const struct jwt_alg_info jwt_algs[JWT_ALG_COUNT];

struct jwt_key {
	EVP_PKEY *pkey;		/* NULL for a secret */
	unsigned char *secret;
	size_t secret_len;
	char *kid;		/* NULL: none given */
	enum fam fam;		/* its kind, for --check-config */
	unsigned algs;		/* what it may verify: its family's, narrowed
				 * by its JWK alg and a secret's size */
};

struct jwt_keys {
	struct jwt_key v[JWT_KEYS_MAX];
	int n;
	int skipped;
};

/* Bytes of a token (or a kid) quoted in a message. */
#define JWT_SHOWN_MAX 60

/* s[0..len) fit to quote in buf: at most JWT_SHOWN_MAX bytes, then "...",
 * only printable ASCII other than quotes and backslashes ('?' for the
 * rest). */
const char *jwt_shown(const char *s, size_t len, char buf[JWT_SHOWN_MAX + 4]);

/* why, printf-style; nothing when len is 0. */
__attribute__((format(printf, 3, 4)))
void jwt_say(char *why, size_t len, const char *fmt, ...);

/* The alg named s[0..len), or -1. */
int jwt_alg_find(const char *s, size_t len);

/* mask as the algorithms' names joined by sep, cut short at a name;
 * families: a family's three (RS, PS, ES or HS 256, 384 and 512) by its
 * two letters ("RS/PS", "HS256/HS384"). */
void jwt_algs_join(unsigned mask, const char *sep, bool families, char *buf,
		   size_t len);

/* The algs a key of family fam may verify; a secret only those whose
 * hash is no longer than it (RFC 7518 §3.2). */
unsigned jwt_fam_algs(enum fam fam, size_t secret_len);

/* Unpadded base64url s[0..len) into out (room for len * 3 / 4 bytes): the
 * decoded length, or -1; one spelling of each byte string only. */
long jwt_b64_decode(const char *s, size_t len, unsigned char *out);

/* s[0..len) as a JSON object (json_object_put() it), or NULL when it is
 * anything else, has trailing bytes, or is not read as written. */
struct json_object *jwt_json_object(const char *s, size_t len);

/* Member name of o: 0 and *out (NULL when absent), or -1 when it is there
 * but not a string. */
int jwt_member_string(struct json_object *o, const char *name,
		      const char **out, size_t *len);

/* Is v the string s? */
bool jwt_string_is(struct json_object *v, const char *s);

/* free() what may hold a secret. */
void jwt_wipe_free(void *p, size_t len);

#endif
