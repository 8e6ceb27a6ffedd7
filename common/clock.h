/*
 * clock.h - the monotonic clock in milliseconds (and microseconds), and
 * milliseconds as a libevent timeout. Header-only: two lines each, used on
 * every loop.
 */
#ifndef IDEMPROXY_CLOCK_H
#define IDEMPROXY_CLOCK_H

#include <stdint.h>
#include <sys/time.h>
#include <time.h>

static inline uint64_t clock_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline uint64_t clock_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static inline struct timeval clock_tv(uint64_t ms)
{
	struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000 };

	return tv;
}

#endif
