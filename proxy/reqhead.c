/*
 * reqhead.c - the upstream request head (see reqhead.h).
 */
#include "reqhead.h"

#include <stdbool.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <llhttp.h>

#include "config.h"
#include "h1.h"

/* X-Forwarded-For: the client's list, comma-joined, then the peer. */
static void write_forwarded_for(struct h1_out *o, const struct reqhead *r)
{
	const struct hdrlist *h = r->fields;
	bool first = true;

	h1_out_add(o, "X-Forwarded-For: ", 17);
	for (int i = hdrlist_find(h, "x-forwarded-for", 0); i >= 0;
	     i = hdrlist_find(h, "x-forwarded-for", (uint32_t)i + 1)) {
		if (h->v[i].value_len == 0)
			continue;
		if (!first)
			h1_out_add(o, ", ", 2);
		h1_out_add(o, hdr_value(h, (uint32_t)i), h->v[i].value_len);
		first = false;
	}
	if (!first)
		h1_out_add(o, ", ", 2);
	h1_out_str(o, r->peer);
	h1_out_add(o, "\r\n", 2);
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The fields the proxy writes itself: X-Forwarded-For (the peer appended),
 * -Proto and -Host (set when absent), and with --tls-client-ca the names of
 * the certificate this listener verified. */
static const char *const forwarded_names[] = {
	"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host",
};
static const char *const cert_names[] = {
	"x-client-cert-subject", "x-client-cert-san",
};

/* Is name[0..len) one of names[0..n) in some spelling of '_' and '-'? */
static bool folds_to_any(const char *name, size_t len,
			 const char *const *names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (httphdr_name_folds_to(name, len, names[i]))
			return true;
	return false;
}

/*
 * The client's fields that go upstream as they are. Host and the
 * X-Forwarded-* fields the proxy sets are its own: a client naming them in
 * Connection does not remove them (DESIGN §7). Over TLS the proxy knows
 * the scheme itself: a client's X-Forwarded-Proto is replaced by https
 * (nobody in front could have terminated TLS).
 *
 * Nor can a client write what the proxy vouches for in another spelling:
 * CGI, WSGI and Rack servers read X_Forwarded_Proto and X-Client-Cert_SAN
 * as the fields the proxy writes (httphdr_name_folds_to). The certificate's
 * names are dropped in every spelling whenever --tls-client-ca is set, the
 * X-Forwarded-* names whenever they hold an '_': a trusted hop in front,
 * whose X-Forwarded-Proto and -Host are kept, spells them with dashes.
 */
static bool forwarded_field(const struct hdrlist *h, uint32_t i, void *arg)
{
	const struct reqhead *r = arg;
	uint32_t n = h->v[i].name_len;
	const char *name = hdr_name(h, i);

	if (r->cfg->tls_client_ca != NULL &&
	    folds_to_any(name, n, cert_names, COUNT(cert_names)))
		return false;	/* ours: what this listener verified */
	if (memchr(name, '_', n) != NULL &&
	    folds_to_any(name, n, forwarded_names, COUNT(forwarded_names)))
		return false;	/* a spelling no hop in front writes */
	if (n == 15 && strcasecmp(name, "x-forwarded-for") == 0)
		return r->cfg->forwarded_for == XFF_OFF;	/* else rewritten */
	if (r->tls && n == 17 && strcasecmp(name, "x-forwarded-proto") == 0)
		return false;	/* written below */
	if ((n == 4 && strcasecmp(name, "host") == 0) ||
	    (n == 17 && strcasecmp(name, "x-forwarded-proto") == 0) ||
	    (n == 16 && strcasecmp(name, "x-forwarded-host") == 0))
		return true;
	if (r->upgrade && n == 7 && strcasecmp(name, "upgrade") == 0)
		return true;	/* the one hop-by-hop field that goes on */
	if (httphdr_drop_on_forward(h, i))
		return false;
	if (r->request_id != NULL &&
	    hdr_named(h, i, r->cfg->request_id_header, r->cfg->request_id_len))
		return false;	/* written below, the same when well-formed */
	if (r->traceparent != NULL && hdr_named(h, i, "traceparent", 11))
		return false;	/* ours: its parent is our span */
	return !(r->drop_expect && n == 6 && strcasecmp(name, "expect") == 0);
}

/* A field whose value is a string of ours. */
static void write_field(struct h1_out *o, const char *name, const char *value)
{
	h1_out_str(o, name);
	h1_out_str(o, value);
	h1_out_add(o, "\r\n", 2);
}

void reqhead_write(struct evbuffer *out, const struct reqhead *r)
{
	const struct hdrlist *h = r->fields;
	const char *prefix = r->cfg->upstream_prefix;
	int host = hdrlist_find(h, "host", 0);
	struct h1_out o;

	h1_out_init(&o, out);
	h1_out_str(&o, llhttp_method_name((llhttp_method_t)r->method));
	h1_out_add(&o, " ", 1);
	h1_out_str(&o, prefix);
	if (!(strcmp(r->target, "*") == 0 && prefix[0]))
		h1_out_str(&o, r->target);
	h1_out_add(&o, " HTTP/1.1\r\n", 11);
	h1_write_fields(&o, h, forwarded_field, (void *)r);
	if (host < 0) {
		h1_out_add(&o, "Host: ", 6);
		h1_out_str(&o, r->cfg->upstream_hp.host);
		h1_out_add(&o, ":", 1);
		h1_out_str(&o, r->cfg->upstream_hp.port);
		h1_out_add(&o, "\r\n", 2);
	}
	if (r->cfg->forwarded_for == XFF_APPEND)
		write_forwarded_for(&o, r);
	if (r->tls)
		h1_out_add(&o, "X-Forwarded-Proto: https\r\n", 26);
	else if (hdrlist_find(h, "x-forwarded-proto", 0) < 0)
		h1_out_add(&o, "X-Forwarded-Proto: http\r\n", 25);
	if (host >= 0 && hdrlist_find(h, "x-forwarded-host", 0) < 0)
		write_field(&o, "X-Forwarded-Host: ", hdr_value(h, (uint32_t)host));
	if (r->client_subject != NULL)
		write_field(&o, "X-Client-Cert-Subject: ", r->client_subject);
	if (r->client_san != NULL)
		write_field(&o, "X-Client-Cert-SAN: ", r->client_san);
	if (r->request_id != NULL) {
		h1_out_str(&o, r->cfg->request_id_header);
		write_field(&o, ": ", r->request_id);
	}
	if (r->traceparent != NULL)
		write_field(&o, "traceparent: ", r->traceparent);
	if (r->upgrade)
		h1_out_add(&o, "Connection: upgrade\r\n", 21);
	if (r->body == BODY_LENGTH) {
		h1_out_add(&o, "Content-Length: ", 16);
		h1_out_dec(&o, r->length);
		h1_out_add(&o, "\r\n", 2);
	} else if (r->body == BODY_CHUNKED) {
		h1_out_add(&o, "Transfer-Encoding: chunked\r\n", 28);
	}
	h1_out_add(&o, "\r\n", 2);
	h1_out_flush(&o);
}

bool reqhead_upgrade(const struct hdrlist *h, unsigned http_minor)
{
	bool asked = false;
	int u = hdrlist_find(h, "upgrade", 0);

	if (u < 0 || http_minor == 0)
		return false;
	for (int i = hdrlist_find(h, "connection", 0); i >= 0 && !asked;
	     i = hdrlist_find(h, "connection", (uint32_t)i + 1))
		asked = httphdr_list_has(hdr_value(h, (uint32_t)i),
					 h->v[i].value_len, "upgrade");
	for (; asked && u >= 0; u = hdrlist_find(h, "upgrade", (uint32_t)u + 1))
		if (httphdr_list_has(hdr_value(h, (uint32_t)u), h->v[u].value_len,
				     "h2c"))
			return false;
	return asked;
}

const char *reqhead_origin_target(const char *t, int method)
{
	if (t == NULL)
		return NULL;
	if (t[0] == '/')
		return t;
	if (strcmp(t, "*") == 0 && method == HTTP_OPTIONS)
		return t;
	if (strncasecmp(t, "http://", 7) == 0) {
		const char *path = strchr(t + 7, '/');

		return path != NULL ? path : "/";
	}
	return NULL;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c |= 0x20;
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static bool unreserved(int c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
	       (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
	       c == '~';
}

/* Is the segment [a, b) "." or ".."? */
static bool dot_segment(const char *a, const char *b)
{
	return (b - a == 1 && a[0] == '.') ||
	       (b - a == 2 && a[0] == '.' && a[1] == '.');
}

/* The path of t (up to '?') into out, normalised; -1 when refused. */
static int normalise_path(const char *t, char *out, size_t *outlen)
{
	size_t n = 0, seg = 0;

	for (const char *p = t; *p != '\0' && *p != '?'; p++) {
		int c = (unsigned char)*p;

		if (c == '%') {
			int h = hexval((unsigned char)p[1]), l = h < 0 ? -1 :
				hexval((unsigned char)p[2]);

			if (h < 0 || l < 0)
				return -1;
			c = h * 16 + l;
			if (c == '/' || c == '\\' || c == 0)
				return -1;
			if (unreserved(c)) {
				out[n++] = (char)c;
			} else {
				memcpy(out + n, p, 3);
				n += 3;
			}
			p += 2;
			continue;
		}
		if (c == '\\')
			return -1;
		if (c == '/') {
			if (dot_segment(out + seg, out + n))
				return -1;
			if (n > 0 && out[n - 1] == '/')
				continue;	/* "//" is "/" */
			out[n++] = '/';
			seg = n;
			continue;
		}
		out[n++] = (char)c;
	}
	if (dot_segment(out + seg, out + n))
		return -1;
	*outlen = n;
	return 0;
}

int reqhead_normalise(const char *target, int method, char *fwd, char *match)
{
	const char *t = reqhead_origin_target(target, method);
	const char *q;
	size_t n, m = 0;

	if (t == NULL)
		return -1;
	if (t[0] != '/') {		/* OPTIONS * */
		strcpy(fwd, t);
		strcpy(match, t);
		return 0;
	}
	if (normalise_path(t, fwd, &n) < 0)
		return -1;
	/* the path routes see: no ";params", no trailing '/' */
	for (size_t i = 0; i < n; i++) {
		if (fwd[i] == ';') {
			while (i + 1 < n && fwd[i + 1] != '/')
				i++;
			continue;
		}
		match[m++] = fwd[i];
	}
	if (m > 1 && match[m - 1] == '/')
		m--;
	match[m] = '\0';
	q = strchr(t, '?');
	strcpy(fwd + n, q != NULL ? q : "");
	return 0;
}
