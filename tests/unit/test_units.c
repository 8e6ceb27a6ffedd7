/*
 * test_units.c - durations and sizes: what is accepted, what is refused,
 * and that printing then parsing gives the same number back.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"
#include "units.h"

struct good {
	const char *in;
	uint64_t want;
};

static const struct good good_durations[] = {
	{ "250ms", 250 },
	{ "10s", 10000 },
	{ "5m", 300000 },
	{ "24h", 86400000 },
	{ "0ms", 0 },
	{ "0s", 0 },
	{ "1ms", 1 },
	{ "010s", 10000 },
	{ "18446744073709551615ms", UINT64_MAX },
	{ "5124095576030h", 5124095576030ULL * 3600000 },
};

static const char *const bad_durations[] = {
	"", "10", "1.5s", " 10s", "10s ", "10S", "10MS", "-1s", "+1s", "10 s",
	"1d", "s", "ms", "10sms", "1h30m", "0x10s", "1e3ms", "10s\t",
	"18446744073709551616ms",	/* 2^64 */
	"18446744073709551615s",	/* overflows when scaled */
	"5124095576031h",
	"99999999999999999999999999h",
};

static const struct good good_sizes[] = {
	{ "1MiB", 1048576 },
	{ "512KiB", 524288 },
	{ "4096", 4096 },
	{ "0", 0 },
	{ "0B", 0 },
	{ "100B", 100 },
	{ "1GiB", 1073741824 },
	{ "8MiB", 8388608 },
	{ "18446744073709551615", UINT64_MAX },
	{ "17179869183GiB", 17179869183ULL << 30 },
};

static const char *const bad_sizes[] = {
	"", "1KB", "1K", "1k", "1kib", "1MB", "1.5MiB", " 1MiB", "1MiB ", "-1",
	"+1", "MiB", "1 MiB", "1TiB", "1b", "1BB",
	"17179869184GiB",		/* 2^64 */
	"18446744073709551616",
};

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void test_parse(void)
{
	uint64_t v;
	size_t i;

	for (i = 0; i < N(good_durations); i++) {
		v = 12345;
		is_int(units_parse_duration(good_durations[i].in, &v), 0,
		       "duration \"%s\" accepted", good_durations[i].in);
		ok(v == good_durations[i].want, "duration \"%s\" = %llu ms",
		   good_durations[i].in, (unsigned long long)good_durations[i].want);
	}
	for (i = 0; i < N(bad_durations); i++) {
		v = 12345;
		is_int(units_parse_duration(bad_durations[i], &v), -1,
		       "duration \"%s\" refused", bad_durations[i]);
		is_int(v, 12345, "refused duration leaves the output alone");
	}
	is_int(units_parse_duration(NULL, &v), -1, "NULL duration refused");

	for (i = 0; i < N(good_sizes); i++) {
		v = 12345;
		is_int(units_parse_size(good_sizes[i].in, &v), 0,
		       "size \"%s\" accepted", good_sizes[i].in);
		ok(v == good_sizes[i].want, "size \"%s\" = %llu", good_sizes[i].in,
		   (unsigned long long)good_sizes[i].want);
	}
	for (i = 0; i < N(bad_sizes); i++) {
		v = 12345;
		is_int(units_parse_size(bad_sizes[i], &v), -1,
		       "size \"%s\" refused", bad_sizes[i]);
	}
}

static void test_format(void)
{
	static const struct good durations[] = {
		{ "250ms", 250 }, { "1s", 1000 }, { "90s", 90000 },
		{ "24h", 86400000 }, { "1h", 3600000 }, { "0s", 0 },
		{ "1500ms", 1500 }, { "2m", 120000 }, { "25h", 90000000 },
	};
	static const struct good sizes[] = {
		{ "1MiB", 1048576 }, { "100B", 100 }, { "1536B", 1536 },
		{ "0B", 0 }, { "1GiB", 1073741824 }, { "2KiB", 2048 },
		{ "1025MiB", 1025ULL << 20 }, { "4096GiB", 4096ULL << 30 },
	};
	char buf[64];
	size_t i;

	for (i = 0; i < N(durations); i++) {
		units_format_duration(durations[i].want, buf, sizeof(buf));
		is_str(buf, durations[i].in, "format duration %llu",
		       (unsigned long long)durations[i].want);
	}
	for (i = 0; i < N(sizes); i++) {
		units_format_size(sizes[i].want, buf, sizeof(buf));
		is_str(buf, sizes[i].in, "format size %llu",
		       (unsigned long long)sizes[i].want);
	}

	units_format_duration(86400000, buf, 3);
	is_str(buf, "24", "format truncates to the buffer");
}

/* parse(format(v)) == v over a spread of values, including the extremes. */
static void test_round_trip(void)
{
	uint64_t seeds[] = { 0, 1, 999, 1000, 1001, 59999, 60000, 3599999,
			     3600000, 86400000, 1023, 1024, 1025, 1048576,
			     UINT64_MAX, UINT64_MAX - 1, 1ULL << 40, 7ULL << 30 };
	uint64_t x = 88172645463325252ULL, v, back;
	int bad_d = 0, bad_s = 0, i;
	char buf[64];

	for (i = 0; i < 20000; i++) {
		if ((size_t)i < N(seeds)) {
			v = seeds[i];
		} else {
			/* xorshift64; shifted so that small values come up too */
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			v = x >> (x % 64);
			if (i % 3 == 0)
				v *= 1000;
			if (i % 5 == 0)
				v <<= 10;
		}
		units_format_duration(v, buf, sizeof(buf));
		if (units_parse_duration(buf, &back) < 0 || back != v) {
			if (bad_d++ == 0)
				printf("# duration %llu -> %s\n", (unsigned long long)v, buf);
		}
		units_format_size(v, buf, sizeof(buf));
		if (units_parse_size(buf, &back) < 0 || back != v) {
			if (bad_s++ == 0)
				printf("# size %llu -> %s\n", (unsigned long long)v, buf);
		}
	}
	is_int(bad_d, 0, "durations round-trip through format and parse");
	is_int(bad_s, 0, "sizes round-trip through format and parse");
}

int main(void)
{
	test_parse();
	test_format();
	test_round_trip();
	return tap_done();
}
