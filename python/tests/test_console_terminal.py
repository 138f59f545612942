"""The console's terminal (xterm.js) in a real browser (headless Chromium) against a real
`lockbox serve`: full-screen programs in a sandbox's PTY — `vim`, `less`, `top` — draw the
screen they draw in any terminal, the PTY takes the size of the window (and follows it when
the window changes), and nothing on the page is refused by the console's Content-Security-
Policy (xterm.js's styles included).

The screen is read through xterm.js's buffer (`#terminal`'s `lockboxTerminal.screen()`), as
a user would read it; keys are typed into the focused terminal.

With LOCKBOX_CONSOLE_SHOTS=DIR the tests save screenshots there (docs/console/*.png)."""

import importlib.util
import os
import re
import shutil

import console_util
import pytest
from conftest import need
from console_util import csp_violations, login, wait_for

SHOTS = os.environ.get("LOCKBOX_CONSOLE_SHOTS")


@pytest.fixture(scope="module")
def logged_browser():
    """A headless Chromium keeping the page's console messages (for CSP violations)."""
    need(importlib.util.find_spec("selenium") is not None, "selenium (pip install selenium)")
    need(console_util.browser_available(), f"Chromium and its driver ({console_util.CHROMIUM})")
    driver = console_util.chrome(browser_log=True)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def nobody_server():
    """A `lockbox serve` run as uid 65534 (the caller being root)."""
    need(os.geteuid() == 0, "root (the server is started as uid 65534)")
    server = console_util.start_server(uid=65534)
    try:
        yield server
    finally:
        console_util.stop_server(server)


@pytest.fixture(params=["root", "uid 65534"])
def shell(request, logged_browser):
    """A sandbox running `bash -i` on a PTY, its terminal open in the console and connected;
    yields the driver. The server runs as root, then as uid 65534. No CSP violation may have
    been logged by the end."""
    console_server = request.getfixturevalue("console_server" if request.param == "root" else "nobody_server")
    driver = logged_browser
    driver.set_window_size(*console_util.WINDOW)
    driver.get(console_server.base + "/ui")
    driver.delete_all_cookies()
    login(driver, console_server.base, console_server.token)
    csp_violations(driver)  # drop what came before
    status, sb, _ = console_server.api("POST", "/v1/sandboxes", {})
    assert status in (200, 201), sb
    status, proc, _ = console_server.api(
        "POST", f"/v1/sandboxes/{sb['id']}/processes",
        {"argv": ["bash", "--norc", "-i"], "env": {"TERM": "xterm-256color", "PS1": "$ "},
         "pty": {"cols": 80, "rows": 24}})
    assert status in (200, 201), proc
    try:
        driver.get(f"{console_server.base}/ui/#/sandboxes/{sb['id']}/terminal/{proc['id']}")
        wait_for(lambda: any(e.get_attribute("data-connected") == "yes"
                             for e in driver.find_elements("id", "terminal-state")),
                 what="the terminal connected")
        wait_for(lambda: any(line.startswith("$") for line in screen(driver)), timeout=15, what="the prompt")
        wait_for(lambda: fitted(driver), what="the terminal sized to its box")
        driver.find_element("id", "terminal").click()
        yield driver
        assert csp_violations(driver) == []
    finally:
        driver.set_window_size(*console_util.WINDOW)
        console_server.api("DELETE", f"/v1/sandboxes/{sb['id']}")


def screen(driver) -> list[str]:
    return driver.execute_script("return document.getElementById('terminal').lockboxTerminal.screen()")


def fitted(driver) -> bool:
    return driver.execute_script("return document.getElementById('terminal').lockboxTerminal.fitted()")


def size(driver) -> tuple[int, int]:
    s = driver.execute_script("return document.getElementById('terminal').lockboxTerminal.size()")
    return s["rows"], s["cols"]


def buffer_kind(driver) -> str:
    """`normal`, or `alternate` while a full-screen program has the screen."""
    return driver.execute_script("return document.getElementById('terminal').lockboxTerminal.xterm.buffer.active.type")


def typed(driver, *keys) -> None:
    """Types into the focused terminal (xterm.js turns keys into what a terminal sends)."""
    from selenium.webdriver.common.action_chains import ActionChains

    focused = driver.execute_script("return document.activeElement && document.activeElement.className")
    assert focused == "xterm-helper-textarea", f"the terminal has not the focus: {focused!r}"
    ActionChains(driver).send_keys(*keys).perform()


def wait_screen(driver, predicate, what, timeout=15.0) -> list[str]:
    """The screen once `predicate(screen)` holds; on a timeout the error shows the screen."""
    try:
        return wait_for(lambda: (lambda s: s if predicate(s) else None)(screen(driver)), timeout=timeout, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}; the screen:\n" + "\n".join(screen(driver))) from None


def run(driver, command: str, done: str) -> list[str]:
    """Types `command` and Enter at the prompt; the screen once a line ends with `done`."""
    typed(driver, command + "\n")
    return wait_screen(driver, lambda s: any(line.endswith(done) for line in s), f"`{command}` done")


def shot(driver, name) -> None:
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        driver.save_screenshot(os.path.join(SHOTS, f"{name}.png"))


def program(name: str, package: str) -> None:
    """Needs `name` on the host: the sandbox sees the host's /usr (scripts/test.sh installs it)."""
    need(shutil.which(name) is not None, f"{name} (apt-get install {package})")


def test_vim_draws_its_screen_takes_typed_text_and_quits(shell):
    program("vim", "vim")
    rows, _ = size(shell)
    typed(shell, "vim -N -u NONE /tmp/notes.txt\n")
    s = wait_screen(shell, lambda s: sum(line == "~" for line in s) >= rows - 3, "vim's empty-buffer tildes")
    assert buffer_kind(shell) == "alternate"
    assert 'notes.txt" [New]' in s[-1], s
    typed(shell, "ihello from the console")
    from selenium.webdriver.common.keys import Keys

    typed(shell, Keys.ESCAPE)
    s = wait_screen(shell, lambda s: s[0] == "hello from the console", "the typed text on vim's first line")
    assert s[1] == "~"
    shot(shell, "terminal")
    typed(shell, ":q!\n")
    wait_for(lambda: buffer_kind(shell) == "normal", what="vim to give the screen back")
    s = run(shell, "test -e /tmp/notes.txt || echo not-written", "not-written")
    assert not any(line == "~" for line in s)


def test_less_pages_a_long_file_and_quits(shell):
    program("less", "less")
    rows, _ = size(shell)
    run(shell, "seq 1 500 > /tmp/nums; echo made", "made")
    typed(shell, "less /tmp/nums\n")
    s = wait_screen(shell, lambda s: s[0] == "1" and s[rows - 2] == str(rows - 1), "less's first page")
    assert buffer_kind(shell) == "alternate"
    from selenium.webdriver.common.keys import Keys

    typed(shell, Keys.PAGE_DOWN)
    # One page on: the line after the first page's last is now at the top.
    s = wait_screen(shell, lambda s: s[0] == str(rows), "less's second page")
    assert s[rows - 2] == str(2 * rows - 2)
    typed(shell, "G")
    s = wait_screen(shell, lambda s: "500" in s, "the end of the file")
    assert "(END)" in s[rows - 1]
    typed(shell, "q")
    wait_for(lambda: buffer_kind(shell) == "normal", what="less to give the screen back")


def test_top_shows_its_header_and_quits(shell):
    program("top", "procps")
    typed(shell, "top -d 1\n")
    s = wait_screen(shell, lambda s: s[0].startswith("top - ") and any(line.startswith("Tasks:") for line in s),
                    "top's header")
    assert any(re.match(r"\s*PID\s+USER", line) for line in s), s
    assert any(line.endswith(" top") for line in s), s  # top lists itself
    # Once it has drawn twice (its clock in the first line moved on) it reads keys.
    wait_screen(shell, lambda now: now[0].startswith("top - ") and now[0] != s[0], "top's second refresh")
    typed(shell, "q")
    run(shell, "echo top-quit", "top-quit")


def test_the_pty_takes_the_windows_size_and_follows_it(shell):
    program("vim", "vim")
    rows, cols = size(shell)
    # The console sized the PTY to the window, not the 80x24 it was started with.
    assert (rows, cols) != (24, 80)
    run(shell, "stty size", f"{rows} {cols}")
    shell.set_window_size(800, 600)
    wait_for(lambda: size(shell)[0] < rows and size(shell)[1] < cols and fitted(shell), what="a smaller terminal")
    new = size(shell)
    s = run(shell, "stty size", f"{new[0]} {new[1]}")
    assert f"{new[0]} {new[1]}" in s
    # A full-screen program drawn after the change uses the whole new screen.
    typed(shell, "vim -N -u NONE\n")
    s = wait_screen(shell, lambda s: len(s) == new[0] and sum(line == "~" for line in s) >= new[0] - 3,
                    "vim on the smaller screen")
    typed(shell, ":q!\n")
    wait_for(lambda: buffer_kind(shell) == "normal", what="vim to quit")


def test_xterm_styles_apply_under_the_csp(shell):
    # The renderer's own style sheet (fonts, white-space) and a true colour cell's style both
    # apply, though the CSP allows no inline style; the fixture checks nothing was refused.
    run(shell, r"printf '\033[38;2;255;0;0mTRUECOLOUR\033[0m\n'", "TRUECOLOUR")
    got = wait_for(lambda: shell.execute_script("""
        const rows = document.querySelector('#terminal .xterm-rows');
        const span = [...rows.querySelectorAll('span')].find(s => s.textContent === 'TRUECOLOUR');
        return span && {ws: getComputedStyle(rows).whiteSpace, font: getComputedStyle(rows).fontFamily,
                        colour: getComputedStyle(span).color};"""), what="the true colour cells drawn")
    assert got["ws"] == "pre"
    assert "monospace" in got["font"]
    assert got["colour"] == "rgb(255, 0, 0)"
    # Leaving the page drops the terminal and its style sheets with it.
    shell.execute_script("location.hash = '#/sandboxes'")
    wait_for(lambda: shell.execute_script("return document.adoptedStyleSheets.length") == 0,
             what="the terminal's style sheets dropped")
