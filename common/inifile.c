/*
 * inifile.c - the config file's INI dialect over inih (see inifile.h).
 *
 * inih drives: it calls ini_line() for each line and on_pair() for each
 * "key = value" it parsed from it. Section headers never reach inih as
 * they were written: ini_line() checks them, tells the handler, remembers
 * the name and gives inih a placeholder, so that a name holding ';' or '#'
 * means the same to both.
 */
#include "inifile.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <ini.h>

struct reader {
	const struct inifile_handler *h;
	void *user;
	struct inifile_pos at;
	FILE *f;
	char *line;		/* getline buffer */
	size_t cap;
	char *section;		/* the current section's name */
	bool failed;
	int err_line;
	char *err;
	size_t errlen;
};

void inifile_error(const struct inifile_pos *at, char *err, size_t errlen,
		   const char *fmt, ...)
{
	char why[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	snprintf(err, errlen, "%s:%d: %s", at->path, at->line, why);
}

/* Stop reading; the message is in x->err already. */
static void stop(struct reader *x)
{
	x->failed = true;
	x->err_line = x->at.line;
}

static void fail(struct reader *x, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void fail(struct reader *x, const char *fmt, ...)
{
	char why[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	inifile_error(&x->at, x->err, x->errlen, "%s", why);
	stop(x);
}

/* "[ NAME ]  ; comment": check it, tell the handler, remember NAME. */
static int header(struct reader *x, char *p)
{
	char *end, *close = strchr(p, ']'), *name;

	if (close == NULL) {
		fail(x, "missing ']' in section header");
		return -1;
	}
	/* nothing but a comment may follow the header */
	for (end = close + 1; *end == ' ' || *end == '\t'; end++)
		;
	if (*end != '\0' && *end != ';' && *end != '#') {
		fail(x, "unexpected text after section header");
		return -1;
	}
	*close = '\0';
	for (p++; *p == ' ' || *p == '\t'; p++)
		;
	for (end = close; end > p && (end[-1] == ' ' || end[-1] == '\t'); end--)
		end[-1] = '\0';
	if (x->h->section(x->user, &x->at, p, x->err, x->errlen) < 0) {
		stop(x);
		return -1;
	}
	name = strdup(p);
	if (name == NULL) {
		fail(x, "out of memory");
		return -1;
	}
	free(x->section);
	x->section = name;
	return 0;
}

/* The next line of the file, without leading blanks and line end; NULL at
 * the end or on an error. */
static char *next_line(struct reader *x, int num)
{
	ssize_t n;
	size_t len;
	char *p;

	errno = 0;
	n = getline(&x->line, &x->cap, x->f);
	x->at.line++;
	if (n < 0) {
		if (ferror(x->f))
			fail(x, "cannot read: %s", strerror(errno ? errno : EIO));
		return NULL;
	}
	if (strlen(x->line) != (size_t)n) {
		fail(x, "NUL byte in line");
		return NULL;
	}
	p = x->line;
	if (x->at.line == 1 && strncmp(p, "\xEF\xBB\xBF", 3) == 0)
		p += 3;
	while (*p == ' ' || *p == '\t')
		p++;
	len = strlen(p);
	while (len > 0 && (p[len - 1] == '\n' || p[len - 1] == '\r'))
		p[--len] = '\0';
	if (len >= (size_t)num) {
		fail(x, "line too long (at most %d characters)", num - 1);
		return NULL;
	}
	return p;
}

/* inih's line reader: one line per call, so that our line count is its
 * (Debian builds inih without INI_HANDLER_LINENO). NULL ends the parse. */
static char *ini_line(char *str, int num, void *stream)
{
	struct reader *x = stream;
	char *p;

	if (x->failed || (p = next_line(x, num)) == NULL)
		return NULL;
	if (*p == '[') {
		if (header(x, p) < 0)
			return NULL;
		snprintf(str, (size_t)num, "[s]");
		return str;
	}
	memcpy(str, p, strlen(p) + 1);
	return str;
}

static int on_pair(void *user, const char *section, const char *key,
		   const char *value)
{
	struct reader *x = user;

	if (x->h->value(x->user, &x->at, x->section, key, value, x->err,
			x->errlen) < 0) {
		stop(x);
		return 0;
	}
	return 1;
}

int inifile_read(const char *path, const struct inifile_handler *h,
		 void *user, char *err, size_t errlen)
{
	struct reader x = {
		.h = h, .user = user, .at = { .path = path }, .err = err,
		.errlen = errlen,
	};
	int rc, ret = -1;

	x.section = strdup("");
	x.f = fopen(path, "r");
	if (x.section == NULL || x.f == NULL) {
		snprintf(err, errlen, "%s: cannot open config file: %s", path,
			 strerror(x.section == NULL ? ENOMEM : errno));
		goto fail;
	}
	rc = ini_parse_stream(ini_line, &x, on_pair, &x);
	if (rc > 0 && (!x.failed || rc < x.err_line)) {
		snprintf(err, errlen, "%s:%d: syntax error (expected "
			 "\"key = value\" or \"[%s]\")", path, rc, h->main_section);
		goto fail;
	}
	if (x.failed)
		goto fail;
	if (rc < 0) {
		snprintf(err, errlen, "%s: out of memory", path);
		goto fail;
	}
	ret = 0;
fail:
	if (x.f != NULL)
		fclose(x.f);
	free(x.line);
	free(x.section);
	return ret;
}
