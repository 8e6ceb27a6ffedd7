/*
 * fuzz_setting.c - the value syntax of every option (common/setting.c,
 * units.c, hostport.c and config.c's special values): through the public
 * entry point, config_parse() with a flag or an environment variable, and
 * through setting_parse() directly.
 *
 * Input: an option selector byte, a source byte (bit 0: environment instead
 * of a flag), then the value.
 * Invariants: for a value of setting.h's syntax, what setting_format()
 * prints parses back to the same value (setting.h promises it); the same
 * holds for durations and sizes printed by units.c; setting_shown() makes
 * one printable, NUL-terminated line of at most its buffer.
 */
#include <stdbool.h>
#include <string.h>

#include "config.h"
#include "fuzz.h"
#include "setting.h"
#include "units.h"

/* config.c's option table, spelt as flags. */
static const char *const options[] = {
	"listen", "upstream", "store", "redis", "admin-listen", "workers",
	"key-header", "methods", "require-key", "in-flight", "wait-timeout",
	"ttl", "lease", "upstream-timeout", "max-body", "max-cached-response",
	"store-down", "on-upstream-error", "drain-timeout", "sweep-interval",
	"log-level", "log-format", "client-timeout", "idle-timeout",
	"max-header-size", "max-connections", "issued-key-ttl",
	"memory-max-bytes", "max-buffered", "store-connections",
	"response-cache", "upstream-deadline", "release-statuses",
	"unknown-outcome",
};
#define NOPTIONS (sizeof(options) / sizeof(options[0]))

static FILE *devnull;

union field {
	char *s;
	int i;
	bool b;
	uint64_t u;
	struct status_set st;
};

static bool same(const struct setting_syntax *syn, const union field *a,
		 const union field *b)
{
	switch (syn->type) {
	case SETTING_STRING:
	case SETTING_TOKEN:
		return strcmp(a->s, b->s) == 0;
	case SETTING_INT:
	case SETTING_WORD:
		return a->i == b->i;
	case SETTING_BOOL:
		return a->b == b->b;
	case SETTING_DURATION:
	case SETTING_SIZE:
		return a->u == b->u;
	case SETTING_STATUSES:
		return memcmp(&a->st, &b->st, sizeof(a->st)) == 0;
	}
	return false;
}

/* Parse, print, parse again: the same value; a copy is the same too. */
static void round_trip(const struct setting_syntax *syn, const char *v)
{
	union field a = { 0 }, b = { 0 }, c = { 0 };
	char err[512], buf[1024];

	if (setting_parse(syn, v, &a, err, sizeof(err)) < 0) {
		FUZZ_REQUIRE(err[0] != '\0' && strlen(err) < sizeof(err));
		return;
	}
	setting_format(syn, &a, buf, sizeof(buf));
	if (strlen(v) < sizeof(buf) - 1) {
		FUZZ_REQUIRE(setting_parse(syn, buf, &b, err, sizeof(err)) == 0);
		FUZZ_REQUIRE(same(syn, &a, &b));
	}
	FUZZ_REQUIRE(setting_copy(syn, &c, &a) == 0 && same(syn, &a, &c));
	setting_clear(syn, &a);
	setting_clear(syn, &b);
	setting_clear(syn, &c);
}

static void units(const char *v)
{
	uint64_t n, m;
	char buf[32];

	if (units_parse_duration(v, &n) == 0) {
		units_format_duration(n, buf, sizeof(buf));
		FUZZ_REQUIRE(units_parse_duration(buf, &m) == 0 && m == n);
	}
	if (units_parse_size(v, &n) == 0) {
		units_format_size(n, buf, sizeof(buf));
		FUZZ_REQUIRE(units_parse_size(buf, &m) == 0 && m == n);
	}
}

static void shown(const char *v)
{
	char buf[80];

	for (size_t len = 1; len <= sizeof(buf); len += 13) {
		const char *s = setting_shown(v, buf, len);

		FUZZ_REQUIRE(s == buf && strlen(buf) < len);
		for (const char *p = buf; *p != '\0'; p++)
			FUZZ_REQUIRE(*p >= 0x20 && *p < 0x7f);
	}
}

/* The option through config_parse(), as a flag or from the environment. */
static void through_config(const char *name, const char *v, bool env)
{
	char flag[1200], var[1200], err[1024];
	char *argv[] = { "idemproxy", "--upstream=http://127.0.0.1:9", flag, NULL };
	char *envp[] = { var, NULL };
	struct config *cfg = NULL;
	enum config_action action;
	int argc = 3;

	snprintf(flag, sizeof(flag), "--%s=%s", name, v);
	if (env) {
		size_t n = (size_t)snprintf(var, sizeof(var), "IDEMPROXY_%s=%s",
					    name, v);

		for (size_t i = 0; i < n && var[i] != '='; i++)
			var[i] = var[i] == '-' ? '_' :
				 (char)(var[i] >= 'a' && var[i] <= 'z' ?
					var[i] - 32 : var[i]);
		argc = 2;
		argv[2] = NULL;
	} else {
		envp[0] = NULL;
	}
	if (config_parse(argc, argv, envp, &cfg, &action, err, sizeof(err)) < 0) {
		FUZZ_REQUIRE(cfg == NULL && err[0] != '\0');
		return;
	}
	if (cfg == NULL)
		return;		/* --help, --version */
	config_print(cfg, devnull);
	config_unref(cfg);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	devnull = fopen("/dev/null", "w");
	return devnull == NULL ? -1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *name;
	char key[64], v[1024];
	const struct setting_syntax *syn;
	uint64_t mask;
	char err[512];

	if (size < 2 || size - 2 >= sizeof(v))
		return 0;
	name = options[data[0] % NOPTIONS];
	memcpy(v, data + 2, size - 2);
	v[size - 2] = '\0';		/* argv, environ, inih: C strings */

	through_config(name, v, data[1] & 1);

	snprintf(key, sizeof(key), "%s", name);
	for (char *p = key; *p != '\0'; p++)
		if (*p == '-')
			*p = '_';
	syn = config_option_syntax(NULL, key, NULL);
	if (syn != NULL)
		round_trip(syn, v);
	units(v);
	shown(v);
	if (setting_parse_methods(v, &mask, err, sizeof(err)) == 0)
		FUZZ_REQUIRE(mask != 0);
	return 0;
}
