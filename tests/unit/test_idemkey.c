/* Idempotency-Key syntax (common/idemkey.c, DESIGN.md §1 item 3 and §7):
 * bare values as before, RFC 8941 sf-strings with spaces and parameters. */
#include <string.h>

#include "idemkey.h"
#include "tap.h"

static char out[IDEMKEY_MAX + 1];

static int parse(const char *v)
{
	memset(out, 0x55, sizeof(out));
	return idemkey_parse(v, strlen(v), out, NULL);
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

/* Rejected, and the reason says what. */
static void bad_because(const char *v, const char *words)
{
	const char *why = NULL;
	int n = idemkey_parse(v, strlen(v), out, &why);

	ok(n == -1 && why != NULL && strstr(why, words) != NULL,
	   "rejected [%s]: \"%s\"", v, why ? why : "(no reason)");
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
		int n = idemkey_parse("ab\0cd", 5, out, NULL);

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
	bad("\"a\x01\"", "control char inside quotes");
	bad("\"a\tb\"", "a tab inside quotes");
	bad("\"\xc3\xa9\"", "UTF-8 inside quotes");

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
		int na = idemkey_parse("\"abc\"", 5, a, NULL);
		int nb = idemkey_parse("abc", 3, b, NULL);

		ok(na == nb && strcmp(a, b) == 0, "\"abc\" == abc");
	}
	/* a bare value may contain quotes and backslashes after the first char */
	good("a\"b", "a\"b");
	good("a\\b", "a\\b");
}

/* Issue 46: every value RFC 8941 allows for an sf-string item. */
static void test_rfc8941(void)
{
	good("\"a b\"", "a b");			/* spaces inside */
	good("\"  lead and trail  \"", "  lead and trail  ");
	good("\" \"", " ");
	good("\"order 42 \\\"rush\\\"\"", "order 42 \"rush\"");
	good("\"k\";v=1", "k");			/* parameters: not the key */
	good("\"k\";v", "k");			/* a parameter without value */
	good("\"k\"; v=1;w=?0;x=\"s t\";y=-1.5;z=tok/en:1;b=:aGVsbG8=:;*q",
	     "k");
	good("\"k\";a=123456789012345", "k");	/* 15 digits */
	good("\"k\";a=123456789012.123", "k");
	bad_because("\"k\" ;v=1", "parameters");	/* no space before ';' */
	bad_because("\"k\"x", "parameters");
	bad_because("\"k\";V=1", "name");		/* upper-case name */
	bad_because("\"k\";1a=1", "name");
	bad_because("\"k\";", "name");
	bad_because("\"k\";v=", "value");
	bad_because("\"k\";v=1234567890123456", "integer");
	bad_because("\"k\";v=1.2345", "decimal");
	bad_because("\"k\";v=?2", "boolean");
	bad_because("\"k\";v=:ab", "closing colon");
	bad_because("\"k\";v=\"open", "closing quote");
	bad_because("\"k\";v=@", "bare item");
	bad_because("\"\"", "empty");
	bad_because("\"a\\nb\"", "escapes");
	bad_because("a b", "quote it");
	bad_because("", "empty");
	/* compatibility: a bare value is taken as it is, ';' and all */
	good("abc;v=1", "abc;v=1");
	good("a\"b", "a\"b");
}

int main(void)
{
	test_bare();
	test_quoted();
	test_rfc8941();
	return tap_done();
}
