/* Header collection and hop-by-hop rules (common/httphdr.c). */
#include <string.h>

#include "httphdr.h"
#include "tap.h"

/* Feed a field in pieces the way llhttp does across two reads. */
static void split_field(struct hdrlist *h, const char *name, const char *value,
			size_t cut)
{
	size_t nl = strlen(name), vl = strlen(value);
	size_t nc = cut < nl ? cut : nl, vc = cut < vl ? cut : vl;

	ok(hdrlist_add_name(h, name, nc) == 0 &&
	   hdrlist_add_name(h, name + nc, nl - nc) == 0, "name %s in pieces", name);
	if (vl > 0)
		ok(hdrlist_add_value(h, value, vc) == 0 &&
		   hdrlist_add_value(h, value + vc, vl - vc) == 0,
		   "value %s in pieces", value);
	ok(hdrlist_end_field(h) == 0, "end of %s", name);
}

static void test_collect(void)
{
	struct hdrlist h;

	hdrlist_init(&h);
	split_field(&h, "Host", "example.com", 2);
	split_field(&h, "X-Empty", "", 3);
	split_field(&h, "Content-Type", "text/plain", 7);
	is_int(h.n, 3, "three fields");
	is_str(hdr_name(&h, 0), "Host", "first name");
	is_str(hdr_value(&h, 0), "example.com", "first value joined");
	is_str(hdr_name(&h, 1), "X-Empty", "empty-valued field keeps its name");
	is_str(hdr_value(&h, 1), "", "empty value");
	is_str(hdr_name(&h, 2), "Content-Type", "field after an empty one");
	is_str(hdr_value(&h, 2), "text/plain", "its value");
	is_int(hdrlist_find(&h, "content-type", 0), 2, "find is case-insensitive");
	is_int(hdrlist_find(&h, "host", 1), -1, "find from an index");

	/* many fields force the arena and the index to grow */
	for (int i = 0; i < 200; i++)
		ok(hdrlist_add(&h, "X-Many", "a value long enough to grow") == 0 ||
		   0, "add %d", i);
	is_int(h.n, 203, "203 fields");
	is_str(hdr_value(&h, 0), "example.com", "first value survives growth");
	is_str(hdr_value(&h, 202), "a value long enough to grow", "last value");

	hdrlist_reset(&h);
	is_int(h.n, 0, "reset empties");
	ok(h.cap == 0, "reset releases a large arena");
	ok(hdrlist_add(&h, "A", "b") == 0, "usable after reset");
	is_str(hdr_value(&h, 0), "b", "value after reset");
	hdrlist_free(&h);
}

static void test_hop_by_hop(void)
{
	struct hdrlist h;
	const char *hop[] = { "Connection", "keep-alive", "Proxy-Connection",
			      "TE", "Trailer", "Transfer-Encoding", "UPGRADE" };

	for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
		ok(httphdr_is_hop_by_hop(hop[i], strlen(hop[i])), "%s is hop-by-hop",
		   hop[i]);
	ok(!httphdr_is_hop_by_hop("Trailers", 8), "Trailers is not");
	ok(!httphdr_is_hop_by_hop("Host", 4), "Host is not");

	hdrlist_init(&h);
	ok(hdrlist_add(&h, "Connection", "keep-alive, X-Secret ,close") == 0 &&
	   hdrlist_add(&h, "X-Secret", "1") == 0 &&
	   hdrlist_add(&h, "X-Public", "2") == 0 &&
	   hdrlist_add(&h, "Content-Length", "5") == 0 &&
	   hdrlist_add(&h, "Connection", "x-other") == 0 &&
	   hdrlist_add(&h, "X-Other", "3") == 0, "fields added");
	ok(httphdr_drop_on_forward(&h, 0), "Connection dropped");
	ok(httphdr_drop_on_forward(&h, 1), "field named in Connection dropped");
	ok(!httphdr_drop_on_forward(&h, 2), "other field kept");
	ok(httphdr_drop_on_forward(&h, 3), "Content-Length dropped (re-framed)");
	ok(httphdr_drop_on_forward(&h, 5), "named in a second Connection field");
	hdrlist_free(&h);
}

static void test_lists_and_tokens(void)
{
	ok(httphdr_list_has("gzip, chunked", 13, "chunked"), "list has chunked");
	ok(httphdr_list_has(" ,Close", 7, "close"), "case-insensitive, empty items");
	ok(!httphdr_list_has("closed", 6, "close"), "no prefix match");
	ok(!httphdr_list_has("", 0, "close"), "empty list");
	ok(httphdr_is_token("X-Foo_1.2~", 10), "token");
	ok(!httphdr_is_token("X Foo", 5), "space is not a token char");
	ok(!httphdr_is_token("", 0), "empty is not a token");
	ok(!httphdr_is_token("a:b", 3), "colon is not a token char");
	{
		/* every byte against RFC 9110's list */
		const char *extra = "!#$%&'*+-.^_`|~";
		int wrong = 0;

		for (int c = 0; c < 256; c++) {
			char b = (char)c;
			bool want = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
				    (c >= 'A' && c <= 'Z') ||
				    (c != 0 && strchr(extra, c) != NULL);

			wrong += httphdr_is_token(&b, 1) != want;
		}
		is_int(wrong, 0, "each of the 256 bytes is a token char or not as RFC 9110 says");
	}
}

/* Issue 44: the spellings CGI, WSGI and Rack servers read as one field. */
static void test_folding(void)
{
	static const char *const same[] = {
		"X-Client-Cert-SAN", "x-client-cert-san", "X_Client_Cert_SAN",
		"X-Client-Cert_SAN", "x_CLIENT-cert_san", "X_CLIENT_CERT_SAN",
	};
	static const char *const other[] = {
		"X-Client-Cert-SAN2", "X-Client-Cert-SA", "X-Client-CertSAN",
		"X-Client-Cert.SAN", "X--Client-Cert-SAN", "", "X-Client-Cert-Subject",
	};

	for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++)
		ok(httphdr_name_folds_to(same[i], strlen(same[i]), "x-client-cert-san"),
		   "%s folds to x-client-cert-san", same[i]);
	for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++)
		ok(!httphdr_name_folds_to(other[i], strlen(other[i]), "x-client-cert-san"),
		   "\"%s\" does not", other[i]);
	ok(httphdr_name_folds_to("X-Forwarded-Proto", 11, "x-forwarded") &&
	   !httphdr_name_folds_to("X-Forwarded-Proto", 17, "x-forwarded"),
	   "the length given counts, not the NUL");
	ok(httphdr_name_folds_to("x-a", 3, "X_A"), "'_' in the name asked for folds too");
	ok(!httphdr_name_folds_to("X-\xc1", 3, "x-\xe1"), "only ASCII letters fold");
}

static void test_validate(void)
{
	struct hdrlist h;

	hdrlist_init(&h);
	ok(hdrlist_add(&h, "Good", "value\twith tab") == 0, "add");
	is_int(httphdr_validate(&h), 0, "tab in a value is fine");
	ok(hdrlist_add(&h, "Bad", "a\001b") == 0, "add");
	is_int(httphdr_validate(&h), -1, "control character rejected");
	hdrlist_reset(&h);
	ok(hdrlist_add(&h, "Host ", "x") == 0, "add");
	is_int(httphdr_validate(&h), -1, "space in a name rejected");

	/* every byte at every place of values of 1 to 24 bytes (the eight at a
	 * time check and the byte loop after it): refused exactly when it is a
	 * control byte other than HTAB */
	{
		int wrong = 0;
		char v[24];

		for (size_t len = 1; len <= sizeof(v); len++) {
			for (size_t at = 0; at < len; at++) {
				for (int c = 0; c < 256; c++) {
					bool want = !((c < 0x20 && c != '\t') || c == 0x7f);

					memset(v, 'a', len);
					v[at] = (char)c;
					hdrlist_reset(&h);
					if (hdrlist_add_name(&h, "X", 1) < 0 ||
					    hdrlist_add_value(&h, v, len) < 0) {
						wrong++;
						continue;
					}
					wrong += (httphdr_validate(&h) == 0) != want;
				}
			}
		}
		is_int(wrong, 0, "each byte at each place of a value is refused or not as RFC 9110 says");
	}
	hdrlist_reset(&h);
	ok(hdrlist_add(&h, "X", "a\ta\ta\ta\ta\ta\ta\ta\ta\ta\ta\ta\ta\001") == 0, "add");
	is_int(httphdr_validate(&h), -1, "a control byte after tabs in earlier words is refused");
	hdrlist_free(&h);
}

int main(void)
{
	test_collect();
	test_hop_by_hop();
	test_lists_and_tokens();
	test_folding();
	test_validate();
	return tap_done();
}
