/*
 * test_setting.c - the value syntax both settings tables share (setting.h):
 * every type accepted and refused with its reason, the bounds, printing
 * that parses back to the same value, and the helpers (booleans, numbers,
 * method lists, values shown in errors).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llhttp.h>

#include "setting.h"
#include "tap.h"

static char err[512];

static const struct setting_word colours[] = {
	{ "red", 1 },
	{ "green", 2 },
	{ "light-blue", 3 },
	{ NULL, 0 },
};

static const struct setting_syntax dur = {
	.type = SETTING_DURATION, .min = 1, .max = SETTING_DURATION_MAX,
};
static const struct setting_syntax dur0 = {
	.type = SETTING_DURATION, .min = 0, .max = 60000,
};
static const struct setting_syntax size = {
	.type = SETTING_SIZE, .min = 1024, .max = 1024 * 1024,
};
static const struct setting_syntax num = {
	.type = SETTING_INT, .min = 1, .max = 256,
};
static const struct setting_syntax boolean = { .type = SETTING_BOOL };
static const struct setting_syntax word = {
	.type = SETTING_WORD, .words = colours,
};
static const struct setting_syntax text = { .type = SETTING_STRING };
static const struct setting_syntax token = { .type = SETTING_TOKEN };

/* Does parsing v fail with an error containing want, leaving *field? */
#define refused(syn, v, field, want) refused_(syn, v, field, sizeof(*(field)), want)

static void refused_(const struct setting_syntax *syn, const char *v,
		     void *field, size_t n, const char *want)
{
	char before[16];

	memcpy(before, field, n);
	err[0] = '\0';
	if (!ok(setting_parse(syn, v, field, err, sizeof(err)) < 0 &&
		strstr(err, want) != NULL, "\"%s\" refused: %s", v, err))
		printf("#   want \"%s\"\n", want);
	ok(memcmp(before, field, n) == 0, "\"%s\": field unchanged", v);
}

static void test_numbers(void)
{
	uint64_t ms = 7, bytes = 7;
	int n = 7;

	ok(setting_parse(&dur, "24h", &ms, err, sizeof(err)) == 0 &&
	   ms == 86400000, "duration 24h");
	ok(setting_parse(&dur, "2147483647s", &ms, err, sizeof(err)) == 0 &&
	   ms == SETTING_DURATION_MAX, "duration at its maximum");
	ms = 7;
	refused(&dur, "10 s", &ms, "invalid duration \"10 s\" (use e.g. 250ms, "
		"10s, 5m, 24h)");
	refused(&dur, "0s", &ms, "must be greater than 0");
	refused(&dur, "2147483648s", &ms, "2147483648s is too long (at most "
		"2147483647s)");
	refused(&dur, "999999999h", &ms, "too long");
	refused(&dur0, "2m", &ms, "2m is too long (at most 1m)");
	ok(setting_parse(&dur0, "0s", &ms, err, sizeof(err)) == 0 && ms == 0,
	   "duration 0 where the minimum is 0");

	ok(setting_parse(&size, "512KiB", &bytes, err, sizeof(err)) == 0 &&
	   bytes == 524288, "size 512KiB");
	refused(&size, "1KB", &bytes, "invalid size \"1KB\" (use e.g. 4096, "
		"512KiB, 1MiB)");
	refused(&size, "100", &bytes, "size 100 out of range (1KiB-1MiB)");
	refused(&size, "2MiB", &bytes, "size 2MiB out of range (1KiB-1MiB)");

	ok(setting_parse(&num, "256", &n, err, sizeof(err)) == 0 && n == 256,
	   "int at its maximum");
	refused(&num, "0", &n, "invalid number \"0\" (use 1-256)");
	refused(&num, "257", &n, "invalid number \"257\"");
	refused(&num, "-1", &n, "invalid number");
	refused(&num, "", &n, "invalid number");
	refused(&num, "99999999999999999999999", &n, "invalid number");
}

static void test_words(void)
{
	bool b = false;
	int w = 0;

	ok(setting_parse(&boolean, "On", &b, err, sizeof(err)) == 0 && b,
	   "bool On");
	ok(setting_parse(&boolean, "FALSE", &b, err, sizeof(err)) == 0 && !b,
	   "bool FALSE");
	refused(&boolean, "maybe", &b, "invalid boolean \"maybe\" (use yes/no, "
		"true/false, on/off or 1/0)");
	refused(&boolean, "", &b, "invalid boolean");

	ok(setting_parse(&word, "LIGHT-BLUE", &w, err, sizeof(err)) == 0 && w == 3,
	   "word, any case");
	refused(&word, "blue", &w, "invalid value \"blue\" (use red, green or "
		"light-blue)");
	is_str(setting_word(colours, 2), "green", "setting_word");
	is_str(setting_word(colours, 9), "?", "setting_word: unknown value");
}

static void test_text(void)
{
	char *s = NULL, *copy = NULL;
	char buf[64];

	ok(setting_parse(&text, "a b", &s, err, sizeof(err)) == 0 &&
	   strcmp(s, "a b") == 0, "string");
	ok(setting_parse(&text, "c", &s, err, sizeof(err)) == 0 &&
	   strcmp(s, "c") == 0, "string replaced (the old one freed)");
	refused(&text, "", &s, "empty value");
	ok(setting_parse(&token, "X-Request-Id", &s, err, sizeof(err)) == 0 &&
	   strcmp(s, "X-Request-Id") == 0, "token");
	refused(&token, "X Id", &s, "invalid header name \"X Id\"");
	refused(&token, "X:Id", &s, "invalid header name");
	refused(&token, "", &s, "empty value");

	setting_format(&token, &s, buf, sizeof(buf));
	is_str(buf, "X-Request-Id", "format a string");
	ok(setting_copy(&token, &copy, &s) == 0 && copy != s &&
	   strcmp(copy, s) == 0, "copy duplicates a string");
	setting_clear(&token, &s);
	ok(s == NULL, "clear frees and clears");
	setting_format(&token, &s, buf, sizeof(buf));
	is_str(buf, "", "format an unset string");
	ok(setting_copy(&token, &copy, &s) == 0 && copy == NULL,
	   "copy of an unset string clears");
}

/* Printing a value and parsing the output gives the value back. */
static void test_round_trip(void)
{
	static const char *const durs[] = { "250ms", "90s", "1h", "25h", "2147483647s" };
	static const char *const sizes[] = { "1KiB", "1025", "1MiB", "3KiB" };
	uint64_t a, b;
	char buf[64];
	bool yes = true, no = false, back;
	int w = 3, wback;

	for (size_t i = 0; i < sizeof(durs) / sizeof(durs[0]); i++) {
		ok(setting_parse(&dur, durs[i], &a, err, sizeof(err)) == 0, "%s", durs[i]);
		setting_format(&dur, &a, buf, sizeof(buf));
		ok(setting_parse(&dur, buf, &b, err, sizeof(err)) == 0 && a == b,
		   "duration %s prints as %s and back", durs[i], buf);
	}
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		ok(setting_parse(&size, sizes[i], &a, err, sizeof(err)) == 0, "%s", sizes[i]);
		setting_format(&size, &a, buf, sizeof(buf));
		ok(setting_parse(&size, buf, &b, err, sizeof(err)) == 0 && a == b,
		   "size %s prints as %s and back", sizes[i], buf);
	}
	setting_format(&boolean, &yes, buf, sizeof(buf));
	ok(strcmp(buf, "yes") == 0 &&
	   setting_parse(&boolean, buf, &back, err, sizeof(err)) == 0 && back,
	   "bool yes round trip");
	setting_format(&boolean, &no, buf, sizeof(buf));
	is_str(buf, "no", "bool no");
	setting_format(&word, &w, buf, sizeof(buf));
	ok(strcmp(buf, "light-blue") == 0 &&
	   setting_parse(&word, buf, &wback, err, sizeof(err)) == 0 && wback == 3,
	   "word round trip");
	w = 256;
	setting_format(&num, &w, buf, sizeof(buf));
	is_str(buf, "256", "int");
}

static void test_helpers(void)
{
	uint64_t n, mask;
	char sh[8];
	bool b;

	ok(setting_parse_uint("65535", 65535, &n) == 0 && n == 65535, "uint max");
	ok(setting_parse_uint("65536", 65535, &n) < 0, "uint over max");
	ok(setting_parse_uint("18446744073709551615", UINT64_MAX, &n) == 0 &&
	   n == UINT64_MAX, "uint 2^64-1");
	ok(setting_parse_uint("18446744073709551616", UINT64_MAX, &n) < 0,
	   "uint 2^64 overflows");
	ok(setting_parse_uint("+1", 10, &n) < 0 && setting_parse_uint(" 1", 10, &n) < 0 &&
	   setting_parse_uint("", 10, &n) < 0, "uint: digits only");
	ok(setting_parse_bool("YES", &b) == 0 && b, "bool helper");

	ok(setting_parse_methods("POST, PATCH", &mask, err, sizeof(err)) == 0 &&
	   mask == ((1ULL << HTTP_POST) | (1ULL << HTTP_PATCH)), "methods");
	ok(setting_parse_methods("post", &mask, err, sizeof(err)) < 0 &&
	   strstr(err, "unknown HTTP method \"post\"") != NULL, "methods: case");
	ok(setting_parse_methods("POST,", &mask, err, sizeof(err)) < 0 &&
	   strstr(err, "empty method in list") != NULL, "methods: empty item");
	ok(setting_parse_methods("", &mask, err, sizeof(err)) < 0 &&
	   strstr(err, "empty method list") != NULL, "methods: empty list");

	is_str(setting_shown("a\tb", sh, sizeof(sh)), "a?b", "shown: control byte");
	is_str(setting_shown("abcdefghij", sh, sizeof(sh)), "abcd...",
	       "shown: cut short");
}

int main(void)
{
	test_numbers();
	test_words();
	test_text();
	test_round_trip();
	test_helpers();
	return tap_done();
}
