"""deploy/ agrees with the binary (issue 6).

The Kubernetes manifests, the Dockerfile, the systemd unit, the nginx site
and the man page name flags, environment variables, ports, paths and
timeouts that the code defines. These tests ask the binary under test
(IDEMPROXY_BIN) — its --help, --check-config, --version and `migrate` — and
fail when a manifest drifts from it:

  k8s        every --flag in container args is in --help; every IDEMPROXY_*
             name (env, envFrom ConfigMaps/Secrets) is documented in --help;
             the idemproxy container's args + env + mounted INI pass
             --check-config, and from its effective settings: probe paths
             /healthz and /readyz on the --admin-listen port, the Service's
             targetPort on the --listen port, both bound beyond loopback,
             the upstream is another container of the pod,
             terminationGracePeriodSeconds > preStop sleep + drain timeout;
             the migrate Job's command runs `migrate`; hardening and
             resources (memory request above the measured idle RSS).
  nginx      the site passes `nginx -t` (skipped without nginx).
  systemd    the unit passes `systemd-analyze verify` (skipped without it),
             its flags exist, TimeoutStopSec > the default drain timeout.
  Dockerfile the install script and meson commands of tests/run.sh; the
             runtime packages provide every library the binary links; the
             HEALTHCHECK command works against a running idemproxy.
  man page   documents every option and environment name of --help.
"""
import base64
import glob
import json
import os
import re
import shutil
import subprocess
import time

import pytest
import yaml

from support.http import http_get
from support.procs import (IDEMPROXY_BIN, ROOT, clean_env, free_port, rss_kib,
                           sanitizer_report)

DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
NGINX_CONF = os.path.join(DEPLOY, "nginx", "idemproxy.conf")
UNIT = os.path.join(DEPLOY, "systemd", "idemproxy.service")
DOCKERFILE = os.path.join(DEPLOY, "Dockerfile")
RUN_SH = os.path.join(ROOT, "tests", "run.sh")
MAN_PAGE = os.path.join(ROOT, "docs", "idemproxy.8")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


# ---------------------------------------------------------------- the binary

def run_bin(args, env=None, timeout=30):
    return subprocess.run([IDEMPROXY_BIN] + list(args), capture_output=True,
                          text=True, timeout=timeout, env=clean_env(env))


_help = None


def help_text():
    global _help
    if _help is None:
        r = run_bin(["--help"])
        assert r.returncode == 0, r.stderr
        _help = r.stdout
    return _help


def help_flags():
    """Every long option the binary documents (--listen, --help, ...)."""
    flags = set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", help_text(),
                           re.M))
    assert "--listen" in flags and "--check-config" in flags, flags
    return flags


def help_envs():
    envs = set(re.findall(r"\benv (IDEMPROXY_[A-Z0-9_]+)", help_text()))
    assert "IDEMPROXY_LISTEN" in envs, envs
    return envs


def help_default(env_name):
    """The default --help states for the option read from env_name."""
    m = re.search(r"env %s, default (\S+)" % re.escape(env_name), help_text())
    assert m, env_name
    return m.group(1)


def version():
    r = run_bin(["--version"])
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[-1]


def seconds(dur):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", dur)
    assert m, f"not a duration: {dur!r}"
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60,
                              "h": 3600}[m.group(2)]


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def host_of(addr):
    return addr.rsplit(":", 1)[0]


# ---------------------------------------------------------------- manifests

def load_manifests():
    docs = []
    paths = sorted(glob.glob(os.path.join(K8S, "*.yaml")))
    assert paths, f"no manifests in {K8S}"
    for path in paths:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    doc["_file"] = os.path.basename(path)
                    docs.append(doc)
    return docs


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def one(docs, kind, name=None):
    found = [d for d in by_kind(docs, kind)
             if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"want one {kind} {name or ''}, found {len(found)}"
    return found[0]


def config_map_data(docs, name):
    return dict(one(docs, "ConfigMap", name).get("data") or {})


def secret_data(docs, name):
    s = one(docs, "Secret", name)
    data = {k: base64.b64decode(v).decode()
            for k, v in (s.get("data") or {}).items()}
    data.update(s.get("stringData") or {})
    return data


def is_idemproxy(container):
    image = container.get("image", "")
    return (container["name"] in ("idemproxy", "migrate") or
            image.rsplit("/", 1)[-1].split(":")[0] == "idemproxy")


def pod_specs(docs):
    """(owner, pod spec) of every Deployment and Job."""
    out = []
    for kind in ("Deployment", "Job"):
        for d in by_kind(docs, kind):
            out.append((f"{kind} {d['metadata']['name']}",
                        d["spec"]["template"]["spec"]))
    assert out
    return out


def idemproxy_containers(docs):
    out = []
    for owner, spec in pod_specs(docs):
        for c in spec.get("initContainers", []) + spec["containers"]:
            if is_idemproxy(c):
                out.append((owner, spec, c))
    assert out, "no idemproxy container in the manifests"
    return out


def sidecar(docs):
    dep = one(docs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    cs = [c for c in spec["containers"] if is_idemproxy(c)]
    assert len(cs) == 1, "want one idemproxy container in the Deployment"
    others = [c for c in spec["containers"] if not is_idemproxy(c)]
    assert others, "the Deployment has no app container beside idemproxy"
    return dep, spec, cs[0], others


def container_env(docs, c):
    """The environment Kubernetes gives container c (names → values)."""
    env = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            data = config_map_data(docs, src["configMapRef"]["name"])
        else:
            data = secret_data(docs, src["secretRef"]["name"])
        prefix = src.get("prefix", "")
        env.update({prefix + k: v for k, v in data.items()})
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
            continue
        ref = e["valueFrom"]
        if "secretKeyRef" in ref:
            r = ref["secretKeyRef"]
            data = secret_data(docs, r["name"])
        elif "configMapKeyRef" in ref:
            r = ref["configMapKeyRef"]
            data = config_map_data(docs, r["name"])
        else:
            continue            # fieldRef etc.: nothing of idemproxy's
        assert r["key"] in data, f"{e['name']}: no key {r['key']} in {r['name']}"
        env[e["name"]] = data[r["key"]]
    return env


def expand(s, env):
    """Kubernetes' $(VAR) expansion in args, command and env values."""
    def sub(m):
        assert m.group(1) in env, f"$({m.group(1)}) is not in the container env"
        return env[m.group(1)]
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)


def container_port(c, port):
    """A probe's or Service's port (number or name) as a number."""
    if isinstance(port, int):
        return port
    for p in c.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    raise AssertionError(f"container {c['name']} has no port named {port!r}")


def effective_settings(docs, spec, c, tmp_path):
    """Run --check-config with the container's args, env and mounted files;
    returns the global settings it prints (name → value)."""
    env = container_env(docs, c)
    # The ConfigMap volumes mounted into c, written under tmp_path.
    mounts = {}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        v = volumes[m["name"]]
        assert "configMap" in v, f"volume {m['name']}: only ConfigMaps expected"
        data = config_map_data(docs, v["configMap"]["name"])
        if "items" in v["configMap"]:
            data = {i["path"]: data[i["key"]] for i in v["configMap"]["items"]}
        local = tmp_path / ("mnt_" + m["name"])
        local.mkdir()
        for key, text in data.items():
            if m.get("subPath") and key != m["subPath"]:
                continue
            (local / key).write_text(text)
        mounts[m["mountPath"]] = (str(local / m["subPath"]) if m.get("subPath")
                                  else str(local))

    def local_path(p):
        for mp, lp in mounts.items():
            if p == mp or p.startswith(mp.rstrip("/") + "/"):
                return lp + p[len(mp):]
        return p

    args = [local_path(expand(a, env)) for a in c.get("args", [])]
    config = env.get("IDEMPROXY_CONFIG")
    for i, a in enumerate(args):
        if a == "--config" and i + 1 < len(args):
            config = args[i + 1]
        elif a.startswith("--config="):
            config = a.split("=", 1)[1]
    env = {k: local_path(v) if k == "IDEMPROXY_CONFIG" else v
           for k, v in env.items()}
    check = ["--check-config", config] if config else []
    r = run_bin(args + check, env=env)
    assert r.returncode == 0, (f"--check-config of the {c['name']} container "
                               f"refused it: {r.stderr}\nargs={args}")
    settings = {}
    for line in r.stdout.splitlines():
        if not line.strip():
            break                       # routes follow the first blank line
        name, _, value = line.partition(" = ")
        settings[name] = value
    assert "listen" in settings and "admin_listen" in settings, r.stdout
    return settings


@pytest.fixture(scope="module")
def docs():
    return load_manifests()


@pytest.fixture
def settings(docs, tmp_path):
    dep, spec, c, _ = sidecar(docs)
    return effective_settings(docs, spec, c, tmp_path)


# ---------------------------------------------------------------- k8s tests

def test_container_flags_exist(docs):
    known = help_flags()
    for owner, _, c in idemproxy_containers(docs):
        args = c.get("args", [])
        if args[:1] == ["migrate"]:
            args = args[1:]
        for a in args + c.get("command", [])[1:]:
            if a.startswith("-"):
                flag = a.split("=", 1)[0]
                assert flag in known, (f"{owner}, container {c['name']}: "
                                       f"{flag} is not an option of idemproxy "
                                       f"(see --help)")


def test_env_names_are_documented(docs):
    known = help_envs()
    seen = set()
    for owner, _, c in idemproxy_containers(docs):
        for name in container_env(docs, c):
            if name.upper().startswith("IDEMPROXY"):
                seen.add(name)
                assert name in known, (f"{owner}, container {c['name']}: "
                                       f"{name} is not read by idemproxy "
                                       f"(--help lists {sorted(known)})")
    assert "IDEMPROXY_STORE" in seen, "the store URL should come from a Secret"


def test_store_comes_from_a_secret(docs):
    for owner, _, c in idemproxy_containers(docs):
        refs = [e for e in c.get("env", []) if e["name"] == "IDEMPROXY_STORE"]
        from_secret = [s for s in c.get("envFrom", []) if "secretRef" in s]
        assert (refs and "secretKeyRef" in refs[0].get("valueFrom", {})) or \
            from_secret, f"{owner}: IDEMPROXY_STORE not from a Secret"
        store = container_env(docs, c)["IDEMPROXY_STORE"]
        assert store.startswith(("postgres://", "postgresql://")), (
            f"{owner}: replicas must share PostgreSQL, not {store!r}")
    for s in by_kind(docs, "Secret"):
        text = open(os.path.join(K8S, s["_file"])).read()
        assert "PLACEHOLDER" in text, "mark the Secret's values as placeholders"


def test_sidecar_config_passes_check_config(settings):
    # effective_settings asserts exit 0; the settings the manifests rely on:
    assert settings["store"].startswith("postgres"), settings["store"]


def test_probes_on_admin_port(docs, settings):
    _, _, c, _ = sidecar(docs)
    admin = port_of(settings["admin_listen"])
    assert host_of(settings["admin_listen"]) not in LOOPBACK_HOSTS, (
        "the kubelet probes the pod IP: --admin-listen must not be loopback")
    for probe, path in (("livenessProbe", "/healthz"),
                        ("readinessProbe", "/readyz")):
        assert probe in c, f"idemproxy has no {probe}"
        get = c[probe].get("httpGet")
        assert get, f"{probe}: want an httpGet probe"
        assert get["path"] == path, f"{probe} path {get['path']}, want {path}"
        assert container_port(c, get["port"]) == admin, (
            f"{probe} port {get['port']} is not the --admin-listen port "
            f"{admin}")
    if "startupProbe" in c:
        get = c["startupProbe"]["httpGet"]
        assert container_port(c, get["port"]) == admin


def test_service_targets_idemproxy(docs, settings):
    dep, _, c, others = sidecar(docs)
    listen = port_of(settings["listen"])
    assert host_of(settings["listen"]) not in LOOPBACK_HOSTS, (
        "the Service connects to the pod IP: --listen must not be loopback")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    services = by_kind(docs, "Service")
    assert services, "no Service"
    for svc in services:
        sel = svc["spec"]["selector"]
        assert all(pod_labels.get(k) == v for k, v in sel.items()), (
            f"Service {svc['metadata']['name']} does not select the pods")
        for p in svc["spec"]["ports"]:
            target = container_port(c, p.get("targetPort", p["port"]))
            assert target == listen, (
                f"Service port {p['port']} targets {target}, not idemproxy's "
                f"--listen port {listen}")
            for o in others:
                assert target not in [q["containerPort"]
                                      for q in o.get("ports", [])]


def test_upstream_is_the_app_container(docs, settings):
    _, _, _, others = sidecar(docs)
    m = re.fullmatch(r"http://([^/]+?)(?::(\d+))?(/.*)?", settings["upstream"])
    assert m, settings["upstream"]
    assert m.group(1) in LOOPBACK_HOSTS, (
        f"upstream {settings['upstream']}: a sidecar talks to its pod over "
        f"localhost")
    port = int(m.group(2) or 80)
    app_ports = [p["containerPort"] for o in others for p in o.get("ports", [])]
    assert port in app_ports, f"upstream port {port} not in {app_ports}"


def test_spans_go_to_a_container_of_the_pod(docs, tmp_path):
    """OTEL_EXPORTER_OTLP_ENDPOINT names a loopback port another container
    of the pod (the collector) listens on, and the binary reads it: its
    --check-config shows tracing on with that endpoint + /v1/traces."""
    dep, spec, c, others = sidecar(docs)
    env = container_env(docs, c)
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    assert endpoint, "the sidecar sends no spans (no OTEL_EXPORTER_OTLP_ENDPOINT)"
    m = re.fullmatch(r"http://([^/:]+):(\d+)/?", endpoint)
    assert m and m.group(1) in LOOPBACK_HOSTS, endpoint
    ports = [p["containerPort"] for o in others for p in o.get("ports", [])]
    assert int(m.group(2)) in ports, f"nothing in the pod listens on {endpoint}"
    settings = effective_settings(docs, spec, c, tmp_path)
    assert settings.get("otel_traces") == endpoint.rstrip("/") + "/v1/traces", (
        settings.get("otel_traces"))


def prestop_seconds(c):
    pre = c.get("lifecycle", {}).get("preStop")
    if not pre:
        return 0
    if "sleep" in pre:
        return int(pre["sleep"]["seconds"])
    cmd = pre["exec"]["command"]
    m = re.search(r"sleep\s+(\d+)", " ".join(cmd))
    assert m, f"preStop {cmd}: want a sleep"
    return int(m.group(1))


def test_grace_period_exceeds_drain(docs, settings):
    _, spec, c, others = sidecar(docs)
    drain = seconds(settings["drain_timeout"])
    grace = spec.get("terminationGracePeriodSeconds", 30)
    pre = prestop_seconds(c)
    assert pre > 0, "idemproxy needs a preStop sleep (endpoint propagation)"
    assert grace > pre + drain, (
        f"terminationGracePeriodSeconds {grace} <= preStop {pre}s + "
        f"drain timeout {drain}s: Kubernetes would SIGKILL a draining proxy")
    for o in others:        # the app must outlive idemproxy's drain
        assert prestop_seconds(o) >= pre + drain, (
            f"container {o['name']} stops before idemproxy finished draining")
        assert prestop_seconds(o) < grace


def test_migrate_job_command_is_accepted(docs, tmp_path):
    jobs = by_kind(docs, "Job")
    assert len(jobs) == 1, "want one migrate Job"
    spec = jobs[0]["spec"]["template"]["spec"]
    c = [c for c in spec["containers"] if is_idemproxy(c)]
    assert len(c) == 1
    c = c[0]
    assert not c.get("command"), "the image's ENTRYPOINT is idemproxy"
    assert c["args"][:1] == ["migrate"], c["args"]
    env = container_env(docs, c)
    assert env["IDEMPROXY_STORE"] == container_env(docs, sidecar(docs)[2])[
        "IDEMPROXY_STORE"], "the Job must migrate the sidecar's database"

    def run_job(store):
        e = dict(env, IDEMPROXY_STORE=store, PGCONNECT_TIMEOUT="3")
        args = [expand(a, e) for a in c["args"]]
        return run_bin(args, env=e)

    # The memory store has no schema: exit 2 from migrate's own check
    # (not "unexpected argument"), so the arguments parsed.
    r = run_job("memory")
    assert r.returncode == 2, r.stderr
    assert "idemproxy migrate: --store must be a postgres" in r.stderr, r.stderr
    # A PostgreSQL that is not there: the command gets as far as connecting.
    r = run_job(f"postgres://idemproxy@127.0.0.1:{free_port()}/idemproxy")
    assert r.returncode == 1, r.stderr
    assert "cannot connect" in r.stderr, r.stderr


def test_images_are_this_version(docs):
    v = version()
    for owner, _, c in idemproxy_containers(docs):
        tag = c["image"].rsplit("/", 1)[-1].partition(":")[2]
        assert tag == v, f"{owner}: image {c['image']}, binary is {v}"


def test_hardening(docs):
    for owner, spec, c in idemproxy_containers(docs):
        pod = spec.get("securityContext", {})
        sc = c.get("securityContext", {})
        assert sc.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, owner
        uid = sc.get("runAsUser", pod.get("runAsUser"))
        assert uid is None or uid != 0, owner
        assert sc.get("readOnlyRootFilesystem") is True, owner
        assert sc.get("allowPrivilegeEscalation") is False, owner
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], owner
        assert not sc.get("capabilities", {}).get("add"), owner
        assert not sc.get("privileged"), owner


def test_resources_cover_measured_footprint(docs, tmp_path):
    _, _, c, _ = sidecar(docs)
    res = c.get("resources", {})
    for kind in ("requests", "limits"):
        assert "memory" in res.get(kind, {}), f"no memory {kind}"
        assert "cpu" in res.get("requests", {}), "no cpu request"

    def mib(q):
        m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", str(q))
        assert m, f"memory quantity {q!r}: use Ki, Mi or Gi"
        return int(m.group(1)) * {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}[
            m.group(2)]
    req, lim = mib(res["requests"]["memory"]), mib(res["limits"]["memory"])
    assert req <= lim
    # Idle footprint as deployed: 2 workers (the manifests' IDEMPROXY_WORKERS).
    workers = container_env(docs, c).get("IDEMPROXY_WORKERS", "2")
    admin = free_port()
    p = subprocess.Popen([IDEMPROXY_BIN, "--upstream", "http://127.0.0.1:9",
                          "--listen", f"127.0.0.1:{free_port()}",
                          "--admin-listen", f"127.0.0.1:{admin}",
                          "--workers", workers],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=clean_env())
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if http_get(admin, "/healthz", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        idle = rss_kib(p.pid) / 1024
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0 and not sanitizer_report(err.decode()), err
    assert req >= idle, f"memory request {req}Mi < idle RSS {idle:.1f} MiB"
    assert lim >= 4 * idle, f"memory limit {lim}Mi leaves no room above " \
                            f"the idle {idle:.1f} MiB"


# ---------------------------------------------------------------- nginx

def test_nginx_conf_passes_nginx_t(tmp_path):
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    text = open(NGINX_CONF).read()
    for needle in ("proxy_http_version 1.1", 'proxy_set_header Connection ""',
                   "keepalive ", "X-Forwarded-For", "X-Forwarded-Proto",
                   "X-Forwarded-Host", "non_idempotent"):
        assert needle in text, f"{NGINX_CONF}: no {needle!r}"
    if not os.access(nginx, os.X_OK):
        pytest.skip("nginx not installed")
    t = str(tmp_path)
    wrapper = tmp_path / "nginx.conf"
    wrapper.write_text(
        f"pid {t}/nginx.pid;\nerror_log {t}/error.log;\nevents {{}}\n"
        f"http {{\n  access_log off;\n"
        f"  client_body_temp_path {t}/body; proxy_temp_path {t}/proxy;\n"
        f"  fastcgi_temp_path {t}/fcgi; uwsgi_temp_path {t}/uwsgi;\n"
        f"  scgi_temp_path {t}/scgi;\n"
        f"  include {NGINX_CONF};\n}}\n")
    r = subprocess.run([nginx, "-t", "-p", t, "-e", f"{t}/error.log", "-c",
                        str(wrapper)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    # The upstream keepalive must end before idemproxy's idle timeout.
    m = re.search(r"^\s*keepalive_timeout\s+(\S+);", text, re.M)
    idle = seconds(help_default("IDEMPROXY_IDLE_TIMEOUT"))
    assert m and seconds(m.group(1)) < idle, (
        "upstream keepalive_timeout must be below idemproxy's idle timeout")


# ---------------------------------------------------------------- systemd

def unit_values(text):
    vals = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            k, _, v = line.partition("=")
            vals.setdefault(k.strip(), []).append(v.strip())
    return vals


def test_systemd_unit(tmp_path):
    text = open(UNIT).read()
    vals = unit_values(text)
    exec_start = vals["ExecStart"][0].split()
    assert exec_start[0].endswith("/idemproxy"), exec_start
    for a in exec_start[1:]:
        if a.startswith("-"):
            assert a.split("=", 1)[0] in help_flags(), a
    assert vals["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert vals["KillSignal"] == ["SIGTERM"]
    stop = vals["TimeoutStopSec"][0]
    stop_s = seconds(stop if not stop.isdigit() else stop + "s")
    assert stop_s > seconds(help_default("IDEMPROXY_DRAIN_TIMEOUT")), (
        "TimeoutStopSec must exceed the drain timeout")
    for k, want in (("DynamicUser", "yes"), ("ProtectSystem", "strict"),
                    ("NoNewPrivileges", "yes"), ("PrivateTmp", "yes"),
                    ("CapabilityBoundingSet", ""),
                    ("Restart", "on-failure")):
        assert vals.get(k) == [want], f"{k}={vals.get(k)}, want {want!r}"
    assert "EnvironmentFile" in vals and "LimitNOFILE" in vals
    sda = shutil.which("systemd-analyze")
    if sda is None:
        pytest.skip("systemd-analyze not installed")
    # verify checks that ExecStart exists: point it at the binary under test.
    unit = tmp_path / "idemproxy.service"
    unit.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={os.path.abspath(IDEMPROXY_BIN)}",
                           text, flags=re.M))
    r = subprocess.run([sda, "verify", "--man=no", str(unit)],
                       capture_output=True, text=True, timeout=60)
    complaints = [l for l in (r.stdout + r.stderr).splitlines()
                  if "idemproxy.service" in l]
    assert r.returncode == 0 and not complaints, r.stdout + r.stderr


# ---------------------------------------------------------------- Dockerfile

def dockerfile_stages():
    stages, cur = [], None
    for line in open(DOCKERFILE).read().replace("\\\n", " ").splitlines():
        if re.match(r"\s*FROM\s", line, re.I):
            cur = []
            stages.append(cur)
        elif cur is not None and line.strip() and \
                not line.lstrip().startswith("#"):
            cur.append(line.strip())
    return stages


def test_dockerfile_builds_like_ci():
    text = open(DOCKERFILE).read()
    run_sh = open(RUN_SH).read()
    build = " ".join(dockerfile_stages()[0])
    for script in re.findall(r"\./(deploy/[\w.-]+\.sh)", run_sh):
        assert script in build, f"build stage does not run {script}"
    for sub, opt in re.findall(r"\bmeson (setup|compile|test)( -C)?", run_sh):
        want = f"meson {sub}{opt}"
        assert want in build, f"build stage lacks {want!r} (tests/run.sh)"
    assert re.search(r'^ENTRYPOINT \["idemproxy"\]', text, re.M)


IMAGE_SH = os.path.join(DEPLOY, "image.sh")


def test_image_script_usage():
    assert subprocess.run(["sh", "-n", IMAGE_SH]).returncode == 0
    r = subprocess.run([IMAGE_SH, "--help"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0
    for cmd in ("build", "check", "clean"):
        assert f"image.sh {cmd}" in r.stdout, r.stdout
    r = subprocess.run([IMAGE_SH, "frob"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "usage" in r.stderr


@pytest.mark.skipif(os.environ.get("IDEMPROXY_IMAGE_TEST") != "1",
                    reason="builds the image (minutes): IDEMPROXY_IMAGE_TEST=1")
def test_image_builds_and_serves():
    """deploy/image.sh check: the Dockerfile built for real, then the image
    (or, where no container can start, its filesystem under chroot as its
    user) answers /healthz, executes a keyed POST once and replays it."""
    r = subprocess.run([IMAGE_SH, "check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=1800)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "/healthz 200" in out and "check passed" in out, out
    assert "keyed POST executed once, its duplicate replayed" in out, out
    assert re.search(r"image size: \d+ bytes", out), out


def test_dockerfile_runtime_stage():
    stages = dockerfile_stages()
    assert len(stages) >= 2, "want a multi-stage build"
    runtime = stages[-1]
    joined = "\n".join(runtime)
    user = re.search(r"^USER\s+(\S+)", joined, re.M)
    assert user and user.group(1).split(":")[0] not in ("root", "0")
    assert not re.search(r"\b(meson|ninja|gcc|build-essential|-dev)\b",
                         joined), "build tools in the runtime stage"
    env = dict(re.findall(r"(IDEMPROXY_[A-Z_]+)=(\S+)", joined))
    for name in env:
        assert name in help_envs(), name
    listen = port_of(env.get("IDEMPROXY_LISTEN",
                             help_default("IDEMPROXY_LISTEN")))
    admin = port_of(env.get("IDEMPROXY_ADMIN_LISTEN",
                            help_default("IDEMPROXY_ADMIN_LISTEN")))
    exposed = {int(p) for line in runtime if line.startswith("EXPOSE")
               for p in line.split()[1:]}
    assert {listen, admin} <= exposed, exposed
    assert re.search(r"^HEALTHCHECK .*/healthz", joined, re.M)
    # Every library the binary links comes from a package the stage
    # installs (or libc6).
    pkgs = set()
    for line in runtime:
        if "apt-get install" in line:
            pkgs |= {w for w in line.split("apt-get install", 1)[1].split()
                     if not w.startswith("-") and re.match(r"[a-z0-9]", w)
                     and w != "&&"}
    if shutil.which("readelf") is None or shutil.which("dpkg") is None:
        pytest.skip("readelf or dpkg missing")
    r = subprocess.run(["readelf", "-d", IDEMPROXY_BIN], capture_output=True,
                       text=True, check=True)
    for lib in re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", r.stdout):
        if re.match(r"lib(asan|ubsan|tsan|lsan|c|m|pthread|dl|rt)\.so", lib) \
                or lib.startswith("ld-linux"):
            continue
        q = subprocess.run(["dpkg", "-S", lib], capture_output=True, text=True)
        owners = {l.split(":")[0] for l in q.stdout.splitlines()}
        assert owners & pkgs, (f"{lib} ({', '.join(owners) or 'no package'}) "
                               f"is not installed by the runtime stage "
                               f"{sorted(pkgs)}")


def healthcheck_command():
    text = open(DOCKERFILE).read().replace("\\\n", " ")
    m = re.search(r"^HEALTHCHECK\b.*?\bCMD\s+(\[.*\])\s*$", text, re.M)
    assert m, "HEALTHCHECK CMD [...] (exec form) not found"
    return json.loads(m.group(1))


def test_dockerfile_healthcheck_works(proxy):
    cmd = healthcheck_command()
    if shutil.which(cmd[0]) is None:
        pytest.skip(f"{cmd[0]} missing")
    env = clean_env({"IDEMPROXY_ADMIN_LISTEN":
                     f"127.0.0.1:{proxy.admin_port}"})
    r = subprocess.run(cmd, env=env, capture_output=True, timeout=10)
    assert r.returncode == 0, r.stderr
    env["IDEMPROXY_ADMIN_LISTEN"] = f"127.0.0.1:{free_port()}"
    r = subprocess.run(cmd, env=env, capture_output=True, timeout=10)
    assert r.returncode != 0, "healthcheck passes with nothing listening"


# ---------------------------------------------------------------- man page

def test_man_page_documents_every_option():
    src = open(MAN_PAGE).read().replace("\\-", "-")
    for flag in help_flags():
        assert re.search(re.escape(flag) + r"(?![a-z-])", src), (
            f"{MAN_PAGE}: {flag} is not documented")
    for env in help_envs():
        assert env in src, f"{MAN_PAGE}: {env} is not documented"
    assert f'"idemproxy {version()}"' in src, "man page version differs"
    man = shutil.which("man")
    if man is None:
        pytest.skip("man not installed")
    r = subprocess.run([man, "-l", MAN_PAGE], capture_output=True, text=True,
                       timeout=30, env=clean_env({"MANWIDTH": "80",
                                                  "MANPAGER": "cat",
                                                  "PAGER": "cat"}))
    assert r.returncode == 0 and "SYNOPSIS" in r.stdout, r.stderr
