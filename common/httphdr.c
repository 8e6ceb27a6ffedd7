/*
 * httphdr.c - header collection and the hop-by-hop rules (see httphdr.h).
 */
#include "httphdr.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Arenas larger than this are released between messages, so an idle
 * keep-alive connection holds almost nothing. */
#define HDR_KEEP_ARENA 2048
#define HDR_KEEP_FIELDS 32

enum {
	HDR_OPEN_NONE,		/* between fields */
	HDR_OPEN_NAME,		/* pieces extend the last field's name */
	HDR_OPEN_VALUE,		/* pieces extend the last field's value */
};

void hdrlist_init(struct hdrlist *h)
{
	memset(h, 0, sizeof(*h));
}

void hdrlist_reset(struct hdrlist *h)
{
	if (h->cap > HDR_KEEP_ARENA) {
		free(h->arena);
		h->arena = NULL;
		h->cap = 0;
	}
	if (h->alloc > HDR_KEEP_FIELDS) {
		free(h->v);
		h->v = NULL;
		h->alloc = 0;
	}
	h->used = 0;
	h->n = 0;
	h->open = HDR_OPEN_NONE;
}

void hdrlist_free(struct hdrlist *h)
{
	free(h->arena);
	free(h->v);
	hdrlist_init(h);
}

/* Make room for len more bytes plus a NUL. */
static int arena_reserve(struct hdrlist *h, size_t len)
{
	size_t want = h->used + len + 1;
	size_t cap;
	char *p;

	if (want <= h->cap)
		return 0;
	if (want > UINT32_MAX)
		return -1;
	cap = h->cap ? h->cap : 256;
	while (cap < want)
		cap *= 2;
	p = realloc(h->arena, cap);
	if (p == NULL)
		return -1;
	h->arena = p;
	h->cap = cap;
	return 0;
}

/* Append bytes to the arena, keeping the text NUL-terminated so that names
 * and values can be used as C strings. The NUL of the previous piece is
 * overwritten when a piece continues it. */
static int arena_append(struct hdrlist *h, const char *p, size_t len)
{
	if (arena_reserve(h, len) < 0)
		return -1;
	memcpy(h->arena + h->used, p, len);
	h->used += len;
	h->arena[h->used] = '\0';
	return 0;
}

static int new_field(struct hdrlist *h)
{
	struct hdr *v;

	if (h->n == h->alloc) {
		uint32_t alloc = h->alloc ? h->alloc * 2 : 16;

		v = realloc(h->v, alloc * sizeof(*v));
		if (v == NULL)
			return -1;
		h->v = v;
		h->alloc = alloc;
	}
	/* Terminate the previous value; a new field always starts after a NUL. */
	if (h->used > 0 && arena_reserve(h, 0) == 0)
		h->used++;
	if (arena_reserve(h, 0) < 0)
		return -1;
	v = &h->v[h->n++];
	v->name_off = (uint32_t)h->used;
	v->name_len = 0;
	v->value_off = (uint32_t)h->used;
	v->value_len = 0;
	h->arena[h->used] = '\0';
	return 0;
}

int hdrlist_add_name(struct hdrlist *h, const char *p, size_t len)
{
	struct hdr *v;

	if (h->open != HDR_OPEN_NAME) {
		if (new_field(h) < 0)
			return -1;
		h->open = HDR_OPEN_NAME;
	}
	v = &h->v[h->n - 1];
	if (arena_append(h, p, len) < 0)
		return -1;
	v->name_len += (uint32_t)len;
	v->value_off = (uint32_t)h->used + 1;
	return 0;
}

int hdrlist_add_value(struct hdrlist *h, const char *p, size_t len)
{
	struct hdr *v;

	if (h->n == 0 || h->open == HDR_OPEN_NONE)
		return -1;
	v = &h->v[h->n - 1];
	if (h->open == HDR_OPEN_NAME) {
		/* step over the name's NUL */
		if (arena_reserve(h, 1) < 0)
			return -1;
		h->used++;
		h->arena[h->used] = '\0';
		v->value_off = (uint32_t)h->used;
		h->open = HDR_OPEN_VALUE;
	}
	if (arena_append(h, p, len) < 0)
		return -1;
	v->value_len += (uint32_t)len;
	return 0;
}

int hdrlist_end_field(struct hdrlist *h)
{
	if (h->open == HDR_OPEN_NAME && hdrlist_add_value(h, "", 0) < 0)
		return -1;
	h->open = HDR_OPEN_NONE;
	return 0;
}

int hdrlist_add(struct hdrlist *h, const char *name, const char *value)
{
	if (hdrlist_add_name(h, name, strlen(name)) < 0 ||
	    hdrlist_add_value(h, value, strlen(value)) < 0)
		return -1;
	return hdrlist_end_field(h);
}

int hdrlist_find(const struct hdrlist *h, const char *name, uint32_t from)
{
	size_t len = strlen(name);

	for (uint32_t i = from; i < h->n; i++)
		if (h->v[i].name_len == len &&
		    strncasecmp(hdr_name(h, i), name, len) == 0)
			return (int)i;
	return -1;
}

static bool name_is(const char *name, size_t len, const char *want)
{
	return strlen(want) == len && strncasecmp(name, want, len) == 0;
}

bool httphdr_is_hop_by_hop(const char *name, size_t len)
{
	static const char *const hop[] = {
		"connection", "keep-alive", "proxy-connection", "te",
		"trailer", "transfer-encoding", "upgrade",
	};

	for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
		if (name_is(name, len, hop[i]))
			return true;
	return false;
}

/* c with '_' read as '-' and ASCII letters lower-cased. */
static char fold(char c)
{
	if (c == '_')
		return '-';
	return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

bool httphdr_name_folds_to(const char *s, size_t len, const char *name)
{
	if (strlen(name) != len)
		return false;
	for (size_t i = 0; i < len; i++)
		if (fold(s[i]) != fold(name[i]))
			return false;
	return true;
}

static bool is_ows(char c)
{
	return c == ' ' || c == '\t';
}

bool httphdr_list_has(const char *list, size_t len, const char *token)
{
	size_t i = 0;

	while (i < len) {
		size_t start, end;

		while (i < len && (is_ows(list[i]) || list[i] == ','))
			i++;
		start = i;
		while (i < len && list[i] != ',')
			i++;
		end = i;
		while (end > start && is_ows(list[end - 1]))
			end--;
		if (end > start && name_is(list + start, end - start, token))
			return true;
	}
	return false;
}

bool httphdr_drop_on_forward(const struct hdrlist *h, uint32_t i)
{
	const char *name = hdr_name(h, i);
	size_t len = h->v[i].name_len;

	if (httphdr_is_hop_by_hop(name, len) ||
	    name_is(name, len, "content-length"))
		return true;
	/* fields named as connection options in any Connection field */
	for (int c = hdrlist_find(h, "connection", 0); c >= 0;
	     c = hdrlist_find(h, "connection", (uint32_t)c + 1)) {
		const char *list = hdr_value(h, (uint32_t)c);
		size_t llen = h->v[c].value_len;
		size_t p = 0;

		while (p < llen) {
			size_t s, e;

			while (p < llen && (is_ows(list[p]) || list[p] == ','))
				p++;
			s = p;
			while (p < llen && list[p] != ',')
				p++;
			e = p;
			while (e > s && is_ows(list[e - 1]))
				e--;
			if (e - s == len && strncasecmp(list + s, name, len) == 0)
				return true;
		}
	}
	return false;
}

/* RFC 9110 tchar: ALPHA, DIGIT and "!#$%&'*+-.^_`|~", as two bit masks of
 * the ASCII range (every byte of every field name is looked up here) */
#define TC_BIT(c) (UINT64_C(1) << ((c) & 63))
#define TC_RUN(first, n) (((UINT64_C(1) << (n)) - 1) << ((first) & 63))
static const uint64_t tchar_lo =	/* 0x00-0x3f */
	TC_BIT('!') | TC_BIT('#') | TC_BIT('$') | TC_BIT('%') | TC_BIT('&') |
	TC_BIT('\'') | TC_BIT('*') | TC_BIT('+') | TC_BIT('-') | TC_BIT('.') |
	TC_RUN('0', 10);
static const uint64_t tchar_hi =	/* 0x40-0x7f */
	TC_RUN('A', 26) | TC_BIT('^') | TC_BIT('_') | TC_BIT('`') |
	TC_RUN('a', 26) | TC_BIT('|') | TC_BIT('~');
#undef TC_BIT
#undef TC_RUN

static bool is_tchar(unsigned char c)
{
	if (c < 64)
		return (tchar_lo >> c) & 1;
	return c < 128 && ((tchar_hi >> (c - 64)) & 1);
}

bool httphdr_is_token(const char *s, size_t len)
{
	if (len == 0)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!is_tchar((unsigned char)s[i]))
			return false;
	return true;
}

/*
 * Does any byte of w lie below 0x20 or equal 0x7f? Eight bytes at a time
 * (the "has less" and "has zero" tricks): the yes or no is exact, though a
 * borrow may also flag bytes above a true one, so the caller looks at the
 * bytes one by one when it says yes. Most values have no control byte at
 * all, and this takes a fifth of the instructions of the byte loop.
 */
static bool word_has_ctl(uint64_t w)
{
	const uint64_t ones = 0x0101010101010101ULL;
	const uint64_t highs = 0x8080808080808080ULL;
	uint64_t del = w ^ (ones * 0x7f);

	return (((w - ones * 0x20) & ~w) | ((del - ones) & ~del)) & highs;
}

/* Is every byte of the value HTAB, SP, VCHAR or obs-text (RFC 9110)? */
static bool value_ok(const unsigned char *v, size_t len)
{
	size_t k = 0;

	for (; k + 8 <= len; k += 8) {
		uint64_t w;

		memcpy(&w, v + k, sizeof(w));
		if (word_has_ctl(w))
			break;		/* maybe only a tab */
	}
	for (; k < len; k++)
		if ((v[k] < 0x20 && v[k] != '\t') || v[k] == 0x7f)
			return false;
	return true;
}

int httphdr_validate(const struct hdrlist *h)
{
	for (uint32_t i = 0; i < h->n; i++) {
		if (!httphdr_is_token(hdr_name(h, i), h->v[i].name_len) ||
		    !value_ok((const unsigned char *)hdr_value(h, i),
			      h->v[i].value_len))
			return -1;
	}
	return 0;
}
