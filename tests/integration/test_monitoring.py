"""The dashboard and the alert rules (issue 13): promtool accepts the rules
and their unit tests pass, every metric the dashboard and the rules query
is one a running instance exports (so they cannot drift from the binary),
and the dashboard JSON has what Grafana needs to load it.
"""
import json
import os
import re
import shutil
import subprocess

import pytest

from support.procs import ROOT, wait_readyz
from test_idempotency import newkey, post, replayed

PROM = os.path.join(ROOT, "deploy", "prometheus")
RULES = os.path.join(PROM, "idemproxy-rules.yml")
RULES_TEST = os.path.join(PROM, "idemproxy-rules.test.yml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "idemproxy.json")
DASHBOARD_PY = os.path.join(ROOT, "deploy", "grafana", "dashboard.py")

PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "rate", "irate", "increase", "by",
    "without", "on", "ignoring", "and", "or", "unless", "histogram_quantile",
    "bool", "offset", "group_left", "group_right", "topk", "bottomk",
    "abs", "clamp_min", "clamp_max", "le", "job", "instance", "outcome",
    "cause", "reason", "store",
}


def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian package prometheus: "
                    "deploy/install-deps.sh)")
    return path


def rules_doc():
    import yaml
    with open(RULES) as f:
        return yaml.safe_load(f)


def rule_exprs():
    """(recorded names, every expr) of the rules file."""
    recorded, exprs = set(), []
    for group in rules_doc()["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                recorded.add(rule["record"])
            exprs.append(rule["expr"])
    return recorded, exprs


def dashboard_exprs(doc):
    out = []
    for p in doc["panels"]:
        for t in p.get("targets", []):
            out.append(t["expr"])
    return out


def metric_names(expr, recorded):
    """The metric families expr reads: identifiers that are neither PromQL
    words, label names nor recording rules; a histogram's _bucket, _count
    and _sum series count as the histogram."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)    # no label values
    text = re.sub(r"\{[^}]*\}", "{}", text)             # no matchers
    text = re.sub(r"\[[^\]]*\]", "[]", text)            # no ranges
    names = set()
    for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        if word in PROMQL_WORDS or word in recorded or word.startswith("$"):
            continue
        if re.fullmatch(r"(\d+)?[smhdwy]", word):
            continue
        names.add(re.sub(r"_(bucket|count|sum)$", "", word))
    return names


def exported_families(metrics_text):
    return set(re.findall(r"^# TYPE (\S+) \S+$", metrics_text, re.M))


def test_promtool_check_and_unit_tests():
    tool = promtool()
    r = subprocess.run([tool, "check", "rules", RULES], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
    r = subprocess.run([tool, "test", "rules", RULES_TEST], cwd=PROM,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_catches_a_broken_rule(tmp_path):
    """The check can fail: an expression that does not parse is refused."""
    tool = promtool()
    bad = tmp_path / "bad.yml"
    bad.write_text(open(RULES).read().replace(
        "expr: min by (job, instance) (idemproxy_store_up) == 0",
        "expr: min by (job, instance) (idemproxy_store_up == 0"))
    r = subprocess.run([tool, "check", "rules", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0


def test_every_alert_the_issue_names():
    names = {r["alert"] for g in rules_doc()["groups"] for r in g["rules"]
             if "alert" in r}
    assert {"IdempotencyStoreDown", "IdempotencyFailOpen",
            "IdempotencySweeperLag", "IdempotencyKeysStuck",
            "IdempotencyConflictSpike", "IdempotencyUpstreamErrors"} <= names
    for g in rules_doc()["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                assert r["labels"]["severity"] in ("critical", "warning",
                                                   "info")
                assert r["annotations"]["summary"]
                assert "for" in r


def test_extraction_sees_a_made_up_metric():
    """The drift check below can fail: a name the binary does not export
    is found in an expression, and histogram suffixes fold."""
    recorded, _ = rule_exprs()
    names = metric_names(
        'sum by (job) (rate(idemproxy_made_up_total{outcome="x"}[5m])) / '
        'histogram_quantile(0.99, rate(idemproxy_wait_seconds_bucket[5m])) '
        '> job:idemproxy_wait_seconds:p99_5m', recorded)
    assert names == {"idemproxy_made_up_total", "idemproxy_wait_seconds"}


@pytest.mark.stores("postgres+redis")
def test_every_metric_used_is_exported(store_args, make_proxy, stub):
    p = make_proxy(*store_args)
    wait_readyz(p)
    key = newkey("mon")
    assert post(p.port, key).status == 200
    assert replayed(post(p.port, key))
    exported = exported_families(p.metrics())
    assert "idemproxy_requests_total" in exported
    recorded, exprs = rule_exprs()
    with open(DASHBOARD) as f:
        exprs += dashboard_exprs(json.load(f))
    used = set()
    for e in exprs:
        used |= metric_names(e, recorded)
    assert used, "no metric found in the expressions"
    missing = sorted(used - exported)
    assert not missing, f"queried but not exported: {missing}"
    # and the store gauge says what /readyz says
    assert re.search(r"^idemproxy_store_up 1$", p.metrics(), re.M)


def test_dashboard_loads():
    with open(DASHBOARD) as f:
        doc = json.load(f)
    assert doc["title"] and doc["uid"] and isinstance(doc["schemaVersion"],
                                                      int)
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = set()
    titles = []
    for p in doc["panels"]:
        assert p["type"] and p["title"] and p["id"] not in ids
        ids.add(p["id"])
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24
        if p["type"] == "row":
            continue
        titles.append(p["title"].lower())
        assert p["datasource"]["uid"] == "${datasource}"
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"] and t["refId"]
            assert t["datasource"]["uid"] == "${datasource}"
    text = " ".join(titles)
    for what in ("outcome", "replay", "in flight", "wait", "claim latency",
                 "store errors", "sweeper", "upstream latency",
                 "upstream errors", "connections"):
        assert what in text, what


def test_dashboard_is_the_generator_output():
    r = subprocess.run(["/usr/bin/python3", DASHBOARD_PY], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    with open(DASHBOARD) as f:
        assert json.loads(r.stdout) == json.load(f), (
            "deploy/grafana/idemproxy.json is stale: run "
            "deploy/grafana/dashboard.py > deploy/grafana/idemproxy.json")
