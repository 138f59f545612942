"""Long-lived sandboxes in process (`Sandbox.open`): sessions, streamed processes, files, the
copy-on-write branch, timeouts, clean close; the same scenario against `lockbox serve`
through `lockbox.Client`, since both must behave alike."""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import need, tree
from test_client import server  # noqa: F401 - the live `lockbox serve` fixture

from lockbox import Client, LocalSandbox, Sandbox
from lockbox.client import ExecResult, RemoteSandbox
from lockbox.errors import ServerError, SetupError


@pytest.fixture(params=["local", "remote"])
def open_box(request, tmp_path):
    """Opens a sandbox on `workdir` in process or on a live `lockbox serve`."""
    if request.param == "local":
        return lambda **kw: Sandbox.open(state_dir=tmp_path / "state", **kw)
    url, token = request.getfixturevalue("server")
    return lambda **kw: Client(url, token).create(**kw)


def test_session_process_files_and_commit_work_alike_locally_and_remotely(open_box, ws):
    with open_box(workdir=str(ws), env={"GREETING": "hi"}) as box:
        assert isinstance(box, RemoteSandbox)
        sh = box.session("build")
        assert sh.exec("mkdir -p sub && cd sub && export A=1").exit_code == 0
        r = sh.exec('echo "$PWD $A $GREETING"')
        assert isinstance(r, ExecResult)
        assert r.stdout == f"{ws}/sub 1 hi\n"

        p = box.start_process(command="for i in 1 2 3; do echo line$i; sleep 0.05; done; echo oops >&2")
        events = list(p.follow())
        assert b"".join(e.bytes for e in events if e.event == "stdout") == b"line1\nline2\nline3\n"
        assert b"".join(e.bytes for e in events if e.event == "stderr") == b"oops\n"
        assert events[-1].event == "eof"
        assert p.logs().text == "line1\nline2\nline3\noops\n"

        box.files.write("sub/new.txt", b"\x00new\n")
        assert box.files.read("sub/new.txt") == b"\x00new\n"
        assert sh.exec("cat new.txt").stdout_bytes == b"\x00new\n"
        assert not (ws / "sub").exists()  # nothing reaches the workdir before a commit

        changes = {c.path: c.kind for c in box.changes()}
        assert changes.get("sub/new.txt") == "added", changes
        # Modes: octal text on the wire, a number in Change.mode.
        assert box.files.stat("sub/new.txt")["mode"] == "0644"
        assert {c.path: c.mode for c in box.changes()}["sub/new.txt"] == 0o644
        box.commit()
        assert (ws / "sub" / "new.txt").read_bytes() == b"\x00new\n"
        assert (ws / "base.txt").read_text() == "base\n"


def test_watch_works_alike_locally_and_remotely_and_closing_it_stops_it(open_box):
    with open_box() as box:
        box.exec("mkdir -p /tmp/w")
        with box.watch("/tmp/w") as w:
            box.exec("echo a > /tmp/w/a && mv /tmp/w/a /tmp/w/b && rm /tmp/w/b")
            seen = []
            for e in w:
                seen.append((e["kind"], e["path"], e.get("from")))
                if e["kind"] == "deleted":
                    break
        assert ("created", "/tmp/w/a", None) in seen
        assert ("moved", "/tmp/w/b", "/tmp/w/a") in seen
        assert seen[-1] == ("deleted", "/tmp/w/b", None)
        # A sandbox has at most 32 watches: 40 opened and closed in turn never reach it.
        for _ in range(40):
            with box.watch("/tmp/w", recursive=False):
                pass


def test_abort_leaves_the_workdir_byte_identical(open_box, ws):
    before = tree(ws)
    with open_box(workdir=str(ws)) as box:
        assert box.exec("echo changed > base.txt; rm calc.py; echo x > extra.txt").exit_code == 0
        assert len(box.changes()) == 3
        box.abort()
        assert box.changes() == []
        assert box.exec("cat base.txt").stdout == "base\n"
    assert tree(ws) == before


def test_timeout_kills_the_command_tree_and_the_session_survives(open_box):
    with open_box() as box:
        sh = box.session("s")
        sh.exec("export KEPT=yes")
        r = sh.exec("(sleep 300 &) ; sleep 300", timeout=0.5)
        assert r.timed_out and r.exit_code == 124
        assert sh.exec("echo $KEPT").stdout == "yes\n"
        assert "sleep 300" not in sh.exec("ps -eo args").stdout


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def test_closing_leaves_no_process_and_no_temp_dir(tmp_path, ws, monkeypatch):
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    before = descendants(os.getpid())
    with Sandbox.open(workdir=ws, on_exit="abort", state_dir=tmp_path / "state") as box:
        box.start_process(argv=["sleep", "4242"])
        box.session("other").exec("(setsid sleep 4243 &)")
        running = descendants(os.getpid()) - before
        assert running, "the sandbox's processes are children of this process"
    deadline = time.monotonic() + 10
    while descendants(os.getpid()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert descendants(os.getpid()) - before == set()
    assert os.listdir(private_tmp) == []
    branches = tmp_path / "state" / "branches"
    # `.new/` is where branches are built before they appear (kept, empty, between creations).
    assert not branches.exists() or [n for n in os.listdir(branches) if n != ".new"] == []
    assert not (branches / ".new").exists() or os.listdir(branches / ".new") == []
    with pytest.raises(ServerError) as e:
        box.exec("true")
    assert e.value.status in (404, 409, 410)


def test_errors_are_the_servers_codes(tmp_path):
    with Sandbox.open(state_dir=tmp_path / "state") as box:
        assert isinstance(box, LocalSandbox)
        with pytest.raises(ServerError) as e:
            box.files.read("/tmp/missing")
        assert e.value.status == 404 and e.value.code == "FILE_NOT_FOUND"
        with pytest.raises(ServerError) as e:
            box.start_process()
        assert e.value.status == 400 and e.value.code == "INVALID_REQUEST"


def test_net_allow_reaches_only_the_listed_destination(tmp_path):
    from test_net import PROBE, Server

    a, b = Server("hello-a"), Server("hello-b")
    try:
        with Sandbox.open(net_allow=[f"127.0.0.2:{a.port}"], state_dir=tmp_path / "state") as box:
            box.files.write("/tmp/probe.py", PROBE.encode())
            assert box.exec(f"python3 /tmp/probe.py {a.port}").stdout.strip() == "hello-a"
            assert box.exec(f"python3 /tmp/probe.py {b.port}").stdout.strip().startswith("refused")
    finally:
        a.close()
        b.close()


def test_a_state_dir_held_by_another_process_is_refused_and_the_default_takes_a_free_one(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKBOX_STATE_DIR", str(tmp_path / "base"))
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom lockbox import Sandbox\nb = Sandbox.open()\n"
         "print(b.client.state_dir, flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = child.stdout.readline().strip()
        assert held == str(tmp_path / "base" / "sdk" / "0")
        with pytest.raises(SetupError) as e:
            Sandbox.open(state_dir=held)
        assert "in use by another lockbox runtime" in str(e.value)
        with Sandbox.open() as box:
            assert box.client.state_dir == str(tmp_path / "base" / "sdk" / "1")
            assert box.exec("echo ok").stdout == "ok\n"
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    assert child.returncode == 0


def test_async_open(tmp_path):
    async def main():
        box = await Sandbox.open_async(state_dir=tmp_path / "state")
        r = await box.exec("echo async")
        events = [e async for e in box.exec_stream("echo streamed")]
        await box.delete()
        return r.stdout, b"".join(e.bytes for e in events if e.event == "stdout")

    assert asyncio.run(main()) == ("async\n", b"streamed\n")


def test_bad_arguments_fail_before_anything_starts(tmp_path):
    from lockbox.errors import PolicyError, UsageError

    with pytest.raises(UsageError):
        Sandbox.open(net_allow=["nope"], state_dir=tmp_path / "state")
    with pytest.raises(UsageError):
        Sandbox.open(max_cpu_time=1, state_dir=tmp_path / "state")
    with pytest.raises(PolicyError):
        Sandbox.open(timeout="soon", state_dir=tmp_path / "state")


NOBODY = r"""
import json, sys
from lockbox import Sandbox
ws, state = sys.argv[1], sys.argv[2]
with Sandbox.open(workdir=ws, state_dir=state) as box:
    sh = box.session("s")
    sh.exec("cd /tmp && export A=1")
    who = sh.exec("echo $(id -u) $PWD $A").stdout.strip()
    box.exec("echo hi > made.txt")
    box.commit()
print(json.dumps({"who": who}))
"""


def test_open_works_as_uid_65534():
    need(os.geteuid() == 0, "root (the test re-runs as uid 65534)")
    need(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    probe = subprocess.run(as_nobody + [sys.executable, "-c", "import lockbox"], capture_output=True)
    need(probe.returncode == 0, f"a Python with lockbox that uid 65534 can run ({sys.executable})")
    root = tempfile.mkdtemp(prefix="lockbox-nobody-open-")
    try:
        ws = os.path.join(root, "repo")
        os.mkdir(ws)
        for p in (root, ws):
            os.chown(p, 65534, 65534)
        res = subprocess.run(as_nobody + [sys.executable, "-c", NOBODY, ws, os.path.join(root, "state")],
                             capture_output=True, text=True, cwd=root, timeout=300)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout.strip().splitlines()[-1]) == {"who": "65534 /tmp 1"}
        with open(os.path.join(ws, "made.txt")) as f:
            assert f.read() == "hi\n"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_gil_is_released_while_a_call_waits(tmp_path):
    import threading

    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.01)

    with Sandbox.open(state_dir=tmp_path / "state") as box:
        t = threading.Thread(target=spin)
        t.start()
        ticks.clear()
        r = box.exec("sleep 0.5")
        during = len(ticks)
        stop.set()
        t.join()
    assert r.exit_code == 0 and during > 0


def test_an_exposed_port_is_reached_on_its_host_loopback_port_locally_and_remotely(open_box):
    import urllib.request

    with open_box() as box:
        box.files.write("/tmp/site/hello.txt", b"hello-from-inside\n")
        box.start_process(argv=["python3", "-m", "http.server", "8741", "--bind", "127.0.0.1",
                                "--directory", "/tmp/site"])
        port = box.expose_port(8741, host_loopback=True)
        assert port["port"] == 8741 and port["host_url"].startswith("http://127.0.0.1:")
        assert ("url" in port) == (not isinstance(box, LocalSandbox)), port
        body = None
        for _ in range(200):
            try:
                with urllib.request.urlopen(port["host_url"] + "hello.txt", timeout=10) as r:  # noqa: S310
                    body = r.read()
                break
            except OSError:
                time.sleep(0.05)
        assert body == b"hello-from-inside\n"
        assert [p["port"] for p in box.ports()] == [8741]
        box.unexpose_port(8741)
        with pytest.raises(ServerError) as e:
            box.unexpose_port(8741)
        assert e.value.code == "PORT_NOT_EXPOSED" and e.value.status == 404


def test_snapshots_capture_the_sandbox_files_alike_locally_and_remotely(open_box, ws):
    with open_box(workdir=str(ws)) as box:
        box.exec("echo one > made.txt")
        snap = box.snapshot("after one")
        assert snap["name"] == "after one" and snap["sandbox"] == box.id
        assert snap["bytes"] > 0 and snap["entries"] >= 1
        # The sandbox goes on after the snapshot.
        assert box.exec("echo two >> made.txt; cat made.txt").stdout == "one\ntwo\n"
        client = box.client
        assert [s["id"] for s in client.snapshots()] == [snap["id"]]
        assert client.snapshot(snap["id"])["name"] == "after one"
        with pytest.raises(ServerError) as e:
            box.snapshot("bad\nname")
        assert e.value.status == 400
        client.delete_snapshot(snap["id"])
        assert client.snapshots() == []
        with pytest.raises(ServerError) as e:
            client.snapshot(snap["id"])
        assert (e.value.status, e.value.code) == (404, "SNAPSHOT_NOT_FOUND")
    with open_box() as box:
        with pytest.raises(ServerError) as e:
            box.snapshot()
        assert e.value.code == "NO_WORKDIR"


def test_forks_are_committed_together_under_a_conflict_policy_locally_and_remotely(open_box, ws):
    with open_box(workdir=str(ws), on_exit="abort") as box:
        box.exec("echo v2 > base.txt")
        snap = box.snapshot("v2")
        client = box.client
        forks = client.fork(snap, 3)
        try:
            ids = [f.id for f in forks]
            for i, f in enumerate(forks):
                f.exec(f"echo fork{i} > mine{i}.txt")
            forks[1].exec("echo one > both.txt")
            forks[2].exec("echo two > both.txt")
            before = tree(ws)
            # fail (the default): refused, naming the path and its sandboxes; nothing changes.
            with pytest.raises(ServerError) as e:
                client.commit_together(forks)
            assert (e.value.status, e.value.code) == (409, "CONFLICT")
            assert e.value.details["conflicts"] == [{"path": "both.txt", "sandboxes": ids[1:]}]
            assert tree(ws) == before
            # A dry run lists the merged result, the snapshot's change once; nothing changes.
            dry = client.commit_together(forks, conflicts="last_writer_wins", dry_run=True)
            assert dry["dry_run"] and not dry["committed"] and tree(ws) == before
            assert [c.path for c in dry["changes"]] == ["base.txt", "both.txt", "mine0.txt", "mine1.txt", "mine2.txt"]
            done = client.commit_together(ids, conflicts="last_writer_wins")
            assert done["committed"] and done["conflicts"] == [
                {"path": "both.txt", "sandboxes": ids[1:], "winner": ids[2]}]
            assert [[c.path for c in x["changes"]] for x in done["contributions"]] == [
                ["mine0.txt"], ["both.txt", "mine1.txt"], ["both.txt", "mine2.txt"]]
            assert (ws / "both.txt").read_text() == "two\n" and (ws / "base.txt").read_text() == "v2\n"
            assert all((ws / f"mine{i}.txt").read_text() == f"fork{i}\n" for i in range(3))
            # The forks keep running over the new workdir; the loser still sees its version.
            assert forks[0].changes() == [] and forks[0].exec("cat both.txt").stdout == "two\n"
            assert [c.path for c in forks[1].changes()] == ["both.txt"]
            with pytest.raises(ServerError) as e:
                client.commit_together([forks[0], "sb-000000000000"])
            assert (e.value.status, e.value.code) == (404, "SANDBOX_NOT_FOUND")
            with pytest.raises(ServerError) as e:
                client.commit_together(forks, conflicts="newest")
            assert (e.value.status, e.value.details["field"]) == (400, "conflicts")
        finally:
            for f in forks:
                f.close()


def test_forks_and_restores_work_alike_locally_and_remotely(open_box, ws):
    with open_box(workdir=str(ws), on_exit="abort") as box:
        sh = box.session("work")
        sh.exec("mkdir -p sub && cd sub && export MODE=fast")
        box.exec("echo v2 > base.txt; rm calc.py")
        snap = box.snapshot("v2")
        client = box.client
        forks = box.client.fork(snap, 2)
        try:
            assert len(forks) == 2 and all(isinstance(f, type(box)) for f in forks)
            for i, f in enumerate(forks):
                # Exactly the snapshot's files; the session where the snapshot found it.
                assert f.exec("cat base.txt; ls").stdout == "v2\nbase.txt\nsub\n"
                assert f.exec('echo "$PWD $MODE"', session="work").stdout == f"{ws}/sub fast\n"
                f.exec(f"echo fork{i} > mine.txt")
            assert [c.path for c in client.snapshot_diff(snap, to_sandbox=forks[0].id)] == ["mine.txt"]
            assert {c.path for c in client.snapshot_diff(snap)} == {"base.txt", "calc.py", "sub"}
            # One fork commits; its sibling's commit of the same paths conflicts.
            forks[0].commit()
            assert (ws / "base.txt").read_text() == "v2\n" and (ws / "mine.txt").read_text() == "fork0\n"
            with pytest.raises(ServerError) as e:
                forks[1].commit()
            assert e.value.code == "CONFLICT"
            assert (ws / "mine.txt").read_text() == "fork0\n"
            with pytest.raises(ServerError) as e:
                client.delete_snapshot(snap["id"])
            assert e.value.code == "SNAPSHOT_IN_USE"
        finally:
            for f in forks:
                f.close()
        # The sandbox rolls back to its snapshot.
        box.exec("echo v3 > base.txt; touch junk")
        info = box.restore(snap)
        assert info["id"] == box.id and info["state"] == "running"
        # The snapshot's files over the workdir as it is now (with the fork's commit).
        assert box.exec("cat base.txt; ls").stdout == "v2\nbase.txt\nmine.txt\nsub\n"
        assert box.exec('echo "$PWD $MODE"', session="work").stdout == f"{ws}/sub fast\n"
        # Fork in one call: a snapshot of the restored sandbox (on its snapshot), then a fork.
        [again] = box.fork(1, name="after restore")
        try:
            assert again.exec("cat base.txt").stdout == "v2\n"
            assert again.info["snapshot"]["parent"] == snap["id"]
            assert again.info["snapshot"]["name"] == "after restore"
        finally:
            again.close()
        client.delete_snapshot(again.info["snapshot"]["id"])
        with pytest.raises(ServerError) as e:
            box.restore("s-none")
        assert (e.value.status, e.value.code) == (404, "SNAPSHOT_NOT_FOUND")
        with pytest.raises(ServerError) as e:
            client.fork(snap, 0)
        assert e.value.status == 400


def test_a_snapshot_keeps_tmp_when_asked_and_its_forks_find_it(open_box, ws):
    with open_box(workdir=str(ws), on_exit="abort") as box:
        box.exec("mkdir -p /tmp/cache && echo warm > /tmp/cache/data")
        [fork] = box.fork(1, include_tmp=True)
        try:
            assert fork.exec("cat /tmp/cache/data").stdout == "warm\n"
        finally:
            fork.close()
        [plain] = box.fork(1)
        try:
            assert plain.exec("test -e /tmp/cache || echo absent").stdout == "absent\n"
        finally:
            plain.close()


def test_audit_lists_the_network_decisions_of_the_sandbox_locally_and_remotely(open_box):
    from test_net import PROBE, Server

    a = Server("hello-a")
    try:
        with open_box(net_allow=[f"127.0.0.2:{a.port}"]) as box:
            box.files.write("/tmp/probe.py", PROBE.encode())
            assert box.exec(f"python3 /tmp/probe.py {a.port}").stdout.strip() == "hello-a"
            # Another port of 127.0.0.2 would stay inside (the sandbox's loopback): not logged.
            box.files.write("/tmp/probe.py", PROBE.replace("127.0.0.2", "192.0.2.1").encode())
            assert box.exec("python3 /tmp/probe.py 80").stdout.strip() == "refused PermissionError"
            deadline = time.monotonic() + 10
            events = box.audit()
            while len(events) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
                events = box.audit()
            assert [(e["kind"], e["decision"], e["address"], e["port"]) for e in events] == [
                ("connect", "allowed", "127.0.0.2", a.port),
                ("connect", "denied", "192.0.2.1", 80),
            ], events
            assert events[1]["reason"] == "not in the allow-list"
            for e in events:
                assert e["sandbox"] == box.id and e["pid"] > 0, e
                assert "/tmp/probe.py" in e["command"], e
            with box.audit(follow=True) as live:
                assert [next(live), next(live)] == events
    finally:
        a.close()


def test_net_ask_questions_reach_the_callback_locally_and_remotely_and_deny_answers_refuse(open_box):
    from test_net import PROBE

    asked = []

    def answer(question):
        asked.append(question)
        return "deny"

    with open_box(net_allow=["tcp://listed.test:1"], net_ask=True, net_ask_timeout=20) as box:
        box.on_ask(answer)
        box.files.write("/tmp/probe.py", PROBE.replace("127.0.0.2", "192.0.2.1").encode())
        assert box.exec("python3 /tmp/probe.py 80").stdout.strip() == "refused PermissionError"
        assert [(q["kind"], q["address"], q["port"], q["protocol"]) for q in asked] == [
            ("connect", "192.0.2.1", 80, "tcp")], asked
        assert "/tmp/probe.py" in asked[0]["command"] and asked[0]["pid"] > 0
        assert box.approvals() == []
        with pytest.raises(ServerError) as e:
            box.decide(asked[0]["id"], "once")
        assert e.value.code == "QUESTION_DECIDED" and e.value.status == 409
        deadline = time.monotonic() + 10
        events = box.audit()
        while len(events) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            events = box.audit()
        assert [(e["decision"], e["reason"], e.get("question")) for e in events] == [
            ("asked", "not in the allow-list; asked", asked[0]["id"]),
            ("denied", "denied by the API", asked[0]["id"]),
        ], events


def test_sandbox_open_on_ask_approves_a_name_for_the_sandbox_once_asked(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts"
    hosts.write_text("198.18.0.9 asked.test\n")
    monkeypatch.setenv("LOCKBOX_NET_HOSTS_FILE", str(hosts))
    asked = []

    def answer(question):
        asked.append(question)
        return "sandbox"

    with Sandbox.open(state_dir=tmp_path / "state", net_allow=["tcp://listed.test:1"],
                      net_ask=True, on_ask=answer) as box:
        box.files.write("/tmp/resolve.py", b"import socket\nprint(socket.gethostbyname('asked.test'))\n")
        assert box.exec("python3 /tmp/resolve.py").stdout == "198.18.0.9\n"
        first = len(asked)
        assert first >= 1 and {(q["kind"], q["name"]) for q in asked} == {("dns", "asked.test")}, asked
        # Approved for the sandbox by the first answer: not asked again.
        assert box.exec("python3 /tmp/resolve.py").stdout == "198.18.0.9\n"
        assert len(asked) == first, asked
    with pytest.raises(ServerError) as e:
        Sandbox.open(state_dir=tmp_path / "state2", net="host", net_ask=True)
    assert e.value.status == 400 and "net_ask" in str(e.value)
