/* otel.c - stub; being written (see otel.h). */
#include "otel.h"
#include <string.h>
#include <stdlib.h>

int otel_parse_traceparent(const char *v, size_t len, struct otel_parent *out) { (void)v; (void)len; out->valid = false; return -1; }
void otel_format_traceparent(const uint8_t t[OTEL_TRACE_ID_LEN], const uint8_t s[OTEL_SPAN_ID_LEN], bool sampled, char *out)
{
	otel_hex(t, OTEL_TRACE_ID_LEN, out + 3);
	memcpy(out, "00-", 3); out[35] = '-';
	otel_hex(s, OTEL_SPAN_ID_LEN, out + 36);
	out[52] = '-'; out[53] = '0'; out[54] = sampled ? '1' : '0'; out[55] = 0;
}
void otel_hex(const uint8_t *id, size_t n, char *out)
{
	static const char d[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) { out[2*i] = d[id[i] >> 4]; out[2*i+1] = d[id[i] & 15]; }
	out[2*n] = 0;
}
void otel_new_trace_id(uint8_t id[OTEL_TRACE_ID_LEN]) { for (int i = 0; i < OTEL_TRACE_ID_LEN; i++) id[i] = (uint8_t)(rand() | 1); }
void otel_new_span_id(uint8_t id[OTEL_SPAN_ID_LEN]) { for (int i = 0; i < OTEL_SPAN_ID_LEN; i++) id[i] = (uint8_t)(rand() | 1); }
int otel_settings_resolve(struct otel_settings *out, const char *const opts[OTEL_OPT_COUNT], char **envp, const char **warn, char *err, size_t errlen)
{ (void)opts; (void)envp; (void)err; (void)errlen; memset(out, 0, sizeof(*out)); *warn = NULL; return 0; }
void otel_settings_free(struct otel_settings *s) { (void)s; }
bool otel_sample(const struct otel_settings *s, const struct otel_parent *p, const uint8_t t[OTEL_TRACE_ID_LEN]) { (void)s; (void)p; (void)t; return false; }
int otel_encode_span(const uint8_t t[OTEL_TRACE_ID_LEN], const struct otel_span *sp, char **buf, size_t *len, size_t *cap) { (void)t; (void)sp; (void)buf; (void)len; (void)cap; return -1; }
char *otel_encode_request(const struct otel_settings *s, const char *v, const char *const *spans, const size_t *lens, size_t n, size_t *len) { (void)s; (void)v; (void)spans; (void)lens; (void)n; *len = 0; return NULL; }
