/*
 * The JSON canonicaliser (common/jcs.c) against RFC 8785: its examples
 * (§3.2.2 and §3.2.3), the number samples of its Appendix B, and
 * data/jcs_numbers.txt, doubles that node's Number.prototype.toString()
 * wrote (data/jcs_numbers.js), which is what RFC 8785 defines number
 * serialisation by. Then what jcs_parse() refuses, because json-c would
 * hide it, and that a canonical form is its own canonical form.
 *
 * argv[1]: the path of data/jcs_numbers.txt.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <json-c/json.h>

#include "jcs.h"
#include "tap.h"

/* The canonical form of text, or "(refused)". Static: one at a time. */
static const char *canon(const char *text)
{
	static char out[4096];
	struct json_object *v = jcs_parse(text, strlen(text));
	struct evbuffer *b = evbuffer_new();
	int n;

	strcpy(out, "(refused)");
	if (v != NULL && b != NULL && jcs_write(b, v) == 0) {
		n = evbuffer_remove(b, out, sizeof(out) - 1);
		out[n > 0 ? n : 0] = '\0';
	}
	json_object_put(v);
	if (b != NULL)
		evbuffer_free(b);
	return out;
}

static void test_rfc_examples(void)
{
	/* §3.2.2: the input, as the RFC prints it */
	is_str(canon("{\n"
		     "  \"numbers\": [333333333.33333329, 1E30, 4.50,\n"
		     "              2e-3, 0.000000000000000000000000001],\n"
		     "  \"string\": \"\\u20ac$\\u000F\\u000aA'\\u0042\\u0022\\u005c\\\\\\\"\\/\",\n"
		     "  \"literals\": [null, true, false]\n"
		     "}"),
	       "{\"literals\":[null,true,false],"
	       "\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],"
	       "\"string\":\"\xe2\x82\xac$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}",
	       "RFC 8785 3.2.2: the sample object");
	/* §3.2.3: member names in the order of their UTF-16 code units */
	is_str(canon("{\n"
		     "  \"\\u20ac\": \"Euro Sign\",\n"
		     "  \"\\r\": \"Carriage Return\",\n"
		     "  \"\\ufb33\": \"Hebrew Letter Dalet With Dagesh\",\n"
		     "  \"1\": \"One\",\n"
		     "  \"\\ud83d\\ude00\": \"Emoji: Grinning Face\",\n"
		     "  \"\\u0080\": \"Control\",\n"
		     "  \"\\u00f6\": \"Latin Small Letter O With Diaeresis\"\n"
		     "}"),
	       "{\"\\r\":\"Carriage Return\",\"1\":\"One\","
	       "\"\xc2\x80\":\"Control\","
	       "\"\xc3\xb6\":\"Latin Small Letter O With Diaeresis\","
	       "\"\xe2\x82\xac\":\"Euro Sign\","
	       "\"\xf0\x9f\x98\x80\":\"Emoji: Grinning Face\","
	       "\"\xef\xac\xb3\":\"Hebrew Letter Dalet With Dagesh\"}",
	       "RFC 8785 3.2.3: sorting by UTF-16 code units (the emoji "
	       "before U+FB33)");
	is_str(canon(" { \"b\" : [ 1 , { \"z\":1, \"a\" : 2 } ] , \"a\":\"x\" } "),
	       "{\"a\":\"x\",\"b\":[1,{\"a\":2,\"z\":1}]}",
	       "nested objects sorted, arrays kept in order, blanks gone");
	is_str(canon("\"\\u001f\\u007f\\b\\f\\t\""), "\"\\u001f\x7f\\b\\f\\t\"",
	       "control characters: short escapes, else \\u00xx; DEL as is");
	is_str(canon("42"), "42", "a bare number");
	is_str(canon("[-0, -0.0, 1.0, 1E2, 100, 0.1e1]"),
	       "[0,0,1,100,100,1]", "one spelling per number");
}

static double from_bits(uint64_t u)
{
	double d;

	memcpy(&d, &u, sizeof(d));
	return d;
}

static void test_appendix_b(void)
{
	static const struct {
		uint64_t bits;
		const char *es;
	} v[] = {
		{ 0x0000000000000000ULL, "0" },
		{ 0x8000000000000000ULL, "0" },
		{ 0x0000000000000001ULL, "5e-324" },
		{ 0x8000000000000001ULL, "-5e-324" },
		{ 0x7fefffffffffffffULL, "1.7976931348623157e+308" },
		{ 0xffefffffffffffffULL, "-1.7976931348623157e+308" },
		{ 0x4340000000000000ULL, "9007199254740992" },
		{ 0xc340000000000000ULL, "-9007199254740992" },
		{ 0x4430000000000000ULL, "295147905179352830000" },
		{ 0x44b52d02c7e14af5ULL, "9.999999999999997e+22" },
		{ 0x44b52d02c7e14af6ULL, "1e+23" },
		{ 0x44b52d02c7e14af7ULL, "1.0000000000000001e+23" },
		{ 0x444b1ae4d6e2ef4eULL, "999999999999999700000" },
		{ 0x444b1ae4d6e2ef4fULL, "999999999999999900000" },
		{ 0x444b1ae4d6e2ef50ULL, "1e+21" },
		{ 0x3eb0c6f7a0b5ed8cULL, "9.999999999999997e-7" },
		{ 0x3eb0c6f7a0b5ed8dULL, "0.000001" },
		{ 0x41b3de4355555553ULL, "333333333.3333332" },
		{ 0x41b3de4355555554ULL, "333333333.33333325" },
		{ 0x41b3de4355555555ULL, "333333333.3333333" },
		{ 0x41b3de4355555556ULL, "333333333.3333334" },
		{ 0x41b3de4355555557ULL, "333333333.33333343" },
		{ 0xbecbf647612f3696ULL, "-0.0000033333333333333333" },
		{ 0x43143ff3c1cb0959ULL, "1424953923781206.2" },
	};
	char buf[JCS_NUMBER_MAX];

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		if (jcs_number(from_bits(v[i].bits), buf) < 0)
			strcpy(buf, "(error)");
		is_str(buf, v[i].es, "appendix B: %016llx",
		       (unsigned long long)v[i].bits);
	}
	ok(jcs_number(from_bits(0x7fffffffffffffffULL), buf) < 0 &&
	   jcs_number(from_bits(0x7ff0000000000000ULL), buf) < 0,
	   "appendix B: NaN and Infinity have no form");
}

static void test_number_file(const char *path)
{
	FILE *f = fopen(path, "r");
	char line[128], want[64], buf[JCS_NUMBER_MAX];
	unsigned long long bits;
	int n = 0, bad = 0;

	ok(f != NULL, "open %s", path);
	while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, "%llx %63s", &bits, want) != 2)
			continue;
		n++;
		if (jcs_number(from_bits(bits), buf) < 0 || strcmp(buf, want) != 0) {
			if (bad++ < 5)
				printf("# %016llx: got %s, node wrote %s\n", bits, buf,
				     want);
		}
	}
	if (f != NULL)
		fclose(f);
	ok(n > 2000 && bad == 0, "%d doubles as node writes them (%d differ)",
	   n, bad);
}

static void test_refused(void)
{
	static const char *const bad[] = {
		"{\"a\":1,\"a\":2}",		/* json-c would keep the 2 */
		"{\"a\":{\"b\":1,\"b\":1}}",
		"[{\"x\":[1]},{\"y\":2,\"z\":{\"q\":1,\"q\":2}}]",
		"{\"a\\u0000b\":1}",		/* json-c cuts names at NUL */
		"\"\\u0000\"",
		"\"\\ud800\"",			/* json-c would write U+FFFD */
		"\"\\udc00\"",
		"\"\\ud800\\u0041\"",
		"\"\\ud800x\"",
		"[1e400]",			/* beyond a double */
		"[-1e309]",
		"[NaN]", "[Infinity]", "[1,]", "{\"a\" 1}", "[01]", "'a'",
		"{'a':1}", "[NaN, 1]", "[-Infinity]",	/* json-c takes them */
		"[\"a\tb\"]",			/* a raw control byte */
		"\"\xff\"",			/* not UTF-8 */
		"{} x", "", "   ", "{",
	};
	char deep[2 * JCS_DEPTH_MAX + 8];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		is_str(canon(bad[i]), "(refused)", "refused: %s", bad[i]);
	memset(deep, '[', JCS_DEPTH_MAX + 1);
	memset(deep + JCS_DEPTH_MAX + 1, ']', JCS_DEPTH_MAX + 1);
	deep[2 * JCS_DEPTH_MAX + 2] = '\0';
	is_str(canon(deep), "(refused)", "refused: nesting deeper than %d",
	       JCS_DEPTH_MAX);
	deep[JCS_DEPTH_MAX] = ']';
	deep[2 * JCS_DEPTH_MAX] = '\0';
	ok(strcmp(canon(deep), "(refused)") != 0, "taken: nesting of %d",
	   JCS_DEPTH_MAX);
	is_str(canon("{\"a\":\"x:y\",\"b\":{\"c\":\"}:{\"}}"),
	       "{\"a\":\"x:y\",\"b\":{\"c\":\"}:{\"}}",
	       "colons and brackets inside strings are not members");
	is_str(canon("[18446744073709551606, 18446744073709551616, "
		     "123456789012345678901234567890, -9223372036854775809, "
		     "1e-400]"),
	       "[18446744073709552000,18446744073709552000,"
	       "1.2345678901234568e+29,-9223372036854776000,0]",
	       "integers beyond 64 bits are the nearest double, as the text "
	       "wrote them (json-c would clamp them)");
	is_str(canon("{\"a\":[1,{\"b\":-2.5e3,\"c\":[3]}],\"d\":4}"),
	       "{\"a\":[1,{\"b\":-2500,\"c\":[3]}],\"d\":4}",
	       "numbers go back where they were, in members and elements");
	is_str(canon("[9223372036854775807, 9007199254740993]"),
	       "[9223372036854776000,9007199254740992]",
	       "integers are doubles: 2^53+1 is 2^53 (documented)");
	is_str(canon("\"\\ud83d\\ude00\\\\u0000\""),
	       "\"\xf0\x9f\x98\x80\\\\u0000\"",
	       "an escaped backslash before u0000 is not an escape");
}

/*
 * Issue 44: UTF-8 as RFC 3629 has it, or the raw-bytes fallback. json-c's
 * JSON_TOKENER_VALIDATE_UTF8 counts continuation bytes only, so d99a8fe
 * canonicalised these.
 */
static void test_utf8(void)
{
	static const struct {
		const char *text, *what;
	} bad[] = {
		{ "\"\xc0\x80\"", "overlong NUL (C0 80)" },
		{ "\"\xc1\xbf\"", "overlong U+007F (C1 BF)" },
		{ "\"\xe0\x80\xaf\"", "overlong '/' (E0 80 AF)" },
		{ "\"\xf0\x8f\xbf\xbf\"", "overlong U+FFFF (F0 8F BF BF)" },
		{ "\"\xed\xa0\x80\"", "an encoded surrogate (ED A0 80)" },
		{ "\"\xed\xbf\xbf\"", "an encoded surrogate (ED BF BF)" },
		{ "\"\xed\xa0\xbd\xed\xb8\x80\"", "a surrogate pair, encoded (CESU-8)" },
		{ "\"\xf4\x90\x80\x80\"", "beyond U+10FFFF (F4 90 80 80)" },
		{ "\"\xf5\x80\x80\x80\"", "a lead byte beyond U+10FFFF (F5)" },
		{ "\"\xf8\x88\x80\x80\x80\"", "a five-byte form (F8)" },
		{ "\"\x80\"", "a continuation byte first" },
		{ "\"\xc3\"", "a sequence cut short by the quote" },
		{ "\"\xe2\x82\"", "a three-byte sequence cut short" },
		{ "{\"\xc0\xaf\":1}", "an overlong member name" },
		{ "[\"ok\",{\"a\":\"\xed\xa0\x80\"}]", "deep in the value" },
	};
	static const char *const good[] = {
		"\"\xc2\x80\"",			/* U+0080 */
		"\"\xdf\xbf\"",			/* U+07FF */
		"\"\xe0\xa0\x80\"",		/* U+0800 */
		"\"\xed\x9f\xbf\"",		/* U+D7FF */
		"\"\xee\x80\x80\"",		/* U+E000 */
		"\"\xef\xbf\xbf\"",		/* U+FFFF */
		"\"\xf0\x90\x80\x80\"",		/* U+10000 */
		"\"\xf4\x8f\xbf\xbf\"",		/* U+10FFFF */
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		is_str(canon(bad[i].text), "(refused)", "not UTF-8, refused: %s",
		       bad[i].what);
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		is_str(canon(good[i]), good[i], "UTF-8 taken as it is: %zu", i);
}

static void test_idempotent(void)
{
	static const char *const texts[] = {
		"{\"z\":[1.5,2e-7,{\"\\u00e9\":null}],\"a\":\"\\u2028\\\\\"}",
		"[1e21, 1e-7, 123456789012345680000, 0.1, -0]",
		"{\"\\ud83d\\ude00\":1,\"\\uffff\":2,\"\\ue000\":3}",
	};

	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		char once[4096];

		snprintf(once, sizeof(once), "%s", canon(texts[i]));
		is_str(canon(once), once, "canonical twice is canonical once: %s",
		       once);
	}
}

int main(int argc, char **argv)
{
	test_rfc_examples();
	test_appendix_b();
	test_number_file(argc > 1 ? argv[1] : "data/jcs_numbers.txt");
	test_refused();
	test_utf8();
	test_idempotent();
	return tap_done();
}
