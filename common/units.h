/*
 * units.h - strict parsing and printing of durations and sizes.
 *
 * Durations are a decimal integer followed by one unit: ms, s, m, h
 * ("250ms", "10s", "5m", "24h"). Sizes are a decimal integer with an optional
 * binary unit: B, KiB, MiB, GiB ("512KiB", "1MiB", "4096"). Anything else -
 * signs, spaces, fractions, unknown units, overflow - is rejected.
 */
#ifndef IDEMPROXY_UNITS_H
#define IDEMPROXY_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

/* Parse a duration into milliseconds. Returns 0, or -1 on a bad value. */
int units_parse_duration(const char *s, uint64_t *ms) MUSTCHECK;

/* Parse a size into bytes. Returns 0, or -1 on a bad value. */
int units_parse_size(const char *s, uint64_t *bytes) MUSTCHECK;

/* Print ms with the largest unit that divides it exactly ("24h", "250ms"). */
void units_format_duration(uint64_t ms, char *buf, size_t len);

/* Print bytes with the largest binary unit that divides it ("1MiB", "100B"). */
void units_format_size(uint64_t bytes, char *buf, size_t len);

#endif
