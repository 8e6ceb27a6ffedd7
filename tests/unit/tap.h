/*
 * tap.h - the smallest Test Anything Protocol producer that does the job.
 *
 *   ok(cond, "name %d", i);   is_int(got, want, "name");  is_str(got, want, "name");
 *   return tap_done();        prints the plan, exit status 1 on any failure
 */
#ifndef IDEMPROXY_TAP_H
#define IDEMPROXY_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int tap_count, tap_failed;

static inline __attribute__((format(printf, 2, 3)))
int ok(int cond, const char *fmt, ...)
{
	va_list ap;

	tap_count++;
	if (!cond)
		tap_failed++;
	printf("%sok %d - ", cond ? "" : "not ", tap_count);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	return cond;
}

#define is_int(got, want, ...) do { \
	long long g_ = (long long)(got), w_ = (long long)(want); \
	if (!ok(g_ == w_, __VA_ARGS__)) \
		printf("#   got %lld, want %lld\n", g_, w_); \
} while (0)

#define is_str(got, want, ...) do { \
	const char *g_ = (got), *w_ = (want); \
	int same_ = (g_ == NULL && w_ == NULL) || \
		(g_ != NULL && w_ != NULL && strcmp(g_, w_) == 0); \
	if (!ok(same_, __VA_ARGS__)) \
		printf("#   got \"%s\", want \"%s\"\n", g_ ? g_ : "(null)", \
		       w_ ? w_ : "(null)"); \
} while (0)

static inline int tap_done(void)
{
	printf("1..%d\n", tap_count);
	return tap_failed ? 1 : 0;
}

#endif
