/*
 * reqlog.c - one request's record, its access-log line and its spans (see
 * reqlog.h, docs/operations.md "Logs and traces").
 *
 * Spans are made only for a sampled request of a process whose exporter
 * runs; the access line only when the access log is on. Otherwise a
 * request pays for its request id (made unless the client sent one), one
 * pass over its fields and the clock readings of its phases
 * (docs/benchmarks.md "The access log and request ids").
 */
#include "reqlog.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "accesslog.h"
#include "cidr.h"
#include "clock.h"
#include "config.h"
#include "otel_export.h"

static int64_t wall_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A random UUID (version 4) as the request id. */
static void make_id(char *out)
{
	uint8_t b[16];

	otel_new_trace_id(b);
	b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
	b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
	otel_hex(b, 4, out);
	out[8] = '-';
	otel_hex(b + 4, 2, out + 9);
	out[13] = '-';
	otel_hex(b + 6, 2, out + 14);
	out[18] = '-';
	otel_hex(b + 8, 2, out + 19);
	out[23] = '-';
	otel_hex(b + 10, 6, out + 24);
}

void reqlog_begin(struct reqlog *rl)
{
	memset(rl, 0, offsetof(struct reqlog, request_id));
	/* the client's, or made in reqlog_head (reqlog_need_id before) */
	rl->request_id[0] = rl->original_id[0] = rl->scope[0] = '\0';
	rl->traced = rl->sampled = false;
	rl->parent.valid = false;
	rl->unknown_us = 0;
	rl->unknown_cause = -1;
	rl->user_agent = rl->referer = rl->host = -1;
	rl->active = true;
	rl->wall_us = wall_us();
	rl->start_us = clock_us();
}

bool reqlog_id_ok(const char *v, size_t len)
{
	if (len == 0 || len > REQLOG_ID_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		char ch = v[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') ||
		      (ch != '\0' && strchr("-_.:+/=@", ch) != NULL)))
			return false;
	}
	return true;
}

void reqlog_head(struct reqlog *rl, const struct config *cfg,
		 const struct hdrlist *fields)
{
	const char *rid_name = cfg->request_id_header;
	size_t rid_len = cfg->request_id_len;
	int rid = -1, tp = -1, nrid = 0, ntp = 0;

	/* one pass: a request's head is read once more here, not per field */
	for (uint32_t i = 0; i < fields->n; i++) {
		if (hdr_named(fields, i, rid_name, rid_len)) {
			rid = (int)i;
			nrid++;
		} else if (hdr_named(fields, i, "traceparent", 11)) {
			tp = (int)i;
			ntp++;
		} else if (hdr_named(fields, i, "user-agent", 10)) {
			rl->user_agent = (int)i;
		} else if (hdr_named(fields, i, "referer", 7)) {
			rl->referer = (int)i;
		} else if (hdr_named(fields, i, "host", 4)) {
			rl->host = (int)i;
		}
	}
	if (nrid == 1 && reqlog_id_ok(hdr_value(fields, (uint32_t)rid),
				      fields->v[rid].value_len)) {
		memcpy(rl->request_id, hdr_value(fields, (uint32_t)rid),
		       fields->v[rid].value_len);
		rl->request_id[fields->v[rid].value_len] = '\0';
	} else {
		make_id(rl->request_id);
	}
	/* W3C §3.2.2: several traceparent fields: none is to be trusted */
	if (ntp == 1)
		(void)otel_parse_traceparent(hdr_value(fields, (uint32_t)tp),
					     fields->v[tp].value_len, &rl->parent);
	if (!cfg->otel.enabled) {
		if (rl->parent.valid)	/* logged; it goes upstream as is */
			memcpy(rl->trace_id, rl->parent.trace_id, OTEL_TRACE_ID_LEN);
		return;
	}
	rl->traced = true;
	if (rl->parent.valid)
		memcpy(rl->trace_id, rl->parent.trace_id, OTEL_TRACE_ID_LEN);
	else
		otel_new_trace_id(rl->trace_id);
	otel_new_span_id(rl->span_id);
	otel_new_span_id(rl->up_span_id);
	rl->sampled = otel_sample(&cfg->otel, &rl->parent, rl->trace_id);
	otel_format_traceparent(rl->trace_id, rl->up_span_id, rl->sampled,
				rl->traceparent);
}

void reqlog_need_id(struct reqlog *rl)
{
	if (rl->active && rl->request_id[0] == '\0')
		make_id(rl->request_id);
}

void reqlog_phase_begin(struct reqlog *rl, enum reqlog_phase ph)
{
	struct reqlog_time *t;

	if (rl == NULL)
		return;
	t = &rl->phase[ph];
	if (t->open != 0)	/* begun again before it ended (a retry) */
		t->total += clock_us() - t->open;
	t->open = clock_us();
	if (t->first == 0)
		t->first = t->open;
}

void reqlog_phase_end(struct reqlog *rl, enum reqlog_phase ph)
{
	struct reqlog_time *t;

	if (rl == NULL || rl->phase[ph].open == 0)
		return;
	t = &rl->phase[ph];
	t->last = clock_us();
	if (t->first_end == 0)
		t->first_end = t->last;
	t->total += t->last - t->open;
	t->open = 0;
}

void reqlog_responded(struct reqlog *rl)
{
	if (rl->active && rl->done_us == 0)
		rl->done_us = clock_us();
}

/* When the request ended: its response queued, or now. */
static uint64_t end_us(const struct reqlog *rl)
{
	return rl->done_us != 0 ? rl->done_us : clock_us();
}

void reqlog_unknown(struct reqlog *rl, enum unknown_cause cause)
{
	if (rl != NULL) {
		rl->unknown_us = clock_us();
		rl->unknown_cause = (int)cause;
	}
}

const char *reqlog_upstream_id(const struct reqlog *rl,
			       const struct config *cfg,
			       const struct policy *p)
{
	const char *key = p == NULL ? cfg->key_header :
			  p->key_source == KEY_SRC_HEADER ? p->key_name : NULL;

	if (key != NULL && strcasecmp(key, cfg->request_id_header) == 0)
		return NULL;
	return rl->request_id;
}

const char *reqlog_traceparent(const struct reqlog *rl)
{
	return rl->traced ? rl->traceparent : NULL;
}

static bool trace_known(const struct reqlog *rl)
{
	return rl->traced || rl->parent.valid;
}

/* ---- the end -------------------------------------------------------- */

static int64_t phase_us(const struct reqlog *rl, enum reqlog_phase ph)
{
	if (rl->phase[ph].last == 0)
		return ALOG_NONE;	/* never began, or never ended */
	return (int64_t)rl->phase[ph].total;
}

/* Field i's value (NUL-terminated in the arena); NULL when absent. */
static const char *field_value(const struct hdrlist *f, int i)
{
	return f != NULL && i >= 0 && (uint32_t)i < f->n ?
	       hdr_value(f, (uint32_t)i) : NULL;
}

/*
 * The client a trusted proxy names: walking X-Forwarded-For from its right
 * end (the hop nearest to us), the first address that is not itself a
 * trusted proxy. Only when the peer is trusted; into buf, or NULL.
 */
static const char *forwarded_client(const struct config *cfg,
				    const struct hdrlist *f, const char *peer,
				    char *buf, size_t len)
{
	const char *found = NULL;
	uint32_t i;

	if (cfg->trusted.n == 0 || f == NULL || !cidr_contains(&cfg->trusted, peer))
		return NULL;
	/* the last field's last item is the nearest hop */
	for (i = f->n; i-- > 0 && found == NULL;) {
		const char *v = hdr_value(f, i), *end;

		if (!hdr_named(f, i, "x-forwarded-for", 15))
			continue;
		end = v + f->v[i].value_len;
		while (end > v && found == NULL) {
			const char *item_end = end, *item;
			uint8_t a[16];

			while (item_end > v && (item_end[-1] == ' ' || item_end[-1] == '\t'))
				item_end--;
			item = item_end;
			while (item > v && item[-1] != ',')
				item--;
			end = item > v ? item - 1 : v;
			while (item < item_end && (*item == ' ' || *item == '\t'))
				item++;
			if (cidr_addr(item, (size_t)(item_end - item), a) < 0)
				return NULL;	/* not an address: trust stops */
			if (cidr_contains_bytes(&cfg->trusted, a))
				continue;
			if ((size_t)(item_end - item) >= len)
				return NULL;
			memcpy(buf, item, (size_t)(item_end - item));
			buf[item_end - item] = '\0';
			found = buf;
		}
	}
	return found;
}

static const char *store_label(const struct config *cfg)
{
	if (strcmp(cfg->store, "memory") == 0)
		return "memory";
	return cfg->redis != NULL ? "postgres+redis" : "postgres";
}

static void write_line(const struct reqlog *rl, const struct reqlog_end *e,
		       const char *client_fwd, const char *tid, const char *sid)
{
	char path[ALOG_LINE_MAX];
	const char *target = e->target;
	struct alog_entry a = {
		.time_us = rl->wall_us,
		.client = e->peer,
		.forwarded = client_fwd,
		.method = e->method,
		.protocol = e->protocol,
		.status = rl->status,
		.bytes_in = rl->bytes_in,
		.bytes_out = rl->bytes_out,
		.total_us = (int64_t)(end_us(rl) - rl->start_us),
		.claim_us = phase_us(rl, REQLOG_CLAIM),
		.wait_us = phase_us(rl, REQLOG_WAIT),
		.upstream_us = phase_us(rl, REQLOG_UPSTREAM),
		.store_us = phase_us(rl, REQLOG_STORE),
		.route = e->route,
		.outcome = e->outcome,
		.replayed = rl->original_id[0] != '\0' ||
			    strcmp(e->outcome, "replayed") == 0,
		.key = e->key != NULL && e->key[0] ? e->key : NULL,
		.request_id = rl->request_id[0] ? rl->request_id : NULL,
		.original_request_id = rl->original_id[0] ? rl->original_id : NULL,
		.trace_id = tid,
		.span_id = sid,
		.user_agent = field_value(e->fields, rl->user_agent),
		.referer = field_value(e->fields, rl->referer),
		.error = e->error,
	};

	if (target != NULL && !e->cfg->access_log_query) {
		const char *q = strchr(target, '?');

		if (q != NULL) {
			size_t n = (size_t)(q - target);

			if (n >= sizeof(path))
				n = sizeof(path) - 1;
			memcpy(path, target, n);
			path[n] = '\0';
			target = path;
		}
	}
	a.path = target;
	if (rl->scope[0] != '\0')
		a.scope = rl->scope;
	if (rl->forwarded)
		a.upstream = e->cfg->upstream_addr;
	alog_write(&a, e->cfg->access_log_format);
}

/* Monotonic µs of this request as wall-clock ns. */
static uint64_t span_ns(const struct reqlog *rl, uint64_t mono_us)
{
	return (uint64_t)(rl->wall_us + (int64_t)(mono_us - rl->start_us)) * 1000;
}

/* A child span of the server span over phase ph; false when it did not
 * happen. */
static bool phase_span(const struct reqlog *rl, enum reqlog_phase ph,
		       const char *name, struct otel_span *sp)
{
	const struct reqlog_time *t = &rl->phase[ph];

	if (t->first == 0)
		return false;
	memset(sp, 0, sizeof(*sp));
	otel_new_span_id(sp->span_id);
	memcpy(sp->parent_id, rl->span_id, OTEL_SPAN_ID_LEN);
	sp->name = name;
	sp->kind = OTEL_KIND_INTERNAL;
	/* one still under way (an exchange the client left) ends now */
	sp->start_ns = span_ns(rl, t->first);
	sp->end_ns = span_ns(rl, t->first_end != 0 ? t->first_end : clock_us());
	sp->sampled = true;
	return true;
}

/* The separator between two encoded spans. */
static int append_comma(char **buf, size_t *len, size_t *cap)
{
	if (*len + 1 > *cap) {
		size_t ncap = *cap ? 2 * *cap : 1024;
		char *nb = realloc(*buf, ncap);

		if (nb == NULL)
			return -1;
		*buf = nb;
		*cap = ncap;
	}
	(*buf)[(*len)++] = ',';
	return 0;
}

static void export_spans(const struct reqlog *rl, const struct reqlog_end *e,
			 const char *client_fwd)
{
	char status_s[16], url[600];
	const char *host = field_value(e->fields, rl->host);
	uint64_t now = clock_us();	/* the server span covers its children,
					 * the outcome's write included */
	struct otel_attr attrs[] = {
		{ "http.request.method", OTEL_ATTR_STRING, .s = e->method },
		{ "url.path", OTEL_ATTR_STRING, .s = NULL },
		{ "url.scheme", OTEL_ATTR_STRING, .s = e->tls ? "https" : "http" },
		{ "server.address", OTEL_ATTR_STRING, .s = host },
		{ "client.address", OTEL_ATTR_STRING,
		  .s = client_fwd ? client_fwd : e->peer },
		{ "network.peer.address", OTEL_ATTR_STRING, .s = e->peer },
		{ "network.protocol.version", OTEL_ATTR_STRING,
		  .s = e->protocol && strlen(e->protocol) > 5 ? e->protocol + 5 : NULL },
		{ "user_agent.original", OTEL_ATTR_STRING,
		  .s = field_value(e->fields, rl->user_agent) },
		{ "http.response.status_code", OTEL_ATTR_INT, .i = rl->status },
		{ "error.type", OTEL_ATTR_STRING, .s = NULL },
		{ "idempotency.key", OTEL_ATTR_STRING,
		  .s = e->key != NULL && e->key[0] ? e->key : NULL },
		{ "idempotency.outcome", OTEL_ATTR_STRING, .s = e->outcome },
		{ "idempotency.replayed", OTEL_ATTR_BOOL,
		  .b = strcmp(e->outcome, "replayed") == 0 },
		{ "idempotency.route", OTEL_ATTR_STRING, .s = e->route },
		{ "idempotency.store", OTEL_ATTR_STRING, .s = store_label(e->cfg) },
		{ "idempotency.request_id", OTEL_ATTR_STRING, .s = rl->request_id },
		{ "idempotency.original_request_id", OTEL_ATTR_STRING,
		  .s = rl->original_id[0] ? rl->original_id : NULL },
	};
	struct otel_attr cause[1] = {
		{ "idempotency.unknown_cause", OTEL_ATTR_STRING,
		  .s = rl->unknown_cause >= 0 ?
		       unknown_cause_name((enum unknown_cause)rl->unknown_cause) : NULL },
	};
	struct otel_event events[1];
	struct otel_attr up_attrs[6];
	struct otel_span spans[5];
	char path[512];
	size_t n = 0, nev = 0, len = 0, cap = 0;
	char *buf = NULL;

	/* the path without its query (it may hold secrets) */
	if (e->target != NULL) {
		size_t pl = strcspn(e->target, "?");

		if (pl >= sizeof(path))
			pl = sizeof(path) - 1;
		memcpy(path, e->target, pl);
		path[pl] = '\0';
		attrs[1].s = path;
	}
	if (e->error != NULL) {
		attrs[9].s = e->error;		/* cut short */
	} else if (rl->status >= 500 || rl->status == 0) {
		snprintf(status_s, sizeof(status_s), "%d", rl->status);
		attrs[9].s = rl->status ? status_s : "aborted";
	}
	if (rl->unknown_us != 0)
		events[nev++] = (struct otel_event){ "idempotency.unknown_outcome",
			span_ns(rl, rl->unknown_us), cause, 1 };

	memset(&spans[0], 0, sizeof(spans[0]));
	memcpy(spans[0].span_id, rl->span_id, OTEL_SPAN_ID_LEN);
	if (rl->parent.valid)
		memcpy(spans[0].parent_id, rl->parent.span_id, OTEL_SPAN_ID_LEN);
	spans[0].name = e->method ? e->method : "HTTP";
	spans[0].kind = OTEL_KIND_SERVER;
	spans[0].start_ns = span_ns(rl, rl->start_us);
	spans[0].end_ns = span_ns(rl, now);
	spans[0].status = attrs[9].s != NULL ? OTEL_STATUS_ERROR : OTEL_STATUS_UNSET;
	spans[0].attrs = attrs;
	spans[0].nattrs = sizeof(attrs) / sizeof(attrs[0]);
	spans[0].events = events;
	spans[0].nevents = nev;
	spans[0].sampled = true;
	n = 1;
	if (phase_span(rl, REQLOG_CLAIM, "idempotency claim", &spans[n]))
		n++;
	if (phase_span(rl, REQLOG_WAIT, "idempotency wait", &spans[n]))
		n++;
	if (phase_span(rl, REQLOG_STORE, "idempotency record", &spans[n]))
		n++;
	if (rl->forwarded && phase_span(rl, REQLOG_UPSTREAM,
					e->method ? e->method : "HTTP", &spans[n])) {
		struct otel_span *up = &spans[n++];

		memcpy(up->span_id, rl->up_span_id, OTEL_SPAN_ID_LEN);
		up->kind = OTEL_KIND_CLIENT;
		snprintf(url, sizeof(url), "%s://%s%s%s",
			 e->cfg->upstream_tls ? "https" : "http",
			 e->cfg->upstream_addr, e->cfg->upstream_prefix,
			 attrs[1].s ? attrs[1].s : "");
		up_attrs[0] = (struct otel_attr){ "http.request.method",
			OTEL_ATTR_STRING, .s = e->method };
		up_attrs[1] = (struct otel_attr){ "server.address",
			OTEL_ATTR_STRING, .s = e->cfg->upstream_hp.host };
		up_attrs[2] = (struct otel_attr){ "server.port", OTEL_ATTR_INT,
			.i = atoi(e->cfg->upstream_hp.port) };
		up_attrs[3] = (struct otel_attr){ "url.full", OTEL_ATTR_STRING,
			.s = url };
		up_attrs[4] = (struct otel_attr){ "http.response.status_code",
			OTEL_ATTR_INT, .i = rl->upstream_error ? 0 : rl->status };
		up_attrs[5] = (struct otel_attr){ "error.type", OTEL_ATTR_STRING,
			.s = rl->upstream_error };
		up->attrs = up_attrs;
		up->nattrs = 5;
		if (rl->upstream_error) {
			up_attrs[4] = up_attrs[5];
			up->nattrs = 5;
			up->status = OTEL_STATUS_ERROR;
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (i > 0 && append_comma(&buf, &len, &cap) < 0)
			goto fail;
		if (otel_encode_span(rl->trace_id, &spans[i], &buf, &len, &cap) < 0)
			goto fail;
	}
	otel_export_spans(buf, len, n);
	return;
fail:
	free(buf);
	metrics_count_n(COUNTER_trace_spans_dropped_total, n);
}

void reqlog_finish(struct reqlog *rl, const struct reqlog_end *e)
{
	char tid[2 * OTEL_TRACE_ID_LEN + 1], sid[2 * OTEL_SPAN_ID_LEN + 1];
	char fwd[INET6_ADDRSTRLEN + 1];
	const char *client_fwd;
	bool spans = rl->traced && rl->sampled;

	if (!rl->active)
		return;
	reqlog_need_id(rl);
	rl->active = false;
	if (!spans && !alog_enabled())
		return;
	client_fwd = forwarded_client(e->cfg, e->fields, e->peer, fwd, sizeof(fwd));
	if (spans)
		export_spans(rl, e, client_fwd);
	if (alog_enabled()) {
		if (trace_known(rl))
			otel_hex(rl->trace_id, OTEL_TRACE_ID_LEN, tid);
		if (rl->traced)
			otel_hex(rl->span_id, OTEL_SPAN_ID_LEN, sid);
		write_line(rl, e, client_fwd, trace_known(rl) ? tid : NULL,
			   rl->traced ? sid : NULL);
	}
}
