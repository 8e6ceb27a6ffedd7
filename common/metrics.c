/*
 * metrics.c - counters, gauges and a latency histogram shared by all threads.
 */
#include "metrics.h"

#include <stdatomic.h>
#include <stdint.h>

/* Upper bounds in seconds, shared by every histogram; then +Inf. */
static const double buckets[] = {
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30,
};
#define NBUCKETS (sizeof(buckets) / sizeof(buckets[0]))

struct histo {
	atomic_ulong bucket[NBUCKETS + 1];
	atomic_ulong sum_us;
};

static struct {
	atomic_ulong outcomes[OUTCOME_COUNT];
	atomic_ulong client_errors[CLIENT_ERROR_COUNT];
	atomic_ulong upstream_errors[UPSTREAM_ERROR_COUNT];
	atomic_ulong tls_errors[TLS_ERROR_COUNT];
	atomic_ulong unknown_causes[UNKNOWN_CAUSE_COUNT];
	atomic_ulong probe_results[PROBE_RESULT_COUNT];
	atomic_long gauges[GAUGE_COUNT];
	atomic_ulong counters[COUNTER_COUNT];
	atomic_ulong store_errors[STORE_KIND_COUNT];
	struct histo histograms[HISTOGRAM_COUNT];
} m;

static const char *const store_kind_names[] = {
#define X(name, label) label,
	STORE_KIND_LIST(X)
#undef X
};

static const struct {
	const char *name, *help;
} counters[] = {
#define X(name, help) { #name, help },
	COUNTER_LIST(X)
#undef X
};

static const struct {
	const char *name, *help;
} histograms[] = {
#define X(name, help) { #name, help },
	HISTOGRAM_LIST(X)
#undef X
};

static const char *const outcome_names[] = {
#define X(name, label) label,
	OUTCOME_LIST(X)
#undef X
};

static const char *const client_error_names[] = {
#define X(name, label) label,
	CLIENT_ERROR_LIST(X)
#undef X
};

static const char *const upstream_error_names[] = {
#define X(name, label) label,
	UPSTREAM_ERROR_LIST(X)
#undef X
};

static const char *const unknown_cause_names[] = {
#define X(name, label) label,
	UNKNOWN_CAUSE_LIST(X)
#undef X
};

static const char *const probe_result_names[] = {
#define X(name, label) label,
	PROBE_RESULT_LIST(X)
#undef X
};

static const char *const tls_error_names[] = {
#define X(name, label) label,
	TLS_ERROR_LIST(X)
#undef X
};

static const struct {
	const char *name, *help;
} gauges[] = {
#define X(name, help) { #name, help },
	GAUGE_LIST(X)
#undef X
};

void metrics_outcome(enum outcome o)
{
	atomic_fetch_add_explicit(&m.outcomes[o], 1, memory_order_relaxed);
}

void metrics_client_error(enum client_error e)
{
	atomic_fetch_add_explicit(&m.client_errors[e], 1, memory_order_relaxed);
}

void metrics_upstream_error(enum upstream_error e)
{
	atomic_fetch_add_explicit(&m.upstream_errors[e], 1, memory_order_relaxed);
}

void metrics_tls_error(enum tls_error e)
{
	atomic_fetch_add_explicit(&m.tls_errors[e], 1, memory_order_relaxed);
}

void metrics_unknown_outcome(enum unknown_cause c)
{
	atomic_fetch_add_explicit(&m.unknown_causes[c], 1, memory_order_relaxed);
}

void metrics_probe(enum probe_result r)
{
	atomic_fetch_add_explicit(&m.probe_results[r], 1, memory_order_relaxed);
}

void metrics_gauge_add(enum gauge g, long delta)
{
	atomic_fetch_add_explicit(&m.gauges[g], delta, memory_order_relaxed);
}

void metrics_count(enum counter c)
{
	atomic_fetch_add_explicit(&m.counters[c], 1, memory_order_relaxed);
}

void metrics_count_n(enum counter c, unsigned long n)
{
	atomic_fetch_add_explicit(&m.counters[c], n, memory_order_relaxed);
}

void metrics_gauge_set(enum gauge g, long value)
{
	atomic_store_explicit(&m.gauges[g], value, memory_order_relaxed);
}

void metrics_store_error(enum store_kind k)
{
	atomic_fetch_add_explicit(&m.store_errors[k], 1, memory_order_relaxed);
}

void metrics_observe(enum histogram h, double seconds)
{
	struct histo *hg = &m.histograms[h];
	size_t i = 0;

	if (seconds < 0)
		seconds = 0;
	while (i < NBUCKETS && seconds > buckets[i])
		i++;
	atomic_fetch_add_explicit(&hg->bucket[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&hg->sum_us, (unsigned long)(seconds * 1e6),
				  memory_order_relaxed);
}

const char *outcome_name(enum outcome o)
{
	return outcome_names[o];
}

const char *client_error_name(enum client_error e)
{
	return client_error_names[e];
}

const char *upstream_error_name(enum upstream_error e)
{
	return upstream_error_names[e];
}

const char *unknown_cause_name(enum unknown_cause c)
{
	return unknown_cause_names[c];
}

static unsigned long load(atomic_ulong *v)
{
	return atomic_load_explicit(v, memory_order_relaxed);
}

/* A counter with one label: HELP, TYPE and a line per value. */
static void labelled(FILE *out, const char *name, const char *help,
		     const char *label, const char *const *values,
		     atomic_ulong *counts, int n)
{
	fprintf(out, "# HELP idemproxy_%s %s\n# TYPE idemproxy_%s counter\n",
		name, help, name);
	for (int i = 0; i < n; i++)
		fprintf(out, "idemproxy_%s{%s=\"%s\"} %lu\n", name, label,
			values[i], load(&counts[i]));
}

void metrics_render(FILE *out)
{
	labelled(out, "requests_total", "Requests by outcome.", "outcome",
		 outcome_names, m.outcomes, OUTCOME_COUNT);
	labelled(out, "client_errors_total", "Requests refused before they "
		 "could be parsed, by reason.", "reason", client_error_names,
		 m.client_errors, CLIENT_ERROR_COUNT);
	labelled(out, "upstream_errors_total", "Failed upstream exchanges, by "
		 "cause.", "cause", upstream_error_names, m.upstream_errors,
		 UPSTREAM_ERROR_COUNT);
	labelled(out, "tls_handshake_errors_total", "Client TLS handshakes "
		 "that failed, by reason.", "reason", tls_error_names,
		 m.tls_errors, TLS_ERROR_COUNT);
	labelled(out, "unknown_outcomes_total", "Keyed requests that may have "
		 "executed and whose outcome is unknown, recorded as such "
		 "(never sent again), by cause.", "cause", unknown_cause_names,
		 m.unknown_causes, UNKNOWN_CAUSE_COUNT);
	labelled(out, "outcome_probes_total", "Answers of outcome probes "
		 "(outcome_probe), by result.", "result", probe_result_names,
		 m.probe_results, PROBE_RESULT_COUNT);
	for (int i = 0; i < GAUGE_COUNT; i++)
		fprintf(out, "# HELP idemproxy_%s %s\n# TYPE idemproxy_%s gauge\n"
			"idemproxy_%s %ld\n", gauges[i].name, gauges[i].help,
			gauges[i].name, gauges[i].name,
			atomic_load_explicit(&m.gauges[i], memory_order_relaxed));

	for (int i = 0; i < COUNTER_COUNT; i++)
		fprintf(out, "# HELP idemproxy_%s %s\n# TYPE idemproxy_%s counter\n"
			"idemproxy_%s %lu\n", counters[i].name, counters[i].help,
			counters[i].name, counters[i].name, load(&m.counters[i]));

	fprintf(out, "# HELP idemproxy_store_errors_total Store calls that "
		"failed, by store.\n"
		"# TYPE idemproxy_store_errors_total counter\n");
	for (int i = 0; i < STORE_KIND_COUNT; i++)
		fprintf(out, "idemproxy_store_errors_total{store=\"%s\"} %lu\n",
			store_kind_names[i], load(&m.store_errors[i]));

	for (int h = 0; h < HISTOGRAM_COUNT; h++) {
		const char *name = histograms[h].name;
		struct histo *hg = &m.histograms[h];
		unsigned long cum = 0;

		fprintf(out, "# HELP idemproxy_%s %s\n# TYPE idemproxy_%s histogram\n",
			name, histograms[h].help, name);
		for (size_t i = 0; i < NBUCKETS; i++) {
			cum += load(&hg->bucket[i]);
			fprintf(out, "idemproxy_%s_bucket{le=\"%g\"} %lu\n", name,
				buckets[i], cum);
		}
		cum += load(&hg->bucket[NBUCKETS]);
		fprintf(out, "idemproxy_%s_bucket{le=\"+Inf\"} %lu\n"
			"idemproxy_%s_sum %.6f\nidemproxy_%s_count %lu\n",
			name, cum, name, load(&hg->sum_us) / 1e6, name, cum);
	}
}
