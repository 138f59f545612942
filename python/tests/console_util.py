"""The review console's browser tests: a running `lockbox serve` (free port, known token and
state directory) and a headless Chromium driven by Selenium, plus `login`.

The server binary is $LOCKBOX_BIN, else the workspace's debug build. A debug build serves the
console's files from $LOCKBOX_UI_DIR when it is set (passed through from the environment).
Chromium and its driver are Debian's (`chromium`, `chromium-driver`: scripts/test.sh installs
them as root); Selenium is pip-installed into the test venv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CHROMIUM = os.environ.get("LOCKBOX_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("LOCKBOX_CHROMEDRIVER", "/usr/bin/chromedriver")
WINDOW = (1280, 800)


def server_binary() -> str:
    env = os.environ.get("LOCKBOX_BIN")
    if env:
        return env
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    return os.path.join(target, "debug", "lockbox")


@dataclass
class Server:
    """A `lockbox serve` started by `start_server`."""

    base: str
    token: str
    state_dir: str
    proc: subprocess.Popen = field(repr=False)

    def api(self, method: str, path: str, body=None, headers=None, bearer: bool = True):
        """One request to the API: (status, parsed JSON body or None, response headers)."""
        data = None if body is None else json.dumps(body).encode()
        h = dict(headers or {})
        if body is not None:
            h.setdefault("Content-Type", "application/json")
        if bearer:
            h["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw, status, rh = r.read(), r.status, r.headers
        except urllib.error.HTTPError as e:
            raw, status, rh = e.read(), e.code, e.headers
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        return status, parsed, rh

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_server(*extra: str, state_dir: str | None = None, uid: int | None = None) -> Server:
    """Starts `lockbox serve` on 127.0.0.1 (a free port) with a fresh state directory (or
    `state_dir`); `extra` are more flags (e.g. `--journal`, URL). With `uid` (the caller being
    root) the server runs as that user and group, owning the fresh state directory."""
    binary = server_binary()
    state = state_dir or tempfile.mkdtemp(prefix="lockbox-console-")
    as_user = {}
    if uid is not None:
        os.chown(state, uid, uid)
        as_user = {"user": uid, "group": uid, "extra_groups": []}
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--print-token", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, **as_user)
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        if state_dir is None:  # made here: not left behind in /tmp
            shutil.rmtree(state, ignore_errors=True)
        raise RuntimeError(f"lockbox serve exited with {proc.returncode} before listening")
    info = json.loads(line)
    return Server(base=f"http://{info['listen']}", token=info["token"], state_dir=state, proc=proc)


def stop_server(server: Server, remove_state: bool = True) -> None:
    server.stop()
    if remove_state:
        # Its sandboxes' last processes may still be letting go of the state directory
        # while the first pass runs (full runs left an empty one in /tmp): try again briefly.
        for _ in range(20):
            shutil.rmtree(server.state_dir, ignore_errors=True)
            if not os.path.exists(server.state_dir):
                break
            time.sleep(0.1)


def browser_available() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def chrome(performance_log: bool = False, browser_log: bool = False):
    """A headless Chromium (1280x800) under Selenium; `--no-sandbox` when run as root
    (Chromium refuses its own sandbox as root). With `performance_log`, the DevTools network
    events are kept (`driver.get_log("performance")`): the statuses of requests a page
    cannot read itself (e.g. a cross-site one). With `browser_log`, the page's console
    messages are (`driver.get_log("browser")`, see `csp_violations`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    opts.add_argument("--headless=new")
    opts.add_argument(f"--window-size={WINDOW[0]},{WINDOW[1]}")
    opts.add_argument("--disable-dev-shm-usage")
    opts.add_argument("--no-first-run")
    if os.geteuid() == 0:
        opts.add_argument("--no-sandbox")
    prefs = {}
    if performance_log:
        prefs["performance"] = "ALL"
    if browser_log:
        prefs["browser"] = "ALL"
    if prefs:
        opts.set_capability("goog:loggingPrefs", prefs)
    # Chromium's shared-memory files (with --disable-dev-shm-usage) and profile go in a
    # directory of this driver's own, removed on quit: a browser that is killed leaves them.
    scratch = tempfile.mkdtemp(prefix="lockbox-chromium-")
    service = Service(executable_path=CHROMEDRIVER, env={**os.environ, "TMPDIR": scratch})
    driver = webdriver.Chrome(service=service, options=opts)
    quit_browser = driver.quit

    def quit_and_clean():
        try:
            quit_browser()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    driver.quit = quit_and_clean
    driver.set_window_size(*WINDOW)
    driver.set_script_timeout(30)
    return driver


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    """Polls `predicate` until it returns something truthy; that value, or AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def login(driver, base: str, token: str) -> None:
    """Opens the console logged out (the browser's cookies for it are dropped first), types the
    token into `#token`, clicks `#login`, and waits until the session cookie is set."""
    from selenium.webdriver.common.by import By

    # A logged-in console shows no login form: start from no session.
    driver.get(base + "/ui")
    driver.delete_all_cookies()
    driver.get(base + "/ui")

    def shown_field():
        found = [e for e in driver.find_elements(By.ID, "token") if e.is_displayed()]
        return found[0] if found else None

    field_ = wait_for(shown_field, what="a visible #token")
    field_.clear()
    field_.send_keys(token)
    driver.find_element(By.ID, "login").click()
    wait_for(lambda: driver.get_cookie("lockbox_session"), what="the session cookie")


def fetch(driver, path: str, method: str = "GET", body=None, csrf: bool = True) -> dict:
    """Runs `fetch` in the page (same origin, with the cookies; `X-CSRF-Token` from the
    lockbox_csrf cookie when `csrf`): {"status": N, "body": text}."""
    return driver.execute_async_script(
        """
        const [path, method, body, csrf, done] = arguments;
        const headers = {};
        if (body !== null) headers["Content-Type"] = "application/json";
        const m = document.cookie.match(/(?:^|; )lockbox_csrf=([^;]*)/);
        if (csrf && m) headers["X-CSRF-Token"] = m[1];
        fetch(path, {method, headers, credentials: "same-origin",
                     body: body === null ? undefined : JSON.stringify(body)})
          .then(async r => done({status: r.status, body: await r.text()}))
          .catch(e => done({status: -1, body: String(e)}));
        """, path, method, body, csrf)


def network_statuses(driver, url_part: str, method: str | None = None,
                     methods: dict | None = None) -> list[int]:
    """HTTP statuses of the responses whose URL contains `url_part` (and, with `method`, whose
    request used that method), from the performance log (needs `chrome(performance_log=True)`).
    Each read drains the log, so a request and its response can fall in different reads: pass
    the same `methods` dict to every call to carry what was seen of the requests."""
    methods = {} if methods is None else methods
    out = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        params = msg.get("params", {})
        if msg.get("method") == "Network.requestWillBeSent":
            methods[params["requestId"]] = params["request"]["method"]
        elif msg.get("method") == "Network.responseReceived":
            resp = params["response"]
            if url_part in resp["url"] and method in (None, methods.get(params["requestId"])):
                out.append(resp["status"])
    return out


def csp_violations(driver) -> list[str]:
    """The browser console's messages since the last call that say the Content-Security-Policy
    refused something (needs `chrome(browser_log=True)`)."""
    return [e["message"] for e in driver.get_log("browser")
            if "Content Security Policy" in e["message"] or "Content-Security-Policy" in e["message"]]


def terminal_lines(driver, element_id: str = "terminal") -> list[str]:
    """The lines of the console's terminal (`#terminal`, or a log's `#log`) as xterm.js holds
    them: scrollback then screen, trailing spaces trimmed."""
    return driver.execute_script(
        "const el = document.getElementById(arguments[0]); return el && el.lockboxTerminal ? el.lockboxTerminal.lines() : []",
        element_id)


def type_in_terminal(driver, *keys) -> None:
    """Clicks the console's terminal (which focuses it) once it is open and types `keys` as a
    user would."""
    from selenium.webdriver.common.action_chains import ActionChains

    wait_for(lambda: driver.execute_script("return document.getElementById('terminal').lockboxTerminal.fitted()"),
             what="the terminal open and sized")
    driver.find_element("id", "terminal").click()
    ActionChains(driver).send_keys(*keys).perform()
