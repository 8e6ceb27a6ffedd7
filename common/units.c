/*
 * units.c - durations and sizes, parsed strictly and printed exactly.
 *
 * The grammar is deliberately narrow (see units.h): configuration typos such
 * as "10 s", "1.5s" or "1KB" must fail loudly at start-up rather than be
 * guessed at, because a misread timeout or limit changes what the proxy
 * promises about duplicate execution.
 */
#include <stdio.h>
#include <string.h>

#include "units.h"

struct unit {
	const char *suffix;
	uint64_t factor;
};

/* Largest first: the formatters pick the first unit that divides exactly. */
static const struct unit duration_units[] = {
	{ "h", 3600000 },
	{ "m", 60000 },
	{ "s", 1000 },
	{ "ms", 1 },
};

static const struct unit size_units[] = {
	{ "GiB", 1024ULL * 1024 * 1024 },
	{ "MiB", 1024ULL * 1024 },
	{ "KiB", 1024 },
	{ "B", 1 },
};

#define NUNITS(a) (sizeof(a) / sizeof((a)[0]))

/*
 * Read the leading decimal digits of s into *n; *end points after them.
 * Fails on no digits or on overflow of uint64_t.
 */
static int parse_digits(const char *s, uint64_t *n, const char **end)
{
	uint64_t v = 0;
	const char *p = s;

	if (*p < '0' || *p > '9')
		return -1;
	for (; *p >= '0' && *p <= '9'; p++) {
		unsigned d = (unsigned)(*p - '0');

		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*n = v;
	*end = p;
	return 0;
}

/* Number followed by exactly one suffix of the table; "" allowed if bare. */
static int parse_with_units(const char *s, const struct unit *units,
			    size_t nunits, int bare_ok, uint64_t *out)
{
	const char *suffix;
	uint64_t n;
	size_t i;

	if (s == NULL || parse_digits(s, &n, &suffix) < 0)
		return -1;
	if (*suffix == '\0') {
		if (!bare_ok)
			return -1;
		*out = n;
		return 0;
	}
	for (i = 0; i < nunits; i++) {
		if (strcmp(suffix, units[i].suffix) != 0)
			continue;
		if (n > UINT64_MAX / units[i].factor)
			return -1;
		*out = n * units[i].factor;
		return 0;
	}
	return -1;
}

int units_parse_duration(const char *s, uint64_t *ms)
{
	/* A bare number is ambiguous (seconds? milliseconds?), so it is refused. */
	return parse_with_units(s, duration_units, NUNITS(duration_units), 0, ms);
}

int units_parse_size(const char *s, uint64_t *bytes)
{
	/* A bare number of bytes is unambiguous. */
	return parse_with_units(s, size_units, NUNITS(size_units), 1, bytes);
}

/*
 * Print v with the largest unit that divides it, so that parsing the result
 * gives v back. Zero has no largest unit; it prints as `zero`.
 */
static void format_with_units(uint64_t v, const struct unit *units,
			      size_t nunits, const char *zero, char *buf,
			      size_t len)
{
	size_t i;

	for (i = 0; v != 0 && i < nunits; i++) {
		if (v % units[i].factor == 0) {
			snprintf(buf, len, "%llu%s",
				 (unsigned long long)(v / units[i].factor),
				 units[i].suffix);
			return;
		}
	}
	snprintf(buf, len, "%s", zero);
}

void units_format_duration(uint64_t ms, char *buf, size_t len)
{
	format_with_units(ms, duration_units, NUNITS(duration_units), "0s",
			  buf, len);
}

void units_format_size(uint64_t bytes, char *buf, size_t len)
{
	format_with_units(bytes, size_units, NUNITS(size_units), "0B", buf,
			  len);
}
