/*
 * idemkey.c - see idemkey.h.
 */
#include "idemkey.h"

#include <stdbool.h>

static bool visible(unsigned char c)
{
	return c >= 0x21 && c <= 0x7e;
}

int idemkey_parse(const char *value, size_t len, char out[IDEMKEY_MAX + 1])
{
	size_t i = 0, n = 0;

	while (len > 0 && (value[0] == ' ' || value[0] == '\t')) {
		value++;
		len--;
	}
	while (len > 0 && (value[len - 1] == ' ' || value[len - 1] == '\t'))
		len--;
	if (len == 0)
		return -1;
	if (value[0] != '"') {
		if (len > IDEMKEY_MAX)
			return -1;
		for (i = 0; i < len; i++) {
			if (!visible((unsigned char)value[i]))
				return -1;
			out[i] = value[i];
		}
		out[len] = '\0';
		return (int)len;
	}
	/* sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE */
	if (len < 2 || value[len - 1] != '"')
		return -1;
	for (i = 1; i < len - 1; i++) {
		unsigned char c = (unsigned char)value[i];

		if (c == '\\') {
			if (i + 1 >= len - 1)
				return -1;
			c = (unsigned char)value[++i];
			if (c != '"' && c != '\\')
				return -1;
		} else if (c == '"') {
			return -1;	/* an unescaped quote inside */
		}
		/* sf-strings may hold spaces; keys may not */
		if (!visible(c) || n == IDEMKEY_MAX)
			return -1;
		out[n++] = (char)c;
	}
	if (n == 0)
		return -1;
	out[n] = '\0';
	return (int)n;
}
