/*
 * policy.c - the words of a policy's modes, and its copy and free (see
 * policy.h).
 */
#include "policy.h"

#include <stdlib.h>
#include <string.h>

#include "jwt.h"

const struct setting_word policy_in_flight_words[] = {
	{ "wait", IN_FLIGHT_WAIT },
	{ "reject", IN_FLIGHT_REJECT },
	{ NULL, 0 },
};

const struct setting_word policy_store_down_words[] = {
	{ "fail-closed", STORE_DOWN_FAIL_CLOSED },
	{ "fail-open", STORE_DOWN_FAIL_OPEN },
	{ NULL, 0 },
};

const struct setting_word policy_upstream_error_words[] = {
	{ "release", UPSTREAM_ERROR_RELEASE },
	{ "keep", UPSTREAM_ERROR_KEEP },
	{ NULL, 0 },
};

const struct setting_word policy_unknown_words[] = {
	{ "keep", UNKNOWN_KEEP },
	{ "release", UNKNOWN_RELEASE },
	{ NULL, 0 },
};

const struct setting_word policy_verify_format_words[] = {
	{ "github", VERIFY_GITHUB },
	{ "stripe", VERIFY_STRIPE },
	{ NULL, 0 },
};

const struct setting_word policy_fp_body_words[] = {
	{ "body", FP_BODY_RAW },
	{ "json", FP_BODY_JSON },
	{ "form", FP_BODY_FORM },
	{ NULL, 0 },
};

const struct setting_word policy_fp_query_words[] = {
	{ "exact", FP_QUERY_EXACT },
	{ "sorted", FP_QUERY_SORTED },
	{ "ignore", FP_QUERY_IGNORE },
	{ NULL, 0 },
};

static void secret_free(struct policy *p)
{
	if (p->verify_secret != NULL)
		memset(p->verify_secret, 0, p->verify_secret_len);
	free(p->verify_secret);
	p->verify_secret = NULL;
	p->verify_secret_len = 0;
}

int policy_set_secret(struct policy *p, const char *secret)
{
	char *copy = strdup(secret);

	if (copy == NULL)
		return -1;
	secret_free(p);
	p->verify_secret = copy;
	p->verify_secret_len = strlen(secret);
	return 0;
}

void policy_free(struct policy *p)
{
	free(p->key_name);
	free(p->key_prefix);
	free(p->scope_name);
	free(p->verify_header);
	free(p->jwt_keys_file);
	free(p->jwt_issuer);
	free(p->jwt_audience);
	if (p->jwt_keys != NULL)
		jwt_keys_free(p->jwt_keys);
	free(p->fp_ignore);
	free(p->fp_only);
	free(p->probe_method);
	free(p->probe_target);
	secret_free(p);
	memset(p, 0, sizeof(*p));
}

static char *dup_or_null(const char *s)
{
	return s != NULL ? strdup(s) : NULL;
}

int policy_copy(struct policy *dst, const struct policy *src)
{
	*dst = *src;
	dst->key_name = dup_or_null(src->key_name);
	dst->key_prefix = dup_or_null(src->key_prefix);
	dst->scope_name = dup_or_null(src->scope_name);
	dst->jwt_keys_file = dup_or_null(src->jwt_keys_file);
	dst->jwt_keys = NULL;
	dst->jwt_issuer = dup_or_null(src->jwt_issuer);
	dst->jwt_audience = dup_or_null(src->jwt_audience);
	dst->verify_header = dup_or_null(src->verify_header);
	dst->fp_ignore = dup_or_null(src->fp_ignore);
	dst->fp_only = dup_or_null(src->fp_only);
	dst->probe_method = dup_or_null(src->probe_method);
	dst->probe_target = dup_or_null(src->probe_target);
	dst->verify_secret = NULL;
	if (src->verify_secret != NULL) {
		dst->verify_secret = malloc(src->verify_secret_len + 1);
		if (dst->verify_secret != NULL)
			memcpy(dst->verify_secret, src->verify_secret,
			       src->verify_secret_len + 1);
	}
	if ((src->key_name && !dst->key_name) ||
	    (src->key_prefix && !dst->key_prefix) ||
	    (src->scope_name && !dst->scope_name) ||
	    (src->jwt_keys_file && !dst->jwt_keys_file) ||
	    (src->jwt_issuer && !dst->jwt_issuer) ||
	    (src->jwt_audience && !dst->jwt_audience) ||
	    (src->verify_header && !dst->verify_header) ||
	    (src->fp_ignore && !dst->fp_ignore) ||
	    (src->fp_only && !dst->fp_only) ||
	    (src->probe_method && !dst->probe_method) ||
	    (src->probe_target && !dst->probe_target) ||
	    (src->verify_secret && !dst->verify_secret))
		return -1;
	return 0;
}
