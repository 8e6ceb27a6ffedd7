/*
 * fuzz_verify.c - signature headers of webhooks and payment callbacks
 * (common/verify.c): GitHub's "sha256=<hex>" and Stripe's
 * "t=<unix>,v1=<hex>[,v1=...]".
 *
 * Input: one selector byte (bit 0: GitHub or Stripe), then the header value
 * up to the first '\n', then the body.
 * Invariants: a header is accepted only when it really carries the HMAC of
 * the body (GitHub) or of "<t>.<body>" for one of its t= (Stripe), with t
 * within the tolerance; the header the sender would compute for the body is
 * always accepted.
 */
#include <stdbool.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "fuzz.h"
#include "verify.h"

#define NOW ((time_t)1700000000)
#define TOLERANCE_MS 300000ULL

static const char secret[] = "whsec_fuzz_secret";

static void mac_hex(const void *a, size_t alen, const void *b, size_t blen,
		    char hex[65])
{
	unsigned char md[32];
	unsigned int len = 0;
	unsigned char *buf = malloc(alen + blen + 1);

	if (buf == NULL)
		abort();
	if (alen > 0)
		memcpy(buf, a, alen);
	if (blen > 0)
		memcpy(buf + alen, b, blen);
	if (HMAC(EVP_sha256(), secret, (int)strlen(secret), buf, alen + blen, md,
		 &len) == NULL || len != 32)
		abort();
	free(buf);
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* Is there an element "NAME=value" (leading blanks skipped) with value
 * equal to want, case-insensitively for hex? Used both ways below. */
static bool element_is(const char *sig, size_t len, const char *name,
		       const char *want)
{
	size_t nl = strlen(name), wl = strlen(want);

	for (size_t i = 0; i < len;) {
		size_t s = i, e;

		while (i < len && sig[i] != ',')
			i++;
		e = i++;
		while (s < e && sig[s] == ' ')
			s++;
		if (e - s == nl + wl && memcmp(sig + s, name, nl) == 0 &&
		    strncasecmp(sig + s + nl, want, wl) == 0)
			return true;
	}
	return false;
}

/* Stripe: some t= within tolerance whose MAC is one of the v1= values. */
static bool stripe_legit(const char *sig, size_t len, const char *body,
			 size_t blen)
{
	for (size_t i = 0; i < len;) {
		size_t s = i, e;
		char t[32], hex[65];
		long long ts = 0;

		while (i < len && sig[i] != ',')
			i++;
		e = i++;
		while (s < e && sig[s] == ' ')
			s++;
		if (e - s < 3 || sig[s] != 't' || sig[s + 1] != '=' ||
		    e - s - 2 > 12)
			continue;
		memcpy(t, sig + s + 2, e - s - 2);
		t[e - s - 2] = '.';
		for (size_t k = 0; k < e - s - 2; k++)
			ts = ts * 10 + (t[k] - '0');
		if ((ts > NOW ? ts - NOW : NOW - ts) * 1000LL > (long long)TOLERANCE_MS)
			continue;
		mac_hex(t, e - s - 1, body, blen, hex);
		if (element_is(sig, len, "v1=", hex))
			return true;
	}
	return false;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	enum verify_format fmt;
	const char *sig, *nl, *body;
	size_t slen, blen;
	char hex[65], good[160], t[32];
	bool ok;
	int n;

	if (size < 1)
		return 0;
	fmt = data[0] & 1 ? VERIFY_STRIPE : VERIFY_GITHUB;
	nl = memchr(data + 1, '\n', size - 1);
	if (nl == NULL)
		return 0;
	sig = (const char *)data + 1;
	slen = (size_t)(nl - sig);
	body = nl + 1;
	blen = size - 1 - slen - 1;

	ok = verify_signature(fmt, secret, strlen(secret), sig, slen, body, blen,
			      NOW, TOLERANCE_MS);
	if (ok && fmt == VERIFY_GITHUB) {
		mac_hex(body, blen, NULL, 0, hex);
		FUZZ_REQUIRE(slen == 71 && strncasecmp(sig, "sha256=", 7) == 0 &&
			     strncasecmp(sig + 7, hex, 64) == 0);
	}
	if (ok && fmt == VERIFY_STRIPE)
		FUZZ_REQUIRE(stripe_legit(sig, slen, body, blen));

	/* what the sender computes is accepted */
	if (fmt == VERIFY_GITHUB) {
		mac_hex(body, blen, NULL, 0, hex);
		n = snprintf(good, sizeof(good), "sha256=%s", hex);
	} else {
		long long at = NOW - 60 + (long long)(data[0] >> 1);

		snprintf(t, sizeof(t), "%lld.", at);
		mac_hex(t, strlen(t), body, blen, hex);
		n = snprintf(good, sizeof(good), "t=%lld,v1=%s", at, hex);
	}
	FUZZ_REQUIRE(verify_signature(fmt, secret, strlen(secret), good,
				      (size_t)n, body, blen, NOW, TOLERANCE_MS));
	return 0;
}
