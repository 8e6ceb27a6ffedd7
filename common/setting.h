/*
 * setting.h - the value syntax of a setting, shared by the option table of
 * config.c and the route table of route.c, so that a value means the same
 * and is held to the same bounds wherever it is written.
 *
 * A table row describes its value with a struct setting_syntax and says
 * where the value lands; setting_parse() checks a string against the syntax
 * and stores it there, setting_format() prints it back so that parsing the
 * output gives the same value. Errors say what is wrong with the value
 * without naming the setting: the caller knows where the value came from
 * ("--ttl", "IDEMPROXY_TTL", "file:7: route orders: ttl") and prefixes it.
 */
#ifndef IDEMPROXY_SETTING_H
#define IDEMPROXY_SETTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

/* What a value is, and the C type of the field it lands in. */
enum setting_type {
	SETTING_STRING,		/* non-empty text; char *, allocated */
	SETTING_TOKEN,		/* an HTTP token such as a header name; char * */
	SETTING_INT,		/* decimal digits, min..max; int */
	SETTING_BOOL,		/* 1/0 true/false yes/no on/off, any case; bool */
	SETTING_DURATION,	/* units.h, in milliseconds, min..max; uint64_t */
	SETTING_SIZE,		/* units.h, in bytes, min..max; uint64_t */
	SETTING_WORD,		/* one of .words, any case; an enum (int-sized) */
	SETTING_STATUSES,	/* HTTP status codes 100-599, comma-separated;
				 * struct status_set */
};

/* A set of HTTP status codes (SETTING_STATUSES). */
#define STATUS_SET_MIN 100
#define STATUS_SET_MAX 599
struct status_set {
	uint64_t bits[(STATUS_SET_MAX - STATUS_SET_MIN + 64) / 64];
};

static inline bool status_set_has(const struct status_set *s, int status)
{
	unsigned i;

	if (status < STATUS_SET_MIN || status > STATUS_SET_MAX)
		return false;
	i = (unsigned)(status - STATUS_SET_MIN);
	return (s->bits[i / 64] >> (i % 64)) & 1u;
}

static inline void status_set_put(struct status_set *s, int status, bool on)
{
	unsigned i = (unsigned)(status - STATUS_SET_MIN);

	if (on)
		s->bits[i / 64] |= (uint64_t)1 << (i % 64);
	else
		s->bits[i / 64] &= ~((uint64_t)1 << (i % 64));
}

/* One word of a SETTING_WORD; a list ends with { NULL, 0 }. */
struct setting_word {
	const char *word;
	int value;
};

struct setting_syntax {
	enum setting_type type;
	uint64_t min, max;			/* INT, DURATION, SIZE */
	const struct setting_word *words;	/* WORD */
};

/* Durations stay below INT32_MAX seconds so that any timeval or SQL
 * interval built from them fits. */
#define SETTING_DURATION_MAX (2147483647ULL * 1000)

/* Initialisers for the rows of a table: .syn = SYNTAX_DURATION(1) */
#define SYNTAX_STRING { .type = SETTING_STRING }
#define SYNTAX_TOKEN { .type = SETTING_TOKEN }
#define SYNTAX_BOOL { .type = SETTING_BOOL }
#define SYNTAX_INT(lo, hi) { .type = SETTING_INT, .min = (lo), .max = (hi) }
#define SYNTAX_DURATION(lo) { .type = SETTING_DURATION, .min = (lo), \
			      .max = SETTING_DURATION_MAX }
#define SYNTAX_SIZE(lo, hi) { .type = SETTING_SIZE, .min = (lo), .max = (hi) }
#define SYNTAX_WORDS(w) { .type = SETTING_WORD, .words = (w) }
#define SYNTAX_STATUSES { .type = SETTING_STATUSES }

/*
 * Check v against syn and store it in *field (of the type syn names),
 * replacing (and freeing) what was there. On error *field is unchanged and
 * err says why, e.g. `invalid duration "10 s" (use e.g. ...)`.
 */
int setting_parse(const struct setting_syntax *syn, const char *v, void *field,
		  char *err, size_t errlen) MUSTCHECK;

/* *field as setting_parse() accepts it: "24h", "1MiB", "yes", "wait". */
void setting_format(const struct setting_syntax *syn, const void *field,
		    char *buf, size_t len);

/* Free what setting_parse() allocated in *field (strings) and clear it. */
void setting_clear(const struct setting_syntax *syn, void *field);

/* Copy *src into *dst (strings duplicated). -1 when out of memory. */
int setting_copy(const struct setting_syntax *syn, void *dst,
		 const void *src) MUSTCHECK;

/* "500,503" (ascending), or "none". */
void status_set_format(const struct status_set *s, char *buf, size_t len);

/* The word of value in a list, or "?". */
const char *setting_word(const struct setting_word *w, int value);

/* The pieces setting_parse() is made of, for values with a syntax of their
 * own (addresses, URLs, route keys). Each returns 0 or -1. */
int setting_parse_bool(const char *s, bool *out) MUSTCHECK;
/* Decimal digits only, no sign or spaces, at most max. */
int setting_parse_uint(const char *s, uint64_t max, uint64_t *out) MUSTCHECK;
/* "POST,PATCH" (blanks around items allowed) into a bitmask of llhttp
 * method numbers; only HTTP methods, spelt as on the wire. */
int setting_parse_methods(const char *v, uint64_t *mask, char *err,
			  size_t errlen) MUSTCHECK;
/* *dst = a copy of v, the old string freed; -1 and err "out of memory"
 * when there is none. */
int setting_set_string(char **dst, const char *v, char *err,
		       size_t errlen) MUSTCHECK;

/*
 * A user-supplied value made fit for an error message: cut short, control
 * bytes replaced, so that the message stays one printable line. Returns buf.
 */
const char *setting_shown(const char *v, char *buf, size_t len);

#endif
