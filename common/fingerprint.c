/*
 * fingerprint.c - see fingerprint.h and docs/protocol.md.
 */
#include "fingerprint.h"

#include <pthread.h>
#include <string.h>

#include <openssl/evp.h>

#include "hex.h"

/* Domain separation: a fingerprint can never equal some other SHA-256 of
 * ours, and a change of definition gets a new tag. */
static const char fp_tag[] = "idemproxy-fingerprint-v1";
static const char fp_tag_shaped[] = "idemproxy-fingerprint-v2";

/*
 * fp_sha256: SHA-256, fetched from OpenSSL's provider once for the
 * process. Given EVP_sha256(), every EVP_DigestInit_ex() looks the
 * implementation up again (a query of the provider's method store, under
 * its lock): a third of what a 1 KiB fingerprint costs. Kept until the
 * process exits; NULL if the fetch failed, and then EVP_sha256() is used
 * as before.
 */
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256_fetched;

static void sha256_fetch(void)
{
	sha256_fetched = EVP_MD_fetch(NULL, "SHA256", NULL);
}

const EVP_MD *fp_sha256(void)
{
	pthread_once(&sha256_once, sha256_fetch);
	return sha256_fetched != NULL ? sha256_fetched : EVP_sha256();
}

static int put_len(EVP_MD_CTX *ctx, uint64_t len)
{
	unsigned char be[8];

	for (int i = 7; i >= 0; i--) {
		be[i] = (unsigned char)(len & 0xff);
		len >>= 8;
	}
	return EVP_DigestUpdate(ctx, be, sizeof(be));
}

static int put_field(EVP_MD_CTX *ctx, const void *p, size_t len)
{
	return put_len(ctx, len) && EVP_DigestUpdate(ctx, p, len);
}

/* The body pieces, length first, and the digest into out. */
static int put_body_final(EVP_MD_CTX *ctx, int ok, const struct iovec *body,
			  int n, uint8_t out[FP_LEN])
{
	uint64_t body_len = 0;
	unsigned int outlen = 0;

	for (int i = 0; i < n; i++)
		body_len += body[i].iov_len;
	ok = ok && put_len(ctx, body_len);
	for (int i = 0; ok && i < n; i++)
		ok = EVP_DigestUpdate(ctx, body[i].iov_base, body[i].iov_len);
	ok = ok && EVP_DigestFinal_ex(ctx, out, &outlen) && outlen == FP_LEN;
	EVP_MD_CTX_free(ctx);
	return ok ? 0 : -1;
}

int fp_compute(const char *method, const char *target, const struct iovec *body,
	       int n, uint8_t out[FP_LEN])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int ok;

	if (ctx == NULL)
		return -1;
	ok = EVP_DigestInit_ex(ctx, fp_sha256(), NULL) &&
	     EVP_DigestUpdate(ctx, fp_tag, sizeof(fp_tag)) &&	/* with its NUL */
	     put_field(ctx, method, strlen(method)) &&
	     put_field(ctx, target, strlen(target));
	return put_body_final(ctx, ok, body, n, out);
}

int fp_compute_shaped(const char *shaping, size_t shaping_len,
		      const char *method, const char *target, size_t target_len,
		      char kind, const struct iovec *body, int n,
		      uint8_t out[FP_LEN])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int ok;

	if (ctx == NULL)
		return -1;
	ok = EVP_DigestInit_ex(ctx, fp_sha256(), NULL) &&
	     EVP_DigestUpdate(ctx, fp_tag_shaped, sizeof(fp_tag_shaped)) &&
	     put_field(ctx, shaping, shaping_len) &&
	     put_field(ctx, method, strlen(method)) &&
	     put_field(ctx, target, target_len) &&
	     EVP_DigestUpdate(ctx, &kind, 1);
	return put_body_final(ctx, ok, body, n, out);
}

void fp_hex(const uint8_t fp[FP_LEN], char *buf)
{
	hex_encode(fp, FP_LEN, buf);
}
