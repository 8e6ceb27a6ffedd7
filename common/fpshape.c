/*
 * fpshape.c - see fpshape.h and docs/protocol.md "Shaped fingerprints".
 */
#include "fpshape.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <json-c/json.h>

#include "jcs.h"
#include "keysrc.h"

int fpshape_list(const char *v, char **out, char *why, size_t len)
{
	char *s = malloc(strlen(v) + 1), *w = s;
	const char *p = v;

	if (s == NULL) {
		snprintf(why, len, "out of memory");
		return -1;
	}
	for (;;) {
		const char *end = p + strcspn(p, ","), *a = p, *b = end;

		while (a < b && (*a == ' ' || *a == '\t'))
			a++;
		while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
			b--;
		if (a == b) {
			free(s);
			snprintf(why, len, "an empty item (items are separated "
				 "by commas)");
			return -1;
		}
		if (w != s)
			*w++ = ',';
		memcpy(w, a, (size_t)(b - a));
		w += b - a;
		if (*end == '\0')
			break;
		p = end + 1;
	}
	*w = '\0';
	free(*out);
	*out = s;
	return 0;
}

/* An RFC 6901 pointer to a member or element (not the whole body). */
static bool pointer_ok(const char *s, size_t len)
{
	if (len < 2 || s[0] != '/')
		return false;
	for (size_t i = 0; i < len; i++)
		if (s[i] == '~' && (i + 1 == len || (s[i + 1] != '0' &&
						     s[i + 1] != '1')))
			return false;
	return true;
}

int fpshape_check(const struct policy *p, char *why, size_t len)
{
	const char *list = p->fp_ignore ? p->fp_ignore : p->fp_only;

	if (list == NULL)
		return 0;
	if (p->fp_ignore != NULL && p->fp_only != NULL) {
		snprintf(why, len, "fingerprint_ignore and fingerprint_only "
			 "exclude each other");
		return -1;
	}
	if (p->fp_body == FP_BODY_RAW) {
		snprintf(why, len, "fingerprint_%s needs fingerprint = json or "
			 "form", p->fp_ignore ? "ignore" : "only");
		return -1;
	}
	while (p->fp_body == FP_BODY_JSON) {
		size_t n = strcspn(list, ",");

		if (!pointer_ok(list, n)) {
			snprintf(why, len, "\"%.*s\" is not a JSON pointer to a "
				 "member (RFC 6901: /member/0/name, ~1 for '/', "
				 "~0 for '~')", (int)(n > 80 ? 80 : n), list);
			return -1;
		}
		if (list[n] == '\0')
			break;
		list += n + 1;
	}
	return 0;
}

bool fpshape_is_default(const struct policy *p)
{
	return p->fp_body == FP_BODY_RAW && p->fp_query == FP_QUERY_EXACT &&
	       p->fp_ignore == NULL && p->fp_only == NULL;
}

/* The words of the shaping; snprintf's return. */
static int describe(const struct policy *p, char *buf, size_t len)
{
	return snprintf(buf, len, "body=%s;query=%s%s%s",
			setting_word(policy_fp_body_words, (int)p->fp_body),
			setting_word(policy_fp_query_words, (int)p->fp_query),
			p->fp_ignore ? ";ignore=" : p->fp_only ? ";only=" : "",
			p->fp_ignore ? p->fp_ignore : p->fp_only ? p->fp_only : "");
}

void fpshape_describe(const struct policy *p, char *buf, size_t len)
{
	(void)describe(p, buf, len);
}

/* Is name[0..n) an item of the comma-separated list? */
static bool listed(const char *list, const char *name, size_t n)
{
	while (list != NULL) {
		size_t len = strcspn(list, ",");

		if (len == n && memcmp(list, name, n) == 0)
			return true;
		list = list[len] == ',' ? list + len + 1 : NULL;
	}
	return false;
}

static int put_u64(struct evbuffer *b, uint64_t v)
{
	unsigned char be[8];

	for (int i = 7; i >= 0; i--, v >>= 8)
		be[i] = (unsigned char)(v & 0xff);
	return evbuffer_add(b, be, sizeof(be));
}

static int put_bytes(struct evbuffer *b, const void *p, size_t len)
{
	return put_u64(b, len) < 0 || evbuffer_add(b, p, len) < 0 ? -1 : 0;
}

/* ---- urlencoded pairs: forms and query strings ---------------------------- */

struct field {
	const char *name, *value;	/* decoded, in fields.buf */
	size_t nlen, vlen;
	size_t pos;			/* order of appearance */
};

struct fields {
	struct field *f;
	size_t n;
	char *buf;
};

static void fields_free(struct fields *fs)
{
	free(fs->f);
	free(fs->buf);
}

static int by_name(const void *a, const void *b)
{
	const struct field *x = a, *y = b;
	int c = memcmp(x->name, y->name, x->nlen < y->nlen ? x->nlen : y->nlen);

	if (c != 0)
		return c;
	if (x->nlen != y->nlen)
		return x->nlen < y->nlen ? -1 : 1;
	return x->pos < y->pos ? -1 : 1;	/* repeated names keep their order */
}

/*
 * "a=1&b=2" into fields decoded and sorted by name. Empty pieces are
 * skipped, and "a" is "a=". With ignore, fields so named are left out;
 * with only, all others are. 1: done; 0: a malformed escape; -1: out of
 * memory.
 */
static int fields_parse(const char *s, size_t len, const char *ignore,
			const char *only, struct fields *fs)
{
	size_t pieces = 1;

	memset(fs, 0, sizeof(*fs));
	for (size_t i = 0; i < len; i++)
		pieces += s[i] == '&';
	fs->buf = malloc(len + 1);
	fs->f = calloc(pieces, sizeof(*fs->f));
	if (fs->buf == NULL || fs->f == NULL)
		return -1;
	memcpy(fs->buf, s, len);
	for (size_t i = 0; i < len;) {
		const char *amp = memchr(s + i, '&', len - i);
		size_t plen = amp != NULL ? (size_t)(amp - (s + i)) : len - i;
		char *start = fs->buf + i, *end, *eq;
		struct field *f = &fs->f[fs->n];
		int nl, vl;

		i += plen + 1;
		if (plen == 0)
			continue;
		end = start + plen;
		eq = memchr(start, '=', plen);
		if (eq == NULL)
			eq = end;
		nl = keysrc_url_decode(start, (size_t)(eq - start), start,
				       (size_t)(eq - start));
		vl = eq == end ? 0 :
		     keysrc_url_decode(eq + 1, (size_t)(end - eq - 1), eq + 1,
				       (size_t)(end - eq - 1));
		if (nl < 0 || vl < 0)
			return 0;
		if ((ignore != NULL && listed(ignore, start, (size_t)nl)) ||
		    (only != NULL && !listed(only, start, (size_t)nl)))
			continue;
		*f = (struct field){ .name = start, .nlen = (size_t)nl,
				     .value = eq + (eq != end), .vlen = (size_t)vl,
				     .pos = fs->n };
		fs->n++;
	}
	qsort(fs->f, fs->n, sizeof(*fs->f), by_name);
	return 1;
}

/* The fields, each name and value length-prefixed. */
static int fields_put(const struct fields *fs, struct evbuffer *out)
{
	for (size_t i = 0; i < fs->n; i++)
		if (put_bytes(out, fs->f[i].name, fs->f[i].nlen) < 0 ||
		    put_bytes(out, fs->f[i].value, fs->f[i].vlen) < 0)
			return -1;
	return 0;
}

/* Percent-encode all but RFC 3986's unreserved characters. */
static int put_encoded(struct evbuffer *out, const char *s, size_t len)
{
	static const char hex[] = "0123456789ABCDEF";

	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		char esc[3] = { '%', hex[c >> 4], hex[c & 15] };
		bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
			     (c >= '0' && c <= '9') || c == '-' || c == '.' ||
			     c == '_' || c == '~';

		if (evbuffer_add(out, plain ? (const char *)&s[i] : esc,
				 plain ? 1 : 3) < 0)
			return -1;
	}
	return 0;
}

/*
 * The target as fingerprint_query says into out: the path and the query's
 * parameters sorted and encoded alike (a query with a malformed escape
 * stays as it came), or the path alone.
 */
static int shape_target(const struct policy *p, const char *target,
			struct evbuffer *out)
{
	size_t path = strcspn(target, "?"), qlen;
	const char *q = target + path + (target[path] == '?');
	struct fields fs;
	int rc;

	if (p->fp_query == FP_QUERY_EXACT)
		return evbuffer_add(out, target, strlen(target));
	if (evbuffer_add(out, target, path) < 0)
		return -1;
	if (p->fp_query == FP_QUERY_IGNORE)
		return 0;
	qlen = strcspn(q, "#");
	rc = fields_parse(q, qlen, NULL, NULL, &fs);
	if (rc == 0)
		rc = evbuffer_add(out, target + path, strlen(target + path)) < 0 ?
		     -1 : 0;
	for (size_t i = 0; rc == 1 && i < fs.n; i++) {
		if (evbuffer_add(out, i == 0 ? "?" : "&", 1) < 0 ||
		    put_encoded(out, fs.f[i].name, fs.f[i].nlen) < 0 ||
		    evbuffer_add(out, "=", 1) < 0 ||
		    put_encoded(out, fs.f[i].value, fs.f[i].vlen) < 0)
			rc = -1;
	}
	fields_free(&fs);
	return rc < 0 ? -1 : 0;
}

/* ---- JSON ----------------------------------------------------------------- */

/*
 * A place a pointer names in the body as the client sent it (RFC 6901):
 * the member of an object or the element of an array that holds it.
 */
struct place {
	struct json_object *in;		/* the object or array */
	const char *name;		/* in an object: the member's name */
	size_t index;			/* in an array: the element's */
	size_t depth;			/* tokens of the pointer before its last */
	struct json_object *value;	/* what is there (NULL: null) */
};

/* Pointer token tok[0..n) unescaped (~1 '/', ~0 '~', one pass) into out,
 * which has room for n + 1 bytes. */
static void token_unescape(const char *tok, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		*out++ = tok[i] == '~' && i + 1 < n ?
			 (tok[++i] == '1' ? '/' : '~') : tok[i];
	*out = '\0';
}

/* An RFC 6901 array index: "0", or digits without a leading zero, below
 * len ("-" names the element after the last: none). */
static bool array_index(const char *tok, size_t len, size_t *out)
{
	size_t i = 0, v = 0;

	if (tok[0] == '\0' || (tok[0] == '0' && tok[1] != '\0'))
		return false;
	for (; tok[i] != '\0'; i++) {
		if (tok[i] < '0' || tok[i] > '9' || v >= len)
			return false;
		v = v * 10 + (size_t)(tok[i] - '0');
	}
	if (v >= len)
		return false;
	*out = v;
	return true;
}

/*
 * The place pointer[0..n) (a pointer fpshape_check() took: "/a/0/b")
 * names in root (RFC 6901), read against root as it is, into *pl; the
 * names of its tokens are written to buf (n + 1 bytes), which the place's
 * name then points into. false when it names nothing: a member or element
 * that is not there ("-" included), a step through a value that is
 * neither object nor array.
 */
static bool json_place(struct json_object *root, const char *pointer, size_t n,
		       char *buf, struct place *pl)
{
	struct json_object *at = root;
	size_t depth = 0;

	if (n == 0 || pointer[0] != '/')
		return false;		/* not a pointer: fpshape_check() */
	for (size_t i = 0; i < n; depth++) {
		size_t start = i + 1, end = start;

		while (end < n && pointer[end] != '/')
			end++;
		token_unescape(pointer + start, end - start, buf + start);
		*pl = (struct place){ .in = at, .depth = depth };
		if (json_object_is_type(at, json_type_object)) {
			pl->name = buf + start;
			if (!json_object_object_get_ex(at, pl->name, &at))
				return false;
		} else if (json_object_is_type(at, json_type_array)) {
			if (!array_index(buf + start, json_object_array_length(at),
					 &pl->index))
				return false;
			at = json_object_array_get_idx(at, pl->index);
		} else {
			return false;	/* a string, a number, null */
		}
		i = end;
	}
	pl->value = at;
	return true;
}

/*
 * Deepest first, then by container, then elements from the last: removing
 * them in this order, no removal moves or frees a place still to remove.
 * A place inside another that is removed goes first (deeper), and a later
 * element of an array goes before an earlier one, whose removal shifts it.
 */
static int by_removal(const void *a, const void *b)
{
	const struct place *x = a, *y = b;

	if (x->depth != y->depth)
		return x->depth > y->depth ? -1 : 1;
	if (x->in != y->in)
		return (uintptr_t)x->in < (uintptr_t)y->in ? -1 : 1;
	if (x->name != NULL || y->name != NULL)	/* one container: one kind */
		return strcmp(x->name, y->name);
	if (x->index != y->index)
		return x->index > y->index ? -1 : 1;
	return 0;
}

/*
 * Remove from root every place the pointers of list name. Each names a
 * place in the body as the client sent it, whatever the others remove:
 * all are found first, then removed in by_removal()'s order, each once.
 * -1: out of memory.
 */
static int json_remove(struct json_object *root, const char *list)
{
	size_t len = strlen(list), count = 1, n = 0;
	char *buf = malloc(len + 1);
	struct place *pl;
	int rc = 0;

	for (size_t i = 0; i < len; i++)
		count += list[i] == ',';
	pl = calloc(count, sizeof(*pl));
	if (buf == NULL || pl == NULL) {
		rc = -1;
		goto out;
	}
	/* each pointer's names go where it is in list: no two overlap */
	for (const char *p = list; p != NULL;) {
		size_t plen = strcspn(p, ",");

		if (json_place(root, p, plen, buf + (p - list), &pl[n]))
			n++;
		p = p[plen] == ',' ? p + plen + 1 : NULL;
	}
	qsort(pl, n, sizeof(*pl), by_removal);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		if (i > 0 && by_removal(&pl[i - 1], &pl[i]) == 0)
			continue;	/* named twice */
		if (pl[i].name != NULL)
			json_object_object_del(pl[i].in, pl[i].name);
		else if (json_object_array_del_idx(pl[i].in, pl[i].index, 1) < 0)
			rc = -1;
	}
out:
	free(pl);
	free(buf);
	return rc;
}

/* Each of only's pointers, with the canonical form of its value or a mark
 * that it has none (json_place(), as for fingerprint_ignore). */
static int json_only(struct json_object *root, const char *only,
		     struct evbuffer *out)
{
	struct evbuffer *v = evbuffer_new();
	char *buf = malloc(strlen(only) + 1);
	int rc = v != NULL && buf != NULL ? 0 : -1;

	while (rc == 0 && only != NULL) {
		size_t n = strcspn(only, ",");
		struct place pl;
		bool found = json_place(root, only, n, buf, &pl);

		evbuffer_drain(v, evbuffer_get_length(v));
		if (put_bytes(out, only, n) < 0 ||
		    evbuffer_add(out, found ? "\1" : "\0", 1) < 0 ||
		    (found && (jcs_write(v, pl.value) < 0 ||
			       put_u64(out, evbuffer_get_length(v)) < 0 ||
			       evbuffer_add_buffer(out, v) < 0)))
			rc = -1;
		only = only[n] == ',' ? only + n + 1 : NULL;
	}
	free(buf);
	if (v != NULL)
		evbuffer_free(v);
	return rc;
}

bool fpshape_media(enum fp_body body, const char *ctype)
{
	static const char form[] = "application/x-www-form-urlencoded";
	static const char json[] = "application/json";
	const char *end, *slash, *rest;
	size_t n;

	if (body == FP_BODY_RAW)
		return true;
	if (ctype == NULL)
		return false;
	while (*ctype == ' ' || *ctype == '\t')
		ctype++;
	end = ctype + strcspn(ctype, "; \t");
	for (rest = end; *rest == ' ' || *rest == '\t'; rest++)
		;
	if (*rest != '\0' && *rest != ';')
		return false;		/* "application/json x" */
	n = (size_t)(end - ctype);
	if (body == FP_BODY_FORM)
		return n == sizeof(form) - 1 && strncasecmp(ctype, form, n) == 0;
	if (n == sizeof(json) - 1 && strncasecmp(ctype, json, n) == 0)
		return true;
	/* type/subtype+json (RFC 6839): application/problem+json */
	slash = memchr(ctype, '/', n);
	return slash != NULL && slash > ctype && end - slash > 6 &&
	       memchr(slash + 1, '/', (size_t)(end - slash - 1)) == NULL &&
	       strncasecmp(end - 5, "+json", 5) == 0;
}

/* The body as p shapes it into out, and what out holds ('j', 'p', 'f'),
 * or 'r' when it is not JSON / a form, by its Content-Type ctype or its
 * bytes. -1: out of memory. */
static int shape_body(const struct policy *p, const char *ctype,
		      const char *body, size_t len, struct evbuffer *out)
{
	struct json_object *root;
	struct fields fs;
	int rc;

	if (!fpshape_media(p->fp_body, ctype))
		return 'r';
	if (p->fp_body == FP_BODY_FORM) {
		rc = fields_parse(body, len, p->fp_ignore, p->fp_only, &fs);
		if (rc == 1)
			rc = fields_put(&fs, out) < 0 ? -1 : 'f';
		fields_free(&fs);
		return rc == 0 ? 'r' : rc;
	}
	if (p->fp_body != FP_BODY_JSON || (root = jcs_parse(body, len)) == NULL)
		return 'r';
	if (p->fp_only != NULL)
		rc = json_only(root, p->fp_only, out) < 0 ? -1 : 'p';
	else if (p->fp_ignore != NULL && json_remove(root, p->fp_ignore) < 0)
		rc = -1;
	else
		rc = jcs_write(out, root) < 0 ? -1 : 'j';
	json_object_put(root);
	return rc;
}

int fpshape_compute(const struct policy *p, const char *method,
		    const char *target, const char *ctype, const char *body,
		    size_t len, uint8_t out[FP_LEN], bool *fallback)
{
	struct iovec v = { .iov_base = (void *)body, .iov_len = len };
	struct evbuffer *t = NULL, *b = NULL;
	char small[256], *desc = small;
	int dlen, kind, rc = -1;

	*fallback = false;
	if (fpshape_is_default(p))
		return fp_compute(method, target, &v, len > 0, out);
	dlen = describe(p, small, sizeof(small));
	if (dlen < 0)
		return -1;
	if ((size_t)dlen >= sizeof(small)) {
		if ((desc = malloc((size_t)dlen + 1)) == NULL)
			return -1;
		(void)describe(p, desc, (size_t)dlen + 1);
	}
	t = evbuffer_new();
	b = evbuffer_new();
	if (t == NULL || b == NULL || shape_target(p, target, t) < 0)
		goto out;
	kind = shape_body(p, ctype, body, len, b);
	if (kind < 0)
		goto out;
	*fallback = kind == 'r' && p->fp_body != FP_BODY_RAW;
	if (kind != 'r') {
		v.iov_len = evbuffer_get_length(b);
		v.iov_base = evbuffer_pullup(b, -1);
	}
	rc = fp_compute_shaped(desc, (size_t)dlen, method,
			       (const char *)evbuffer_pullup(t, -1),
			       evbuffer_get_length(t), (char)kind, &v,
			       v.iov_len > 0, out);
out:
	if (desc != small)
		free(desc);
	if (t != NULL)
		evbuffer_free(t);
	if (b != NULL)
		evbuffer_free(b);
	return rc;
}
