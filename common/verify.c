/*
 * verify.c - see verify.h.
 */
#include "verify.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "hex.h"

#define MAC_LEN 32

/* 64 hex digits into 32 bytes; false when it is not exactly that. */
static bool parse_mac(const char *s, size_t len, unsigned char out[MAC_LEN])
{
	if (len != 2 * MAC_LEN)
		return false;
	for (size_t i = 0; i < MAC_LEN; i++) {
		int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return false;
		out[i] = (unsigned char)(hi << 4 | lo);
	}
	return true;
}

/*
 * An HMAC-SHA256 context with its digest set, made once for the process;
 * each MAC starts from a copy. Fetching HMAC and naming SHA-256 on every
 * request looked both up in OpenSSL's provider store again: a third more
 * than the MAC of a 1 KiB body itself. Read-only after it is made, so the
 * workers copy it at the same time. NULL if it could not be made: then
 * every MAC fails, as a failed fetch did.
 */
static pthread_once_t hmac_once = PTHREAD_ONCE_INIT;
static EVP_MAC_CTX *hmac_template;

static void hmac_make(void)
{
	EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	EVP_MAC_CTX *ctx = mac != NULL ? EVP_MAC_CTX_new(mac) : NULL;
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0),
		OSSL_PARAM_construct_end(),
	};

	EVP_MAC_free(mac);	/* the context holds its own reference */
	if (ctx != NULL && EVP_MAC_CTX_set_params(ctx, params) != 1) {
		EVP_MAC_CTX_free(ctx);
		ctx = NULL;
	}
	hmac_template = ctx;
}

/* HMAC-SHA256 over the concatenation of up to two pieces. */
static bool hmac2(const char *key, size_t klen, const void *a, size_t alen,
		  const void *b, size_t blen, unsigned char out[MAC_LEN])
{
	EVP_MAC_CTX *ctx;
	size_t outlen = 0;
	bool ok;

	pthread_once(&hmac_once, hmac_make);
	ctx = hmac_template != NULL ? EVP_MAC_CTX_dup(hmac_template) : NULL;
	ok = ctx != NULL &&
	     EVP_MAC_init(ctx, (const unsigned char *)key, klen, NULL) &&
	     EVP_MAC_update(ctx, a, alen) &&
	     (blen == 0 || EVP_MAC_update(ctx, b, blen)) &&
	     EVP_MAC_final(ctx, out, &outlen, MAC_LEN) && outlen == MAC_LEN;
	EVP_MAC_CTX_free(ctx);
	return ok;
}

static bool verify_github(const char *secret, size_t slen, const char *sig,
			  size_t sig_len, const void *body, size_t body_len)
{
	unsigned char want[MAC_LEN], got[MAC_LEN];

	if (sig_len < 7 || strncasecmp(sig, "sha256=", 7) != 0 ||
	    !parse_mac(sig + 7, sig_len - 7, got))
		return false;
	if (!hmac2(secret, slen, body, body_len, NULL, 0, want))
		return false;
	return CRYPTO_memcmp(want, got, MAC_LEN) == 0;
}

static bool verify_stripe(const char *secret, size_t slen, const char *sig,
			  size_t sig_len, const void *body, size_t body_len,
			  time_t now, uint64_t tolerance_ms)
{
	const char *t = NULL;
	size_t tlen = 0;
	unsigned char want[MAC_LEN], got[MAC_LEN];
	long long ts = 0;
	char tbuf[32];
	bool match = false;
	size_t i = 0;

	/* first pass: the timestamp */
	while (i < sig_len) {
		size_t s = i, e;

		while (i < sig_len && sig[i] != ',')
			i++;
		e = i++;
		while (s < e && sig[s] == ' ')
			s++;
		if (e - s > 2 && sig[s] == 't' && sig[s + 1] == '=') {
			t = sig + s + 2;
			tlen = e - s - 2;
		}
	}
	if (t == NULL || tlen == 0 || tlen > 12)
		return false;	/* 12 digits: the year 33658; no overflow below */
	for (size_t k = 0; k < tlen; k++) {
		if (t[k] < '0' || t[k] > '9')
			return false;
		ts = ts * 10 + (t[k] - '0');
	}
	if ((uint64_t)(ts > now ? ts - now : now - ts) * 1000 > tolerance_ms)
		return false;	/* too old (a replay) or from the future */
	memcpy(tbuf, t, tlen);
	tbuf[tlen] = '.';
	if (!hmac2(secret, slen, tbuf, tlen + 1, body, body_len, want))
		return false;
	/* second pass: any v1 may match (secrets being rolled) */
	for (i = 0; i < sig_len;) {
		size_t s = i, e;

		while (i < sig_len && sig[i] != ',')
			i++;
		e = i++;
		while (s < e && sig[s] == ' ')
			s++;
		if (e - s > 3 && memcmp(sig + s, "v1=", 3) == 0 &&
		    parse_mac(sig + s + 3, e - s - 3, got))
			match |= CRYPTO_memcmp(want, got, MAC_LEN) == 0;
	}
	return match;
}

bool verify_signature(enum verify_format fmt, const char *secret,
		      size_t secret_len, const char *sig, size_t sig_len,
		      const void *body, size_t body_len, time_t now,
		      uint64_t tolerance_ms)
{
	switch (fmt) {
	case VERIFY_GITHUB:
		return verify_github(secret, secret_len, sig, sig_len, body,
				     body_len);
	case VERIFY_STRIPE:
		return verify_stripe(secret, secret_len, sig, sig_len, body,
				     body_len, now, tolerance_ms);
	case VERIFY_NONE:
		return true;
	}
	return false;
}
