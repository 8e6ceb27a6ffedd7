#!/usr/bin/env python3
"""Writes deploy/grafana/idemproxy.json, the Grafana dashboard for
idemproxy: edit the panels here and run

    /usr/bin/python3 deploy/grafana/dashboard.py > deploy/grafana/idemproxy.json

tests/integration/test_monitoring.py checks that the committed JSON is
this script's output, that Grafana finds what it needs in it, and that
every metric it queries is one the binary exports.
"""
import json

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance"'


def sel(extra=""):
    return "{" + SEL + (", " + extra if extra else "") + "}"


O_REPLAYED = 'outcome="replayed"'
O_DECIDED = 'outcome=~"forwarded|replayed|conflict|mismatch"'
O_REFUSED = 'outcome=~"conflict|mismatch|missing_key|invalid_key|too_large|busy"'
panels = []
y = 0
pid = 0


def row(title):
    global y, pid
    pid += 1
    panels.append({"type": "row", "title": title, "id": pid, "collapsed": False,
                   "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
    y += 1


x = 0


def panel(title, targets, unit="short", kind="timeseries", w=8, desc=""):
    global x, y, pid
    pid += 1
    if x + w > 24:
        x = 0
        y += 8
    p = {"type": kind, "title": title, "id": pid, "datasource": DS,
         "description": desc,
         "gridPos": {"h": 8, "w": w, "x": x, "y": y},
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
         "options": {"legend": {"displayMode": "list", "placement": "bottom"}}
         if kind == "timeseries" else {},
         "targets": [{"refId": chr(65 + i), "datasource": DS, "expr": e,
                      "legendFormat": l} for i, (e, l) in enumerate(targets)]}
    panels.append(p)
    x += w


def quantiles(metric):
    """p50 and p99 of a histogram over the selected instances."""
    return [(f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{sel()}"
             f"[$__rate_interval])))", f"p{int(q * 100)}") for q in (0.5, 0.99)]


def endrow():
    global x, y
    x = 0
    y += 8


row("Requests")
panel("Requests by outcome",
      [(f"sum by (outcome) (rate(idemproxy_requests_total{sel()}[$__rate_interval]))", "{{outcome}}")],
      "reqps", desc="One outcome per request (docs/operations.md Metrics).")
panel("Replay ratio",
      [(f'sum(rate(idemproxy_requests_total{sel(O_REPLAYED)}[$__rate_interval])) / '
        f'sum(rate(idemproxy_requests_total{sel(O_DECIDED)}[$__rate_interval]))',
        "replayed / keyed")],
      "percentunit", desc="Duplicates answered from a stored response among keyed requests that reached a decision.")
panel("409 / 422 / refused",
      [(f'sum by (outcome) (rate(idemproxy_requests_total{sel(O_REFUSED)}[$__rate_interval]))', "{{outcome}}"),
       (f"sum by (reason) (rate(idemproxy_client_errors_total{sel()}[$__rate_interval]))", "client {{reason}}")],
      "reqps")
endrow()

row("Keys in flight and waits")
panel("In flight (executing upstream)",
      [(f"sum by (instance) (idemproxy_in_flight{sel()})", "{{instance}}")])
panel("Duplicates waiting (rate)",
      [(f"sum(rate(idemproxy_wait_seconds_count{sel()}[$__rate_interval]))", "waits/s")],
      "reqps")
panel("Wait duration",
      quantiles("idemproxy_wait_seconds"),
      "s")
endrow()
panel("Unknown outcomes (never executed again)",
      [(f"sum by (cause) (increase(idemproxy_unknown_outcomes_total{sel()}[$__rate_interval]))", "{{cause}}"),
       (f"sum(increase(idemproxy_unknown_outcomes_released_total{sel()}[$__rate_interval]))", "released (at-least-once)")],
      "short", desc="Keyed requests that reached the upstream with no answer that says what they did (docs/protocol.md \"How an exchange ends\"). Each needs resolving: docs/operations.md \"Unknown outcomes\".")
panel("Outcome probes and late responses",
      [(f"sum by (result) (increase(idemproxy_outcome_probes_total{sel()}[$__rate_interval]))", "probe {{result}}"),
       (f"sum(increase(idemproxy_late_responses_total{sel()}[$__rate_interval]))", "late responses stored")],
      "short")
endrow()

row("Store")
panel("Store up",
      [(f"min by (instance) (idemproxy_store_up{sel()})", "{{instance}}")],
      "bool", kind="stat", w=4)
panel("Claim latency (every layer)",
      quantiles("idemproxy_store_claim_seconds"),
      "s")
panel("Store errors",
      [(f"sum by (store) (rate(idemproxy_store_errors_total{sel()}[$__rate_interval]))", "{{store}}"),
       (f"sum(rate(idemproxy_completion_retries_total{sel()}[$__rate_interval]))", "completion retries"),
       (f"sum(increase(idemproxy_completion_failures_total{sel()}[$__rate_interval]))", "completion failures")],
      "short", w=6)
panel("Replays served by cache layers",
      [(f"sum(rate(idemproxy_response_cache_hits_total{sel()}[$__rate_interval]))", "response cache"),
       (f"sum(rate(idemproxy_redis_hits_total{sel()}[$__rate_interval]))", "redis")],
      "reqps", w=6)
endrow()
panel("Sweeper lag",
      [(f"max(idemproxy_sweep_lag_seconds{sel()})", "lag")], "s")
panel("Expired records deleted",
      [(f"sum(rate(idemproxy_sweep_deleted_total{sel()}[$__rate_interval]))", "deleted/s")], "short")
panel("Response cache size",
      [(f"sum by (instance) (idemproxy_response_cache_bytes{sel()})", "{{instance}} bytes")], "bytes")
endrow()

row("Upstream")
panel("Upstream latency",
      quantiles("idemproxy_upstream_seconds"),
      "s")
panel("Upstream errors",
      [(f"sum by (cause) (rate(idemproxy_upstream_errors_total{sel()}[$__rate_interval]))", "{{cause}}")],
      "short")
panel("Upstream connections",
      [(f"sum by (instance) (idemproxy_upstream_connections{sel()})", "{{instance}}"),
       (f"sum(rate(idemproxy_upstream_tls_handshakes_total{sel()}[$__rate_interval]))", "TLS handshakes/s")])
endrow()

row("Connections")
panel("Client connections",
      [(f"sum by (instance) (idemproxy_connections{sel()})", "{{instance}}")])
panel("TLS handshakes",
      [(f"sum(rate(idemproxy_tls_handshakes_total{sel()}[$__rate_interval]))", "handshakes/s"),
       (f"sum(rate(idemproxy_tls_resumed_total{sel()}[$__rate_interval]))", "resumed/s")],
      "short")
panel("TLS handshake errors",
      [(f"sum by (reason) (rate(idemproxy_tls_handshake_errors_total{sel()}[$__rate_interval]))", "{{reason}}")],
      "short")
endrow()


# The access log (docs/operations.md "Logs and traces") where a Loki data
# source holds it: the keyed requests that did not simply pass, newest
# first. A line's trace_id opens its trace where the Loki data source has
# the derived field of deploy/grafana/datasources.yaml (Grafana links
# fields to traces in the data source, not in a dashboard).
LOGS = {"type": "loki", "uid": "${logs}"}
row("Requests, one by one (access log)")
pid += 1
panels.append({
    "type": "logs", "title": "Keyed requests: outcome, key, trace", "id": pid,
    "datasource": LOGS,
    "description": "The access log's JSON lines (--access-log-format json) "
                   "of keyed requests, from Loki; expand a line and follow "
                   "its trace_id to the trace (derived field, "
                   "deploy/grafana/datasources.yaml).",
    "gridPos": {"h": 10, "w": 24, "x": 0, "y": y},
    "options": {"showTime": True, "wrapLogMessage": False, "sortOrder": "Descending",
                "enableLogDetails": True, "dedupStrategy": "none"},
    "targets": [{"refId": "A", "datasource": LOGS,
                 "expr": '{job=~"$job", instance=~"$instance"} |= "request_id" '
                         '| json | outcome != "passthrough"'}]})
y += 10


def var(name, query, label):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "definition": query, "refresh": 2, "includeAll": True, "multi": True,
            "allValue": ".*", "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1}


dash = {
    "title": "idemproxy",
    "uid": "idemproxy",
    "description": "idemproxy: request outcomes, replays, keys in flight and waits, the store, the upstream, connections (docs/operations.md).",
    "tags": ["idemproxy"],
    "timezone": "",
    "schemaVersion": 38,
    "version": 1,
    "editable": True,
    "refresh": "30s",
    "time": {"from": "now-3h", "to": "now"},
    "templating": {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource",
         "query": "prometheus", "current": {}, "hide": 0, "refresh": 1},
        {"name": "logs", "label": "Logs", "type": "datasource",
         "query": "loki", "current": {}, "hide": 0, "refresh": 1},
        var("job", "label_values(idemproxy_requests_total, job)", "Job"),
        var("instance", 'label_values(idemproxy_requests_total{job=~"$job"}, instance)', "Instance"),
    ]},
    "annotations": {"list": []},
    "panels": panels,
}
print(json.dumps(dash, indent=2))

