/*
 * fuzz_idemkey.c - Idempotency-Key header values (common/idemkey.c): bare
 * keys and RFC 8941 sf-strings, then what the proxy does with a key it
 * accepted (the route's key_prefix, the issue time of an issued key).
 *
 * Input: the header value, as llhttp would hand it over (any bytes).
 * Invariants: an accepted key is 1-255 printable ASCII characters (visible
 * ones when bare); it reads back the same when written as an sf-string
 * (and bare, unless it starts with a quote or holds a space); acceptance
 * agrees with the grammar of idemkey.h written out independently below
 * (for a quoted key with parameters, only the key is compared: the
 * parameters' grammar is the unit test's); a refusal always says why.
 */
#include <stdbool.h>
#include <string.h>

#include "fuzz.h"
#include "idemkey.h"
#include "issue.h"
#include "keysrc.h"

/* idemkey.h's grammar, written from the header's comment, not the code:
 * the key's length, -1 refused, or -2 (with out set) when parameters
 * follow a quoted key. */
static int reference(const char *v, size_t len, char *out)
{
	size_t n = 0;

	while (len > 0 && (*v == ' ' || *v == '\t')) {
		v++;
		len--;
	}
	while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
		len--;
	if (len == 0)
		return -1;
	if (v[0] != '"') {
		for (size_t i = 0; i < len; i++) {
			if ((unsigned char)v[i] < 0x21 || (unsigned char)v[i] > 0x7e)
				return -1;
			out[n++] = v[i];
			if (n > IDEMKEY_MAX)
				return -1;
		}
		out[n] = '\0';
		return (int)n;
	}
	for (size_t i = 1;; i++) {
		unsigned char c;

		if (i >= len)
			return -1;		/* no closing quote */
		c = (unsigned char)v[i];
		if (c == '"') {
			if (n == 0)
				return -1;
			out[n] = '\0';
			if (i == len - 1)
				return (int)n;
			return v[i + 1] == ';' ? -2 : -1;
		}
		if (c == '\\') {
			if (++i >= len)
				return -1;
			c = (unsigned char)v[i];
			if (c != '"' && c != '\\')
				return -1;
		}
		if (c < 0x20 || c > 0x7e || n == IDEMKEY_MAX)
			return -1;
		out[n++] = (char)c;
	}
}

/* key as an sf-string. */
static size_t quote(const char *key, char *buf)
{
	size_t n = 0;

	buf[n++] = '"';
	for (; *key != '\0'; key++) {
		if (*key == '"' || *key == '\\')
			buf[n++] = '\\';
		buf[n++] = *key;
	}
	buf[n++] = '"';
	return n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *v = (const char *)data;
	char key[IDEMKEY_MAX + 1], again[IDEMKEY_MAX + 1], ref[IDEMKEY_MAX + 2];
	char quoted[2 * IDEMKEY_MAX + 3], prefixed[IDEMKEY_MAX + 1];
	const char *why = NULL;
	int n = idemkey_parse(v, size, key, &why), r = reference(v, size, ref);
	size_t q;

	FUZZ_REQUIRE(n >= 0 || (why != NULL && why[0] != '\0'));
	if (r != -2)
		FUZZ_REQUIRE((n < 0) == (r < 0));
	if (n < 0)
		return 0;
	if (r == -2)
		r = (int)strlen(ref);	/* the key before the parameters */
	FUZZ_REQUIRE(n == r && memcmp(key, ref, (size_t)n + 1) == 0);
	FUZZ_REQUIRE(n >= 1 && n <= IDEMKEY_MAX && strlen(key) == (size_t)n);
	for (int i = 0; i < n; i++)
		FUZZ_REQUIRE(key[i] >= 0x20 && key[i] <= 0x7e);

	/* "abc" and abc are the same key */
	q = quote(key, quoted);
	FUZZ_REQUIRE(idemkey_parse(quoted, q, again, NULL) == n &&
		     strcmp(again, key) == 0);
	if (key[0] != '"' && strchr(key, ' ') == NULL)
		FUZZ_REQUIRE(idemkey_parse(key, (size_t)n, again, NULL) == n &&
			     strcmp(again, key) == 0);

	/* a route's key_prefix: the whole key is still at most 255 */
	r = keysrc_finish_quoted("pay:", key, (size_t)n, prefixed);
	FUZZ_REQUIRE(n + 4 > IDEMKEY_MAX ? r == KEYSRC_INVALID :
		     r == n + 4 && strncmp(prefixed, "pay:", 4) == 0 &&
		     strcmp(prefixed + 4, key) == 0);

	/* an issued key's time: 12 digits at most after the last '.' */
	FUZZ_REQUIRE(issue_time(key) >= 0 && issue_time(key) <= 999999999999LL);
	return 0;
}
