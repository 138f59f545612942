"""Helpers of the E2B SDK tests (test_*.py here). The unmodified E2B SDK (`e2b`, `e2b-code-interpreter`) against a real `lockbox serve`:
E2B_API_URL and E2B_SANDBOX_URL point at the server, E2B_API_KEY is its token (docs/e2b.md).
The server is the built binary ($LOCKBOX_BIN, else the workspace's debug build), started by
`serving`: per module by the `e2b_server` fixture (imported by each test module), which runs
the module once per HTTP version the SDK can speak (E2B_HTTP_VERSION 1.1 and 2: over plain
http both use HTTP/1.1 today, and "2" is the default a user gets), or by a test or fixture
that needs flags of its own."""

import contextlib
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))


def need(condition: bool, what: str) -> None:
    """As python/tests/conftest.py's: a skip locally, a failure in CI (LOCKBOX_TEST_REQUIRE=all)."""
    if condition:
        return
    if os.environ.get("LOCKBOX_TEST_REQUIRE") == "all":
        pytest.fail(f"missing in CI: {what}")
    pytest.skip(f"SKIP: {what}", allow_module_level=True)


# What `need` names when the SDK is not installed (the versions scripts/test.sh pins).
E2B_SDK = "the e2b SDK (pip install e2b==2.63.0 e2b-code-interpreter==2.11.5)"


E2B_VARS = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN", "E2B_HTTP_VERSION",
            "E2B_DEBUG", "E2B_ACCESS_TOKEN")


def point_sdk_at(base: str, token: str, http_version: str) -> dict:
    """Sets the SDK's environment for `base`; returns the previous values."""
    saved = {k: os.environ.get(k) for k in E2B_VARS}
    for k in E2B_VARS:
        os.environ.pop(k, None)
    os.environ["E2B_API_URL"] = base
    os.environ["E2B_SANDBOX_URL"] = base
    os.environ["E2B_API_KEY"] = token
    os.environ["E2B_DOMAIN"] = "lockbox.test"
    os.environ["E2B_HTTP_VERSION"] = http_version
    return saved


ENVD_PORT = "49983"


def envd_route(sandbox_id: str, token: str | None = None) -> dict:
    """The headers the SDK sends to reach a sandbox's envd through E2B_SANDBOX_URL (and its
    access token, when given): for tests that speak to envd without the SDK."""
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": ENVD_PORT}
    if token is not None:
        headers["X-Access-Token"] = token
    return headers


def restore(saved: dict) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def start(*extra: str, uid=None):
    """A `lockbox serve` (console_util.Server) with `extra` flags, as `uid` if given."""
    import console_util
    need(os.path.exists(console_util.server_binary()),
         f"the lockbox binary ({console_util.server_binary()}; cargo build -p lockbox-cli)")
    return console_util.start_server(*extra, uid=uid)


@contextlib.contextmanager
def serving(*extra: str, uid=None, http_version: str = "1.1"):
    """A `lockbox serve` (`start`'s arguments) with the SDK pointed at it over `http_version`;
    the SDK's environment is put back and the server stopped after."""
    import console_util
    server = start(*extra, uid=uid)
    saved = point_sdk_at(server.base, server.token, http_version)
    try:
        yield server
    finally:
        restore(saved)
        console_util.stop_server(server)


@pytest.fixture(scope="module", params=["1.1", "2"])
def e2b_server(request):
    """A `lockbox serve` the E2B SDK is pointed at (console_util.Server)."""
    try:
        import e2b  # noqa: F401
    except ImportError:
        need(False, E2B_SDK)
    with serving(http_version=request.param) as server:
        yield server


def eventually(predicate, within: float = 60.0, what: str = "condition"):
    """Polls `predicate` until it is true, failing after `within` seconds (a bound, not a
    timing assertion)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"{what} not reached within {within} s")
