/*
 * fuzz_keysrc.c - the key sources of a route besides a header
 * (common/keysrc.c): a query string parameter, an urlencoded form field, the
 * value at a JSON pointer.
 *
 * Input: one selector byte, then NAME '\n' DATA. The low two bits of the
 * selector pick the source (query: DATA is a request-target; form and json:
 * DATA is the body), the next bit a key_prefix. NAME is the route's
 * query:NAME, form:FIELD or json:/pointer.
 * Invariants: a key is returned NUL-terminated with its length, starts with
 * the prefix, is at most 255 characters, all visible ASCII; anything else
 * is KEYSRC_MISSING or KEYSRC_INVALID.
 */
#include <string.h>

#include "fuzz.h"
#include "keysrc.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *prefix, *nl;
	char name[256], key[IDEMKEY_MAX + 1], *body;
	size_t nlen, blen;
	int r = KEYSRC_MISSING;

	if (size < 1)
		return 0;
	prefix = data[0] & 4 ? "tenant-7:" : "";
	nl = memchr(data + 1, '\n', size - 1);
	if (nl == NULL)
		return 0;
	nlen = (size_t)(nl - (const char *)data - 1);
	if (nlen >= sizeof(name))
		return 0;
	memcpy(name, data + 1, nlen);
	name[nlen] = '\0';		/* a config value: a C string */
	blen = size - 1 - nlen - 1;
	/* bodies are not NUL-terminated: a copy of exactly blen bytes, so that
	 * ASan sees a read past the end */
	body = malloc(blen + 1);
	if (body == NULL)
		return 0;
	memcpy(body, nl + 1, blen);
	memset(key, 'X', sizeof(key));
	switch (data[0] & 3) {
	case 0:
		body[blen] = '\0';	/* the target is a C string (h1_head) */
		r = keysrc_query(body, name, prefix, key);
		break;
	case 1:
		r = keysrc_form(body, blen, name, prefix, key);
		break;
	default:
		r = keysrc_json(body, blen, name, prefix, key);
		break;
	}
	free(body);
	if (r < 0) {
		FUZZ_REQUIRE(r == KEYSRC_MISSING || r == KEYSRC_INVALID);
		return 0;
	}
	FUZZ_REQUIRE(r <= IDEMKEY_MAX && memchr(key, '\0', (size_t)r + 1) ==
		     key + r);
	FUZZ_REQUIRE(strncmp(key, prefix, strlen(prefix)) == 0 &&
		     (size_t)r > strlen(prefix));
	for (int i = 0; i < r; i++)
		FUZZ_REQUIRE(key[i] >= 0x21 && key[i] <= 0x7e);
	return 0;
}
