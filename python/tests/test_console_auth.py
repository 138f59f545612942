"""The review console's authentication in a real browser against a real `lockbox serve`: the
API refuses requests without the session cookie or token (401); a wrong token logs nobody in;
logging in with the server token sets an HttpOnly, SameSite=Strict cookie with which the API
answers; a state-changing request needs the CSRF header; a POST from another origin, made by
a page the browser loaded from another port, is refused (403) and changes nothing; a
sandbox's page, opened from the console, is on its port's own origin, so the 80 KB of cookies
it sets leave the console working (issue 32)."""

import http.server
import os
import threading
import time
import urllib.request

import pytest
from conftest import need

import console_util
from console_util import fetch, login, network_statuses, wait_for


def test_api_without_cookie_or_token_is_401(console_server, browser):
    status, body, headers = console_server.api("GET", "/v1/sandboxes", bearer=False)
    assert status == 401
    assert body["code"] == "UNAUTHORIZED"
    assert headers["WWW-Authenticate"] == "Bearer"
    # The console's own page, not logged in: its fetch gets 401 too.
    browser.get(console_server.base + "/ui")
    browser.delete_all_cookies()
    assert fetch(browser, "/v1/sandboxes")["status"] == 401
    assert fetch(browser, "/ui/session")["status"] == 401


def test_a_wrong_token_logs_nobody_in(console_server):
    status, body, headers = console_server.api(
        "POST", "/ui/login", {"token": "not-the-token-0123456789"}, bearer=False)
    assert status == 401
    assert body["code"] == "UNAUTHORIZED"
    assert headers.get("Set-Cookie") is None


def test_login_sets_a_strict_httponly_cookie_and_the_api_answers(console_server, browser):
    login(browser, console_server.base, console_server.token)
    session = browser.get_cookie("lockbox_session")
    assert session["httpOnly"] is True
    assert session["sameSite"] == "Strict"
    assert len(session["value"]) == 64
    csrf = browser.get_cookie("lockbox_csrf")
    assert csrf["httpOnly"] is False and csrf["sameSite"] == "Strict"
    # The page's script cannot read the session id.
    assert "lockbox_session" not in browser.execute_script("return document.cookie")

    reply = fetch(browser, "/v1/sandboxes")
    assert reply["status"] == 200, reply
    assert '"sandboxes"' in reply["body"]
    assert fetch(browser, "/ui/session")["status"] == 200


def test_a_state_changing_request_needs_the_csrf_header(console_server, browser):
    login(browser, console_server.base, console_server.token)
    without = fetch(browser, "/v1/sandboxes/sb-missing/abort", method="POST", csrf=False)
    assert without["status"] == 403, without
    assert "X-CSRF-Token" in without["body"]
    # With it, the request reaches its handler (which does not know the sandbox).
    with_it = fetch(browser, "/v1/sandboxes/sb-missing/abort", method="POST")
    assert with_it["status"] == 404, with_it


def test_a_post_with_the_cookie_from_a_foreign_origin_is_403(console_server):
    status, _, headers = console_server.api(
        "POST", "/ui/login", {"token": console_server.token}, bearer=False)
    assert status == 204
    cookies = [c.split(";")[0] for c in headers.get_all("Set-Cookie")]
    csrf = next(c.split("=", 1)[1] for c in cookies if c.startswith("lockbox_csrf="))
    status, body, _ = console_server.api(
        "POST", "/v1/sandboxes", {}, bearer=False,
        headers={"Cookie": "; ".join(cookies), "X-CSRF-Token": csrf,
                 "Origin": "http://attacker.example"})
    assert status == 403
    assert body["code"] == "FORBIDDEN"
    assert "attacker.example" in body["message"]
    assert console_server.api("GET", "/v1/sandboxes")[1]["sandboxes"] == []


ATTACK = """<!doctype html><title>attack</title><script>
fetch("{base}/v1/sandboxes", {{method: "POST", mode: "no-cors", credentials: "include",
  headers: {{"Content-Type": "text/plain"}}, body: "{{}}"}})
  .then(() => document.title = "sent", () => document.title = "failed");
</script>"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_a_cross_site_post_from_another_page_is_refused(console_server, tmp_path):
    need(console_util.browser_available(), "Chromium and chromedriver")
    pytest.importorskip("selenium")
    (tmp_path / "attack.html").write_text(ATTACK.format(base=console_server.base))
    handler = lambda *a, **kw: _Quiet(*a, directory=str(tmp_path), **kw)  # noqa: E731
    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    driver = console_util.chrome(performance_log=True)
    try:
        login(driver, console_server.base, console_server.token)
        driver.get_log("performance")  # drop the login's events
        # Another port of the same host: the same site, so the browser sends the
        # SameSite=Strict cookie along; the server must refuse it by its origin.
        driver.get(f"http://127.0.0.1:{attacker.server_address[1]}/attack.html")
        wait_for(lambda: driver.title in ("sent", "failed"), what="the attack page's fetch")
        # The page's title can change before the browser logs the response: poll (the log
        # is drained by each read, so keep what was read).
        # Only the attack's POST counts: the console page, left just before, may still
        # log the answer to its own GET of the list.
        statuses, methods = [], {}

        def posts():
            return network_statuses(driver, console_server.base + "/v1/sandboxes", "POST", methods)

        def answered():
            statuses.extend(posts())
            return statuses

        wait_for(answered, what="the cross-site request's response in the browser's log")
        time.sleep(0.2)  # a second request, were there one, would show now
        statuses.extend(posts())
        assert statuses == [403], statuses
    finally:
        driver.quit()
        attacker.shutdown()
    assert console_server.api("GET", "/v1/sandboxes")[1]["sandboxes"] == []


def test_console_pages_carry_the_content_security_policy(console_server):
    with urllib.request.urlopen(console_server.base + "/ui") as r:
        csp = r.headers["Content-Security-Policy"]
        assert r.headers["X-Frame-Options"] == "DENY"
        assert r.headers["Cache-Control"] == "no-store"
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp


# A sandbox's server whose page sets 20 cookies of 4,000 bytes, valid for a year (issue 32).
COOKIE_PAGE = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"<!doctype html><title>page</title><p id=page>a sandbox's page</p>"
        self.send_response(200)
        for i in range(20):
            self.send_header("Set-Cookie", f"big{i}={'x' * 4000}; Path=/; Max-Age=31536000")
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _sandbox_page_leaves_the_console_working(server, driver):
    from selenium.webdriver.common.by import By

    status, box, _ = server.api("POST", "/v1/sandboxes", {})
    assert status == 201, box
    sid = box["id"]
    try:
        status, proc, _ = server.api("POST", f"/v1/sandboxes/{sid}/processes",
                                     {"argv": ["python3", "-c", COOKIE_PAGE, "8765"]})
        assert status == 201, proc
        status, port, _ = server.api("POST", f"/v1/sandboxes/{sid}/ports", {"port": 8765})
        assert status == 201, port
        origin = port["origin"]
        assert origin.startswith("http://8765-" + sid + ".localhost:"), port
        wait_for(lambda: server.api("GET", f"/v1/sandboxes/{sid}/ports/8765/")[0] == 200,
                 what="the sandbox's server")
        login(driver, server.base, server.token)
        # The sandbox's page in the console links the port's open_url.
        driver.get(f"{server.base}/ui#/sandboxes/{sid}")
        link = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#ports a.port-link"),
                        what="the exposed port's link")[0]
        assert link.get_attribute("href") == port["open_url"]
        assert link.get_attribute("rel") == "noopener noreferrer"
        # The console's user opens the port at the API's address, as before: the browser is
        # sent to the port's own origin (Chromium resolves *.localhost to the loopback).
        driver.get(f"{server.base}/v1/sandboxes/{sid}/ports/8765/")
        wait_for(lambda: driver.current_url == origin + "/", what="the port's own origin")
        assert driver.find_element(By.ID, "page").text == "a sandbox's page"
        assert len([c for c in driver.get_cookies() if c["name"].startswith("big")]) == 20
        # On the console's host nothing of it was stored, and the console and API answer.
        driver.get(server.base + "/ui")
        assert not [c for c in driver.get_cookies() if c["name"].startswith("big")]
        assert fetch(driver, "/ui/session")["status"] == 200
        reply = fetch(driver, "/v1/sandboxes")
        assert reply["status"] == 200, reply
        assert sid in reply["body"]
    finally:
        server.api("DELETE", f"/v1/sandboxes/{sid}")


def test_issue_32_a_sandbox_page_cannot_fill_the_console_cookie_jar(console_server, browser):
    _sandbox_page_leaves_the_console_working(console_server, browser)


def test_issue_32_a_sandbox_page_cannot_fill_the_console_cookie_jar_as_uid_65534(browser):
    need(os.geteuid() == 0, "root (the server is started as uid 65534)")
    server = console_util.start_server(uid=65534)
    try:
        _sandbox_page_leaves_the_console_working(server, browser)
    finally:
        console_util.stop_server(server)
