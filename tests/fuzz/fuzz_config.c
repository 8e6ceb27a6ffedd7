/*
 * fuzz_config.c - the config file (common/inifile.c, config.c, route.c):
 * INI syntax, the [idemproxy] section and [route NAME] sections with every
 * route key, as config_parse() reads them from --config FILE.
 *
 * Input: the file's bytes, written to a memfd that --config names
 * (/proc/self/fd/N). Two variables of the process environment (passed as
 * main.c passes environ) hold webhook secrets for verify_secret_env.
 * Invariants: an error leaves no config and says why; a config that loads
 * reloads (SIGHUP) to the same effective settings (--check-config output);
 * every route's glob matches its own text, and looking that path up finds
 * the route or one before it.
 */
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <llhttp.h>

#include "config.h"
#include "fuzz.h"
#include "route.h"

static int memfd = -1;
static char path[64];
static FILE *devnull;

/* --check-config's output, allocated. */
static char *printed(const struct config *cfg)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (f == NULL)
		abort();
	config_print(cfg, f);
	fclose(f);
	return buf;
}

static void check_routes(const struct config *cfg)
{
	for (int i = 0; i < cfg->routing.nroutes; i++) {
		const struct route *r = &cfg->routing.routes[i];
		const char *name = NULL;
		int m = 0;

		FUZZ_REQUIRE(r->glob != NULL && r->methods != 0);
		FUZZ_REQUIRE(route_glob_match(r->glob, r->glob, strlen(r->glob)));
		if (strchr(r->glob, '?') != NULL)
			continue;	/* route_policy ignores the query */
		while (!((r->methods >> m) & 1))
			m++;
		(void)route_policy(&cfg->routing, m, r->glob, &name);
		FUZZ_REQUIRE(name != NULL);
		for (int j = 0;
		     j <= i && cfg->routing.routes[j].name != name; j++)
			FUZZ_REQUIRE(j < i);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	/* as main.c: the process environment, where SIGHUP finds it again */
	if (setenv("HOOK_SECRET", "s3cret", 1) < 0 ||
	    setenv("STRIPE_SECRET", "whsec_fuzz", 1) < 0)
		return -1;
	memfd = memfd_create("fuzz-config", 0);
	devnull = fopen("/dev/null", "w");
	if (memfd < 0 || devnull == NULL)
		return -1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *argv[] = { "idemproxy", "--upstream", "http://127.0.0.1:9",
			 "--config", path, NULL };
	struct config *cfg = NULL, *again;
	enum config_action action;
	char err[1024];
	char *a, *b;

	if (ftruncate(memfd, 0) < 0 ||
	    pwrite(memfd, data, size, 0) != (ssize_t)size)
		abort();
	if (config_parse(5, argv, environ, &cfg, &action, err, sizeof(err)) < 0) {
		FUZZ_REQUIRE(cfg == NULL && err[0] != '\0');
		return 0;
	}
	FUZZ_REQUIRE(cfg != NULL && action == CONFIG_RUN);
	check_routes(cfg);
	config_print(cfg, devnull);

	/* SIGHUP with the file unchanged: the same settings */
	again = config_reload(cfg, err, sizeof(err));
	if (again == NULL)
		fprintf(stderr, "reload: %s\n", err);
	FUZZ_REQUIRE(again != NULL);
	a = printed(cfg);
	b = printed(again);
	FUZZ_REQUIRE(strcmp(a, b) == 0);
	free(a);
	free(b);
	config_unref(again);
	config_unref(cfg);
	return 0;
}
