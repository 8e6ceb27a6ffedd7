"""idemproxy's own answers as real SDKs read them (docs/protocol.md
"Problem details"): stripe-node and openai, from npm at the versions pinned
in tests/support/sdk/package-lock.json, pointed at the proxy.

Both decide by the body's "error" member: stripe-node returns any JSON body
without one as the created object, whatever the status, and openai reports
"409 status code (no body)". Every problem document carries that member, so:

  409 request-in-progress   stripe-node: StripeAPIError, rawType
                            idempotency_error, code request-in-progress;
                            openai: ConflictError "409 <detail>"
  422 key mismatch          stripe-node: StripeAPIError, rawType
                            idempotency_error; openai:
                            UnprocessableEntityError "422 <detail>"
  503 store-unavailable     stripe-node: StripeAPIError, rawType api_error;
                            openai: InternalServerError "503 <detail>"

stripe-node maps a v1 error to its class by status first (generateV1Error in
its Error.js): StripeIdempotencyError only for a 400 or 404 whose type is
idempotency_error, StripeAPIError for any other status it has no class for,
409 and 422 among them. The type is kept as err.rawType, the code as
err.code: that is what an application tells them apart by.

The node side is tests/support/sdk/sdk_errors.js: it makes the SDK call and
then the same request raw, so each SDK error is held against the problem
document the proxy actually sent. The 409 is provoked without a race: a raw
first request with the stub's ?delay_ms= (out of the fingerprint with
--fingerprint-query ignore), and the SDK's duplicate only once the stub has
counted the first (it counts a request when it has read it, before the
delay), under --in-flight reject.

The SDKs are installed with `npm ci` into the build directory
(<build>/tests/support/sdk, or IDEMPROXY_SDK_DIR, or ~/.cache/idemproxy/sdk
for a binary outside a build directory), again only when the lock file
changed. Without npm (deploy/install-deps.sh installs Debian's) the tests
skip; a failing `npm ci` fails them. To move the pins: edit
tests/support/sdk/package.json, run `npm install --package-lock-only` there
and commit both files. The pinned versions run on Debian 12's node 18.
"""
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from support import npm
from support.procs import ROOT, free_port, wait_readyz

SDK_SRC = Path(ROOT) / "tests" / "support" / "sdk"
SCRIPT = SDK_SRC / "sdk_errors.js"
SDKS = ("stripe", "openai")
# what the SDK call sends: the path the stub echoes back
PATHS = {"stripe": "/v1/payment_intents", "openai": "/v1/chat/completions"}
# the class each pinned SDK raises, by status (module docstring)
CLASSES = {
    ("stripe", 409): "StripeAPIError",
    ("stripe", 422): "StripeAPIError",
    ("stripe", 503): "StripeAPIError",
    ("stripe", 502): "StripeAPIError",
    ("openai", 409): "ConflictError",
    ("openai", 422): "UnprocessableEntityError",
    ("openai", 503): "InternalServerError",
    ("openai", 502): "InternalServerError",
}


@pytest.fixture(scope="session")
def sdk_modules():
    """The directory whose node_modules holds the pinned SDKs (support/npm.py
    installs them into the build directory, or IDEMPROXY_SDK_DIR)."""
    try:
        return npm.install(SDK_SRC, npm.install_dir("sdk", "IDEMPROXY_SDK_DIR"))
    except npm.NodeUnavailable:
        pytest.skip("npm is not installed (deploy/install-deps.sh installs "
                    "Debian's npm)")


def run_sdk(modules, sdk, scenario, proxy, stub, key):
    """Run one scenario of sdk_errors.js; its JSON result."""
    env = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and k != "NODE_OPTIONS"}
    r = subprocess.run([shutil.which("node"), str(SCRIPT), str(modules), sdk,
                        scenario, str(proxy.port), str(stub.port), key],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, \
        f"sdk_errors.js {sdk} {scenario} exited {r.returncode}:\n" \
        f"{r.stdout}\n{r.stderr}"
    print(f"--- sdk_errors.js {sdk} {scenario} ---\n{r.stdout}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def problem_doc(raw, status, slug, error_type):
    """The raw answer's problem document, checked whole."""
    assert raw["status"] == status, raw
    doc = json.loads(raw["body"])
    assert doc["type"] == f"urn:idemproxy:problem:{slug}", doc
    assert doc["status"] == status and doc["title"] and doc["detail"], doc
    assert doc["error"] == {"type": error_type, "code": slug,
                            "message": doc["detail"]}, doc
    return doc


def assert_sdk_error(sdk, got, doc):
    """The SDK raised, with the class, type, code, status and message the
    document gives it."""
    status, err = doc["status"], doc["error"]
    assert got["ok"] is False, f"{sdk} took the {status} for a success: {got}"
    assert got["class"] == CLASSES[sdk, status], got
    assert got["status"] == status, got
    assert got["code"] == err["code"], got
    if sdk == "stripe":
        assert got["type"] == got["class"], got
        assert got["rawType"] == err["type"], got
        assert got["message"] == doc["detail"], got
    else:
        assert got["type"] == err["type"], got
        assert got["message"] == f"{status} {doc['detail']}", got


def executions(stub, key):
    return stub.stats()["keys"].get(key, 0)


def newkey(sdk, what):
    return f"sdk-{sdk}-{what}-{uuid.uuid4()}"


@pytest.fixture
def keyed_proxy(store_args, make_proxy):
    """make_proxy with the store setup's flags, once /readyz says the store
    is connected."""
    def make(*flags):
        p = make_proxy(*store_args, *flags)
        wait_readyz(p)
        return p
    return make


@pytest.mark.parametrize("sdk", SDKS)
def test_in_progress(sdk, keyed_proxy, stub, sdk_modules):
    """A duplicate while the first runs: 409, an error to the SDK, and the
    first still completes once."""
    p = keyed_proxy("--in-flight", "reject", "--fingerprint-query", "ignore")
    key = newkey(sdk, "busy")
    out = run_sdk(sdk_modules, sdk, "in-progress", p, stub, key)
    doc = problem_doc(out["raw"], 409, "request-in-progress",
                      "idempotency_error")
    assert_sdk_error(sdk, out["sdk"], doc)
    assert out["first"] == 200, out
    assert executions(stub, key) == 1


@pytest.mark.parametrize("sdk", SDKS)
def test_key_mismatch(sdk, keyed_proxy, stub, sdk_modules):
    """The SDK's first request executes and is returned as the object; the
    same key with other parameters is 422, an error to the SDK."""
    p = keyed_proxy()
    key = newkey(sdk, "mismatch")
    out = run_sdk(sdk_modules, sdk, "mismatch", p, stub, key)
    first = out["first"]
    assert first["ok"] is True, first
    assert first["value"]["method"] == "POST", first
    assert first["value"]["target"] == PATHS[sdk], first
    doc = problem_doc(out["raw"], 422, "idempotency-key-mismatch",
                      "idempotency_error")
    assert_sdk_error(sdk, out["sdk"], doc)
    assert executions(stub, key) == 1


@pytest.mark.parametrize("sdk", SDKS)
def test_store_unavailable(sdk, make_proxy, stub, sdk_modules):
    """A store nobody answers on (a PostgreSQL URL to a closed port): 503,
    an error to the SDK, nothing executed."""
    p = make_proxy("--store",
                   f"postgresql://idem@127.0.0.1:{free_port()}/idem")
    wait_readyz(p, 503)
    key = newkey(sdk, "down")
    out = run_sdk(sdk_modules, sdk, "store-down", p, stub, key)
    doc = problem_doc(out["raw"], 503, "store-unavailable", "api_error")
    assert_sdk_error(sdk, out["sdk"], doc)
    assert executions(stub, key) == 0


@pytest.mark.parametrize("sdk", SDKS)
def test_unknown_outcome(sdk, keyed_proxy, stub, sdk_modules):
    """The upstream executed the first request and dropped the connection
    (issue 43): its outcome is unknown, and the SDK's request with the same
    key gets the replayed 502 outcome-unknown - an error, never a created
    object, and never a second execution."""
    p = keyed_proxy("--fingerprint-query", "ignore")
    key = newkey(sdk, "unknown")
    out = run_sdk(sdk_modules, sdk, "unknown", p, stub, key)
    assert out["first"] == 502, out
    doc = problem_doc(out["raw"], 502, "outcome-unknown", "idempotency_error")
    assert_sdk_error(sdk, out["sdk"], doc)
    assert executions(stub, key) == 1
