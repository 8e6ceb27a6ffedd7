/* Idempotency-Key syntax (common/idemkey.c, DESIGN.md §1 item 3 and §7). */
#include <string.h>

#include "idemkey.h"
#include "tap.h"

static char out[IDEMKEY_MAX + 1];

static int parse(const char *v)
{
	memset(out, 0x55, sizeof(out));
	return idemkey_parse(v, strlen(v), out);
}

static void good(const char *v, const char *want)
{
	int n = parse(v);

	if (!ok(n == (int)strlen(want) && strcmp(out, want) == 0,
		"accepted [%s] as [%s]", v, want))
		printf("#   got %d [%.*s]\n", n, n > 0 ? n : 0, out);
}

static void bad(const char *v, const char *why)
{
	int n = parse(v);

	if (!ok(n == -1, "rejected: %s", why))
		printf("#   got %d\n", n);
}

static void test_bare(void)
{
	char key[IDEMKEY_MAX + 2];
	char vis[0x7e - 0x21 + 2];

	good("a", "a");
	good("abc", "abc");
	good("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324");
	good("  abc\t", "abc");		/* OWS around the value */
	for (int c = 0x21; c <= 0x7e; c++)
		vis[c - 0x21] = (char)c;
	vis[0x7e - 0x21 + 1] = '\0';
	vis[0] = '!';			/* not a quote at the start */
	good(vis, vis);

	memset(key, 'k', sizeof(key));
	key[255] = '\0';
	good(key, key);
	key[255] = 'k';
	key[256] = '\0';
	bad(key, "256 characters");

	bad("", "empty");
	bad("   ", "only spaces");
	bad("\t", "only a tab");
	bad("a b", "inner space");
	bad("a\tb", "inner tab");
	bad("a\x01" "b", "control char 0x01");
	bad("ab\x7f", "DEL");
	bad("a\x80", "non-ASCII byte");
	bad("\xc3\xa9t\xc3\xa9", "UTF-8");
	bad("a\r\nb", "CR LF");
	{
		/* an embedded NUL is part of the value, and not visible */
		int n = idemkey_parse("ab\0cd", 5, out);

		is_int(n, -1, "rejected: embedded NUL");
	}
}

static void test_quoted(void)
{
	char key[IDEMKEY_MAX + 4];

	good("\"abc\"", "abc");
	good(" \"abc\" ", "abc");
	good("\"a\\\"b\"", "a\"b");		/* \" */
	good("\"a\\\\b\"", "a\\b");		/* \\ */
	good("\"\\\\\"", "\\");
	good("\"x\"", "x");

	bad("\"\"", "empty quoted string");
	bad("\"", "a lone quote");
	bad("\"abc", "unterminated quote");
	bad("\"abc\\\"", "unterminated: the last quote is escaped");
	bad("\"a\\nb\"", "bad escape \\n");
	bad("\"a\\x\"", "bad escape \\x");
	bad("\"a\"b\"", "unescaped quote inside");
	bad("\"a b\"", "space inside quotes (a key has no spaces)");
	bad("\"a\x01\"", "control char inside quotes");

	/* 255 counts the unquoted key */
	key[0] = '"';
	memset(key + 1, 'q', 255);
	key[256] = '"';
	key[257] = '\0';
	{
		char want[256];

		memset(want, 'q', 255);
		want[255] = '\0';
		good(key, want);
	}
	key[256] = 'q';
	key[257] = '"';
	key[258] = '\0';
	bad(key, "256 characters quoted");

	/* "abc" and abc are the same key */
	{
		char a[IDEMKEY_MAX + 1], b[IDEMKEY_MAX + 1];
		int na = idemkey_parse("\"abc\"", 5, a);
		int nb = idemkey_parse("abc", 3, b);

		ok(na == nb && strcmp(a, b) == 0, "\"abc\" == abc");
	}
	/* a bare value may contain quotes and backslashes after the first char */
	good("a\"b", "a\"b");
	good("a\\b", "a\\b");
}

int main(void)
{
	test_bare();
	test_quoted();
	return tap_done();
}
