"""Pause, resume, fork, snapshots, logs and metrics through the unmodified E2B SDK, sync and
async (docs/e2b.md: a paused sandbox keeps its files, not its processes)."""

import asyncio
import os
import time
import uuid

import httpx
import pytest
from e2b_util import E2B_SDK, e2b_server, eventually, need  # noqa: F401 (a fixture)

try:
    from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState
    from e2b.exceptions import SandboxException
except ImportError:
    need(False, E2B_SDK)


def ids_in(state):
    return {s.sandbox_id for s in Sandbox.list(query=SandboxQuery(state=[state])).next_items()}


def api_get(path: str):
    """A GET on the control plane with the API key, as JSON."""
    resp = httpx.get(os.environ["E2B_API_URL"] + path,
                     headers={"X-API-Key": os.environ["E2B_API_KEY"]})
    resp.raise_for_status()
    return resp.json()


def test_a_paused_sandbox_keeps_its_files_not_its_processes_and_connect_resumes_it(e2b_server):
    sbx = Sandbox.create(metadata={"suite": "pause"}, envs={"COLOUR": "blue"})
    sid = sbx.sandbox_id
    try:
        sbx.files.write("state.txt", "kept across the pause")
        sbx.commands.run("mkdir -p /tmp/sub && echo deep > /tmp/sub/f")
        sbx.commands.run("sleep 1000", background=True, timeout=0)
        assert any("sleep" in " ".join([p.cmd, *p.args]) for p in sbx.commands.list())

        assert sbx.pause() is True
        assert sbx.pause() is False  # already paused
        assert not sbx.is_running()
        info = sbx.get_info()
        assert info.state == SandboxState.PAUSED
        assert info.metadata == {"suite": "pause"}
        assert sid in ids_in(SandboxState.PAUSED)
        assert sid not in ids_in(SandboxState.RUNNING)
        assert sid in {s.sandbox_id for s in Sandbox.list().next_items()}

        again = Sandbox.connect(sid)
        assert again.sandbox_id == sid
        assert again.is_running()
        assert again.get_info().state == SandboxState.RUNNING
        assert again.files.read("state.txt") == "kept across the pause"
        assert again.files.read("/tmp/sub/f") == "deep\n"
        assert not any("sleep" in " ".join([p.cmd, *p.args]) for p in again.commands.list())
        assert again.commands.run("echo $COLOUR").stdout == "blue\n"
        # The SDK object made before the pause goes on working against the resumed sandbox.
        assert sbx.files.read("state.txt") == "kept across the pause"
        assert sid in ids_in(SandboxState.RUNNING)

        # A second pause and resume (through the instance's connect) keeps it all too.
        sbx.files.write("second.txt", "2")
        assert sbx.pause() is True
        sbx.connect()
        assert sbx.files.read("second.txt") == "2"
        assert sbx.files.read("state.txt") == "kept across the pause"
    finally:
        assert Sandbox.kill(sid)
    assert not Sandbox.kill(sid)


def test_home_user_is_the_users_home_and_survives_a_pause(e2b_server):
    # E2B's own SDK tests and agents write under /home/user: the host's userland has no such
    # directory, so a base sandbox sees its workdir there (docs/e2b.md).
    sbx = Sandbox.create()
    try:
        r = sbx.commands.run('pwd; echo "$HOME"; ls -ld /home/user | cut -c1')
        assert r.stdout == "/home/user\n/home/user\nd\n"
        info = sbx.files.write("/home/user/main.py", "print('hi')\n")
        assert info.path == "/home/user/main.py"
        assert [e.path for e in sbx.files.list(".")] == ["/home/user/main.py"]
        assert sbx.commands.run("python3 main.py").stdout == "hi\n"
        assert sbx.pause() is True
        sbx.connect()
        assert sbx.files.read("main.py") == "print('hi')\n"
        assert sbx.commands.run("cat ~/main.py", user="user").stdout == "print('hi')\n"
    finally:
        sbx.kill()


def test_a_paused_sandbox_can_be_killed(e2b_server):
    sbx = Sandbox.create()
    sbx.pause()
    assert sbx.kill()
    assert sbx.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}
    with pytest.raises(SandboxException):
        Sandbox.connect(sbx.sandbox_id)


def test_pause_with_memory_is_refused_naming_the_field(e2b_server):
    sbx = Sandbox.create()
    try:
        with pytest.raises(SandboxException) as refused:
            sbx.pause(mode="full")
        assert "memory" in str(refused.value)
        assert sbx.is_running()
        with pytest.raises(SandboxException) as refused:
            Sandbox.create(lifecycle={"on_timeout": {"action": "pause", "mode": "full"}})
        assert "autoPauseMemory" in str(refused.value)
    finally:
        sbx.kill()


def test_auto_pause_pauses_at_the_timeout_instead_of_killing(e2b_server):
    sbx = Sandbox.create(lifecycle={"on_timeout": "pause"})
    try:
        assert sbx.get_info().lifecycle["on_timeout"] == "pause"
        sbx.files.write("auto.txt", "paused, not killed")
        sbx.set_timeout(1)
        eventually(lambda: sbx.get_info().state == SandboxState.PAUSED, within=60,
                   what="the sandbox pausing at its timeout")
        sbx.connect(timeout=60)
        assert sbx.files.read("auto.txt") == "paused, not killed"
    finally:
        sbx.kill()


def test_the_async_sdk_pauses_and_resumes(e2b_server):
    async def scenario():
        sbx = await AsyncSandbox.create()
        try:
            await sbx.files.write("a.txt", "async pause")
            assert await sbx.pause() is True
            assert not await sbx.is_running()
            assert (await sbx.get_info()).state == SandboxState.PAUSED
            again = await AsyncSandbox.connect(sbx.sandbox_id)
            assert again.sandbox_id == sbx.sandbox_id
            assert await again.files.read("a.txt") == "async pause"
        finally:
            await sbx.kill()

    asyncio.run(scenario())


def test_fork_makes_independent_copies_of_a_running_sandbox(e2b_server):
    sbx = Sandbox.create(metadata={"suite": "fork"})
    forks = []
    try:
        sbx.files.write("base.txt", "before the fork")
        sbx.commands.run("sleep 1000", background=True, timeout=0)
        forks = sbx.fork(count=2, timeout=120)
        assert len(forks) == 2
        assert all(isinstance(f, Sandbox) for f in forks), forks
        assert len({f.sandbox_id for f in forks} | {sbx.sandbox_id}) == 3
        for i, f in enumerate(forks):
            assert f.files.read("base.txt") == "before the fork"
            f.files.write("mine.txt", f"fork {i}")
            assert f.get_info().metadata == {"suite": "fork"}
        assert forks[0].files.read("mine.txt") == "fork 0"
        assert forks[1].files.read("mine.txt") == "fork 1"
        # The source goes on, with its processes, and does not see the forks' writes.
        assert sbx.is_running()
        assert any("sleep" in " ".join([p.cmd, *p.args]) for p in sbx.commands.list())
        assert not sbx.files.exists("mine.txt")
        with pytest.raises(SandboxException):
            sbx.fork(count=0)
    finally:
        for f in forks:
            if isinstance(f, Sandbox):
                f.kill()
        sbx.kill()


def test_the_async_sdk_forks(e2b_server):
    async def scenario():
        sbx = await AsyncSandbox.create()
        forks = []
        try:
            await sbx.files.write("x.txt", "async fork")
            forks = await sbx.fork()
            assert len(forks) == 1
            assert await forks[0].files.read("x.txt") == "async fork"
        finally:
            for f in forks:
                if isinstance(f, AsyncSandbox):
                    await f.kill()
            await sbx.kill()

    asyncio.run(scenario())


def test_a_snapshot_is_a_template_until_deleted(e2b_server):
    name = f"snap-{uuid.uuid4().hex[:8]}"
    sbx = Sandbox.create()
    made = []
    try:
        sbx.files.write("snap.txt", "in the snapshot")
        snap = sbx.create_snapshot(name=name)
        assert snap.names == [name]
        sbx.files.write("snap.txt", "after the snapshot")
        listed = [s.snapshot_id for s in sbx.list_snapshots().next_items()]
        assert listed == [snap.snapshot_id]
        by_id = Sandbox.create(snap.snapshot_id)
        made.append(by_id)
        assert by_id.files.read("snap.txt") == "in the snapshot"
        by_name = Sandbox.create(name)
        made.append(by_name)
        assert by_name.files.read("snap.txt") == "in the snapshot"
        with pytest.raises(SandboxException) as refused:
            Sandbox.create(snap.snapshot_id, envs={"A": "1"})
        assert "envVars" in str(refused.value)
        with pytest.raises(SandboxException):
            Sandbox.delete_snapshot(snap.snapshot_id)  # sandboxes lie on it: 409
        for s in made:
            s.kill()
        made = []
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
        assert Sandbox.delete_snapshot(snap.snapshot_id) is False
        assert sbx.list_snapshots().next_items() == []
    finally:
        for s in made:
            s.kill()
        sbx.kill()


def test_the_async_sdk_takes_and_deletes_snapshots(e2b_server):
    async def scenario():
        sbx = await AsyncSandbox.create()
        try:
            await sbx.files.write("s.txt", "async snapshot")
            snap = await sbx.create_snapshot()
            assert snap.names == []
            listed = await sbx.list_snapshots().next_items()
            assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
            other = await AsyncSandbox.create(snap.snapshot_id)
            try:
                assert await other.files.read("s.txt") == "async snapshot"
            finally:
                await other.kill()
            assert await AsyncSandbox.delete_snapshot(snap.snapshot_id) is True
        finally:
            await sbx.kill()

    asyncio.run(scenario())


def test_metrics_report_the_sandboxs_memory_and_cpus(e2b_server):
    sbx = Sandbox.create()
    try:
        metrics = sbx.get_metrics()
        assert len(metrics) == 1
        m = metrics[0]
        assert m.cpu_count >= 1
        assert m.mem_used > 0
        assert m.mem_total >= m.mem_used
        assert 0 <= m.cpu_used_pct <= 100
        many = api_get(f"/sandboxes/metrics?sandbox_ids={sbx.sandbox_id}")
        assert list(many["sandboxes"]) == [sbx.sandbox_id]
        sbx.pause()
        assert Sandbox.get_metrics(sbx.sandbox_id) == []
    finally:
        sbx.kill()

    async def scenario():
        a = await AsyncSandbox.create()
        try:
            assert len(await a.get_metrics()) == 1
        finally:
            await a.kill()

    asyncio.run(scenario())


def test_logs_tell_what_happened_to_the_sandbox(e2b_server):
    sbx = Sandbox.create()
    try:
        sbx.pause()
        sbx.connect()
        logs = api_get(f"/v2/sandboxes/{sbx.sandbox_id}/logs")["logs"]
        messages = [e["message"] for e in logs]
        assert messages[0].startswith("created")
        assert any(m.startswith("paused") for m in messages)
        assert any(m.startswith("resumed") for m in messages)
        assert all(e["level"] == "info" for e in logs)
        back = api_get(f"/v2/sandboxes/{sbx.sandbox_id}/logs?direction=backward&limit=1")
        assert back["logs"][0]["message"].startswith("resumed")
        v1 = api_get(f"/sandboxes/{sbx.sandbox_id}/logs")
        assert [line["line"] for line in v1["logs"]] == messages
        # The pause's snapshot is the sandbox's own: not deleted from under it.
        paused = next(m for m in messages if m.startswith("paused"))
        snapshot = paused.split("snapshot ")[1].split(";")[0]
        with pytest.raises(SandboxException) as refused:
            Sandbox.delete_snapshot(snapshot)
        assert "belongs to E2B sandbox" in str(refused.value)
    finally:
        sbx.kill()


def test_logs_carry_the_network_supervisors_decisions(e2b_server):
    sbx = Sandbox.create(network={"deny_out": ["10.255.255.1"]})
    try:
        r = sbx.commands.run("bash -c 'echo > /dev/tcp/10.255.255.1/80' 2>&1 || echo refused")
        assert "refused" in r.stdout, r.stdout
        url = f"/v2/sandboxes/{sbx.sandbox_id}/logs?level=warn"
        # The supervisor hands its decisions over asynchronously: wait for this one.
        eventually(lambda: api_get(url)["logs"], within=30, what="the denied connect in the log")
        logs = api_get(url)["logs"]
        assert all(e["level"] == "warn" for e in logs)
        denied = [e for e in logs if "10.255.255.1:80" in e["message"]]
        assert denied and "denied" in denied[0]["message"], logs
        assert denied[0]["fields"]["decision"] == "denied"
        found = api_get(f"/v2/sandboxes/{sbx.sandbox_id}/logs?search=10.255.255.1")["logs"]
        assert [e["message"] for e in found] == [e["message"] for e in denied]
    finally:
        sbx.kill()


def test_the_network_of_a_running_sandbox_is_replaced_and_kept_across_a_pause(e2b_server):
    sbx = Sandbox.create()
    try:
        sbx.update_network({"deny_out": ["10.255.255.1"]})
        denied = "bash -c 'echo > /dev/tcp/10.255.255.1/80' 2>&1 || echo refused"
        assert "refused" in sbx.commands.run(denied).stdout
        assert sbx.pause()
        sbx.connect()
        assert "refused" in sbx.commands.run(denied).stdout
        # Created with a deny-list (the host's resolver): an allow-list by name needs
        # lockbox's resolver, which it does not have. A clear 409; its rules stay.
        with pytest.raises(SandboxException) as refused:
            sbx.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": ["example.com"]})
        assert str(refused.value).startswith("409"), refused.value
        assert "resolver" in str(refused.value)
        assert sbx.is_running()
    finally:
        sbx.kill()


def test_a_paused_image_sandbox_keeps_tmp_but_not_its_root_writes(e2b_server, tmp_path):
    need(os.path.exists("/bin/busybox") and os.path.exists("/bin/bash-static"),
         "busybox-static and bash-static (Debian packages) for the image")
    from test_image import busybox_layout
    ref = busybox_layout(str(tmp_path / "layout"))
    sbx = Sandbox.create(ref)
    try:
        sbx.files.write("/tmp/kept.txt", "in /tmp")
        sbx.files.write("/work/root-write.txt", "in the image's root")
        assert sbx.pause()
        sbx.connect()
        assert sbx.files.read("/tmp/kept.txt") == "in /tmp"
        # docs/e2b.md: an image's root outside /tmp starts again from the image.
        assert not sbx.files.exists("/work/root-write.txt")
        assert sbx.commands.run("cat /tmp/kept.txt").stdout == "in /tmp"
    finally:
        sbx.kill()


def test_the_code_interpreter_starts_afresh_after_a_pause(e2b_server):
    try:
        from e2b_code_interpreter import Sandbox as CodeSandbox
    except ImportError:
        need(False, "e2b-code-interpreter==2.11.5")
    sbx = CodeSandbox.create()
    try:
        assert sbx.run_code("x = 41\nopen('/tmp/code.txt', 'w').write('file')").error is None
        assert sbx.pause()
        sbx.connect()
        # Its variables were memory (gone); its files are kept.
        assert sbx.run_code("x").error.name == "NameError"
        assert sbx.run_code("open('/tmp/code.txt').read()").text == "file"  # E2B's text of a string: without its quotes
    finally:
        sbx.kill()


def test_the_async_sdk_updates_the_network_and_auto_pauses(e2b_server):
    async def scenario():
        sbx = await AsyncSandbox.create(lifecycle={"on_timeout": "pause"})
        try:
            await sbx.update_network({"allow_internet_access": False})
            assert (await sbx.get_info()).allow_internet_access is False
            # autoPause through the async SDK: paused at the timeout, then resumed.
            await sbx.files.write("a.txt", "auto")
            await sbx.set_timeout(1)
            deadline = time.monotonic() + 60
            while (await sbx.get_info()).state != SandboxState.PAUSED:
                assert time.monotonic() < deadline, "not paused at its timeout"
                await asyncio.sleep(0.2)
            await sbx.connect(timeout=60)
            assert await sbx.files.read("a.txt") == "auto"
        finally:
            await sbx.kill()

    asyncio.run(scenario())
