/*
 * setting.c - one parser for the values of both settings tables (see
 * setting.h).
 *
 * The grammar is deliberately narrow: a typo such as "10 s", "1KB" or
 * "maybe" fails loudly at start-up instead of being guessed at, because a
 * misread timeout or mode changes what the proxy promises about duplicate
 * execution. Durations and sizes are units.h's; everything else is here.
 */
#include "setting.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <llhttp.h>

#include "httphdr.h"
#include "units.h"

const char *setting_shown(const char *v, char *buf, size_t len)
{
	size_t i;

	for (i = 0; v[i] != '\0' && i + 1 < len; i++)
		buf[i] = (v[i] >= 0x20 && v[i] < 0x7f) ? v[i] : '?';
	buf[i] = '\0';
	if (v[i] != '\0' && len > 4)
		memcpy(buf + len - 4, "...", 4);
	return buf;
}

int setting_parse_uint(const char *s, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;

	if (*s == '\0')
		return -1;
	for (; *s != '\0'; s++) {
		unsigned d = (unsigned)(*s - '0');

		if (*s < '0' || *s > '9' || d > max || v > (max - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

int setting_parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "1", "true", "yes", "on" };
	static const char *const no[] = { "0", "false", "no", "off" };
	size_t i;

	for (i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return -1;
}

int setting_set_string(char **dst, const char *v, char *err, size_t errlen)
{
	char *dup = strdup(v);

	if (dup == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	free(*dst);
	*dst = dup;
	return 0;
}

/* The llhttp number of the HTTP method spelt p[0..n), or -1. */
static int method_number(const char *p, size_t n)
{
#define XX(num, name, string) num,
	static const int http_methods[] = { HTTP_METHOD_MAP(XX) };
#undef XX
	size_t i;

	for (i = 0; i < sizeof(http_methods) / sizeof(http_methods[0]); i++) {
		const char *name = llhttp_method_name((llhttp_method_t)http_methods[i]);

		if (strlen(name) == n && memcmp(name, p, n) == 0)
			return http_methods[i];
	}
	return -1;
}

int setting_parse_methods(const char *v, uint64_t *mask, char *err,
			  size_t errlen)
{
	const char *p = v, *end;
	uint64_t m = 0;
	char sh[80], item[40];
	size_t n;
	int num;

	if (*v == '\0') {
		snprintf(err, errlen, "empty method list (e.g. POST,PATCH)");
		return -1;
	}
	for (;; p = end + 1) {
		end = strchr(p, ',');
		if (end == NULL)
			end = p + strlen(p);
		/* "POST, PATCH" reads naturally in an INI file */
		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		n = (size_t)(end - p);
		while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
			n--;
		if (n == 0) {
			snprintf(err, errlen, "empty method in list \"%s\"",
				 setting_shown(v, sh, sizeof(sh)));
			return -1;
		}
		num = method_number(p, n);
		if (num < 0) {
			snprintf(item, sizeof(item), "%.*s", (int)(n < 32 ? n : 32), p);
			snprintf(err, errlen, "unknown HTTP method \"%s\" (methods "
				 "are case-sensitive, e.g. POST,PATCH)",
				 setting_shown(item, sh, sizeof(sh)));
			return -1;
		}
		m |= 1ULL << num;
		if (*end == '\0')
			break;
	}
	*mask = m;
	return 0;
}

const char *setting_word(const struct setting_word *w, int value)
{
	for (; w->word != NULL; w++) {
		if (w->value == value)
			return w->word;
	}
	return "?";
}

/* "wait or reject", "debug, info, warn or error" */
static void word_choices(const struct setting_word *w, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (; w->word != NULL && used < len; w++) {
		used += (size_t)snprintf(buf + used, len - used, "%s%s",
					 used == 0 ? "" : (w[1].word ? ", " : " or "),
					 w->word);
	}
}

static int parse_text(const struct setting_syntax *syn, const char *v,
		      char **field, char *err, size_t errlen)
{
	char sh[80];

	if (v[0] == '\0') {
		snprintf(err, errlen, "empty value");
		return -1;
	}
	if (syn->type == SETTING_TOKEN && !httphdr_is_token(v, strlen(v))) {
		snprintf(err, errlen, "invalid header name \"%s\"",
			 setting_shown(v, sh, sizeof(sh)));
		return -1;
	}
	return setting_set_string(field, v, err, errlen);
}

static int parse_duration(const struct setting_syntax *syn, const char *v,
			  uint64_t *field, char *err, size_t errlen)
{
	char sh[80], bound[32];
	uint64_t n;

	if (units_parse_duration(v, &n) < 0) {
		snprintf(err, errlen, "invalid duration \"%s\" (use e.g. "
			 "250ms, 10s, 5m, 24h)", setting_shown(v, sh, sizeof(sh)));
		return -1;
	}
	if (n < syn->min) {
		units_format_duration(syn->min, bound, sizeof(bound));
		if (syn->min == 1)
			snprintf(err, errlen, "must be greater than 0");
		else
			snprintf(err, errlen, "%s is too short (at least %s)",
				 setting_shown(v, sh, sizeof(sh)), bound);
		return -1;
	}
	if (n > syn->max) {
		units_format_duration(syn->max, bound, sizeof(bound));
		snprintf(err, errlen, "%s is too long (at most %s)",
			 setting_shown(v, sh, sizeof(sh)), bound);
		return -1;
	}
	*field = n;
	return 0;
}

static int parse_size(const struct setting_syntax *syn, const char *v,
		      uint64_t *field, char *err, size_t errlen)
{
	char sh[80], lo[32], hi[32];
	uint64_t n;

	if (units_parse_size(v, &n) < 0) {
		snprintf(err, errlen, "invalid size \"%s\" (use e.g. 4096, "
			 "512KiB, 1MiB)", setting_shown(v, sh, sizeof(sh)));
		return -1;
	}
	if (n < syn->min || n > syn->max) {
		units_format_size(syn->min, lo, sizeof(lo));
		units_format_size(syn->max, hi, sizeof(hi));
		snprintf(err, errlen, "size %s out of range (%s-%s)",
			 setting_shown(v, sh, sizeof(sh)), lo, hi);
		return -1;
	}
	*field = n;
	return 0;
}

static int parse_word(const struct setting_syntax *syn, const char *v,
		      int *field, char *err, size_t errlen)
{
	const struct setting_word *w;
	char sh[80], choices[128];

	for (w = syn->words; w->word != NULL; w++) {
		if (strcasecmp(v, w->word) == 0) {
			*field = w->value;
			return 0;
		}
	}
	word_choices(syn->words, choices, sizeof(choices));
	snprintf(err, errlen, "invalid value \"%s\" (use %s)",
		 setting_shown(v, sh, sizeof(sh)), choices);
	return -1;
}

/* "500, 503,429" into a set; "none" is the empty set. Each code once. */
static int parse_statuses(const char *v, struct status_set *field, char *err,
			  size_t errlen)
{
	struct status_set set = { { 0 } };
	const char *p = v;
	char sh[80];

	while (*p == ' ' || *p == '\t')
		p++;
	if (strcasecmp(p, "none") == 0) {
		*field = set;
		return 0;
	}
	for (;;) {
		uint64_t n = 0;
		int digits = 0;

		while (*p == ' ' || *p == '\t')
			p++;
		while (*p >= '0' && *p <= '9' && digits < 4) {
			n = n * 10 + (uint64_t)(*p++ - '0');
			digits++;
		}
		while (*p == ' ' || *p == '\t')
			p++;
		if (digits != 3 || n < STATUS_SET_MIN || n > STATUS_SET_MAX ||
		    (*p != ',' && *p != '\0')) {
			snprintf(err, errlen, "invalid status list \"%s\" (use "
				 "e.g. 500,503,429, codes 100-599, or none)",
				 setting_shown(v, sh, sizeof(sh)));
			return -1;
		}
		if (status_set_has(&set, (int)n)) {
			snprintf(err, errlen, "status %llu is listed twice",
				 (unsigned long long)n);
			return -1;
		}
		status_set_put(&set, (int)n, true);
		if (*p == '\0')
			break;
		p++;
	}
	*field = set;
	return 0;
}

void status_set_format(const struct status_set *s, char *buf, size_t len)
{
	size_t used = 0;

	if (len == 0)
		return;
	buf[0] = '\0';
	for (int st = STATUS_SET_MIN; st <= STATUS_SET_MAX && used < len; st++)
		if (status_set_has(s, st))
			used += (size_t)snprintf(buf + used, len - used, "%s%d",
						 used == 0 ? "" : ",", st);
	if (used == 0)
		snprintf(buf, len, "none");
}

int setting_parse(const struct setting_syntax *syn, const char *v, void *field,
		  char *err, size_t errlen)
{
	char sh[80];
	uint64_t n;
	bool b;

	switch (syn->type) {
	case SETTING_STRING:
	case SETTING_TOKEN:
		return parse_text(syn, v, field, err, errlen);
	case SETTING_INT:
		if (setting_parse_uint(v, syn->max, &n) < 0 || n < syn->min) {
			snprintf(err, errlen, "invalid number \"%s\" (use %llu-%llu)",
				 setting_shown(v, sh, sizeof(sh)),
				 (unsigned long long)syn->min,
				 (unsigned long long)syn->max);
			return -1;
		}
		*(int *)field = (int)n;
		return 0;
	case SETTING_BOOL:
		if (setting_parse_bool(v, &b) < 0) {
			snprintf(err, errlen, "invalid boolean \"%s\" (use yes/no, "
				 "true/false, on/off or 1/0)",
				 setting_shown(v, sh, sizeof(sh)));
			return -1;
		}
		*(bool *)field = b;
		return 0;
	case SETTING_DURATION:
		return parse_duration(syn, v, field, err, errlen);
	case SETTING_SIZE:
		return parse_size(syn, v, field, err, errlen);
	case SETTING_WORD:
		return parse_word(syn, v, field, err, errlen);
	case SETTING_STATUSES:
		return parse_statuses(v, field, err, errlen);
	}
	snprintf(err, errlen, "internal error: setting type %d", (int)syn->type);
	return -1;
}

void setting_format(const struct setting_syntax *syn, const void *field,
		    char *buf, size_t len)
{
	const char *s;

	switch (syn->type) {
	case SETTING_STRING:
	case SETTING_TOKEN:
		s = *(char *const *)field;
		snprintf(buf, len, "%s", s != NULL ? s : "");
		return;
	case SETTING_INT:
		snprintf(buf, len, "%d", *(const int *)field);
		return;
	case SETTING_BOOL:
		snprintf(buf, len, "%s", *(const bool *)field ? "yes" : "no");
		return;
	case SETTING_DURATION:
		units_format_duration(*(const uint64_t *)field, buf, len);
		return;
	case SETTING_SIZE:
		units_format_size(*(const uint64_t *)field, buf, len);
		return;
	case SETTING_WORD:
		snprintf(buf, len, "%s", setting_word(syn->words, *(const int *)field));
		return;
	case SETTING_STATUSES:
		status_set_format(field, buf, len);
		return;
	}
	snprintf(buf, len, "?");
}

void setting_clear(const struct setting_syntax *syn, void *field)
{
	if (syn->type == SETTING_STRING || syn->type == SETTING_TOKEN) {
		free(*(char **)field);
		*(char **)field = NULL;
	}
}

int setting_copy(const struct setting_syntax *syn, void *dst, const void *src)
{
	const char *s;
	char *dup;

	switch (syn->type) {
	case SETTING_STRING:
	case SETTING_TOKEN:
		s = *(char *const *)src;
		dup = s != NULL ? strdup(s) : NULL;
		if (s != NULL && dup == NULL)
			return -1;
		setting_clear(syn, dst);
		*(char **)dst = dup;
		return 0;
	case SETTING_INT:
	case SETTING_WORD:
		*(int *)dst = *(const int *)src;
		return 0;
	case SETTING_BOOL:
		*(bool *)dst = *(const bool *)src;
		return 0;
	case SETTING_DURATION:
	case SETTING_SIZE:
		*(uint64_t *)dst = *(const uint64_t *)src;
		return 0;
	case SETTING_STATUSES:
		*(struct status_set *)dst = *(const struct status_set *)src;
		return 0;
	}
	return -1;
}
