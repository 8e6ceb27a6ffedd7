/* Metrics registry and problem documents (common/metrics.c, problem.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "problem.h"
#include "tap.h"

static char *render(void)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	metrics_render(f);
	fclose(f);
	return text;
}

static void test_metrics(void)
{
	char *text;

	metrics_outcome(OUTCOME_PASSTHROUGH);
	metrics_outcome(OUTCOME_PASSTHROUGH);
	metrics_outcome(OUTCOME_REPLAYED);
	metrics_gauge_add(GAUGE_connections, 3);
	metrics_gauge_add(GAUGE_connections, -1);
	metrics_observe(HISTOGRAM_upstream_seconds, 0.0001);
	metrics_observe(HISTOGRAM_upstream_seconds, 0.003);
	metrics_observe(HISTOGRAM_upstream_seconds, 100);
	metrics_client_error(CLIENT_ERROR_HEADERS_TOO_LARGE);
	text = render();
	ok(strstr(text, "idemproxy_requests_total{outcome=\"passthrough\"} 2\n") != NULL,
	   "passthrough counted twice");
	ok(strstr(text, "idemproxy_requests_total{outcome=\"replayed\"} 1\n") != NULL,
	   "replayed counted");
	ok(strstr(text, "idemproxy_requests_total{outcome=\"fail_open\"} 0\n") != NULL,
	   "every outcome present");
	ok(strstr(text, "idemproxy_connections 2\n") != NULL, "gauge value");
	ok(strstr(text, "idemproxy_upstream_seconds_bucket{le=\"0.0005\"} 1\n") != NULL,
	   "first bucket");
	ok(strstr(text, "idemproxy_upstream_seconds_bucket{le=\"0.005\"} 2\n") != NULL,
	   "buckets are cumulative");
	ok(strstr(text, "idemproxy_upstream_seconds_bucket{le=\"+Inf\"} 3\n") != NULL,
	   "+Inf holds everything");
	ok(strstr(text, "idemproxy_upstream_seconds_count 3\n") != NULL, "count");
	ok(strstr(text, "idemproxy_client_errors_total{reason=\"headers_too_large\"} 1\n")
	   != NULL, "client error by reason");
	ok(strstr(text, "# TYPE idemproxy_upstream_seconds histogram\n") != NULL,
	   "histogram type line");
	free(text);
}

static void test_problem(void)
{
	char buf[512];
	size_t len;

	is_int(problem_status(PROBLEM_KEY_MISMATCH), 422, "mismatch is 422");
	is_str(problem_slug(PROBLEM_IN_PROGRESS), "request-in-progress", "slug");
	len = problem_render(PROBLEM_UPSTREAM_TIMEOUT, "said \"slow\"\n", buf,
			     sizeof(buf));
	is_int(len, strlen(buf), "length returned");
	is_str(buf, "{\"type\":\"urn:idemproxy:problem:upstream-timeout\","
	       "\"title\":\"Gateway Timeout\",\"status\":504,"
	       "\"detail\":\"said \\\"slow\\\"\\u000a\","
	       "\"error\":{\"type\":\"api_error\",\"code\":\"upstream-timeout\","
	       "\"message\":\"said \\\"slow\\\"\\u000a\"}}", "JSON escaped");
	problem_render(PROBLEM_BAD_REQUEST, NULL, buf, sizeof(buf));
	ok(strstr(buf, "\"detail\":\"Bad Request\"") != NULL, "title as default detail");
	ok(strstr(buf, "\"message\":\"Bad Request\"}}") != NULL,
	   "title as default message");
	is_str(http_reason(404), "Not Found", "reason phrase");
	is_str(http_reason(299), "", "unknown status");
}

int main(void)
{
	test_metrics();
	test_problem();
	return tap_done();
}
