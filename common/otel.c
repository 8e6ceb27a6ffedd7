/*
 * otel.c - trace context, samplers, settings and OTLP/JSON (see otel.h).
 *
 * There is no OpenTelemetry SDK for C in Debian (opentelemetry-cpp is not
 * packaged, and would bring protobuf, gRPC and a C++ runtime for what is
 * a few hundred bytes of JSON per request), so the parts of one that a
 * proxy needs are written here against the specifications:
 *
 *   W3C Trace Context level 1     traceparent parsed and formatted
 *   OpenTelemetry SDK env vars    OTEL_* read from the envp given (never
 *                                 getenv: the caller decides the source)
 *   Sampling                      the six built-in samplers' decisions
 *   OTLP/HTTP JSON encoding       opentelemetry-proto's JSON mapping as
 *                                 collectors read it: ids in hex, 64-bit
 *                                 integers and times as decimal strings,
 *                                 enums as numbers, lowerCamelCase keys
 *
 * Spans are written by hand into one growing buffer: a span is encoded on
 * the worker that served the request, for every sampled request, and a
 * document builder (json-c) would allocate a node per field only to print
 * them in the same order. The strings are escaped as JSON requires and
 * invalid UTF-8 is replaced by U+FFFD, so that one bad header value cannot
 * make a collector refuse the batch it travels in.
 */
#include "otel.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include "hex.h"
#include "hostport.h"
#include "setting.h"
#include "utf8.h"

/* ---- trace context ---------------------------------------------------- */

static int lhex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;	/* upper case too: W3C's HEXDIGLC */
}

/* 2n lowercase hex digits at s into out[n]; false on any other byte. */
static bool lhex_bytes(const char *s, size_t n, uint8_t *out)
{
	for (size_t i = 0; i < n; i++) {
		int hi = lhex(s[2 * i]), lo = lhex(s[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return false;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return true;
}

static bool all_zero(const uint8_t *b, size_t n)
{
	uint8_t acc = 0;

	for (size_t i = 0; i < n; i++)
		acc |= b[i];
	return acc == 0;
}

static bool is_ows(char c)
{
	return c == ' ' || c == '\t';
}

int otel_parse_traceparent(const char *v, size_t len, struct otel_parent *out)
{
	uint8_t version, flags;

	memset(out, 0, sizeof(*out));
	while (len > 0 && is_ows(v[0])) {
		v++;
		len--;
	}
	while (len > 0 && is_ows(v[len - 1]))
		len--;
	if (len < OTEL_TRACEPARENT_LEN || !lhex_bytes(v, 1, &version) ||
	    version == 0xff)
		goto fail;
	/* version 00 is exactly 55 bytes; a later version may add fields
	 * after a '-', and its first 55 bytes are read as version 00's */
	if (version == 0 ? len != OTEL_TRACEPARENT_LEN :
	    len > OTEL_TRACEPARENT_LEN && v[OTEL_TRACEPARENT_LEN] != '-')
		goto fail;
	if (v[2] != '-' || v[35] != '-' || v[52] != '-' ||
	    !lhex_bytes(v + 3, OTEL_TRACE_ID_LEN, out->trace_id) ||
	    !lhex_bytes(v + 36, OTEL_SPAN_ID_LEN, out->span_id) ||
	    !lhex_bytes(v + 53, 1, &flags) ||
	    all_zero(out->trace_id, OTEL_TRACE_ID_LEN) ||
	    all_zero(out->span_id, OTEL_SPAN_ID_LEN))
		goto fail;
	out->sampled = flags & 1;
	out->valid = true;
	return 0;
fail:
	memset(out, 0, sizeof(*out));
	return -1;
}

/* Every byte's two hex digits: one copy per byte (ids are made for every
 * request: its request id, its trace). */
#define HEX2(b) "0123456789abcdef"[(b) >> 4], "0123456789abcdef"[(b) & 15]
#define HEX2_4(b) HEX2(b), HEX2((b) + 1), HEX2((b) + 2), HEX2((b) + 3)
#define HEX2_16(b) HEX2_4(b), HEX2_4((b) + 4), HEX2_4((b) + 8), HEX2_4((b) + 12)
#define HEX2_64(b) HEX2_16(b), HEX2_16((b) + 16), HEX2_16((b) + 32), HEX2_16((b) + 48)
static const char hex_pairs[512] = {
	HEX2_64(0), HEX2_64(64), HEX2_64(128), HEX2_64(192),
};

void otel_hex(const uint8_t *id, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		memcpy(out + 2 * i, hex_pairs + 2 * id[i], 2);
	out[2 * n] = '\0';
}

void otel_format_traceparent(const uint8_t trace_id[OTEL_TRACE_ID_LEN],
			     const uint8_t span_id[OTEL_SPAN_ID_LEN],
			     bool sampled, char *out)
{
	memcpy(out, "00-", 3);
	otel_hex(trace_id, OTEL_TRACE_ID_LEN, out + 3);
	out[35] = '-';
	otel_hex(span_id, OTEL_SPAN_ID_LEN, out + 36);
	out[52] = '-';
	out[53] = '0';
	out[54] = sampled ? '1' : '0';
	out[55] = '\0';
}

/* ---- ids ---------------------------------------------------------------- */

/*
 * xoshiro256** (Blackman and Vigna), one state per thread, seeded from
 * getrandom() the first time the thread draws an id. Ids need to be unique
 * and unpredictable enough that two proxies never collide, not secret; the
 * kernel is asked once per thread, not once per request.
 */
struct rng {
	uint64_t s[4];
	bool seeded;
};

static __thread struct rng rng;

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* splitmix64: spreads a weak seed over the state when getrandom fails. */
static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static void rng_seed(struct rng *r)
{
	unsigned char *p = (unsigned char *)r->s;
	size_t got = 0;

	while (got < sizeof(r->s)) {
		ssize_t n = getrandom(p + got, sizeof(r->s) - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (got < sizeof(r->s)) {
		/* no getrandom (an old kernel, a seccomp filter): the time and
		 * this thread's address, which differ between threads */
		struct timespec ts;
		uint64_t x;

		clock_gettime(CLOCK_REALTIME, &ts);
		x = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
		x ^= (uint64_t)(uintptr_t)r;
		for (int i = 0; i < 4; i++)
			r->s[i] = splitmix(&x);
	}
	if (r->s[0] == 0 && r->s[1] == 0 && r->s[2] == 0 && r->s[3] == 0)
		r->s[0] = 1;	/* the one state xoshiro cannot leave */
	r->seeded = true;
}

static uint64_t rng_next(void)
{
	struct rng *r = &rng;
	uint64_t *s = r->s, result, t;

	if (!r->seeded)
		rng_seed(r);
	result = rotl(s[1] * 5, 7) * 9;
	t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

/* n (a multiple of 8) random bytes, not all zero. */
static void new_id(uint8_t *id, size_t n)
{
	do {
		for (size_t i = 0; i < n; i += 8) {
			uint64_t x = rng_next();

			memcpy(id + i, &x, 8);
		}
	} while (all_zero(id, n));
}

void otel_new_trace_id(uint8_t id[OTEL_TRACE_ID_LEN])
{
	new_id(id, OTEL_TRACE_ID_LEN);
}

void otel_new_span_id(uint8_t id[OTEL_SPAN_ID_LEN])
{
	new_id(id, OTEL_SPAN_ID_LEN);
}

/* ---- settings ------------------------------------------------------------ */

/* Where a setting's value came from, for its error message. */
struct src {
	const char *v;		/* NULL: set nowhere (an empty value is unset) */
	const char *name;	/* the variable's name */
	bool flag;		/* given in opts[] rather than in envp */
};

static const char *env_get(char **envp, const char *name)
{
	size_t n = strlen(name);

	for (char **e = envp; e != NULL && *e != NULL; e++)
		if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
			return (*e)[n + 1] != '\0' ? *e + n + 1 : NULL;
	return NULL;
}

/* The flag's value (named as fallback, or var), else var, else fallback
 * in envp: the signal-specific variable beats the general one. */
static struct src lookup(const char *flag, char **envp, const char *var,
			 const char *fallback)
{
	struct src s = { .name = var };

	if (flag != NULL && flag[0] != '\0') {
		s.v = flag;
		s.flag = true;
		if (fallback != NULL)
			s.name = fallback;
	} else if ((s.v = env_get(envp, var)) == NULL && fallback != NULL) {
		s.v = env_get(envp, fallback);
		s.name = fallback;
	}
	return s;
}

/* The flag that stands for a variable (config.c's otel-* options). */
static const char *flag_of(const char *var)
{
	static const char *const map[][2] = {
		{ "OTEL_EXPORTER_OTLP_ENDPOINT", "--otel-endpoint" },
		{ "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "--otel-traces-endpoint" },
		{ "OTEL_EXPORTER_OTLP_HEADERS", "--otel-headers" },
		{ "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "--otel-headers" },
		{ "OTEL_SERVICE_NAME", "--otel-service-name" },
		{ "OTEL_RESOURCE_ATTRIBUTES", "--otel-resource-attributes" },
		{ "OTEL_TRACES_SAMPLER", "--otel-traces-sampler" },
		{ "OTEL_TRACES_SAMPLER_ARG", "--otel-traces-sampler-arg" },
		{ "OTEL_SDK_DISABLED", "--otel-sdk-disabled" },
	};

	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (strcmp(map[i][0], var) == 0)
			return map[i][1];
	return var;
}

/* "NAME", or the flag that set it, the prefix of a setting's error. */
static const char *src_name(const struct src *s, char *buf, size_t len)
{
	snprintf(buf, len, "%s", s->flag ? flag_of(s->name) : s->name);
	return buf;
}

__attribute__((format(printf, 4, 5)))
static int src_error(const struct src *s, char *err, size_t errlen,
		     const char *fmt, ...)
{
	char name[64], msg[192], sh[80];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	snprintf(err, errlen, "%s: %s (\"%s\")", src_name(s, name, sizeof(name)),
		 msg, setting_shown(s->v, sh, sizeof(sh)));
	return -1;
}

static void pairs_free(struct otel_pair *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(p[i].name);
		free(p[i].value);
	}
	free(p);
}

/* [s, s + n) without OWS around it, percent-decoded into a new string
 * (*out); -1 on a bad escape or %00 (*out NULL), or out of memory (*oom). */
static int pct_decode(const char *s, size_t n, char **out, bool *oom)
{
	char *o;

	while (n > 0 && is_ows(s[0])) {
		s++;
		n--;
	}
	while (n > 0 && is_ows(s[n - 1]))
		n--;
	o = *out = malloc(n + 1);
	if (o == NULL) {
		*oom = true;
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		int hi, lo;

		if (s[i] != '%') {
			*o++ = s[i];
			continue;
		}
		if (n - i < 3)
			goto bad;
		hi = hex_digit(s[i + 1]);
		lo = hex_digit(s[i + 2]);
		if (hi < 0 || lo < 0 || (hi | lo) == 0)
			goto bad;
		*o++ = (char)(hi << 4 | lo);
		i += 2;
	}
	*o = '\0';
	return 0;
bad:
	free(*out);
	*out = NULL;
	return -1;
}

/* An HTTP token (RFC 9110 §5.6.2), for a header's name. */
static bool is_token(const char *s)
{
	if (*s == '\0')
		return false;
	for (; *s != '\0'; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || strchr("!#$%&'*+-.^_`|~", *s)))
			return false;
	return true;
}

/* A field value: visible bytes, spaces and tabs; no CR, LF or NUL that
 * would end the line early. */
static bool is_field_value(const char *s)
{
	for (; *s != '\0'; s++)
		if (((unsigned char)*s < 0x20 && *s != '\t') || *s == 0x7f)
			return false;
	return true;
}

/* The headers the exporter writes itself; one given again would make a
 * request the collector reads differently from what we meant. */
static bool is_framing_header(const char *name)
{
	static const char *const names[] = {
		"host", "content-length", "content-type", "connection",
		"transfer-encoding", "te", "upgrade", "keep-alive", "expect",
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcasecmp(name, names[i]) == 0)
			return true;
	return false;
}

/*
 * "k=v,k2=v2" (OTEL_EXPORTER_OTLP_HEADERS, OTEL_RESOURCE_ATTRIBUTES: the
 * W3C baggage syntax without properties): items trimmed, keys and values
 * percent-decoded, empty items skipped, a key given twice keeps its last
 * value. headers: names must be HTTP tokens and not framing headers,
 * values field values.
 */
static int pairs_parse(const struct src *src, bool headers,
		       struct otel_pair **out, size_t *nout, char *err,
		       size_t errlen)
{
	struct otel_pair *p = NULL;
	size_t n = 0, cap = 0;
	const char *item = src->v;
	bool oom = false;

	for (;;) {
		const char *end = strchr(item, ','), *eq;
		size_t ilen = end ? (size_t)(end - item) : strlen(item), k;
		char *name = NULL, *value = NULL;

		if (strspn(item, " \t") >= ilen)
			goto next;	/* an empty item: "a=1,,b=2", "a=1," */
		eq = memchr(item, '=', ilen);
		if (eq == NULL) {
			src_error(src, err, errlen, "an item without '=' (expected "
				  "key=value,key2=value2)");
			goto fail;
		}
		if (pct_decode(item, (size_t)(eq - item), &name, &oom) < 0 ||
		    pct_decode(eq + 1, ilen - (size_t)(eq - item) - 1, &value,
			       &oom) < 0) {
			free(name);
			if (oom)
				goto nomem;
			src_error(src, err, errlen, "a bad percent escape "
				  "(%%XX, not %%00)");
			goto fail;
		}
		if (name[0] == '\0' ||
		    (headers && (!is_token(name) || !is_field_value(value) ||
				 is_framing_header(name)))) {
			src_error(src, err, errlen, name[0] == '\0' ? "an empty key" :
				  !is_token(name) ? "a header name that is not a token" :
				  is_framing_header(name) ? "a header the exporter "
				  "sets itself" : "a control character in a value");
			free(name);
			free(value);
			goto fail;
		}
		for (k = 0; k < n; k++)
			if (headers ? strcasecmp(p[k].name, name) == 0 :
			    strcmp(p[k].name, name) == 0)
				break;
		if (k < n) {
			free(p[k].value);
			p[k].value = value;
			free(name);
			goto next;
		}
		if (n == cap) {
			struct otel_pair *np = realloc(p, (cap ? cap * 2 : 4) *
						       sizeof(*p));

			if (np == NULL) {
				free(name);
				free(value);
				goto nomem;
			}
			p = np;
			cap = cap ? cap * 2 : 4;
		}
		p[n].name = name;
		p[n].value = value;
		n++;
next:
		if (end == NULL)
			break;
		item = end + 1;
	}
	pairs_free(*out, *nout);
	*out = p;
	*nout = n;
	return 0;
nomem:
	snprintf(err, errlen, "out of memory");
fail:
	pairs_free(p, n);
	return -1;
}

/* An OTLP/HTTP URL: http[s]://HOST[:PORT][/PATH], as hostport checks the
 * upstream's (no user info, query or fragment). */
static int check_url(const struct src *src, char *err, size_t errlen)
{
	struct hostport hp = { 0 };
	char *prefix = NULL, why[160];
	bool tls;
	int rc;

	rc = hostport_parse_http_url(src->v, &hp, &prefix, &tls, why,
				     sizeof(why));
	if (rc < 0) {
		char name[64];

		snprintf(err, errlen, "%s: %s", src_name(src, name, sizeof(name)),
			 why);
	}
	hostport_clear(&hp);
	free(prefix);
	return rc;
}

/*
 * The endpoint: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is the URL as is;
 * OTEL_EXPORTER_OTLP_ENDPOINT is a base URL, "/v1/traces" joined to it
 * (one '/' between them, the base's trailing '/' not doubled). Flags
 * before variables; the signal's own setting before the general one.
 */
static int resolve_endpoint(struct otel_settings *s,
			    const char *const opts[OTEL_OPT_COUNT], char **envp,
			    char *err, size_t errlen)
{
	static const char traces[] = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
			  base[] = "OTEL_EXPORTER_OTLP_ENDPOINT",
			  path[] = "/v1/traces";
	const char *ft = opts ? opts[OTEL_OPT_TRACES_ENDPOINT] : NULL,
		   *fb = opts ? opts[OTEL_OPT_ENDPOINT] : NULL;
	struct src src = { 0 };
	bool as_is = true;
	size_t n;

	if (ft != NULL && ft[0] != '\0')
		src = (struct src){ ft, traces, true };
	else if (fb != NULL && fb[0] != '\0')
		src = (struct src){ fb, base, true };
	else if ((src.v = env_get(envp, traces)) != NULL)
		src.name = traces;
	else if ((src.v = env_get(envp, base)) != NULL)
		src.name = base;
	if (src.v == NULL)
		return 0;
	as_is = src.name == traces;
	if (check_url(&src, err, errlen) < 0)
		return -1;
	n = strlen(src.v);
	if (!as_is && src.v[n - 1] == '/')
		n--;
	s->endpoint = malloc(n + sizeof(path));
	if (s->endpoint == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	memcpy(s->endpoint, src.v, n);
	if (as_is)
		s->endpoint[n] = '\0';
	else
		memcpy(s->endpoint + n, path, sizeof(path));
	return 0;
}

static const struct {
	const char *name;
	enum otel_sampler sampler;
} samplers[] = {
	{ "always_on", OTEL_SAMPLER_ALWAYS_ON },
	{ "always_off", OTEL_SAMPLER_ALWAYS_OFF },
	{ "traceidratio", OTEL_SAMPLER_TRACEIDRATIO },
	{ "parentbased_always_on", OTEL_SAMPLER_PARENT_ALWAYS_ON },
	{ "parentbased_always_off", OTEL_SAMPLER_PARENT_ALWAYS_OFF },
	{ "parentbased_traceidratio", OTEL_SAMPLER_PARENT_TRACEIDRATIO },
};

static int resolve_sampler(struct otel_settings *s,
			   const char *const opts[OTEL_OPT_COUNT], char **envp,
			   char *err, size_t errlen)
{
	struct src src = lookup(opts ? opts[OTEL_OPT_SAMPLER] : NULL, envp,
				"OTEL_TRACES_SAMPLER", NULL);
	size_t i;
	char *end;

	if (src.v != NULL) {
		for (i = 0; i < sizeof(samplers) / sizeof(samplers[0]); i++)
			if (strcasecmp(src.v, samplers[i].name) == 0)
				break;
		if (i == sizeof(samplers) / sizeof(samplers[0]))
			return src_error(&src, err, errlen, "unsupported sampler "
					 "(use always_on, always_off, traceidratio, "
					 "parentbased_always_on, "
					 "parentbased_always_off or "
					 "parentbased_traceidratio)");
		s->sampler = samplers[i].sampler;
	}
	if (s->sampler != OTEL_SAMPLER_TRACEIDRATIO &&
	    s->sampler != OTEL_SAMPLER_PARENT_TRACEIDRATIO)
		return 0;	/* the argument means nothing to the others */
	src = lookup(opts ? opts[OTEL_OPT_SAMPLER_ARG] : NULL, envp,
		     "OTEL_TRACES_SAMPLER_ARG", NULL);
	if (src.v == NULL)
		return 0;
	errno = 0;
	s->ratio = strtod(src.v, &end);
	if (errno != 0 || end == src.v || *end != '\0' ||
	    !(s->ratio >= 0.0 && s->ratio <= 1.0))
		return src_error(&src, err, errlen, "expected a ratio from 0 to 1");
	return 0;
}

/* The millisecond and count settings: variable, fallback, field, bounds. */
static const struct {
	const char *var, *fallback;
	size_t off;
	uint64_t min, max;
	const char *what;
} numbers[] = {
	{ "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT",
	  offsetof(struct otel_settings, timeout_ms), 1, 3600000,
	  "milliseconds, 1-3600000" },
	{ "OTEL_BSP_SCHEDULE_DELAY", NULL,
	  offsetof(struct otel_settings, schedule_delay_ms), 1, 3600000,
	  "milliseconds, 1-3600000" },
	{ "OTEL_BSP_MAX_QUEUE_SIZE", NULL,
	  offsetof(struct otel_settings, max_queue), 1, 16777216,
	  "spans, 1-16777216" },
	{ "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", NULL,
	  offsetof(struct otel_settings, max_batch), 1, 16777216,
	  "spans, 1-16777216" },
};

static int resolve_numbers(struct otel_settings *s, char **envp, char *err,
			   size_t errlen)
{
	bool batch_given = false;

	for (size_t i = 0; i < sizeof(numbers) / sizeof(numbers[0]); i++) {
		struct src src = lookup(NULL, envp, numbers[i].var,
					numbers[i].fallback);
		uint64_t v;

		if (src.v == NULL)
			continue;
		if (setting_parse_uint(src.v, numbers[i].max, &v) < 0 ||
		    v < numbers[i].min)
			return src_error(&src, err, errlen, "expected %s",
					 numbers[i].what);
		*(uint64_t *)(void *)((char *)s + numbers[i].off) = v;
		if (numbers[i].off == offsetof(struct otel_settings, max_batch))
			batch_given = true;
	}
	if (s->max_batch > s->max_queue) {
		if (batch_given) {
			snprintf(err, errlen, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE: %llu "
				 "is more than OTEL_BSP_MAX_QUEUE_SIZE (%llu)",
				 (unsigned long long)s->max_batch,
				 (unsigned long long)s->max_queue);
			return -1;
		}
		s->max_batch = s->max_queue;	/* the default shrinks to fit */
	}
	return 0;
}

/* OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER, the protocol: is anything sent,
 * and how. */
static int resolve_switches(const char *const opts[OTEL_OPT_COUNT],
			    char **envp, bool *off, const char **warn, char *err,
			    size_t errlen)
{
	struct src src = lookup(opts ? opts[OTEL_OPT_DISABLED] : NULL, envp,
				"OTEL_SDK_DISABLED", NULL);

	if (src.v != NULL) {
		if (strcasecmp(src.v, "true") == 0)
			*off = true;
		else if (strcasecmp(src.v, "false") != 0)
			return src_error(&src, err, errlen, "expected true or false");
	}
	src = lookup(NULL, envp, "OTEL_TRACES_EXPORTER", NULL);
	if (src.v != NULL) {
		if (strcasecmp(src.v, "none") == 0)
			*off = true;
		else if (strcasecmp(src.v, "otlp") != 0)
			return src_error(&src, err, errlen, "unsupported exporter "
					 "(use otlp or none)");
	}
	src = lookup(NULL, envp, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		     "OTEL_EXPORTER_OTLP_PROTOCOL");
	if (src.v == NULL || strcasecmp(src.v, "http/json") == 0)
		return 0;
	if (strcasecmp(src.v, "http/protobuf") == 0) {
		*warn = "OTLP over http/protobuf is not supported; spans are "
			"sent as http/json (every OTLP/HTTP receiver accepts both)";
		return 0;
	}
	if (strcasecmp(src.v, "grpc") == 0)
		return src_error(&src, err, errlen, "OTLP over gRPC is not "
				 "supported (use http/json, the collector's OTLP/HTTP "
				 "port, 4318 by default)");
	return src_error(&src, err, errlen, "unknown protocol (use http/json)");
}

int otel_settings_resolve(struct otel_settings *out,
			  const char *const opts[OTEL_OPT_COUNT], char **envp,
			  const char **warn, char *err, size_t errlen)
{
	struct otel_settings s = {
		.sampler = OTEL_SAMPLER_PARENT_ALWAYS_ON,
		.ratio = 1.0,
		.timeout_ms = 10000,
		.schedule_delay_ms = 5000,
		.max_queue = 2048,
		.max_batch = 512,
	};
	const char *name = NULL;
	struct src src;
	bool off = false;

	*warn = NULL;
	if (resolve_endpoint(&s, opts, envp, err, errlen) < 0 ||
	    resolve_switches(opts, envp, &off, warn, err, errlen) < 0 ||
	    resolve_sampler(&s, opts, envp, err, errlen) < 0 ||
	    resolve_numbers(&s, envp, err, errlen) < 0)
		goto fail;
	src = lookup(opts ? opts[OTEL_OPT_HEADERS] : NULL, envp,
		     "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS");
	if (src.v != NULL &&
	    pairs_parse(&src, true, &s.headers, &s.nheaders, err, errlen) < 0)
		goto fail;
	src = lookup(opts ? opts[OTEL_OPT_RESOURCE_ATTRIBUTES] : NULL, envp,
		     "OTEL_RESOURCE_ATTRIBUTES", NULL);
	if (src.v != NULL &&
	    pairs_parse(&src, false, &s.resource, &s.nresource, err, errlen) < 0)
		goto fail;
	src = lookup(opts ? opts[OTEL_OPT_SERVICE_NAME] : NULL, envp,
		     "OTEL_SERVICE_NAME", NULL);
	name = src.v;
	for (size_t i = 0; name == NULL && i < s.nresource; i++)
		if (strcmp(s.resource[i].name, "service.name") == 0)
			name = s.resource[i].value;
	src = lookup(NULL, envp, "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
		     "OTEL_EXPORTER_OTLP_CERTIFICATE");
	if ((s.service_name = strdup(name ? name : "idemproxy")) == NULL ||
	    (src.v != NULL && (s.ca_file = strdup(src.v)) == NULL)) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	s.enabled = s.endpoint != NULL && !off;
	*out = s;
	return 0;
fail:
	*warn = NULL;
	otel_settings_free(&s);
	memset(out, 0, sizeof(*out));
	return -1;
}

void otel_settings_free(struct otel_settings *s)
{
	free(s->endpoint);
	pairs_free(s->headers, s->nheaders);
	free(s->service_name);
	pairs_free(s->resource, s->nresource);
	free(s->ca_file);
	memset(s, 0, sizeof(*s));
}

/* ---- sampling ------------------------------------------------------------ */

/*
 * TraceIdRatioBased: the trace id's lower 8 bytes, big-endian, below
 * ratio * 2^64. Every service that samples by the same ratio keeps the
 * same traces, whoever started them.
 */
static bool ratio_sample(double ratio, const uint8_t trace_id[OTEL_TRACE_ID_LEN])
{
	uint64_t x = 0;

	if (ratio >= 1.0)
		return true;
	if (!(ratio > 0.0))
		return false;
	for (int i = 8; i < OTEL_TRACE_ID_LEN; i++)
		x = x << 8 | trace_id[i];
	/* ratio < 1, so the product is below 2^64 and fits */
	return x < (uint64_t)(ratio * 18446744073709551616.0);
}

bool otel_sample(const struct otel_settings *s, const struct otel_parent *parent,
		 const uint8_t trace_id[OTEL_TRACE_ID_LEN])
{
	bool has_parent = parent != NULL && parent->valid;

	switch (s->sampler) {
	case OTEL_SAMPLER_ALWAYS_ON:
		return true;
	case OTEL_SAMPLER_ALWAYS_OFF:
		return false;
	case OTEL_SAMPLER_TRACEIDRATIO:
		return ratio_sample(s->ratio, trace_id);
	case OTEL_SAMPLER_PARENT_ALWAYS_ON:
		return has_parent ? parent->sampled : true;
	case OTEL_SAMPLER_PARENT_ALWAYS_OFF:
		return has_parent ? parent->sampled : false;
	case OTEL_SAMPLER_PARENT_TRACEIDRATIO:
		return has_parent ? parent->sampled :
		       ratio_sample(s->ratio, trace_id);
	}
	return false;
}

/* ---- OTLP/JSON ------------------------------------------------------------ */

/* The caller's growing buffer; oom once a reservation failed (what
 * follows is skipped, and the caller rolls back). */
struct jbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

/* The slow path of jb_room: grow by doubling. */
static bool jb_grow(struct jbuf *b, size_t n)
{
	size_t cap;
	char *p;

	if (b->oom)
		return false;
	cap = b->cap ? b->cap : 512;
	while (cap - b->len < n)
		cap *= 2;
	p = realloc(b->p, cap);
	if (p == NULL) {
		b->oom = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

/* Room for n more bytes; false once out of memory. */
static inline bool jb_room(struct jbuf *b, size_t n)
{
	return (!b->oom && b->cap - b->len >= n) || jb_grow(b, n);
}

static inline void jb_put(struct jbuf *b, const char *s, size_t n)
{
	if (!jb_room(b, n))
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

/* a literal: its length known, its copy inlined */
#define JB_LIT(b, lit) jb_put((b), (lit), sizeof(lit) - 1)

/* A byte JSON takes as it is: printable ASCII but '"' and '\\'. */
static inline bool json_plain(unsigned c)
{
	return c - 0x20u < 0x60u && c != '"' && c != '\\';
}

/* c's escape into e (at most 6 bytes); its length. */
static size_t json_escape(unsigned c, char *e)
{
	static const char hexd[] = "0123456789abcdef";

	e[0] = '\\';
	switch (c) {
	case '"':
	case '\\':
		e[1] = (char)c;
		return 2;
	case '\n':
		e[1] = 'n';
		return 2;
	case '\r':
		e[1] = 'r';
		return 2;
	case '\t':
		e[1] = 't';
		return 2;
	}
	if (c < 0x20) {
		memcpy(e + 1, "u00", 3);
		e[4] = hexd[c >> 4];
		e[5] = hexd[c & 15];
	} else {
		memcpy(e + 1, "ufffd", 5);	/* a byte that is not UTF-8 */
	}
	return 6;
}

/*
 * str as a JSON string, quotes included: runs of bytes JSON takes as they
 * are copied at once, '"', '\\' and control bytes escaped, bytes that are
 * not UTF-8 written as U+FFFD. Room is made once for the common case (no
 * escape), and again at each escape for the rest and 6 more.
 */
static void jb_str(struct jbuf *b, const char *str)
{
	const unsigned char *s = (const unsigned char *)(str ? str : "");
	size_t n = strlen((const char *)s), run = 0, seq;

	if (!jb_room(b, n + 2))
		return;
	b->p[b->len++] = '"';
	while (run < n) {
		unsigned c = s[run];

		if (json_plain(c)) {
			run++;
			continue;
		}
		if (c >= 0x80 && (seq = utf8_len(s + run, n - run)) > 0) {
			run += seq;
			continue;
		}
		if (!jb_room(b, n + 7))
			return;
		memcpy(b->p + b->len, s, run);
		b->len += run;
		b->len += json_escape(c, b->p + b->len);
		s += run + 1;
		n -= run + 1;
		run = 0;
	}
	memcpy(b->p + b->len, s, run);
	b->len += run;
	b->p[b->len++] = '"';
}

/* v in decimal, in quotes when quoted (int64 and fixed64 in proto3 JSON). */
static void jb_u64(struct jbuf *b, uint64_t v, bool neg, bool quoted)
{
	char t[24];
	size_t i = sizeof(t);

	if (quoted)
		t[--i] = '"';
	do {
		t[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v != 0);
	if (neg)
		t[--i] = '-';
	if (quoted)
		t[--i] = '"';
	jb_put(b, t + i, sizeof(t) - i);
}

/* An id as a quoted hex string. */
static void jb_hex(struct jbuf *b, const uint8_t *id, size_t n)
{
	static const char digits[] = "0123456789abcdef";
	char *o;

	if (!jb_room(b, 2 * n + 2))
		return;
	o = b->p + b->len;
	*o++ = '"';
	for (size_t i = 0; i < n; i++) {
		*o++ = digits[id[i] >> 4];
		*o++ = digits[id[i] & 15];
	}
	*o = '"';
	b->len += 2 * n + 2;
}

/* A double as proto3 JSON has it: the shortest text strtod reads back,
 * and the non-finite ones as their strings. */
static void jb_double(struct jbuf *b, double d)
{
	char t[32];
	int n;

	if (isnan(d)) {
		JB_LIT(b, "\"NaN\"");
		return;
	}
	if (isinf(d)) {
		if (d > 0)
			JB_LIT(b, "\"Infinity\"");
		else
			JB_LIT(b, "\"-Infinity\"");
		return;
	}
	n = snprintf(t, sizeof(t), "%.15g", d);
	if (strtod(t, NULL) != d)
		n = snprintf(t, sizeof(t), "%.17g", d);
	jb_put(b, t, (size_t)n);
}

/* ,"attributes":[...] when at least one attribute has a value; a string
 * attribute whose value is NULL is left out. */
static void jb_attrs(struct jbuf *b, const struct otel_attr *a, size_t n)
{
	bool any = false;

	for (size_t i = 0; i < n; i++) {
		if (a[i].type == OTEL_ATTR_STRING && a[i].s == NULL)
			continue;
		if (any)
			JB_LIT(b, ",");
		else
			JB_LIT(b, ",\"attributes\":[");
		any = true;
		JB_LIT(b, "{\"key\":");
		jb_str(b, a[i].key);
		switch (a[i].type) {
		case OTEL_ATTR_STRING:
			JB_LIT(b, ",\"value\":{\"stringValue\":");
			jb_str(b, a[i].s);
			break;
		case OTEL_ATTR_INT:
			JB_LIT(b, ",\"value\":{\"intValue\":");
			jb_u64(b, a[i].i < 0 ? 0 - (uint64_t)a[i].i : (uint64_t)a[i].i,
			       a[i].i < 0, true);
			break;
		case OTEL_ATTR_BOOL:
			if (a[i].b)
				JB_LIT(b, ",\"value\":{\"boolValue\":true");
			else
				JB_LIT(b, ",\"value\":{\"boolValue\":false");
			break;
		case OTEL_ATTR_DOUBLE:
			JB_LIT(b, ",\"value\":{\"doubleValue\":");
			jb_double(b, a[i].d);
			break;
		}
		JB_LIT(b, "}}");
	}
	if (any)
		JB_LIT(b, "]");
}

/*
 * Span flags (opentelemetry-proto SpanFlags): the W3C trace flags in the
 * low byte. Bits 8 and 9 (whether the parent was remote) are left clear,
 * which means "not known": the span does not say where its parent ran.
 */
int otel_encode_span(const uint8_t trace_id[OTEL_TRACE_ID_LEN],
		     const struct otel_span *sp, char **buf, size_t *len,
		     size_t *cap)
{
	struct jbuf b = { *buf, *len, *cap, false };

	/* one reservation for the fixed part; strings grow it if needed */
	if (!jb_room(&b, 384))
		goto fail;
	JB_LIT(&b, "{\"traceId\":");
	jb_hex(&b, trace_id, OTEL_TRACE_ID_LEN);
	JB_LIT(&b, ",\"spanId\":");
	jb_hex(&b, sp->span_id, OTEL_SPAN_ID_LEN);
	if (!all_zero(sp->parent_id, OTEL_SPAN_ID_LEN)) {
		JB_LIT(&b, ",\"parentSpanId\":");
		jb_hex(&b, sp->parent_id, OTEL_SPAN_ID_LEN);
	}
	if (sp->tracestate != NULL && sp->tracestate[0] != '\0') {
		JB_LIT(&b, ",\"traceState\":");
		jb_str(&b, sp->tracestate);
	}
	JB_LIT(&b, ",\"name\":");
	jb_str(&b, sp->name);
	JB_LIT(&b, ",\"kind\":");
	jb_u64(&b, (uint64_t)sp->kind, false, false);
	JB_LIT(&b, ",\"startTimeUnixNano\":");
	jb_u64(&b, sp->start_ns, false, true);
	JB_LIT(&b, ",\"endTimeUnixNano\":");
	jb_u64(&b, sp->end_ns, false, true);
	jb_attrs(&b, sp->attrs, sp->nattrs);
	for (size_t i = 0; i < sp->nevents; i++) {
		const struct otel_event *e = &sp->events[i];

		if (i == 0)
			JB_LIT(&b, ",\"events\":[");
		else
			JB_LIT(&b, ",");
		JB_LIT(&b, "{\"timeUnixNano\":");
		jb_u64(&b, e->time_ns, false, true);
		JB_LIT(&b, ",\"name\":");
		jb_str(&b, e->name);
		jb_attrs(&b, e->attrs, e->nattrs);
		JB_LIT(&b, "}");
	}
	if (sp->nevents > 0)
		JB_LIT(&b, "]");
	JB_LIT(&b, ",\"status\":{\"code\":");
	jb_u64(&b, (uint64_t)sp->status, false, false);
	if (sp->status_message != NULL) {
		JB_LIT(&b, ",\"message\":");
		jb_str(&b, sp->status_message);
	}
	if (sp->sampled)
		JB_LIT(&b, "},\"flags\":1}");
	else
		JB_LIT(&b, "}}");
	if (b.oom)
		goto fail;
	*buf = b.p;
	*len = b.len;
	*cap = b.cap;
	return 0;
fail:
	/* what was there stays; a larger buffer realloc made is kept */
	*buf = b.p;
	*cap = b.cap;
	return -1;
}

/* {"key":k,"value":{"stringValue":v}} with a ',' before all but the first. */
static void jb_str_attr(struct jbuf *b, bool *first, const char *k,
			const char *v)
{
	if (!*first)
		JB_LIT(b, ",");
	*first = false;
	JB_LIT(b, "{\"key\":");
	jb_str(b, k);
	JB_LIT(b, ",\"value\":{\"stringValue\":");
	jb_str(b, v);
	JB_LIT(b, "}}");
}

static bool has_resource(const struct otel_settings *s, const char *key)
{
	for (size_t i = 0; i < s->nresource; i++)
		if (strcmp(s->resource[i].name, key) == 0)
			return true;
	return false;
}

/*
 * The resource: service.name (resolved), the OTEL_RESOURCE_ATTRIBUTES
 * pairs, and the SDK's name and version unless those pairs set them.
 * telemetry.sdk.language is left out: its values name the languages of
 * OpenTelemetry's SDKs, and C is none of them.
 */
char *otel_encode_request(const struct otel_settings *s, const char *version,
			  const char *const *spans, const size_t *lens,
			  size_t n, size_t *len)
{
	struct jbuf b = { 0 };
	size_t total = 256;
	bool first = true;

	for (size_t i = 0; i < n; i++)
		total += lens[i] + 1;
	if (!jb_room(&b, total))
		goto fail;
	JB_LIT(&b, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
	jb_str_attr(&b, &first, "service.name",
		    s->service_name ? s->service_name : "idemproxy");
	for (size_t i = 0; i < s->nresource; i++)
		if (strcmp(s->resource[i].name, "service.name") != 0)
			jb_str_attr(&b, &first, s->resource[i].name,
				    s->resource[i].value);
	if (!has_resource(s, "telemetry.sdk.name"))
		jb_str_attr(&b, &first, "telemetry.sdk.name", "idemproxy");
	if (!has_resource(s, "telemetry.sdk.version"))
		jb_str_attr(&b, &first, "telemetry.sdk.version", version);
	JB_LIT(&b, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"idemproxy\","
	       "\"version\":");
	jb_str(&b, version);
	JB_LIT(&b, "},\"spans\":[");
	for (size_t i = 0; i < n; i++) {
		if (i > 0)
			JB_LIT(&b, ",");
		jb_put(&b, spans[i], lens[i]);
	}
	JB_LIT(&b, "]}]}]}");
	if (!jb_room(&b, 1))
		goto fail;
	b.p[b.len] = '\0';
	*len = b.len;
	return b.p;
fail:
	free(b.p);
	*len = 0;
	return NULL;
}
