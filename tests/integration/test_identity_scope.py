"""Scopes from verified identity through the real binary (issue 23;
DESIGN.md §4): who is asking decides whose key it is.

- scope = jwt:sub: a client whose token was refreshed (another token, the
  same sub) retries and gets the replay - one execution, where scope =
  header:Authorization executed twice; another sub with the same key is
  another caller (its own execution, never the other's response).
- Tokens that are missing, expired, forged, alg=none, signed with the
  public key as an HMAC secret (algorithm confusion), of another issuer or
  audience: 401 invalid-token with WWW-Authenticate, nothing claimed or
  forwarded. A request without a key still passes (the upstream does its
  own authentication).
- The key file is re-read on SIGHUP; a bad file keeps the running keys.
- A key file is read as what it holds (issue 44): an identity provider's
  certificate as DER (.cer) or the bare base64 of an x5c entry is its RSA
  key, so an HS256 token MAC'ed with those public bytes is 401; a file of no
  known form is refused at start, naming the file; a shared secret is one
  only as jwt_keys = hmac:FILE. --check-config shows each key's kind.
- scope = tls:subject / tls:san with --tls-client-ca: the verified client
  certificate is the caller; no certificate is 401; a certificate of
  another CA fails the handshake; the upstream is told the certificate's
  names in X-Client-Cert-Subject / -SAN, which a client cannot set.

Tokens are signed here with the openssl CLI (RS256, ES256) and hmac
(HS256): no Python package beyond the standard library.
"""
import base64
import hashlib
import hmac
import json
import signal
import ssl
import subprocess
import time
import uuid

import pytest

from support.http import assert_problem, upstream_echo
from support.procs import IDEMPROXY_BIN, clean_env, free_port
from support.tls import Pki, TlsConn
from test_routes import (JSON, echo_n, executions, replayed, routed, send,
                         wait_log, write_config)

assert routed  # a fixture, used by name


# ---------------------------------------------------------------- tokens

def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def ossl(*args, data=None, cwd=None):
    r = subprocess.run(["openssl", *args], input=data, capture_output=True,
                       timeout=60, cwd=cwd)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def der_to_raw(der, size):
    """An ECDSA signature as openssl writes it (DER) to JWS's R || S."""
    assert der[0] == 0x30
    i = 2 if der[1] < 0x80 else 2 + (der[1] & 0x7f)
    out = b""
    for _ in range(2):
        assert der[i] == 0x02
        n = der[i + 1]
        v = der[i + 2:i + 2 + n].lstrip(b"\0")
        out += v.rjust(size, b"\0")
        i += 2 + n
    return out


class Keys:
    """An RSA and an EC key pair and an HMAC secret, in files."""

    def __init__(self, d):
        self.dir = d
        ossl("genpkey", "-algorithm", "RSA", "-pkeyopt",
             "rsa_keygen_bits:2048", "-out", str(d / "rsa.key"))
        ossl("pkey", "-in", str(d / "rsa.key"), "-pubout", "-out",
             str(d / "rsa.pub"))
        ossl("genpkey", "-algorithm", "EC", "-pkeyopt",
             "ec_paramgen_curve:P-256", "-out", str(d / "ec.key"))
        ossl("pkey", "-in", str(d / "ec.key"), "-pubout", "-out",
             str(d / "ec.pub"))
        ossl("genpkey", "-algorithm", "RSA", "-pkeyopt",
             "rsa_keygen_bits:2048", "-out", str(d / "other.key"))
        self.secret = b"s" * 16 + uuid.uuid4().hex.encode()
        (d / "hs.secret").write_bytes(self.secret + b"\n")
        # the public keys of both kinds in one file
        (d / "both.pub").write_bytes((d / "rsa.pub").read_bytes() +
                                     (d / "ec.pub").read_bytes())
        # the RSA key's certificate as an identity provider publishes it:
        # DER (a .cer), and the bare base64 of a JWKS x5c entry
        ossl("req", "-x509", "-new", "-key", str(d / "rsa.key"), "-subj",
             "/CN=login.example.test", "-days", "2", "-outform", "DER",
             "-out", str(d / "rsa.cer"))
        self.cer = (d / "rsa.cer").read_bytes()
        self.x5c = base64.b64encode(self.cer)
        (d / "rsa.x5c").write_bytes(self.x5c + b"\n")

    def path(self, name):
        return str(self.dir / name)

    def token(self, claims, alg="RS256", key="rsa.key", header=None,
              secret=None):
        h = {"alg": alg, "typ": "JWT"}
        h.update(header or {})
        signing = (b64u(json.dumps(h).encode()) + "." +
                   b64u(json.dumps(claims).encode())).encode()
        if alg == "none":
            sig = b""
        elif alg == "HS256":
            sig = hmac.new(secret if secret is not None else self.secret,
                           signing, hashlib.sha256).digest()
        elif alg == "ES256":
            sig = der_to_raw(ossl("dgst", "-sha256", "-sign", self.path(key),
                                  data=signing), 32)
        else:
            sig = ossl("dgst", "-sha256", "-sign", self.path(key),
                       data=signing)
        return signing.decode() + "." + b64u(sig)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return Keys(tmp_path_factory.mktemp("jwtkeys"))


def claims(sub, **kw):
    now = int(time.time())
    c = {"sub": sub, "iat": now, "exp": now + 3600,
         "iss": "https://login.example.test/", "aud": "orders-api"}
    c.update(kw)
    return c


def jwt_ini(keys, keyfile="rsa.pub", extra="", algs="RS256, ES256, HS256",
            prefix=""):
    """A route scoped by jwt:sub; algs None: what the keys can verify."""
    algs = "" if algs is None else f"jwt_algorithms = {algs}"
    return f"""
[idemproxy]
upstream_timeout = 5s
lease = 10s

[route orders]
match          = POST /orders*
scope          = jwt:sub
jwt_keys       = {prefix}{keys.path(keyfile)}
{algs}
jwt_issuer     = https://login.example.test/
jwt_audience   = orders-api
{extra}

[route legacy]
match = POST /legacy*
scope = header:Authorization
"""


def bearer(token):
    return ("Authorization", f"Bearer {token}")


# ---------------------------------------------------------------- JWT

@pytest.mark.stores("memory", "postgres")
def test_refreshed_token_keeps_the_scope(store_args, keys, stub, routed):
    p = routed(jwt_ini(keys, "both.pub"), *store_args)
    base = executions(stub)
    k = ("Idempotency-Key", f"k-{uuid.uuid4()}")
    body = b'{"item":"book"}'
    a1 = keys.token(claims("alice", jti="1"))
    a2 = keys.token(claims("alice", jti="2", iat=int(time.time()) + 5),
                    alg="ES256", key="ec.key")
    first = send(p.port, "POST", "/orders", body, JSON, [bearer(a1), k])
    again = send(p.port, "POST", "/orders", body, JSON, [bearer(a2), k])
    assert first.status == 200 and not replayed(first), first
    assert again.status == 200 and replayed(again), again
    assert echo_n(again) == echo_n(first)
    # bob, the same key: his own execution, never alice's response
    b1 = keys.token(claims("bob"))
    bob = send(p.port, "POST", "/orders", body, JSON, [bearer(b1), k])
    assert bob.status == 200 and not replayed(bob), bob
    assert echo_n(bob) != echo_n(first)
    bob2 = send(p.port, "POST", "/orders", body, JSON, [bearer(b1), k])
    assert replayed(bob2) and echo_n(bob2) == echo_n(bob), bob2
    # the upstream got the token as sent
    assert upstream_echo(first)["hdict"]["authorization"] == [f"Bearer {a1}"]
    assert executions(stub) == base + 2

    # what scope = header:Authorization does with a refreshed token
    k = ("Idempotency-Key", f"h-{uuid.uuid4()}")
    x = send(p.port, "POST", "/legacy", body, JSON, [bearer(a1), k])
    y = send(p.port, "POST", "/legacy", body, JSON, [bearer(a2), k])
    assert not replayed(x) and not replayed(y) and echo_n(x) != echo_n(y)
    assert executions(stub) == base + 4


def test_refused_tokens_are_401(keys, stub, routed):
    p = routed(jwt_ini(keys, "both.pub"))
    base = executions(stub)
    now = int(time.time())
    body = b'{"item":"book"}'
    rsa_pub = open(keys.path("rsa.pub"), "rb").read()
    bad = {
        "missing": None,
        "not a JWT": "abc.def",
        "expired": keys.token(claims("alice", exp=now - 600)),
        "not yet": keys.token(claims("alice", nbf=now + 600)),
        "forged": keys.token(claims("alice"), key="other.key"),
        "alg none": keys.token(claims("alice"), alg="none"),
        "HS256 with the public key": keys.token(claims("alice"), alg="HS256",
                                                secret=rsa_pub),
        "another issuer": keys.token(claims("alice", iss="https://evil/")),
        "another audience": keys.token(claims("alice", aud=["billing"])),
        "no sub": keys.token({k: v for k, v in claims("x").items()
                              if k != "sub"}),
        "a tampered payload": (lambda t: t.split(".")[0] + "." +
                               b64u(json.dumps(claims("mallory")).encode()) +
                               "." + t.split(".")[2])(
                                   keys.token(claims("alice"))),
    }
    for what, token in bad.items():
        hs = [("Idempotency-Key", f"r-{uuid.uuid4()}")]
        if token is not None:
            hs.append(bearer(token))
        r = send(p.port, "POST", "/orders", body, JSON, hs)
        doc = assert_problem(r, 401, "invalid-token")
        assert r.header("WWW-Authenticate", "").startswith("Bearer"), (what, r)
        assert "token" in doc["detail"], (what, doc)
    # within the leeway (60 s) an expired token still counts
    ok = keys.token(claims("alice", exp=now - 20))
    r = send(p.port, "POST", "/orders", body, JSON,
             [bearer(ok), ("Idempotency-Key", f"l-{uuid.uuid4()}")])
    assert r.status == 200, r
    # no key on the route: passed through as before, token or not
    r = send(p.port, "POST", "/orders", body, JSON)
    assert r.status == 200 and not replayed(r), r
    assert executions(stub) == base + 2


def test_key_file_reloaded_on_sighup(tmp_path, keys, stub, routed):
    keyfile = tmp_path / "jwks.pem"
    keyfile.write_bytes(open(keys.path("rsa.pub"), "rb").read())
    ini = jwt_ini(keys).replace(keys.path("rsa.pub"), str(keyfile))
    p = routed(ini)
    body = b'{"item":"book"}'

    def post(token):
        return send(p.port, "POST", "/orders", body, JSON,
                    [bearer(token), ("Idempotency-Key", f"s-{uuid.uuid4()}")])

    rsa = keys.token(claims("alice"))
    ec = keys.token(claims("alice"), alg="ES256", key="ec.key")
    assert post(rsa).status == 200
    assert_problem(post(ec), 401, "invalid-token")
    # rotate to the EC key
    keyfile.write_bytes(open(keys.path("ec.pub"), "rb").read())
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: reloaded", 1)
    assert post(ec).status == 200
    assert_problem(post(rsa), 401, "invalid-token")
    # a broken file: the running keys stay
    keyfile.write_text("-----BEGIN PUBLIC KEY-----\nnot a key\n")
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: keeping the running config", 1)
    assert post(ec).status == 200


def post_token(p, token):
    return send(p.port, "POST", "/orders", b'{"item":"book"}', JSON,
                [bearer(token), ("Idempotency-Key", f"d-{uuid.uuid4()}")])


@pytest.mark.parametrize("keyfile", ["rsa.cer", "rsa.x5c"])
def test_der_and_x5c_are_the_public_key(keys, stub, routed, keyfile):
    """jwt_algorithms left to what the keys verify: a certificate is its RSA
    key (RS*, PS*), never an HMAC secret anyone holding it could MAC with."""
    p = routed(jwt_ini(keys, keyfile, algs=None))
    base = executions(stub)
    for what, secret in (("the DER bytes", keys.cer),
                         ("the x5c text", keys.x5c),
                         ("the file as written", keys.x5c + b"\n")):
        forged = keys.token(claims("mallory"), alg="HS256", secret=secret)
        r = post_token(p, forged)
        assert r.status == 401, (what, r)
        doc = assert_problem(r, 401, "invalid-token")
        assert "not accepted" in doc["detail"], (what, doc)
    assert executions(stub) == base
    assert post_token(p, keys.token(claims("alice"))).status == 200
    assert executions(stub) == base + 1


def start_fails(tmp_path, stub, text):
    """Start the proxy itself (not --check-config) with text: exit 2 and its
    stderr."""
    path = write_config(tmp_path, text, "start.ini")
    r = subprocess.run([IDEMPROXY_BIN, "--config", path, "--upstream",
                        stub.url, "--listen", f"127.0.0.1:{free_port()}",
                        "--admin-listen", f"127.0.0.1:{free_port()}"],
                       capture_output=True, timeout=20, env=clean_env({}))
    assert r.returncode == 2, r
    return r.stderr.decode()


def test_key_file_of_no_known_form_refused_at_start(tmp_path, keys, stub):
    blob = tmp_path / "idp.key"
    blob.write_bytes(b"these are words, not a key: the IdP sent something "
                     b"else\n")
    err = start_fails(tmp_path, stub, jwt_ini(keys, algs=None).replace(
        keys.path("rsa.pub"), str(blob)))
    assert f"jwt_keys: {blob}: text that is neither a JWKS, PEM, DER" in err, \
        err
    assert "hmac:FILE" in err, err
    # binary that is not DER
    blob.write_bytes(bytes(range(1, 200)))
    err = start_fails(tmp_path, stub, jwt_ini(keys, algs=None).replace(
        keys.path("rsa.pub"), str(blob)))
    assert f"{blob}: binary data that is neither" in err, err
    # a secret file is a secret only when the config says so
    err = start_fails(tmp_path, stub, jwt_ini(keys, "hs.secret", algs=None))
    assert f"{keys.path('hs.secret')}: " in err and "hmac:FILE" in err, err
    # and hmac: never makes a key file a secret
    err = start_fails(tmp_path, stub, jwt_ini(keys, "rsa.cer", algs=None,
                                              prefix="hmac:"))
    assert f"{keys.path('rsa.cer')}: hmac: names a DER certificate" in err, err


def test_hmac_secret_named_as_such(keys, stub, routed):
    p = routed(jwt_ini(keys, "hs.secret", algs=None, prefix="hmac:"))
    hs = keys.token(claims("alice"), alg="HS256")
    assert post_token(p, hs).status == 200
    assert_problem(post_token(p, keys.token(claims("alice"))), 401,
                   "invalid-token")


@pytest.mark.parametrize("route,what", [
    ("scope = jwt:sub\n", "needs jwt_keys"),
    ("scope = jwt:sub\njwt_keys = /nonexistent/jwks.json\n", "jwt_keys"),
    ("scope = jwt:sub\njwt_keys = {rsa}\njwt_algorithms = none\n", "none"),
    ("scope = jwt:sub\njwt_keys = {rsa}\njwt_algorithms = HS256\n",
     "no key of"),
    ("jwt_issuer = https://x/\n", "needs scope = jwt:CLAIM"),
    ("scope = jwt:\n", "jwt:CLAIM"),
    ("scope = tls:subject\n", "--tls-client-ca"),
])
def test_identity_config_errors(tmp_path, keys, stub, route, what):
    path = write_config(tmp_path, "[route o]\nmatch = POST /o\n" +
                        route.format(rsa=keys.path("rsa.pub")))
    r = subprocess.run([IDEMPROXY_BIN, "--check-config", path,
                        "--upstream", stub.url],
                       capture_output=True, timeout=20, env=clean_env({}))
    err = r.stderr.decode()
    assert r.returncode == 2 and "route o" in err and what in err, err


def test_check_config_shows_jwt(tmp_path, keys, stub):
    path = write_config(tmp_path, "[idemproxy]\nupstream = http://127.0.0.1:9\n"
                        + jwt_ini(keys, "both.pub").replace("[idemproxy]", ""))
    r = subprocess.run([IDEMPROXY_BIN, "--check-config", path],
                       capture_output=True, timeout=20, env=clean_env({}))
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    for want in ("scope = jwt:sub\n",
                 f"jwt_keys = {keys.path('both.pub')} (2 keys: RSA 2048 "
                 "RS/PS, EC P-256 ES256)\n",
                 "jwt_algorithms = RS256,ES256\n",
                 "jwt_issuer = https://login.example.test/\n",
                 "jwt_audience = orders-api\n", "jwt_leeway = 1m\n"):
        assert want in out, (want, out)
    # a DER certificate is shown as its key, a secret as one
    for ini, want in (
            (jwt_ini(keys, "rsa.cer", algs=None),
             f"jwt_keys = {keys.path('rsa.cer')} (1 key: RSA 2048 RS/PS)\n"
             "jwt_algorithms = RS256,RS384,RS512,PS256,PS384,PS512\n"),
            (jwt_ini(keys, "hs.secret", algs=None, prefix="hmac:"),
             f"jwt_keys = hmac:{keys.path('hs.secret')} (1 key: HMAC 48 "
             "bytes HS256/HS384)\njwt_algorithms = HS256,HS384\n")):
        path = write_config(tmp_path, "[idemproxy]\nupstream = "
                            "http://127.0.0.1:9\n" +
                            ini.replace("[idemproxy]", ""), "shown.ini")
        r = subprocess.run([IDEMPROXY_BIN, "--check-config", path],
                           capture_output=True, timeout=20, env=clean_env({}))
        assert r.returncode == 0, r.stderr.decode()
        assert want in r.stdout.decode(), (want, r.stdout.decode())


# ---------------------------------------------------------------- mTLS

@pytest.fixture(scope="module")
def mpki(tmp_path_factory):
    pki = Pki(tmp_path_factory.mktemp("mtlspki"))
    client = "extendedKeyUsage=clientAuth\n"
    pki._leaf("alice", "/O=Acme/CN=alice",
              "subjectAltName=email:alice@acme.example\n" + client)
    pki._leaf("alice2", "/O=Acme/CN=alice",      # a renewed certificate
              "subjectAltName=email:alice@acme.example\n" + client)
    pki._leaf("bob", "/O=Acme/CN=bob",
              "subjectAltName=DNS:bob.acme.example\n" + client)
    # a certificate of a CA the proxy does not trust
    pki._ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "eve.key",
              "-out", "eve.csr", "-subj", "/O=Acme/CN=alice")
    pki._ossl("x509", "-req", "-in", "eve.csr", "-CA", "other_ca.pem",
              "-CAkey", "other_ca.key", "-CAcreateserial", "-out", "eve.pem",
              "-days", "2")
    return pki


# what a client sees of a handshake the proxy refused
REFUSED = (ssl.SSLError, ConnectionError, OSError, EOFError)


def tls_conn(port, pki, who=None):
    ctx = ssl.create_default_context(cafile=pki.ca)
    if who is not None:
        ctx.load_cert_chain(pki.cert(who), pki.key(who))
    return TlsConn(port, pki, context=ctx)


MTLS_INI = """
[idemproxy]
upstream_timeout = 5s
lease = 10s

[route subject]
match = POST /subject*
scope = tls:subject

[route san]
match = POST /san*
scope = tls:san
"""


def mtls_post(p, pki, who, target, key, extra=()):
    with tls_conn(p.port, pki, who) as c:
        hs = [("Content-Type", "application/json")] + list(extra)
        if key is not None:
            hs.append(("Idempotency-Key", key))
        return c.request("POST", target, hs, b'{"item":"book"}')


def test_client_certificate_scopes(mpki, stub, routed):
    p = routed(MTLS_INI, "--tls-cert", mpki.cert("server"), "--tls-key",
               mpki.key("server"), "--tls-client-ca", mpki.ca)
    base = executions(stub)
    k = f"t-{uuid.uuid4()}"
    a = mtls_post(p, mpki, "alice", "/subject", k)
    a2 = mtls_post(p, mpki, "alice2", "/subject", k)   # renewed: same subject
    b = mtls_post(p, mpki, "bob", "/subject", k)
    assert a.status == 200 and not replayed(a), a
    assert replayed(a2) and echo_n(a2) == echo_n(a), a2
    assert b.status == 200 and not replayed(b) and echo_n(b) != echo_n(a), b
    echo = upstream_echo(a)["hdict"]
    assert echo["x-client-cert-subject"] == ["CN=alice,O=Acme"], echo
    assert echo["x-client-cert-san"] == ["email:alice@acme.example"], echo
    # by SAN
    k = f"s-{uuid.uuid4()}"
    c = mtls_post(p, mpki, "alice", "/san", k)
    d = mtls_post(p, mpki, "bob", "/san", k)
    assert not replayed(c) and not replayed(d) and echo_n(c) != echo_n(d)
    assert replayed(mtls_post(p, mpki, "alice2", "/san", k))
    # no certificate: 401 on a scoped route with a key; a request without
    # a key passes, and a client cannot claim a certificate by header
    r = mtls_post(p, mpki, None, "/subject", f"n-{uuid.uuid4()}")
    assert_problem(r, 401, "client-certificate-required")
    r = mtls_post(p, mpki, None, "/subject", None,
                  [("X-Client-Cert-Subject", "CN=alice,O=Acme")])
    assert r.status == 200 and not replayed(r), r
    assert "x-client-cert-subject" not in upstream_echo(r)["hdict"], r
    # a certificate of another CA does not get through the handshake
    with pytest.raises(REFUSED):
        mtls_post(p, mpki, "eve", "/subject", f"e-{uuid.uuid4()}")
    assert executions(stub) == base + 5


def test_client_certificate_required(mpki, stub, routed):
    p = routed(MTLS_INI, "--tls-cert", mpki.cert("server"), "--tls-key",
               mpki.key("server"), "--tls-client-ca", mpki.ca,
               "--tls-client-cert", "required")
    assert mtls_post(p, mpki, "alice", "/other", None).status == 200
    # TLS 1.3: the client's handshake ends before the server's refusal,
    # which comes on the first read (an alert, a reset or an EOF)
    with pytest.raises(REFUSED):
        mtls_post(p, mpki, None, "/other", None)
