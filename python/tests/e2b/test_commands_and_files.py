"""envd through the unmodified E2B SDK (sync and async): commands (foreground, background,
stdin, kill, reattach, timeouts, users, env and cwd), PTYs, and files (make_dir, list with
depth, info, rename, remove, symlinks, errors, watching). docs/e2b.md lists what differs.

Each test gets a fresh sandbox from `Sandbox.create()` on the module's `lockbox serve`
(the `e2b_server` fixture of e2b_util.py, run once per HTTP version)."""

import asyncio
import time
import uuid

import pytest

from e2b_util import e2b_server, envd_route, need  # noqa: F401 (a fixture)

try:
    from e2b import (
        AsyncSandbox,
        CommandExitException,
        FilesystemEventType,
        FileType,
        NotFoundException,
        Sandbox,
        TimeoutException,
    )
    from e2b.exceptions import FileNotFoundException
    from e2b.sandbox.commands.command_handle import PtySize
except ImportError:
    need(False, "the e2b SDK (pip install e2b==2.63.0 e2b-code-interpreter==2.11.5)")


@pytest.fixture
def e2b_sandbox(e2b_server):  # noqa: F811 (the fixture imported above)
    """A fresh sync sandbox, killed after the test."""
    sbx = Sandbox.create()
    try:
        yield sbx
    finally:
        sbx.kill()


def run_async(e2b_server, scenario):  # noqa: F811
    """Runs `scenario(sandbox)` with a fresh AsyncSandbox in its own event loop."""

    async def main():
        sbx = await AsyncSandbox.create()
        try:
            await scenario(sbx)
        finally:
            await sbx.kill()

    asyncio.run(main())


def home_of(sbx, user="user"):
    return sbx.commands.run("pwd", user=user).stdout.strip()


# ---------------------------------------------------------------- commands


def test_a_command_returns_its_stdout_stderr_and_exit_code(e2b_sandbox):
    r = e2b_sandbox.commands.run('echo "Hello, World!"; echo oops >&2')
    assert (r.stdout, r.stderr, r.exit_code) == ("Hello, World!\n", "oops\n", 0)
    with pytest.raises(CommandExitException) as failed:
        e2b_sandbox.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stdout == "partial\n"
    # Output is bytes until decoded: a broken UTF-8 sequence becomes U+FFFD.
    r = e2b_sandbox.commands.run('printf "' + "a" * 8191 + '\\xe2"')
    assert r.stdout == "a" * 8191 + "\ufffd"


def test_envs_and_cwd_apply_to_one_command_only(e2b_sandbox):
    r = e2b_sandbox.commands.run("echo $FOO; pwd", envs={"FOO": "bar"}, cwd="/tmp")
    assert r.stdout == "bar\n/tmp\n"
    assert e2b_sandbox.commands.run('echo "[$FOO]"').stdout == "[]\n"


def test_root_and_user_start_in_their_home(e2b_sandbox):
    for user in ("root", "user"):
        r = e2b_sandbox.commands.run('echo "$USER"; pwd', user=user)
        name, cwd = r.stdout.split()
        assert name == user
        # The user's home when the sandbox has it, else lockbox's default HOME.
        assert cwd in ({"root": "/root", "user": "/home/user"}[user], "/tmp")


def test_a_background_command_outlives_its_handle_and_is_killed_by_pid(e2b_sandbox):
    c1 = e2b_sandbox.commands.run("sleep 30", background=True)
    c2 = e2b_sandbox.commands.run("sleep 30", background=True)
    c1.disconnect()
    pids = [p.pid for p in e2b_sandbox.commands.list()]
    assert c1.pid in pids and c2.pid in pids
    listed = next(p for p in e2b_sandbox.commands.list() if p.pid == c1.pid)
    assert (listed.cmd, listed.args) == ("/bin/bash", ["-l", "-c", "sleep 30"])
    assert e2b_sandbox.commands.kill(c1.pid)
    with pytest.raises(CommandExitException):
        e2b_sandbox.commands.run(f"kill -0 {c1.pid}")
    assert not e2b_sandbox.commands.kill(c1.pid), "gone already"
    assert not e2b_sandbox.commands.kill(999999)
    c2.kill()


def test_stdin_is_sent_streamed_and_closed(e2b_sandbox):
    cmd = e2b_sandbox.commands.run("cat", background=True, stdin=True)
    e2b_sandbox.commands.send_stdin(cmd.pid, "Hello, ")
    e2b_sandbox.commands.stream_input(cmd.pid, ["stream", b"ed\n"])
    cmd.close_stdin()
    result = cmd.wait()
    assert (result.exit_code, result.stdout) == (0, "Hello, streamed\n")


def test_connect_reattaches_and_an_unknown_pid_is_not_found(e2b_sandbox):
    cmd = e2b_sandbox.commands.run("read line; echo got $line", background=True, stdin=True)
    cmd.disconnect()
    again = e2b_sandbox.commands.connect(cmd.pid)
    assert again.pid == cmd.pid
    e2b_sandbox.commands.send_stdin(cmd.pid, "x\n")
    assert again.wait().stdout == "got x\n"
    with pytest.raises(NotFoundException):
        e2b_sandbox.commands.connect(999999)


def test_a_command_past_its_timeout_raises_timeout(e2b_sandbox):
    with pytest.raises(TimeoutException):
        e2b_sandbox.commands.run("sleep 10", timeout=1)
    cmd = e2b_sandbox.commands.run("sleep 10", timeout=1, background=True)
    with pytest.raises(TimeoutException):
        for _ in cmd:
            pass


def test_a_pty_has_its_size_resizes_and_is_killed(e2b_sandbox):
    output = []
    terminal = e2b_sandbox.pty.create(PtySize(cols=80, rows=24), envs={"FOO": "bar"})
    e2b_sandbox.pty.resize(terminal.pid, PtySize(cols=100, rows=30))
    e2b_sandbox.pty.send_stdin(terminal.pid, b"stty size; echo $FOO; exit\n")
    result = terminal.wait(on_pty=lambda data: output.append(data.decode()))
    text = "".join(output)
    assert result.exit_code == 0
    assert "30 100" in text and "bar" in text
    terminal = e2b_sandbox.pty.create(PtySize(cols=80, rows=24))
    assert e2b_sandbox.pty.kill(terminal.pid)
    with pytest.raises(CommandExitException):
        e2b_sandbox.commands.run(f"kill -0 {terminal.pid}")
    assert not e2b_sandbox.pty.kill(999999)


# ------------------------------------------------------------------ files


def test_directories_are_made_listed_by_depth_renamed_and_removed(e2b_sandbox):
    fs = e2b_sandbox.files
    top = f"dir_{uuid.uuid4().hex[:8]}"
    assert fs.make_dir(f"{top}/a/a1")
    assert not fs.make_dir(f"{top}/a/a1"), "exists already"
    fs.make_dir(f"{top}/b")
    e2b_sandbox.commands.run(f"printf 'Hello, World!' > {top}/file1.txt")
    home = home_of(e2b_sandbox)
    assert [(e.name, e.type) for e in fs.list(top)] == [
        ("a", FileType.DIR), ("b", FileType.DIR), ("file1.txt", FileType.FILE)]
    deep = fs.list(top, depth=2)
    assert [e.path for e in deep] == [f"{home}/{top}/{p}" for p in ("a", "a/a1", "b", "file1.txt")]
    entry = next(e for e in deep if e.name == "file1.txt")
    assert (entry.size, entry.mode, entry.permissions) == (13, 0o644, "-rw-r--r--")
    assert (entry.owner, entry.group) == ("user", "user")
    assert entry.modified_time.tzinfo is not None
    moved = fs.rename(f"{top}/file1.txt", f"{top}/b/moved.txt")
    assert moved.path == f"{home}/{top}/b/moved.txt"
    assert not fs.exists(f"{top}/file1.txt")
    assert e2b_sandbox.commands.run(f"cat {top}/b/moved.txt").stdout == "Hello, World!"
    fs.remove(top)
    assert not fs.exists(top)
    fs.remove(top)  # removing what is gone is not an error


def test_a_tilde_path_is_the_users_home_in_reads_writes_and_listings(e2b_sandbox):
    # files.write/read go through envd's REST /files, list and remove through its RPCs:
    # `~` is the home in both, as in envd.
    home = home_of(e2b_sandbox)
    e2b_sandbox.files.write("~/tilde.txt", "t")
    assert e2b_sandbox.commands.run(f"cat {home}/tilde.txt").stdout == "t"
    assert e2b_sandbox.files.read("~/tilde.txt") == "t"
    assert "tilde.txt" in {e.name for e in e2b_sandbox.files.list("~")}
    e2b_sandbox.files.remove("~/tilde.txt")
    assert not e2b_sandbox.files.exists(f"{home}/tilde.txt")


def test_info_describes_files_directories_and_symlinks(e2b_sandbox):
    fs = e2b_sandbox.files
    e2b_sandbox.commands.run("mkdir -p info && printf test > info/f.txt && ln -s f.txt info/link")
    home = home_of(e2b_sandbox)
    f = fs.get_info("info/f.txt")
    assert (f.name, f.type, f.path, f.size) == ("f.txt", FileType.FILE, f"{home}/info/f.txt", 4)
    d = fs.get_info("info")
    assert (d.type, d.mode, d.permissions) == (FileType.DIR, 0o755, "drwxr-xr-x")
    link = fs.get_info("info/link")
    assert link.type == FileType.FILE
    assert link.symlink_target == f"{home}/info/f.txt"
    with pytest.raises(FileNotFoundException):
        fs.get_info("info/missing")
    with pytest.raises(FileNotFoundException):
        fs.rename("info/missing", "info/other")
    with pytest.raises(Exception, match="depth should be at least 1"):
        fs.list("info", depth=-1)


def test_file_metadata_is_kept_as_xattrs_and_shown_by_info_list_and_rename(e2b_sandbox):
    # E2B keeps a file's metadata as its `user.e2b.*` extended attributes: set by an upload's
    # X-Metadata-* headers (both upload forms) or by code in the sandbox.
    fs = e2b_sandbox.files
    meta = {"author": "mish", "purpose": "upload"}
    assert fs.write("m/a.txt", "a", metadata=meta).metadata == meta
    assert fs.write("m/b.txt", "b", metadata=meta, use_octet_stream=True).metadata == meta
    assert fs.get_info("m/b.txt").metadata == meta
    listed = {e.name: e.metadata for e in fs.list("m")}
    assert listed == {"a.txt": meta, "b.txt": meta}
    assert fs.rename("m/a.txt", "m/c.txt").metadata == meta
    # Written over without metadata: the old file's goes with it.
    assert fs.write("m/c.txt", "again").metadata is None
    assert fs.get_info("m/c.txt").metadata is None
    path = fs.get_info("m/c.txt").path
    e2b_sandbox.commands.run(
        f"python3 -c \"import os; os.setxattr('{path}', 'user.e2b.k', b'v')\"")
    assert fs.get_info("m/c.txt").metadata == {"k": "v"}


def test_metadata_the_sdk_would_refuse_is_refused_by_the_server_too(e2b_sandbox):
    import httpx
    url = f"{e2b_sandbox.envd_api_url}/files"
    route = envd_route(e2b_sandbox.sandbox_id, e2b_sandbox._envd_access_token)
    for value in ["caf\u00e9".encode(), b"tab\there"]:
        r = httpx.post(url, params={"path": "/tmp/meta.txt"}, content=b"x",
                       headers=[("Content-Type", "application/octet-stream"),
                                ("X-Metadata-Good", value),
                                *route.items()])
        assert r.status_code == 400, r.text
        assert "x-metadata-good" in r.text
    assert not e2b_sandbox.files.exists("/tmp/meta.txt")
    r = httpx.post(url, params={"path": "/tmp/meta.txt"}, content=b"x",
                   headers={"Content-Type": "application/octet-stream",
                            "X-Metadata-Good": "fine", **route})
    assert r.status_code == 200, r.text
    assert r.json()[0]["metadata"] == {"good": "fine"}


def test_a_watched_directory_reports_creates_writes_and_removes(e2b_sandbox):
    fs = e2b_sandbox.files
    fs.make_dir("watched/sub")
    handle = fs.watch_dir("watched", recursive=True, include_entry=True)
    e2b_sandbox.commands.run("printf x > watched/sub/new.txt; rm watched/sub/new.txt")
    events = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(e.type == FilesystemEventType.REMOVE for e in events):
        events += handle.get_new_events()
    handle.stop()
    kinds = [(e.name, e.type) for e in events]
    assert ("sub/new.txt", FilesystemEventType.CREATE) in kinds
    assert ("sub/new.txt", FilesystemEventType.WRITE) in kinds
    assert ("sub/new.txt", FilesystemEventType.REMOVE) in kinds
    with pytest.raises(FileNotFoundException):
        fs.watch_dir("not-there")


# ------------------------------------------------------------------ async


def test_the_async_sdk_runs_kills_and_watches(e2b_server):  # noqa: F811
    async def scenario(sbx):
        r = await sbx.commands.run("echo async; echo err >&2")
        assert (r.stdout, r.stderr, r.exit_code) == ("async\n", "err\n", 0)
        cmd = await sbx.commands.run("cat", background=True, stdin=True)
        await sbx.commands.send_stdin(cmd.pid, "in\n")
        await sbx.commands.close_stdin(cmd.pid)
        assert (await cmd.wait()).stdout == "in\n"
        sleeper = await sbx.commands.run("sleep 30", background=True)
        assert await sbx.commands.kill(sleeper.pid)
        assert not await sbx.commands.kill(sleeper.pid)

        await sbx.files.make_dir("awatch")
        seen = []
        handle = await sbx.files.watch_dir("awatch", on_event=lambda e: seen.append((e.name, e.type)))
        await sbx.commands.run("touch awatch/f1")
        for _ in range(300):
            if ("f1", FilesystemEventType.CREATE) in seen:
                break
            await asyncio.sleep(0.1)
        await handle.stop()
        assert ("f1", FilesystemEventType.CREATE) in seen
        assert [e.name for e in await sbx.files.list("awatch")] == ["f1"]

    run_async(e2b_server, scenario)
