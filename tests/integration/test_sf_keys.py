"""Keys as RFC 8941 sf-strings (issue 46 item 3; common/idemkey.h):
draft-ietf-httpapi-idempotency-key-header makes Idempotency-Key an
sf-string, so every value the RFC allows is a key: spaces inside the
quotes, the \\" and \\\\ escapes, parameters after the string (checked, not
part of the key). A bare value is still taken as it is (compatibility), and
every key that worked before maps to the same stored key, so a record
written before replays to either spelling.

  - a quoted key with spaces executes once and replays, on every store
  - "k", k, "k";v=1 and "k"; a=?1;b=tok are one key: one execution
  - a bare value keeps its ';' (abc;v=1 is the key abc;v=1, as before)
  - malformed values get 400 invalid-idempotency-key with the reason
  - the admin listener and the access log show a key with spaces
"""
import json

import pytest

from support.http import assert_problem, upstream_echo
from test_idempotency import executions, make_proxy, newkey, post, replayed  # noqa: F401
from test_keys import admin


def test_quoted_key_with_spaces_executes_once(make_proxy, stub):
    p = make_proxy()
    key = newkey("order") + " for  two"
    r1 = post(p.port, '"' + key + '"')
    r2 = post(p.port, '"' + key + '"')
    assert r1.status == r2.status == 200
    assert not replayed(r1) and replayed(r2)
    assert executions(stub) == 1
    # the same characters without the quotes are not a key: a space
    assert_problem(post(p.port, key), 400, "invalid-idempotency-key")
    assert executions(stub) == 1


@pytest.mark.stores("memory", "postgres")
def test_every_spelling_is_one_key(make_proxy, stub):
    p = make_proxy()
    key = newkey("k")
    spellings = [key, f'"{key}"', f'"{key}";v=1', f'"{key}"; a=?1;b=tok;c="x y"',
                 f'  "{key}";n=-12.5  ']
    rs = [post(p.port, s) for s in spellings]
    assert [r.status for r in rs] == [200] * len(spellings), rs
    assert not replayed(rs[0]) and all(replayed(r) for r in rs[1:])
    assert executions(stub) == 1
    # the escapes are unescaped: "a\"b" is the key a"b, as bare a"b
    k2 = newkey("q") + '"x\\y'
    quoted = '"' + k2.replace("\\", "\\\\").replace('"', '\\"') + '"'
    assert post(p.port, k2).status == 200
    assert replayed(post(p.port, quoted))
    assert executions(stub) == 2


def test_bare_value_keeps_its_semicolon(make_proxy, stub):
    """Compatibility: a bare value is taken whole, as before sf-strings."""
    p = make_proxy()
    key = newkey("b")
    assert post(p.port, key + ";v=1").status == 200
    r = post(p.port, key)		# another key: executes
    assert r.status == 200 and not replayed(r)
    assert replayed(post(p.port, key + ";v=1"))
    assert executions(stub) == 2


@pytest.mark.parametrize("value,why", [
    ('"k" ;v=1', "parameters"),
    ('"k"x', "parameters"),
    ('"k";V=1', "name"),
    ('"k";v=', "value"),
    ('"k";v=12345678901234567', "integer"),
    ('"k";v=?5', "boolean"),
    ('"k";v="open', "closing quote"),
    ('"a\tb"', "printable"),
    ('"a\\nb"', "escapes"),
    ('""', "empty"),
    ("a b", "quote it"),
], ids=["space-before-param", "junk-after", "upper-param", "no-value",
        "long-integer", "bad-boolean", "open-string", "tab", "bad-escape",
        "empty", "bare-space"])
def test_malformed_values_say_why(proxy, stub, value, why):
    r = post(proxy.port, value)
    doc = assert_problem(r, 400, "invalid-idempotency-key")
    assert why in doc["detail"], doc
    assert executions(stub) == 0


def test_a_key_with_spaces_is_found_and_logged(make_proxy, stub, tmp_path):
    log = tmp_path / "access.json"
    p = make_proxy("--access-log", str(log), "--access-log-format", "json")
    key = newkey("s") + " with space"
    assert post(p.port, f'"{key}";v=2').status == 200
    status, _, rec = admin(p, "GET", key)
    assert status == 200 and rec["key"] == key, rec
    p.stop()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["key"] for x in lines] == [key]


def test_a_key_header_that_is_the_request_id_goes_as_sent(make_proxy, stub):
    """An API whose key is its request id (--key-header X-Request-Id): the
    field goes upstream exactly as the client sent it, also when it is no
    request id (a quoted key with a space), and is still the key."""
    p = make_proxy("--key-header", "X-Request-Id")
    key = '"' + newkey("rid") + ' two";v=1'
    r1 = post(p.port, key, key_header="X-Request-Id")
    assert r1.status == 200
    echo = upstream_echo(r1)
    assert echo["hdict"]["x-request-id"] == [key], echo["headers"]
    assert replayed(post(p.port, key, key_header="X-Request-Id"))
    assert executions(stub) == 1
