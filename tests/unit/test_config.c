/*
 * test_config.c - the option table seen from outside: defaults, the
 * precedence of flags, environment and file, strict validation with errors
 * that name their source, the INI dialect, and SIGHUP reloads.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llhttp.h>

#include "config.h"
#include "tap.h"

static char tmpdir[] = "/tmp/idemproxy-test-config-XXXXXX";
static char files[64][256];
static int nfiles;

/* Write a file into the temp dir; returns its path (lives until exit). */
static char *write_file(const char *name, const char *text)
{
	char *path = files[nfiles++];
	FILE *f;

	snprintf(path, sizeof(files[0]), "%s/%s", tmpdir, name);
	f = fopen(path, "w");
	if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
		perror(path);
		exit(99);
	}
	return path;
}

static void cleanup(void)
{
	int i;

	for (i = 0; i < nfiles; i++)
		unlink(files[i]);
	rmdir(tmpdir);
}

static int count(char **v)
{
	int n = 0;

	while (v[n] != NULL)
		n++;
	return n;
}

#define ARGS(...) ((char *[]){ "idemproxy", __VA_ARGS__, NULL })
#define ENV(...) ((char *[]){ __VA_ARGS__, NULL })
#define NOENV ((char *[]){ NULL })

static char err[1024];

/* Parse; on success the config is returned (the caller unrefs it). */
static struct config *parse(char **argv, char **env, enum config_action *action)
{
	struct config *c = NULL;
	enum config_action a;

	err[0] = '\0';
	if (config_parse(count(argv), argv, env, &c, &a, err, sizeof(err)) < 0) {
		if (c != NULL)
			printf("# BUG: config returned on error\n");
		return NULL;
	}
	if (action != NULL)
		*action = a;
	return c;
}

/* Expect the parse to fail with an error containing want. */
static void fails(char **argv, char **env, const char *want, const char *name)
{
	struct config *c = parse(argv, env, NULL);

	if (!ok(c == NULL && strstr(err, want) != NULL, "%s", name))
		printf("#   error \"%s\", want it to contain \"%s\"\n", err, want);
	if (strchr(err, '\n') != NULL)
		ok(0, "%s: error is one line", name);
	config_unref(c);
}

static struct config *parses(char **argv, char **env, const char *name)
{
	struct config *c = parse(argv, env, NULL);

	if (!ok(c != NULL, "%s", name))
		printf("#   error: %s\n", err);
	return c;
}

static void test_defaults(void)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	struct config *c = parses(ARGS("--upstream", "http://127.0.0.1:9000"),
				  NOENV, "defaults parse");

	if (c == NULL)
		return;
	is_str(c->listen, "127.0.0.1:8080", "listen default");
	is_str(c->listen_hp.host, "127.0.0.1", "listen host");
	is_str(c->listen_hp.port, "8080", "listen port");
	is_str(c->upstream_hp.host, "127.0.0.1", "upstream host");
	is_str(c->upstream_hp.port, "9000", "upstream port");
	is_str(c->upstream_prefix, "", "upstream prefix empty");
	is_str(c->store, "memory", "store default");
	ok(c->redis == NULL && c->redis_hp.host == NULL, "redis off");
	is_str(c->admin_listen, "127.0.0.1:9090", "admin default");
	is_str(c->admin_hp.port, "9090", "admin port");
	ok(c->config_file == NULL, "no config file");
	is_int(c->workers, cpus < 1 ? 1 : cpus > 256 ? 256 : cpus, "workers = CPUs");
	is_str(c->key_header, "Idempotency-Key", "key header");
	is_str(c->methods, "POST,PATCH", "methods");
	ok(config_method_protected(c, HTTP_POST), "POST protected");
	ok(config_method_protected(c, HTTP_PATCH), "PATCH protected");
	ok(!config_method_protected(c, HTTP_GET), "GET not protected");
	ok(!config_method_protected(c, HTTP_PUT), "PUT not protected");
	ok(!config_method_protected(c, -1) && !config_method_protected(c, 64),
	   "out-of-range methods not protected");
	ok(!c->require_key, "require_key off");
	is_int(c->in_flight, IN_FLIGHT_WAIT, "in_flight wait");
	is_int(c->wait_timeout_ms, 10000, "wait_timeout 10s");
	is_int(c->ttl_ms, 86400000, "ttl 24h");
	is_int(c->lease_ms, 30000, "lease 30s");
	is_int(c->upstream_timeout_ms, 20000, "upstream_timeout 20s");
	is_int(c->max_body, 1048576, "max_body 1MiB");
	is_int(c->max_cached_response, 8388608, "max_cached_response 8MiB");
	is_int(c->store_down, STORE_DOWN_FAIL_CLOSED, "store_down fail-closed");
	is_int(c->on_upstream_error, UPSTREAM_ERROR_RELEASE, "release");
	is_int(c->drain_timeout_ms, 20000, "drain_timeout 20s");
	is_int(c->sweep_interval_ms, 10000, "sweep_interval 10s");
	is_int(c->log_level, LOG_INFO, "log_level info");
	is_int(c->log_format, LOG_FORMAT_TEXT, "log_format text");
	is_int(c->client_timeout_ms, 10000, "client_timeout 10s");
	is_int(c->idle_timeout_ms, 60000, "idle_timeout 60s");
	is_int(c->max_header_size, 32768, "max_header_size 32KiB");
	is_int(c->max_connections, 10000, "max_connections 10000");
	is_int(c->argc, 3, "argv kept");
	is_str(c->argv[2], "http://127.0.0.1:9000", "argv copied");
	ok(c->env != NULL && c->env[0] == NULL, "no env kept");
	is_int(atomic_load(&c->refcount), 1, "refcount 1");
	ok(config_ref(c) == c, "ref returns the config");
	is_int(atomic_load(&c->refcount), 2, "refcount 2");
	config_unref(c);
	config_unref(c);
}

static void test_precedence(void)
{
	char *ini = write_file("prec.ini",
		"[idemproxy]\nupstream = http://file:1\nttl = 1h\nlog_level = warn\n");
	char cfgenv[300];
	struct config *c;

	snprintf(cfgenv, sizeof(cfgenv), "IDEMPROXY_CONFIG=%s", ini);

	c = parses(ARGS("--ttl", "3h"), ENV(cfgenv, "IDEMPROXY_TTL=2h"),
		   "flag + env + file");
	if (c) {
		is_int(c->ttl_ms, 3 * 3600000, "flag beats env and file");
		is_str(c->upstream_hp.host, "file", "file fills what others leave");
		is_int(c->log_level, LOG_WARN, "file log_level");
		is_str(c->config_file, ini, "config_file from env");
		is_int(count(c->env), 2, "only IDEMPROXY_ variables kept");
	}
	config_unref(c);

	c = parses(ARGS("--config", ini), ENV("IDEMPROXY_TTL=2h"), "env + file");
	if (c)
		is_int(c->ttl_ms, 2 * 3600000, "env beats file");
	config_unref(c);

	c = parses(ARGS("--config", ini), NOENV, "file only");
	if (c)
		is_int(c->ttl_ms, 3600000, "file beats default");
	config_unref(c);

	c = parses(ARGS("--upstream", "http://a:1", "--upstream", "http://b:2"),
		   ENV("IDEMPROXY_UPSTREAM=http://env:3"), "flag twice");
	if (c)
		is_str(c->upstream_hp.host, "b", "last flag wins");
	config_unref(c);

	c = parses(ARGS("--upstream", "http://a:1"),
		   ENV("PATH=/bin", "IDEMPROXY_NOT_AN_OPTION=x", "IDEMPROXY_TTL",
		       "IDEMPROXY_TTL=5m", "IDEMPROXY_TTL=bogus"),
		   "unknown env ignored, first duplicate wins");
	if (c)
		is_int(c->ttl_ms, 300000, "env ttl");
	config_unref(c);

	/* a bad value is an error even where a higher source overrides it */
	fails(ARGS("--upstream", "http://a:1", "--ttl", "1h"),
	      ENV("IDEMPROXY_TTL=10 s"),
	      "IDEMPROXY_TTL: invalid duration \"10 s\" (use e.g. 250ms, 10s, 5m, 24h)",
	      "bad env under a flag");
	{
		char *bad = write_file("bad.ini",
			"[idemproxy]\n; comment\n\nmax_body = 1MB\n");
		char want[400];

		snprintf(want, sizeof(want), "%s:4: max_body: invalid size \"1MB\"", bad);
		fails(ARGS("--upstream", "http://a:1", "--max-body", "2MiB",
			   "--config", bad), NOENV, want, "bad file value under a flag");
	}
	fails(ARGS("--upstream", "http://a:1", "--ttl", "1 h", "--ttl", "1h"),
	      NOENV, "--ttl: invalid duration \"1 h\"", "overridden bad flag");
	c = parses(ARGS("--upstream", "http://a:1", "--config", ini),
		   ENV("IDEMPROXY_CONFIG=/nonexistent/x.ini"),
		   "--config beats IDEMPROXY_CONFIG; only the winner is read");
	config_unref(c);
}

static void test_required_and_lease(void)
{
	char *ini = write_file("noup.ini", "[idemproxy]\nttl = 1h\n");
	enum config_action a;
	struct config *c;

	fails(ARGS("--ttl", "1h"), NOENV, "--upstream is required", "missing upstream");
	fails(ARGS("--check-config", ini), NOENV, "--upstream is required",
	      "missing upstream under --check-config");
	fails(ARGS("--upstream", "http://a:1", "--lease", "20s"), NOENV,
	      "--lease (20s) must be longer than --upstream-timeout (20s)",
	      "lease == upstream-timeout");
	fails(ARGS("--upstream", "http://a:1", "--upstream-timeout", "1m"), NOENV,
	      "--upstream-timeout", "default lease under a longer upstream timeout");
	c = parses(ARGS("--upstream", "http://a:1", "--lease", "10s",
			"--upstream-timeout", "5s"), NOENV, "lease > upstream-timeout");
	config_unref(c);

	c = parse(ARGS("--check-config", ini, "--upstream", "http://a:1"), NOENV, &a);
	ok(c != NULL && a == CONFIG_CHECK, "--check-config gives CHECK (%s)", err);
	if (c) {
		is_str(c->config_file, ini, "check file is the config file");
		is_int(c->ttl_ms, 3600000, "check file was read");
	}
	config_unref(c);
	c = parse(ARGS("--upstream", "http://a:1", "--check-config=/nonexistent.ini"),
		  NOENV, &a);
	ok(c == NULL && strstr(err, "/nonexistent.ini") != NULL,
	   "missing check file named: %s", err);
}

static void test_upstream(void)
{
	static const struct {
		const char *url, *host, *port, *prefix;
	} good[] = {
		{ "http://127.0.0.1:9000", "127.0.0.1", "9000", "" },
		{ "http://backend", "backend", "80", "" },
		{ "http://backend/", "backend", "80", "" },
		{ "http://app.svc.cluster.local:8080/api/v1/", "app.svc.cluster.local",
		  "8080", "/api/v1" },
		{ "http://[::1]:9000/api", "::1", "9000", "/api" },
		{ "http://[::1]", "::1", "80", "" },
		{ "HTTP://h:1//x//", "h", "1", "//x" },
	};
	static const char *const bad[] = {
		"ftp://h", "h:80", "https://", "https://u@h", "http://", "http://:80",
		"http://h:0", "http://h:65536", "http://h:x", "http://::1:80",
		"http://[::1", "http://[nope]:80", "http://h:80?x=1", "http://u@h",
		"http://h/a b", "http://300.1.1.1:80", "http://h:80#f", "",
	};
	struct config *c;
	size_t i;

	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		c = parses(ARGS("--upstream", (char *)good[i].url), NOENV, good[i].url);
		if (c == NULL)
			continue;
		is_str(c->upstream, good[i].url, "upstream kept as given");
		is_str(c->upstream_hp.host, good[i].host, "%s host", good[i].url);
		is_str(c->upstream_hp.port, good[i].port, "%s port", good[i].url);
		is_str(c->upstream_prefix, good[i].prefix, "%s prefix", good[i].url);
		config_unref(c);
	}
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		fails(ARGS("--upstream", (char *)bad[i]), NOENV, "--upstream: ", bad[i]);
	c = parses(ARGS("--upstream", "HTTPS://h/api/"), NOENV, "https");
	if (c != NULL) {
		ok(c->upstream_tls, "https: TLS to the upstream");
		is_str(c->upstream_hp.port, "443", "https: port 443 by default");
		is_str(c->upstream_prefix, "/api", "https: prefix");
		config_unref(c);
	}
	c = parses(ARGS("--upstream", "http://h"), NOENV, "http");
	if (c != NULL) {
		ok(!c->upstream_tls, "http: no TLS to the upstream");
		config_unref(c);
	}
	fails(ARGS("--upstream", "http://h", "--upstream-ca", "/x"), NOENV,
	      "--upstream-ca needs an https:// --upstream", "CA, plain upstream");
	fails(ARGS("--upstream", "https://h", "--upstream-client-cert", "/x"),
	      NOENV, "--upstream-client-key is missing", "client cert alone");
	fails(ARGS("--upstream", "http://h", "--tls-cert", "/x"), NOENV,
	      "--tls-key is missing", "listener cert alone");
	fails(ARGS("--upstream", "http://h", "--tls-key", "/x"), NOENV,
	      "--tls-cert is missing", "listener key alone");
	fails(ARGS("--upstream", "http://h", "--tls-ciphers", "HIGH"), NOENV,
	      "--tls-ciphers needs --tls-cert", "ciphers without a cert");
}

static void test_addresses(void)
{
	static const char *const good[] = {
		"0.0.0.0:80", "[::]:8080", "localhost:0", "127.0.0.1:65535",
		"my-host_1.example:8080", "[fe80::1]:1",
	};
	static const char *const bad[] = {
		":8080", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "::1:80",
		"[::1]", "[::1]8080", "1.2.3:80", "host:-1", "host: 80", "a..b:1",
		"h:123456", "",
	};
	struct config *c;
	size_t i;

	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		c = parses(ARGS("--upstream", "http://u", "--admin-listen",
				(char *)good[i]), NOENV, good[i]);
		config_unref(c);
	}
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		fails(ARGS("--upstream", "http://u", "--listen", (char *)bad[i]),
		      NOENV, "--listen: ", bad[i]);

	c = parses(ARGS("--upstream", "http://u", "--listen", "[::1]:08080"),
		   NOENV, "ipv6 listen");
	if (c) {
		is_str(c->listen_hp.host, "::1", "ipv6 host without brackets");
		is_str(c->listen_hp.port, "8080", "port canonical");
	}
	config_unref(c);

	c = parses(ARGS("--upstream", "http://u", "--redis", "redis://10.0.0.1:6380/2",
			"--store", "postgres://u:secret@db/idem"), NOENV, "redis + pg");
	if (c) {
		is_str(c->redis_hp.host, "10.0.0.1", "redis host");
		is_str(c->redis_hp.port, "6380", "redis port");
		is_int(c->redis_db, 2, "redis db");
		is_str(c->store, "postgres://u:secret@db/idem", "store kept");
	}
	config_unref(c);
	c = parses(ARGS("--upstream", "http://u", "--redis", "redis://cache",
			"--store", "postgresql://db"), NOENV, "redis default port");
	if (c) {
		is_str(c->redis_hp.port, "6379", "redis default port");
		is_int(c->redis_db, 0, "redis default db");
	}
	config_unref(c);
	c = parses(ARGS("--upstream", "http://u", "--redis",
			"redis-sentinel://s1,10.0.0.2:26380,[::1]/mymaster/3",
			"--store", "postgresql://db"), NOENV, "redis sentinel");
	if (c) {
		is_str(c->redis_hp.host, "s1:26379,10.0.0.2:26380,[::1]:26379",
		       "sentinels: canonical list, default port 26379");
		ok(c->redis_hp.port == NULL, "sentinels: no single port");
		is_str(c->redis_master, "mymaster", "sentinel master name");
		is_int(c->redis_db, 3, "sentinel db");
	}
	config_unref(c);
	c = parses(ARGS("--upstream", "http://u", "--redis", "redis://cache",
			"--store", "postgresql://db"), NOENV, "plain redis again");
	ok(c != NULL && c->redis_master == NULL, "redis://: no master");
	config_unref(c);
	fails(ARGS("--upstream", "http://u", "--redis", "redis-sentinel://s1"),
	      NOENV, "--redis: invalid URL", "sentinel without a master");
	fails(ARGS("--upstream", "http://u", "--redis", "redis-sentinel:///m"),
	      NOENV, "--redis: invalid URL", "no sentinel");
	fails(ARGS("--upstream", "http://u", "--redis", "redis-sentinel://s1/m m"),
	      NOENV, "--redis: invalid master name", "bad master name");
	fails(ARGS("--upstream", "http://u", "--redis", "redis-sentinel://s1:0/m"),
	      NOENV, "--redis: invalid port", "bad sentinel port");
	fails(ARGS("--upstream", "http://u", "--redis",
		   "redis-sentinel://a,b,c,d,e,f,g,h,i/m"),
	      NOENV, "--redis: more than 8 sentinels", "too many sentinels");
	fails(ARGS("--upstream", "http://u", "--redis", "redis-sentinel://s/m/x"),
	      NOENV, "--redis: invalid database", "bad sentinel db");
	fails(ARGS("--upstream", "http://u", "--redis", "rediss://c"), NOENV,
	      "--redis: TLS", "rediss refused");
	fails(ARGS("--upstream", "http://u", "--redis", "redis://c/x"), NOENV,
	      "--redis: invalid database", "bad redis db");
	fails(ARGS("--upstream", "http://u", "--redis", "redis://:pw@c"), NOENV,
	      "--redis: ", "redis password refused");
	fails(ARGS("--upstream", "http://u", "--store", "mysql://db"), NOENV,
	      "--store: invalid store \"mysql://db\"", "bad store");
	fails(ARGS("--upstream", "http://u", "--store", "Memory"), NOENV,
	      "--store: ", "store is case-sensitive");
}

static void test_values(void)
{
	struct config *c;

	c = parses(ARGS("--upstream", "http://u", "--methods", "GET, POST,DELETE,M-SEARCH"),
		   NOENV, "methods list");
	if (c) {
		ok(config_method_protected(c, HTTP_GET) &&
		   config_method_protected(c, HTTP_POST) &&
		   config_method_protected(c, HTTP_DELETE) &&
		   config_method_protected(c, HTTP_MSEARCH), "listed methods protected");
		ok(!config_method_protected(c, HTTP_PATCH), "PATCH not listed");
		is_str(c->methods, "GET, POST,DELETE,M-SEARCH", "methods kept as given");
	}
	config_unref(c);
	fails(ARGS("--upstream", "http://u", "--methods", "post"), NOENV,
	      "--methods: unknown HTTP method \"post\"", "methods case-sensitive");
	fails(ARGS("--upstream", "http://u", "--methods="), NOENV,
	      "--methods: empty method list", "empty methods");
	fails(ARGS("--upstream", "http://u", "--methods", "POST,,PUT"), NOENV,
	      "--methods: empty method", "empty item");
	fails(ARGS("--upstream", "http://u", "--methods", "POST,"), NOENV,
	      "--methods: empty method", "trailing comma");
	fails(ARGS("--upstream", "http://u", "--methods", "DESCRIBE"), NOENV,
	      "--methods: unknown HTTP method", "RTSP method refused");

	c = parses(ARGS("--upstream", "http://u", "--require-key"), NOENV, "bool alone");
	if (c)
		ok(c->require_key, "--require-key alone is true");
	config_unref(c);
	c = parses(ARGS("--upstream", "http://u", "--require-key=no"),
		   ENV("IDEMPROXY_REQUIRE_KEY=ON"), "bool =no");
	if (c)
		ok(!c->require_key, "--require-key=no beats env");
	config_unref(c);
	{
		static const char *const yes[] = { "1", "true", "YES", "On", "TRUE" };
		static const char *const no[] = { "0", "false", "No", "OFF" };
		char buf[64];
		size_t i;

		for (i = 0; i < 5; i++) {
			snprintf(buf, sizeof(buf), "IDEMPROXY_REQUIRE_KEY=%s", yes[i]);
			c = parses(ARGS("--upstream", "http://u"), ENV(buf), yes[i]);
			ok(c && c->require_key, "%s is true", yes[i]);
			config_unref(c);
		}
		for (i = 0; i < 4; i++) {
			snprintf(buf, sizeof(buf), "IDEMPROXY_REQUIRE_KEY=%s", no[i]);
			c = parses(ARGS("--upstream", "http://u"), ENV(buf), no[i]);
			ok(c && !c->require_key, "%s is false", no[i]);
			config_unref(c);
		}
	}
	fails(ARGS("--upstream", "http://u"), ENV("IDEMPROXY_REQUIRE_KEY=maybe"),
	      "IDEMPROXY_REQUIRE_KEY: invalid boolean \"maybe\"", "bad boolean");
	c = parses(ARGS("--upstream", "http://u", "--require-key", "no"), NOENV,
		   "bool with a separate value");
	ok(c && !c->require_key, "--require-key no is false");
	config_unref(c);
	c = parses(ARGS("--upstream", "http://u", "--require-key", "--ttl", "5m"),
		   NOENV, "bool followed by a flag");
	ok(c && c->require_key, "--require-key before another flag is true");
	config_unref(c);
	fails(ARGS("--upstream", "http://u", "--require-key", "perhaps"), NOENV,
	      "--require-key: invalid boolean \"perhaps\"", "bad separate value");

	c = parses(ARGS("--upstream=http://u", "--listen=0.0.0.0:80", "--ttl=5m",
			"--in-flight=reject", "--store-down", "fail-open",
			"--on-upstream-error=keep", "--log-level", "debug",
			"--log-format=JSON", "--workers=3", "--max-connections", "5",
			"--key-header", "X-Request-Id", "--drain-timeout", "0s",
			"--max-header-size", "1KiB", "--idle-timeout", "250ms"),
		   NOENV, "--x=y and --x y forms");
	if (c) {
		is_str(c->listen, "0.0.0.0:80", "--listen=");
		is_int(c->ttl_ms, 300000, "--ttl=5m");
		is_int(c->in_flight, IN_FLIGHT_REJECT, "reject");
		is_int(c->store_down, STORE_DOWN_FAIL_OPEN, "fail-open");
		is_int(c->on_upstream_error, UPSTREAM_ERROR_KEEP, "keep");
		is_int(c->log_level, LOG_DEBUG, "debug");
		is_int(c->log_format, LOG_FORMAT_JSON, "json");
		is_int(c->workers, 3, "workers");
		is_int(c->max_connections, 5, "max_connections");
		is_str(c->key_header, "X-Request-Id", "key header");
		is_int(c->drain_timeout_ms, 0, "drain 0s allowed");
		is_int(c->max_header_size, 1024, "header size");
		is_int(c->idle_timeout_ms, 250, "idle 250ms");
	}
	config_unref(c);

	fails(ARGS("--upstream", "http://u", "--ttl", "0s"), NOENV,
	      "--ttl: must be greater than 0", "zero ttl");
	fails(ARGS("--upstream", "http://u", "--client-timeout", "0ms"), NOENV,
	      "--client-timeout: must be greater than 0", "zero timeout");
	fails(ARGS("--upstream", "http://u", "--workers", "0"), NOENV,
	      "--workers: invalid number \"0\" (use 1-256)", "workers 0");
	fails(ARGS("--upstream", "http://u", "--workers", "257"), NOENV,
	      "--workers: ", "workers 257");
	fails(ARGS("--upstream", "http://u", "--workers", "-1"), NOENV,
	      "--workers: ", "workers -1");
	fails(ARGS("--upstream", "http://u", "--key-header", "Idem Key"), NOENV,
	      "--key-header: invalid header name", "bad header name");
	fails(ARGS("--upstream", "http://u", "--key-header="), NOENV,
	      "--key-header: empty value", "empty header name");
	fails(ARGS("--upstream", "http://u", "--in-flight", "queue"), NOENV,
	      "--in-flight: invalid value \"queue\" (use wait or reject)", "bad enum");
	fails(ARGS("--upstream", "http://u", "--log-level", "trace"), NOENV,
	      "--log-level: invalid log level", "bad level");
	fails(ARGS("--upstream", "http://u", "--max-header-size", "100"), NOENV,
	      "--max-header-size: size 100 out of range (1KiB-1MiB)", "header size range");
	fails(ARGS("--upstream", "http://u", "--max-body", "0"), NOENV,
	      "--max-body: ", "zero max body");
	fails(ARGS("--upstream", "http://u", "--ttl", "999999999999h"), NOENV,
	      "--ttl: 999999999999h is too long", "huge ttl");
}

static void test_command_line(void)
{
	enum config_action a;
	struct config *c;

	fails(ARGS("--upstream", "http://u", "--nope"), NOENV,
	      "unknown option --nope", "unknown flag");
	fails(ARGS("--upstream", "http://u", "--nope=1"), NOENV,
	      "unknown option --nope", "unknown flag with =");
	fails(ARGS("--upstream", "http://u", "-x"), NOENV, "unknown option -x",
	      "unknown short flag");
	fails(ARGS("--upstream", "http://u", "serve"), NOENV,
	      "unexpected argument \"serve\"", "positional");
	fails(ARGS("--upstream", "http://u", "--", "x"), NOENV,
	      "unexpected argument \"x\"", "positional after --");
	fails(ARGS("--upstream"), NOENV, "--upstream: missing value", "missing value");
	fails(ARGS("--ttl", "--upstream", "http://u"), NOENV, "--ttl: missing value",
	      "value that looks like a flag");
	fails(ARGS("--upstream", "http://u", "--check-config"), NOENV,
	      "--check-config: missing value", "check-config without file");

	c = parse(ARGS("--help"), NOENV, &a);
	ok(c == NULL && a == CONFIG_HELP, "--help");
	c = parse(ARGS("--ttl", "bogus", "-h"), NOENV, &a);
	ok(c == NULL && a == CONFIG_HELP, "-h wins over errors");
	c = parse(ARGS("--version"), NOENV, &a);
	ok(c == NULL && a == CONFIG_VERSION, "--version");
	c = parse(ARGS("-V"), NOENV, &a);
	ok(c == NULL && a == CONFIG_VERSION, "-V");
	c = parse(ARGS("--upstream", "http://u"), NOENV, &a);
	ok(c != NULL && a == CONFIG_RUN, "run");
	config_unref(c);
	c = parse(ARGS("--upstream", "http://u"), NULL, &a);
	ok(c != NULL, "NULL envp");
	config_unref(c);
}

static void test_ini(void)
{
	char want[512];
	char *p;
	struct config *c;

	p = write_file("good.ini",
		"\xEF\xBB\xBF; idemproxy settings\n"
		"# another comment\n"
		"[idemproxy]\n"
		"upstream = http://app:9000/api ; inline comment\n"
		"  ttl = 5m\n"
		"\tmethods = POST, PUT\n"
		"require_key = yes\r\n"
		"store_down: fail-open\n"
		"[ idemproxy ]   ; again\n"
		"log_format = json\n");
	c = parses(ARGS("--config", p), NOENV, "good ini");
	if (c) {
		is_str(c->upstream, "http://app:9000/api", "inline comment stripped");
		is_str(c->upstream_prefix, "/api", "prefix from file");
		is_int(c->ttl_ms, 300000, "indented key is a key");
		ok(config_method_protected(c, HTTP_PUT) &&
		   !config_method_protected(c, HTTP_PATCH), "methods from file");
		ok(c->require_key, "CRLF line");
		is_int(c->store_down, STORE_DOWN_FAIL_OPEN, "colon separator");
		is_int(c->log_format, LOG_FORMAT_JSON, "section repeated");
	}
	config_unref(c);

#define INI_FAILS(name, text, line, msg) do { \
	p = write_file(name, text); \
	snprintf(want, sizeof(want), "%s:%d: %s", p, line, msg); \
	fails(ARGS("--upstream", "http://u", "--config", (char *)p), NOENV, \
	      want, name); \
} while (0)

	INI_FAILS("unknown-key.ini", "[idemproxy]\nttl = 1h\nttls = 2h\n", 3,
		  "unknown key \"ttls\"");
	INI_FAILS("dash-key.ini", "[idemproxy]\nlog-level = info\n", 2,
		  "unknown key \"log-level\" (keys use underscores");
	INI_FAILS("bad-value.ini", "[idemproxy]\n\n\nttl = 10 s\n", 4,
		  "ttl: invalid duration \"10 s\"");
	INI_FAILS("no-section.ini", "; top\nttl = 1h\n[idemproxy]\n", 2,
		  "ttl: key outside a section");
	INI_FAILS("other-section.ini", "[idemproxy]\nttl = 1h\n[server]\nx = 1\n", 3,
		  "unknown section [server]");
	INI_FAILS("route.ini",
		  "[idemproxy]\nttl = 1h\n\n[route orders]\nmatch = POST /orders*\n"
		  "ttl = 10 s\n", 6, "route orders: ttl: invalid duration");
	INI_FAILS("empty-route.ini", "[idemproxy]\n[route x]\n", 2,
		  "route x: match is required");
	INI_FAILS("syntax.ini", "[idemproxy]\nttl = 1h\njust words\n", 3,
		  "syntax error");
	INI_FAILS("unclosed.ini", "[idemproxy\n", 1, "missing ']'");
	INI_FAILS("junk.ini", "[idemproxy] x\n", 1, "unexpected text after section");
	INI_FAILS("twice.ini", "[idemproxy]\nttl = 1h\nttl = 2h\n", 3,
		  "ttl: set twice (first on line 2)");
	INI_FAILS("config-key.ini", "[idemproxy]\nconfig = other.ini\n", 2,
		  "config: not allowed in a config file");
	INI_FAILS("empty-value.ini", "[idemproxy]\nmax_body =\n", 2,
		  "max_body: invalid size \"\"");
	INI_FAILS("quoted.ini", "[idemproxy]\nlisten = \"0.0.0.0:80\"\n", 2,
		  "listen: invalid");
	{
		char big[400];

		memset(big, 'a', sizeof(big));
		memcpy(big, "[idemproxy]\nkey_header = ", 25);
		big[sizeof(big) - 2] = '\n';
		big[sizeof(big) - 1] = '\0';
		INI_FAILS("long.ini", big, 2, "line too long");
	}
	/* an error before a syntax error is the one reported, and vice versa */
	INI_FAILS("first-error.ini", "[idemproxy]\nwords\nttl = x\n", 2, "syntax error");

	fails(ARGS("--upstream", "http://u", "--config", "/nonexistent/idem.ini"),
	      NOENV, "/nonexistent/idem.ini: cannot open config file",
	      "missing file named");
	fails(ARGS("--upstream", "http://u", "--config", tmpdir), NOENV,
	      "cannot read", "directory as config file");
}

static void test_reload(void)
{
	char *p = write_file("reload.ini",
		"[idemproxy]\nupstream = http://app:9000\nttl = 1h\n"
		"max_body = 4MiB\nlisten = 127.0.0.1:8081\n");
	struct config *c, *n;
	FILE *f;

	c = parses(ARGS("--config", (char *)p, "--lease", "40s"),
		   ENV("IDEMPROXY_MAX_BODY=2MiB", "HOME=/root"), "reload: start");
	if (c == NULL)
		return;
	is_int(c->ttl_ms, 3600000, "reload: file ttl");
	is_int(c->max_body, 2 * 1048576, "reload: env max_body");

	f = fopen(p, "w");
	fputs("[idemproxy]\nupstream = http://app:9000\nttl = 2h\n"
	      "max_body = 8MiB\nlease = 1m\nworkers = 7\n"
	      "listen = 0.0.0.0:9999\nlog_level = error\n", f);
	fclose(f);
	n = config_reload(c, err, sizeof(err));
	ok(n != NULL, "reload: new config (%s)", err);
	if (n != NULL) {
		is_int(n->ttl_ms, 2 * 3600000, "reload: new file ttl");
		is_int(n->max_body, 2 * 1048576, "reload: env still wins");
		is_int(n->lease_ms, 40000, "reload: flag still wins");
		is_int(n->log_level, LOG_ERROR, "reload: log level live");
		is_str(n->listen, "127.0.0.1:8081", "reload: listen kept (restart)");
		is_str(n->listen_hp.port, "8081", "reload: listen port kept");
		is_int(n->workers, c->workers, "reload: workers kept (restart)");
		is_int(n->argc, c->argc, "reload: argv carried");
		is_int(atomic_load(&n->refcount), 1, "reload: fresh refcount");
		config_unref(n);
	}

	f = fopen(p, "w");
	fputs("[idemproxy]\nupstream = http://app:9000\nttl = never\n", f);
	fclose(f);
	n = config_reload(c, err, sizeof(err));
	ok(n == NULL && strstr(err, ":3: ttl: invalid duration") != NULL,
	   "reload: bad file refused: %s", err);

	unlink(p);
	n = config_reload(c, err, sizeof(err));
	ok(n == NULL && strstr(err, "cannot open config file") != NULL,
	   "reload: missing file refused: %s", err);
	config_unref(c);

	/* redis unset at start and set in the file: stays off until restart */
	p = write_file("reload2.ini", "[idemproxy]\nupstream = http://app:9000\n");
	c = parses(ARGS("--config", (char *)p), NOENV, "reload2: start");
	if (c == NULL)
		return;
	f = fopen(p, "w");
	fputs("[idemproxy]\nupstream = http://other:1\nredis = redis://r\n", f);
	fclose(f);
	n = config_reload(c, err, sizeof(err));
	ok(n != NULL && n->redis == NULL && n->redis_hp.host == NULL,
	   "reload: redis stays off");
	ok(n != NULL && strcmp(n->upstream_hp.host, "app") == 0,
	   "reload: upstream kept");
	config_unref(n);
	config_unref(c);

	/* numbers that need a restart keep their running value, 0 included */
	p = write_file("reload3.ini", "[idemproxy]\nupstream = http://app:9000\n"
		       "response_cache = 0\n");
	c = parses(ARGS("--config", (char *)p), NOENV, "reload3: start");
	if (c == NULL)
		return;
	f = fopen(p, "w");
	fputs("[idemproxy]\nupstream = http://app:9000\nresponse_cache = 32MiB\n"
	      "store_connections = 9\n", f);
	fclose(f);
	n = config_reload(c, err, sizeof(err));
	ok(n != NULL && n->response_cache == 0,
	   "reload: response_cache 0 kept (restart)");
	ok(n != NULL && n->store_connections == 4,
	   "reload: store_connections kept (restart)");
	config_unref(n);
	config_unref(c);
}

/* Does config_print(c), or config_usage() for NULL, print want? */
static int printed(struct config *c, const char *want)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	int found;

	if (c != NULL)
		config_print(c, f);
	else
		config_usage(f);
	fclose(f);
	found = strstr(buf, want) != NULL;
	if (!found)
		printf("# output:\n%s", buf);
	free(buf);
	return found;
}

static void test_print(void)
{
	struct config *c = parses(ARGS("--upstream", "http://u:1", "--ttl", "90s",
				       "--store", "postgres://app:s3cret@db:5432/idem"),
				  NOENV, "print: parse");

	if (c == NULL)
		return;
	ok(printed(c, "listen = 127.0.0.1:8080\nupstream = http://u:1\n"),
	   "print: starts in table order");
	ok(printed(c, "\nttl = 90s\n"), "print: duration formatted");
	ok(printed(c, "\nmax_body = 1MiB\n"), "print: size formatted");
	ok(printed(c, "\nmethods = POST,PATCH\n"), "print: methods");
	ok(printed(c, "\nredis = off\n"), "print: redis off");
	ok(printed(c, "\nconfig = none\n"), "print: no config");
	ok(printed(c, "\nrequire_key = no\n"), "print: boolean");
	ok(printed(c, "\nin_flight = wait\n"), "print: enum");
	ok(printed(c, "\nstore_down = fail-closed\n"), "print: enum with dash");
	ok(printed(c, "\nlog_level = info\n"), "print: log level");
	ok(printed(c, "\nmax_header_size = 32KiB\n"), "print: addition");
	ok(printed(c, "\nstore = postgres://app:***@db:5432/idem\n"),
	   "print: password masked");
	config_unref(c);

	ok(printed(NULL, "idemproxy --upstream URL [options]"), "usage line");
	ok(printed(NULL, "idemproxy --check-config FILE"), "usage check line");
	ok(printed(NULL, "idemproxy --version | --help"), "usage version line");
	ok(printed(NULL, "--log-format text|json\n"), "usage metavar");
	ok(printed(NULL, "env IDEMPROXY_LOG_FORMAT, default text\n"), "usage env");
	ok(printed(NULL, "env IDEMPROXY_WORKERS, default number of online CPUs"),
	   "usage workers default");
	ok(printed(NULL, "--require-key[=yes|no]"), "usage bool");
}

/* Every password form libpq accepts is masked (issue 11 item 12). */
static void test_redact(void)
{
	static const struct { const char *in, *out; } cases[] = {
		{ "postgres://app:s3cret@db:5432/idem",
		  "postgres://app:***@db:5432/idem" },
		{ "postgresql://app@db/idem?password=s3cret&sslmode=require",
		  "postgresql://app@db/idem?password=***&sslmode=require" },
		{ "postgres://db/idem?sslmode=disable&password=s3cret",
		  "postgres://db/idem?sslmode=disable&password=***" },
		{ "postgres://u:p%40ss@db/x?password=two",
		  "postgres://u:***@db/x?password=***" },
		{ "host=db password=s3cret dbname=idem",
		  "host=db password=*** dbname=idem" },
		{ "host=db password='s3 \\'cret' dbname=idem",
		  "host=db password=*** dbname=idem" },
		{ "PASSWORD=x host=db", "password=*** host=db" },
		{ "host=db mypassword=x", "host=db mypassword=x" },
		{ "memory", "memory" },
	};
	char out[256];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		config_redact_conninfo(cases[i].in, out, sizeof(out));
		is_str(out, cases[i].out, "redact %zu", i);
		ok(strstr(out, "s3cret") == NULL && strstr(out, "cret'") == NULL,
		   "... no secret left");
	}
}

int main(void)
{
	test_redact();
	if (mkdtemp(tmpdir) == NULL) {
		perror("mkdtemp");
		return 99;
	}
	test_defaults();
	test_precedence();
	test_required_and_lease();
	test_upstream();
	test_addresses();
	test_values();
	test_command_line();
	test_ini();
	test_reload();
	test_print();
	cleanup();
	return tap_done();
}
