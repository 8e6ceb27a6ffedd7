"""Key inspection and purge (issue 13): GET and DELETE /keys/{key} on the
admin listener with every store, the bearer token, routes and scopes, a
purge seen by a second instance at once, the fencing of an in-flight
key's owner, and `idemproxy keys get|delete` with no instance running.

What a purge must achieve is what users see: the same key executes again
(once), and nothing replays the purged response from any layer.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.parse

import pytest

from support.procs import IDEMPROXY_BIN, clean_env, wait_readyz
from test_idempotency import executions, newkey, post, replayed

TOKEN = "t0ken-for-the-tests-0123456789"


def admin(p, method, key, query="", token=None, timeout=10.0):
    """(status, headers, parsed JSON body) of METHOD /keys/<key> on p's
    admin listener."""
    path = "/keys/" + urllib.parse.quote(key, safe="") + (
        "?" + query if query else "")
    conn = http.client.HTTPConnection("127.0.0.1", p.admin_port,
                                      timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request(method, path, headers=headers)
        r = conn.getresponse()
        body = r.read()
        return r.status, dict(r.getheaders()), json.loads(body or b"null")
    finally:
        conn.close()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "admin.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def keyed(store_args, make_proxy, token_file):
    """keyed(*flags, **kw) -> a proxy on the test's store, with the token."""
    def make(*flags, **kw):
        p = make_proxy(*store_args, "--admin-token-file", token_file, *flags,
                       **kw)
        wait_readyz(p)
        return p
    return make


def where(store_args):
    """Where a completed record is found right after its request."""
    if not store_args:
        return {"memory"}
    return {"postgres", "redis"} if "--redis" in store_args else {"postgres"}


def copies_settled(p, key, store_args, timeout=5.0):
    """Replay key until every layer holds a copy: a worker's first
    completion can come before its Redis connection is up (the write-through
    is skipped then), and a replay reads the record through into Redis."""
    deadline = time.monotonic() + timeout
    while True:
        status, _, doc = admin(p, "GET", key)
        if status == 200 and where(store_args) <= set(doc["found_in"]):
            return doc
        assert time.monotonic() < deadline, doc
        assert replayed(post(p.port, key))
        time.sleep(0.05)


def wait_state(p, key, state, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        status, _, doc = admin(p, "GET", key)
        if status == 200 and doc["state"] == state:
            return doc
        assert time.monotonic() < deadline, (status, doc)
        time.sleep(0.02)


def in_background(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()))
    t.start()
    return t, out


def test_get_completed_in_flight_absent(keyed, stub, store_args):
    p = keyed()
    key = newkey("get")
    first = post(p.port, key)
    assert first.status == 200
    copies_settled(p, key, store_args)
    status, headers, doc = admin(p, "GET", key)
    assert status == 200, doc
    assert headers["Content-Type"] == "application/json"
    assert doc["key"] == key and doc["scope"] == "" and doc["route"] is None
    assert doc["state"] == "completed" and doc["status"] == 200
    assert re.fullmatch(r"[0-9a-f]{64}", doc["fingerprint"])
    assert doc["body_bytes"] == len(first.body) and doc["body_stored"]
    assert doc["head_bytes"] > 0 and doc["owner"] is None
    assert doc["lease_until"] is None
    assert doc["created"] <= doc["expires"]
    assert where(store_args) <= set(doc["found_in"])
    assert "body" not in doc and "head" not in doc

    slow = newkey("getslow")
    t, _ = in_background(lambda: post(p.port, slow,
                                      target="/orders?delay_ms=1500"))
    doc = wait_state(p, slow, "in_flight")
    assert re.fullmatch(r"[0-9a-f]{32}", doc["owner"])
    assert doc["lease_until"] is not None and doc["status"] is None
    t.join()
    assert wait_state(p, slow, "completed")["status"] == 200

    status, headers, doc = admin(p, "GET", newkey("absent"))
    assert status == 404
    assert headers["Content-Type"] == "application/problem+json"
    assert doc["type"] == "urn:idemproxy:problem:key-not-found"
    assert executions(stub) == 2


def test_body_needs_the_token(keyed, make_proxy, stub):
    p = keyed()
    key = newkey("body")
    first = post(p.port, key)
    assert admin(p, "GET", key, "body=1")[0] == 401
    assert admin(p, "GET", key, "body=1", token="wrong")[0] == 401
    status, _, doc = admin(p, "GET", key, "body=1", token=TOKEN)
    assert status == 200
    assert doc["body"].encode() == first.body
    assert "Content-Type: application/json" in doc["head"]
    assert "audit: GET body of /keys/" in p.log()

    # without --admin-token-file: GET works, body and DELETE are off
    bare = make_proxy()
    post(bare.port, key)
    assert admin(bare, "GET", key)[0] == 200
    status, _, doc = admin(bare, "GET", key, "body=1", token=TOKEN)
    assert status == 403 and "admin-token-file" in doc["detail"]
    status, _, doc = admin(bare, "DELETE", key, token=TOKEN)
    assert status == 403
    assert admin(bare, "GET", key)[0] == 200     # not deleted


def test_delete_completed_executes_again(keyed, stub, store_args):
    p = keyed()
    key = newkey("del")
    first = post(p.port, key)
    for _ in range(2):
        r = post(p.port, key)
        assert replayed(r) and r.body == first.body
    copies_settled(p, key, store_args)
    assert admin(p, "DELETE", key)[0] == 401
    assert admin(p, "DELETE", key, token="nope")[0] == 401
    assert replayed(post(p.port, key))           # refused: nothing changed
    status, _, doc = admin(p, "DELETE", key, token=TOKEN)
    assert status == 200, doc
    assert doc["purged"] is True and doc["state"] == "completed"
    assert where(store_args) <= set(doc["found_in"])
    assert "unreachable" not in doc
    assert admin(p, "GET", key)[0] == 404
    again = post(p.port, key)
    assert again.status == 200 and not replayed(again)
    assert json.loads(again.body)["n"] == 2
    assert executions(stub) == 2
    r = post(p.port, key)
    assert replayed(r) and r.body == again.body
    assert admin(p, "DELETE", newkey("nothing"), token=TOKEN)[0] == 404
    log = p.log()
    assert f"audit: DELETE /keys/{key} scope \"\" by 127.0.0.1:" in log
    assert "refused (no or wrong bearer token)" in log


def test_delete_in_flight_fences_the_owner(keyed, stub):
    """The operator releases a stuck key: a retry executes at once, the old
    owner's late completion is refused (logged), and what duplicates get
    from then on is the retry's response."""
    p = keyed()
    key = newkey("fence")
    t, out = in_background(lambda: post(p.port, key,
                                        target="/orders?delay_ms=1500"))
    owner = wait_state(p, key, "in_flight")["owner"]
    status, _, doc = admin(p, "DELETE", key, token=TOKEN)
    assert status == 200 and doc["state"] == "in_flight"
    assert doc["owner"] == owner
    retry = post(p.port, key)                    # executes now, no waiting
    assert retry.status == 200 and not replayed(retry)
    t.join()
    late = out["r"]
    assert late.status == 200 and not replayed(late)
    assert json.loads(late.body)["n"] == 1
    assert json.loads(retry.body)["n"] == 2
    r = post(p.port, key)
    assert replayed(r) and r.body == retry.body
    assert executions(stub) == 2
    deadline = time.monotonic() + 5
    while "not ours any more" not in p.log():
        assert time.monotonic() < deadline, p.log()
        time.sleep(0.05)


@pytest.mark.stores("postgres+redis")
def test_purge_seen_by_a_second_instance_at_once(keyed, stub):
    """Both instances replay from their in-process caches and Redis; a
    DELETE on one and the very next request on the other executes."""
    a = keyed(name="a", workers=2)
    b = keyed(name="b", workers=2)
    key = newkey("two")
    first = post(a.port, key)
    for p in (b, a, b, b):
        r = post(p.port, key)
        assert replayed(r) and r.body == first.body
    copies_settled(a, key, ["--redis"])
    status, _, doc = admin(a, "DELETE", key, token=TOKEN)
    assert status == 200
    assert {"postgres", "redis"} <= set(doc["found_in"])
    again = post(b.port, key)
    assert again.status == 200 and not replayed(again)
    r = post(a.port, key)
    assert replayed(r) and r.body == again.body
    assert executions(stub) == 2


@pytest.mark.stores("postgres+redis")
def test_redis_copy_without_a_row(keyed, stub, pg_db, redis):
    """A row deleted by hand leaves Redis' copy, which would still be
    replayed: GET shows it, DELETE removes it."""
    p = keyed("--response-cache", "0")
    key = newkey("orphan")
    post(p.port, key)
    copies_settled(p, key, ["--redis"])
    pg_db.psql(f"delete from idempotency_keys where key = '{key}'")
    status, _, doc = admin(p, "GET", key)
    assert status == 200 and doc["found_in"] == ["redis"]
    assert doc["state"] == "completed" and doc["created"] is None
    assert replayed(post(p.port, key))
    status, _, doc = admin(p, "DELETE", key, token=TOKEN)
    assert status == 200 and doc["found_in"] == ["redis"]
    # a tombstone stands in for the copy, as long as the copy would have
    # lived: a read- or write-through that learned the record before the
    # purge cannot put it back
    rkey = f"idemproxy::{key}"
    assert redis.cmd("GET", rkey).startswith(b"idemproxy:purged:")
    assert 10000 < int(redis.cmd("PTTL", rkey)) <= 24 * 3600 * 1000
    assert admin(p, "GET", key)[0] == 404
    r = post(p.port, key)
    assert r.status == 200 and not replayed(r)
    again = post(p.port, key)
    assert replayed(again) and again.body == r.body
    assert executions(stub) == 2


ROUTES = """
[route pay]
match       = POST /pay/*
key         = header:Idempotency-Key
key_prefix  = pay:
scope       = header:Authorization
"""


def test_route_prefix_and_scope(keyed, stub, tmp_path):
    ini = tmp_path / "routes.ini"
    ini.write_text(ROUTES)
    p = keyed("--config", str(ini))
    key = newkey("r")
    r = post(p.port, key, target="/pay/1",
             headers=[("Authorization", "Bearer alice")])
    assert r.status == 200
    q = "route=pay&scope=" + urllib.parse.quote("Bearer alice")
    status, _, doc = admin(p, "GET", key, q)
    assert status == 200, doc
    assert doc["key"] == "pay:" + key and doc["route"] == "pay"
    assert re.fullmatch(r"[0-9a-f]{64}", doc["scope"])
    assert admin(p, "GET", key, "route=pay&scope=Bearer%20bob")[0] == 404
    assert admin(p, "GET", key, "route=pay")[0] == 404
    assert admin(p, "GET", key)[0] == 404
    status, _, doc = admin(p, "GET", key, "route=nope")
    assert status == 400 and "no route named" in doc["detail"]
    status, _, doc = admin(p, "GET", key, "scope=x")
    assert status == 400 and "has no scope" in doc["detail"]
    assert admin(p, "DELETE", key, q, token=TOKEN)[0] == 200
    r = post(p.port, key, target="/pay/1",
             headers=[("Authorization", "Bearer alice")])
    assert r.status == 200 and not replayed(r)
    assert executions(stub) == 2


def test_bad_requests(keyed):
    p = keyed()
    conn = http.client.HTTPConnection("127.0.0.1", p.admin_port, timeout=5)
    conn.request("POST", "/keys/x")
    r = conn.getresponse()
    assert r.status == 405 and r.getheader("Allow") == "GET, DELETE"
    r.read()
    conn.close()
    assert admin(p, "GET", "a\x01b")[0] == 400      # not a printable key
    assert admin(p, "GET", "a\tb")[0] == 400
    # a key with a space is one (a quoted sf-string key, issue 46): absent
    assert admin(p, "GET", "a b")[0] == 404
    assert admin(p, "GET", "x" * 300)[0] == 400
    assert admin(p, "GET", "a/b?c")[0] == 404       # any visible key is fine


def run_keys(*args, timeout=30):
    r = subprocess.run([IDEMPROXY_BIN, "keys", *args], capture_output=True,
                       text=True, timeout=timeout, env=clean_env())
    return r.returncode, r.stdout, r.stderr


@pytest.mark.stores("postgres", "postgres+redis")
def test_cli_with_no_instance_running(keyed, stub, store_args):
    p = keyed()
    key = newkey("cli")
    first = post(p.port, key)
    copies_settled(p, key, store_args)
    p.stop()
    rc, out, err = run_keys("get", key, *store_args)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["state"] == "completed" and doc["status"] == 200
    assert where(store_args) == set(doc["found_in"]), (out, err)
    rc, out, err = run_keys("get", key, "--body", *store_args)
    assert rc == 0 and json.loads(out)["body"].encode() == first.body
    rc, out, err = run_keys("delete", key, *store_args)
    assert rc == 0, err
    assert json.loads(out)["purged"] is True
    rc, out, err = run_keys("get", key, *store_args)
    assert rc == 1 and json.loads(out)["found_in"] == []
    rc, out, err = run_keys("delete", key, *store_args)
    assert rc == 1


def test_cli_usage():
    assert run_keys("get")[0] == 2
    rc, _, err = run_keys("get", "k", "--store", "memory")
    assert rc == 2 and "admin listener" in err
    assert run_keys("frob", "k")[0] == 2
    assert run_keys("get", "k", "--bogus", "1")[0] == 2
    rc, _, err = run_keys("get", "k", "--store",
                          "postgres://127.0.0.1:1/none?connect_timeout=1")
    assert rc == 3 and "could not be reached" in err
    # a route's prefix and namespace are in its config: without it the
    # name would address another record, or a misspelt route none at all
    for cmd in ("get", "delete"):
        rc, _, err = run_keys(cmd, "k", "--route", "orders", "--store",
                              "postgres://127.0.0.1:1/none?connect_timeout=1")
        assert rc == 2 and "--route needs --config" in err, err


def test_token_file_must_be_readable(stub, tmp_path):
    for content in (None, "\n"):
        path = tmp_path / "t"
        if content is not None:
            path.write_text(content)
        r = subprocess.run([IDEMPROXY_BIN, "--upstream", stub.url,
                            "--admin-token-file", str(path),
                            "--check-config", "/dev/null"],
                           capture_output=True, text=True, timeout=30,
                           env=clean_env())
        assert r.returncode == 2 and "--admin-token-file" in r.stderr


def test_token_rotated_on_sighup(keyed, token_file):
    p = keyed()
    key = newkey("rot")
    post(p.port, key)
    with open(token_file, "w") as f:
        f.write("the-next-token-abcdefghijklmn\n")
    p.signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while admin(p, "GET", key, "body=1", token=TOKEN)[0] != 401:
        assert time.monotonic() < deadline, p.log()
        time.sleep(0.05)
    assert admin(p, "GET", key, "body=1",
                 token="the-next-token-abcdefghijklmn")[0] == 200
    # a file that cannot be read keeps the running token
    os.unlink(token_file)
    p.signal(signal.SIGHUP)
    while "keeping the running admin token" not in p.log():
        assert time.monotonic() < deadline + 5, p.log()
        time.sleep(0.05)
    assert admin(p, "GET", key, "body=1",
                 token="the-next-token-abcdefghijklmn")[0] == 200
