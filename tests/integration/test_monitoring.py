"""The dashboard and the alert rules (issue 13): promtool accepts the rules
and their unit tests pass; every metric the dashboard, the rules and the
PromQL of docs/operations.md query is one a running instance exports, and
every label value they match on is one it writes (so none of them can
drift from the binary); the dashboard JSON has what Grafana needs to load
it. Each check is shown to fail on a broken copy.
"""
import copy
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
OPERATIONS = os.path.join(ROOT, "docs", "operations.md")

# PromQL words that are neither metrics nor followed by "(" (functions and
# aggregations always are, so they need no list).
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without",
                   "on", "ignoring", "group_left", "group_right", "inf",
                   "nan", "atan2"}
# Labels Prometheus adds at scrape time: the binary does not write them.
TARGET_LABELS = {"job", "instance"}
IDENT = r"(?<![\w.:$])[a-zA-Z_:][a-zA-Z0-9_:]*"
STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`'
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


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


def rule_exprs(doc):
    """(recorded names, every expr) of a rules document."""
    recorded, exprs = set(), []
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                recorded.add(rule["record"])
            exprs.append(rule["expr"])
    return recorded, exprs


def dashboard_doc():
    with open(DASHBOARD) as f:
        return json.load(f)


def dashboard_exprs(doc):
    """The panels' PromQL queries and the query variables' metrics (the
    access log's panel queries Loki: LogQL, not metrics)."""
    out = []
    for p in doc["panels"]:
        for t in p.get("targets", []):
            if t["datasource"]["type"] == "prometheus":
                out.append(t["expr"])
    for v in doc["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) \
                else v["query"]
            # label_values(SELECTOR, LABEL): only SELECTOR is PromQL
            m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", q)
            out.append(m.group(1) if m else q)
    return out


def docs_exprs():
    """PromQL lines of docs/operations.md: the lines of its unlabelled code
    blocks that read an idemproxy_ metric, '#' comments left out."""
    blocks, block = [], None
    with open(OPERATIONS) as f:
        for line in f:
            line = line.rstrip("\n")
            if block is None:
                if line.startswith("```"):
                    # "skip": a block with a language (sh, sql, ...)
                    block = [] if line == "```" else "skip"
            elif line.startswith("```"):
                if block != "skip":
                    blocks.append(block)
                block = None
            elif block != "skip":
                block.append(line)
    out = []
    for lines in blocks:
        lines = [ln for ln in lines
                 if ln.strip() and not ln.lstrip().startswith("#")]
        if lines and all(re.search(r"\bidemproxy_\w", ln) for ln in lines):
            out += lines
    return out


def metric_names(expr, recorded=()):
    """The series names expr reads: identifiers outside strings, matchers,
    ranges and grouping clauses that are not followed by "(" (functions,
    aggregations), not PromQL keywords and not recording rules."""
    text = re.sub(STRING, '""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)"
                  r"\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(IDENT + r"(\s*\()?", text):
        word = m.group(0).rstrip("( \t\n")
        if m.group(1) or word.lower() in PROMQL_KEYWORDS or word in recorded:
            continue
        names.add(word)
    return names


def label_matchers(expr, recorded=()):
    """(series name, label, operator, value) of every matcher on a named
    series in expr."""
    out = []
    for m in re.finditer(IDENT + r"\s*\{([^}]*)\}", expr):
        name = m.group(0)[:m.group(0).index("{")].strip()
        if name in recorded:
            continue
        for lm in re.finditer(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"',
                              m.group(1)):
            out.append((name, *lm.groups()))
    return out


class Scrape:
    """A /metrics page: its families (name -> type) and, per series name,
    the label values its samples carry (label -> set of values)."""

    def __init__(self, text):
        self.families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        self.labels = {}
        for name, labels in re.findall(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ",
                                       text, re.M):
            seen = self.labels.setdefault(name, {})
            for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels):
                seen.setdefault(k, set()).add(v)

    def has_series(self, name):
        if name in self.families:
            return True
        for suffix in HISTOGRAM_SUFFIXES:
            stem = name[:-len(suffix)]
            if name.endswith(suffix) and \
                    self.families.get(stem) in ("histogram", "summary"):
                return True
        return False


def drift(exprs, recorded, scrape):
    """What exprs query that the scraped binary does not export: unknown
    series names, labels it does not write, label values it never uses."""
    problems = set()
    for e in exprs:
        for name in metric_names(e, recorded):
            if not scrape.has_series(name):
                problems.add(f"metric {name}")
        for name, label, op, value in label_matchers(e, recorded):
            if label in TARGET_LABELS or "$" in value:
                continue
            have = scrape.labels.get(name, {})
            if label not in have:
                problems.add(f"label {name}{{{label}}}")
                continue
            if op in ("=~", "!~"):
                if not re.fullmatch(r"[\w|]+", value):
                    continue        # a real regex: not checked
                wanted = value.split("|")
            else:
                wanted = [value]
            for w in wanted:
                if w not in have[label]:
                    problems.add(f'value {name}{{{label}="{w}"}}')
    return sorted(problems)


def test_promtool_check_and_unit_tests():
    tool = promtool()
    r = subprocess.run([tool, "check", "rules", RULES], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
    r = subprocess.run([tool, "test", "rules", RULES_TEST], cwd=PROM,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_catches_a_broken_rule_and_a_wrong_alert(tmp_path):
    """Both promtool checks can fail: an expression that does not parse is
    refused, and the unit tests see a fail-open alert that never fires."""
    tool = promtool()
    text = open(RULES).read()
    bad = tmp_path / "idemproxy-rules.yml"
    bad.write_text(text.replace(
        "expr: min by (job, instance) (idemproxy_store_up) == 0",
        "expr: min by (job, instance) (idemproxy_store_up == 0"))
    r = subprocess.run([tool, "check", "rules", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    wrong = text.replace('outcome="fail_open"', 'outcome="failopen"')
    assert wrong != text
    bad.write_text(wrong)
    shutil.copy(RULES_TEST, tmp_path)
    r = subprocess.run([tool, "test", "rules", "idemproxy-rules.test.yml"],
                       cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert "IdempotencyFailOpen" in r.stdout + r.stderr


def test_every_alert_the_issue_names():
    names = {r["alert"] for g in rules_doc()["groups"] for r in g["rules"]
             if "alert" in r}
    assert {"IdempotencyStoreDown", "IdempotencyFailOpen",
            "IdempotencyStoreErrors", "IdempotencySweeperLag",
            "IdempotencyKeysStuck", "IdempotencyConflictSpike",
            "IdempotencyUpstreamErrors", "IdempotencyUnknownOutcomes"} <= names
    with open(OPERATIONS) as f:
        docs = f.read()
    for g in rules_doc()["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                assert r["labels"]["severity"] in ("critical", "warning",
                                                   "info")
                assert r["annotations"]["summary"]
                assert r["annotations"]["description"]
                assert "for" in r, r["alert"]
                assert f"`{r['alert']}`" in docs, (
                    f"{r['alert']} is not in docs/operations.md's alert table")


def test_extraction():
    """The drift check's parsing, on PromQL with each construct it skips."""
    recorded = {"job:idemproxy_wait_seconds:p99_5m"}
    e = ('sum by (job, le) (rate(idemproxy_made_up_total{outcome="x", '
         "job=~'a|b'}[5m] offset 1h)) / on (job) group_left (instance) "
         "histogram_quantile(0.99, rate(idemproxy_wait_seconds_bucket"
         "[$__rate_interval])) > bool 1e3 unless "
         "job:idemproxy_wait_seconds:p99_5m > 5 or absent(idemproxy_store_up)"
         " * count(x_y) without (le)")
    assert metric_names(e, recorded) == {
        "idemproxy_made_up_total", "idemproxy_wait_seconds_bucket",
        "idemproxy_store_up", "x_y"}
    assert label_matchers(e, recorded) == [
        ("idemproxy_made_up_total", "outcome", "=", "x")]
    # the query variables and docs blocks are read too
    assert "idemproxy_requests_total" in dashboard_exprs(dashboard_doc())[-1]
    assert any("idemproxy_store_up" in e for e in docs_exprs())


def scrape_pg_redis(store_args, make_proxy):
    """/metrics of an instance on PostgreSQL + Redis that executed and
    replayed a keyed request."""
    p = make_proxy(*store_args)
    wait_readyz(p)
    key = newkey("mon")
    assert post(p.port, key).status == 200
    assert replayed(post(p.port, key))
    text = p.metrics()
    assert re.search(r"^idemproxy_store_up 1$", text, re.M), \
        "the store gauge does not say what /readyz says"
    assert re.search(r'^idemproxy_requests_total\{outcome="replayed"\} 1$',
                     text, re.M)
    return Scrape(text)


@pytest.mark.stores("postgres+redis")
def test_every_metric_used_is_exported(store_args, make_proxy):
    scrape = scrape_pg_redis(store_args, make_proxy)
    doc = rules_doc()
    recorded, exprs = rule_exprs(doc)
    exprs += dashboard_exprs(dashboard_doc())
    used = set()
    for e in exprs:
        used |= metric_names(e, recorded)
    assert len(used) >= 15, f"too few metrics found: {sorted(used)}"
    assert drift(exprs, recorded, scrape) == []

    # ... and it fails on a copy of the rules with a made-up metric, a
    # label the binary does not write, or a label value it never uses
    for old, new, problem in (
            ("(idemproxy_store_up)", "(idemproxy_store_upp)",
             "metric idemproxy_store_upp"),
            ("idemproxy_wait_seconds_bucket[", "idemproxy_waits_bucket[",
             "metric idemproxy_waits_bucket"),
            ('outcome="fail_open"', 'outcome="failopen"',
             'value idemproxy_requests_total{outcome="failopen"}'),
            ('outcome=~"forwarded|replayed|conflict|mismatch"',
             'outcome=~"forwarded|replay|conflict|mismatch"',
             'value idemproxy_requests_total{outcome="replay"}'),
            ("(idemproxy_requests_total{", "(idemproxy_requests_total{rc=\"1\",",
             "label idemproxy_requests_total{rc}")):
        broken = copy.deepcopy(doc)
        hits = 0
        for g in broken["groups"]:
            for r in g["rules"]:
                if old in r["expr"]:
                    r["expr"] = r["expr"].replace(old, new)
                    hits += 1
        assert hits, old
        assert problem in drift(rule_exprs(broken)[1], recorded, scrape)


@pytest.mark.stores("postgres+redis")
def test_docs_promql_and_metric_table_match_the_binary(store_args,
                                                       make_proxy):
    """docs/operations.md's PromQL reads exported series only, and every
    idemproxy_ name the page mentions is exported and every exported
    family is on the page."""
    scrape = scrape_pg_redis(store_args, make_proxy)
    recorded, _ = rule_exprs(rules_doc())
    exprs = docs_exprs()
    assert len(exprs) >= 8
    assert drift(exprs, recorded, scrape) == []
    with open(OPERATIONS) as f:
        mentioned = {m for m in re.findall(IDENT, f.read())
                     if m.startswith("idemproxy_")}
    assert sorted(n for n in mentioned if not scrape.has_series(n)) == [], \
        "docs/operations.md names metrics the binary does not export"
    undocumented = sorted(n for n in scrape.families
                          if n.startswith("idemproxy_") and n not in mentioned)
    assert undocumented == [], (
        "exported but not described in docs/operations.md (Metrics table)")


def test_dashboard_loads():
    doc = dashboard_doc()
    assert doc["title"] and doc["uid"] and isinstance(doc["schemaVersion"],
                                                      int)
    assert doc["schemaVersion"] >= 36
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    # the access log's panel reads Loki (docs/operations.md "Logs and
    # traces")
    assert variables["logs"]["type"] == "datasource"
    assert variables["logs"]["query"] == "loki"
    for name in ("job", "instance"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    ids = set()
    titles = []
    for p in doc["panels"]:
        assert p["type"] and p["title"] and p["id"] not in ids
        ids.add(p["id"])
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"]
        assert g["x"] + g["w"] <= 24
        if p["type"] == "row":
            continue
        titles.append(p["title"].lower())
        uid = "${logs}" if p["type"] == "logs" else "${datasource}"
        assert p["datasource"]["uid"] == uid
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"] and t["refId"]
            assert t["datasource"]["uid"] == uid
            # every panel follows the job and instance variables
            assert 'job=~"$job"' in t["expr"], t["expr"]
            assert 'instance=~"$instance"' in t["expr"], t["expr"]
    text = " ".join(titles)
    for what in ("outcome", "replay", "in flight", "wait", "claim latency",
                 "store errors", "sweeper", "upstream latency",
                 "upstream errors", "connections", "tls handshake errors",
                 "trace"):
        assert what in text, what


def test_dashboard_is_the_generator_output():
    r = subprocess.run(["/usr/bin/python3", DASHBOARD_PY], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == dashboard_doc(), (
        "deploy/grafana/idemproxy.json is stale: run "
        "deploy/grafana/dashboard.py > deploy/grafana/idemproxy.json")
