/*
 * inifile.h - the INI dialect of idemproxy's config file, read with inih.
 *
 * The reader hands inih one line at a time so that line numbers are exact,
 * reports every section header (an empty section too), strips leading
 * blanks (so an indented line is a key, never a continuation of the one
 * before), skips a UTF-8 BOM and refuses NUL bytes and over-long lines.
 * What the sections and keys mean is the handler's business (config.c).
 */
#ifndef IDEMPROXY_INIFILE_H
#define IDEMPROXY_INIFILE_H

#include <stddef.h>

#include "compiler.h"

/* Where a handler is called from, for its error messages. */
struct inifile_pos {
	const char *path;
	int line;
};

/*
 * Both callbacks return 0 to go on, or -1 with the whole message in err
 * (inifile_error() writes "path:line: why") to stop reading.
 */
struct inifile_handler {
	/* "[NAME]", blanks around NAME removed */
	int (*section)(void *user, const struct inifile_pos *at,
		       const char *name, char *err, size_t errlen);
	/* "key = value" under the last section's NAME ("" before any) */
	int (*value)(void *user, const struct inifile_pos *at,
		     const char *section, const char *key, const char *value,
		     char *err, size_t errlen);
	/* the section a syntax error suggests, e.g. "idemproxy" */
	const char *main_section;
};

/* Read the file at path through h. 0, or -1 with a one-line message. */
int inifile_read(const char *path, const struct inifile_handler *h,
		 void *user, char *err, size_t errlen) MUSTCHECK;

void inifile_error(const struct inifile_pos *at, char *err, size_t errlen,
		   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
