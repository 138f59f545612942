"""Shared fixtures: a throwaway workspace and state directory per test, and whether a
missing optional dependency is a skip (locally) or a failure (CI: LOCKBOX_TEST_REQUIRE=all)."""

import os
import sys
import time

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
sys.path.insert(0, os.path.abspath(EXAMPLES))

REQUIRE_ALL = os.environ.get("LOCKBOX_TEST_REQUIRE") == "all"


def need(condition: bool, what: str) -> None:
    """Skips (locally) or fails (in CI) when an optional dependency is missing."""
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"missing in CI: {what}")
    pytest.skip(f"SKIP: {what}")


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A workspace with one file, and LOCKBOX_STATE_DIR under the test's tmp dir."""
    monkeypatch.setenv("LOCKBOX_STATE_DIR", str(tmp_path / "state"))
    w = tmp_path / "repo"
    w.mkdir()
    (w / "base.txt").write_text("base\n")
    (w / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    settle()
    return w


def settle() -> None:
    """Lets the clock tick after writing workspace files: a transaction's optimistic base
    check treats a change within the tick it began in as a change (docs/transactions.md)."""
    time.sleep(0.05)


def tree(path) -> dict[str, bytes]:
    """Every file under `path` with its content (to compare a workspace before/after)."""
    out = {}
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = fh.read()
    return out


# The review console's browser tests (python/tests/test_console_*.py): a live server and a
# headless Chromium, both per module. Helpers in console_util.py.

@pytest.fixture(scope="module")
def console_server():
    """A `lockbox serve` (console_util.Server: base, token, state_dir, api())."""
    import console_util

    binary = console_util.server_binary()
    need(os.path.exists(binary), f"the lockbox binary ({binary}; cargo build -p lockbox-cli)")
    server = console_util.start_server()
    try:
        yield server
    finally:
        console_util.stop_server(server)


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium WebDriver (1280x800), quit after the module."""
    import console_util

    try:
        import selenium  # noqa: F401
    except ImportError:
        selenium = None
    need(selenium is not None, "selenium (pip install selenium)")
    need(console_util.browser_available(),
         f"Chromium and its driver ({console_util.CHROMIUM}, {console_util.CHROMEDRIVER}; apt-get install chromium chromium-driver)")
    driver = console_util.chrome()
    try:
        yield driver
    finally:
        driver.quit()
