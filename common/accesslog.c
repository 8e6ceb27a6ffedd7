/* accesslog.c - stub; being written (see accesslog.h). */
#include "accesslog.h"

size_t alog_format(const struct alog_entry *e, enum alog_format f, char *buf)
{
	(void)e; (void)f;
	buf[0] = '\n';
	return 1;
}
int alog_open(const char *dest, char *err, size_t errlen) { (void)dest; (void)err; (void)errlen; return 0; }
void alog_reopen(void) {}
bool alog_enabled(void) { return false; }
void alog_write(const struct alog_entry *e, enum alog_format f) { (void)e; (void)f; }
void alog_close(uint64_t flush_ms) { (void)flush_ms; }
uint64_t alog_dropped(void) { return 0; }
