"""lockbox as an MCP server, driven by the official MCP Python SDK (`pip install mcp`) as the
client: `lockbox mcp` over stdio (also run as uid 65534), and `POST /mcp` of `lockbox serve`
over streamable HTTP. Each drives an agent's edit -> test -> commit loop on a workdir and
checks the host directory; an unknown sandbox is a tool error with its code; /mcp without
the token is 401. The operator lets the agent work on the test's repository (`--allow-workdir`:
by default an agent gets no workdir, issue 32). Only the lockbox binary and the SDK are used
(no `import lockbox`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from conftest import need
from console_util import server_binary, start_server, stop_server

try:
    import mcp  # noqa: F401
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    HAVE_MCP = True
except ImportError:
    HAVE_MCP = False

AS_NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
TOOLS = {"create_sandbox", "list_sandboxes", "delete_sandbox", "exec", "read_file", "write_file",
         "list_files", "changes", "diff", "commit", "abort", "run_code", "snapshot",
         "list_snapshots", "fork", "restore", "delete_snapshot"}

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
# A 1x1 PNG.
PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
TEST = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"


def need_sdk():
    need(HAVE_MCP, "the MCP Python SDK (pip install mcp)")
    need(os.path.exists(server_binary()), f"the lockbox binary ({server_binary()}): cargo build")


def is_error(result) -> bool:
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", None))


def structured(result) -> dict:
    value = getattr(result, "structured_content", None)
    if value is None:
        value = getattr(result, "structuredContent", None)
    return value


def text(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def call(client, tool: str, **args):
    """A tool call that must succeed; its result."""
    result = await client.call_tool(tool, args)
    assert not is_error(result), f"{tool}: {text(result)}"
    return result


async def edit_test_commit(session, workdir: str) -> dict:
    """What an agent does: list tools, open the repo, run its test, fix the code, see the
    change and its diff, commit. Returns facts for the caller to assert on."""
    listed = await session.list_tools()
    names = {t.name for t in listed.tools}
    assert TOOLS <= names, names
    for tool in listed.tools:
        schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None)
        assert schema["type"] == "object", tool.name
        assert tool.description, tool.name

    created = structured(await call(session, "create_sandbox", workdir=workdir, labels={"by": "mcp"}))
    sid = created["id"]
    assert created["state"] == "running"

    no_pyc = {"PYTHONDONTWRITEBYTECODE": "1"}  # a .pyc of the same second would be reused
    failing = await call(session, "exec", sandbox_id=sid, command="cd %s && python3 test_calc.py" % workdir,
                         env=no_pyc)
    assert structured(failing)["exit_code"] != 0
    assert "AssertionError" in text(failing)

    read = structured(await call(session, "read_file", sandbox_id=sid, path=f"{workdir}/calc.py"))
    assert read["content"] == BUGGY and read["truncated"] is False

    await call(session, "write_file", sandbox_id=sid, path=f"{workdir}/calc.py", content=FIXED)
    passing = await call(session, "exec", sandbox_id=sid, command="python3 test_calc.py | tee test.log",
                         cwd=workdir, env=no_pyc)
    assert structured(passing)["exit_code"] == 0, text(passing)
    assert structured(passing)["stdout"] == "ok\n"
    assert text(passing).startswith("exit_code: 0")

    # A plot the tests wrote comes back as an image a client can show.
    await call(session, "write_file", sandbox_id=sid, path="/tmp/plot.png", content_b64=PNG_B64)
    image = await call(session, "read_file", sandbox_id=sid, path="/tmp/plot.png")
    kinds = [(block.type, getattr(block, "mime_type", None) or getattr(block, "mimeType", None))
             for block in image.content]
    assert ("image", "image/png") in kinds, kinds
    assert image.content[0].data == PNG_B64

    # A named session is a shell of its own, made on first use: cd and exports persist.
    await call(session, "exec", sandbox_id=sid, session="build", command="cd /tmp && export STEP=2")
    shell = await call(session, "exec", sandbox_id=sid, session="build", command='echo "$PWD $STEP"')
    assert structured(shell)["stdout"] == "/tmp 2\n", text(shell)

    # A code context keeps its variables; an image result is image content, an error has its traceback.
    await call(session, "run_code", sandbox_id=sid, code="import base64\ntotal = 40")
    ran = await call(session, "run_code", sandbox_id=sid, code="total + 2")
    assert structured(ran)["results"][0]["data"]["text/plain"] == "42", text(ran)
    plot = await call(session, "run_code", sandbox_id=sid, code=(
        f"class Plot:\n    def _repr_png_(self): return base64.b64decode({PNG_B64!r})\nPlot()"))
    assert [(b.type, b.data) for b in plot.content if b.type == "image"] == [("image", PNG_B64)], plot.content
    failed = await call(session, "run_code", sandbox_id=sid, context="other", code="print('x')\n{}['k']")
    assert structured(failed)["error"]["name"] == "KeyError" and "x\n" in text(failed), text(failed)
    assert "Traceback" in text(failed)

    listing = structured(await call(session, "list_files", sandbox_id=sid, path=workdir))
    assert {"calc.py", "test_calc.py"} <= {os.path.basename(e["path"]) for e in listing["entries"]}

    # The host is untouched until the commit.
    with open(os.path.join(workdir, "calc.py")) as f:
        before_commit = f.read()

    changes = structured(await call(session, "changes", sandbox_id=sid))["changes"]
    changed = {c["path"]: c["kind"] for c in changes}
    assert changed.get("calc.py") == "modified", changes
    assert changed.get("test.log") == "added", changes

    diff = await call(session, "diff", sandbox_id=sid, path="calc.py")
    assert "-    return a - b" in text(diff) and "+    return a + b" in text(diff), text(diff)
    assert structured(diff)["kind"] == "text"

    # Only the fix: the test's log stays in the branch.
    committed = await call(session, "commit", sandbox_id=sid, only=["calc.py"])
    assert structured(committed)["report"], structured(committed)

    # Explore: snapshot, break the fix, roll back; fork the snapshot twice.
    snap = structured(await call(session, "snapshot", sandbox_id=sid, name="fixed"))
    assert snap["name"] == "fixed", snap
    await call(session, "exec", sandbox_id=sid, command=f"echo broken > {workdir}/calc.py")
    restored = structured(await call(session, "restore", sandbox_id=sid, snapshot_id=snap["id"]))
    assert restored["id"] == sid and restored["state"] == "running", restored
    back = structured(await call(session, "read_file", sandbox_id=sid, path=f"{workdir}/calc.py"))
    assert back["content"] == FIXED, back
    forks = structured(await call(session, "fork", snapshot_id=snap["id"], count=2))["sandboxes"]
    assert len(forks) == 2 and sid not in {f["id"] for f in forks}, forks
    for fork in forks:
        log = structured(await call(session, "read_file", sandbox_id=fork["id"], path=f"{workdir}/test.log"))
        assert log["content"] == "ok\n", log
    listed = structured(await call(session, "list_snapshots"))["snapshots"]
    assert snap["id"] in {s["id"] for s in listed}, listed
    in_use = await session.call_tool("delete_snapshot", {"snapshot_id": snap["id"]})
    assert is_error(in_use) and structured(in_use)["code"] == "SNAPSHOT_IN_USE", text(in_use)
    for fork in forks:
        await call(session, "delete_sandbox", sandbox_id=fork["id"])

    missing = await session.call_tool("exec", {"sandbox_id": "sb-no-such-sandbox", "command": "true"})
    bad_args = await session.call_tool("exec", {"sandbox_id": sid, "command": "true", "timeout_ms": 0})

    # Latency of a trivial exec through the whole MCP path (client, transport, runtime).
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        await call(session, "exec", sandbox_id=sid, command="true")
        times.append(time.perf_counter() - t0)
    times.sort()

    sandboxes = structured(await call(session, "list_sandboxes", state="running"))["sandboxes"]
    assert sid in {s["id"] for s in sandboxes}
    return {"sid": sid, "before_commit": before_commit, "missing": missing, "bad_args": bad_args,
            "exec_p50_ms": times[len(times) // 2] * 1000}


def make_repo(root: str, owner: int | None = None) -> str:
    repo = os.path.join(root, "repo")
    os.mkdir(repo)
    for name, body in (("calc.py", BUGGY), ("test_calc.py", TEST)):
        with open(os.path.join(repo, name), "w") as f:
            f.write(body)
    if owner is not None:
        for dirpath, _, files in os.walk(root):
            os.chown(dirpath, owner, owner)
            for name in files:
                os.chown(os.path.join(dirpath, name), owner, owner)
    return repo


def check_outcome(got: dict, repo: str) -> None:
    assert got["before_commit"] == BUGGY, "the host changed before the commit"
    with open(os.path.join(repo, "calc.py")) as f:
        assert f.read() == FIXED, "the commit did not reach the host workdir"
    assert not os.path.exists(os.path.join(repo, "test.log")), "only calc.py was committed"
    missing = got["missing"]
    assert is_error(missing)
    assert text(missing).startswith("SANDBOX_NOT_FOUND:"), text(missing)
    assert structured(missing)["code"] == "SANDBOX_NOT_FOUND"
    bad = got["bad_args"]
    assert is_error(bad) and structured(bad)["code"] == "INVALID_REQUEST"
    assert structured(bad)["details"]["field"] == "timeout_ms"
    print(f"exec 'true' over MCP: p50 {got['exec_p50_ms']:.2f} ms")


async def over_stdio(command: list[str], workdir: str, state: str) -> dict:
    args = command[1:] + ["mcp", "--state-dir", state, "--allow-workdir", workdir]
    params = StdioServerParameters(command=command[0], args=args)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await edit_test_commit(session, workdir)


def sandboxes_after_restart(state: str, owner: int | None) -> list:
    """The sandboxes recorded in `state`, as the operator sees them (an agent sees only
    those it made, so a new `lockbox mcp` would list none)."""
    server = start_server(state_dir=state, uid=owner)
    try:
        req = urllib.request.Request(server.base + "/v1/sandboxes",
                                     headers={"Authorization": f"Bearer {server.token}"})
        with urllib.request.urlopen(req, timeout=30) as reply:
            return json.load(reply)["sandboxes"]
    finally:
        stop_server(server, remove_state=False)


def run_stdio(command: list[str], owner: int | None) -> None:
    root = tempfile.mkdtemp(prefix="lockbox-mcp-")
    try:
        state = os.path.join(root, "state")
        os.mkdir(state)
        repo = make_repo(root, owner)
        if owner is not None:
            os.chown(state, owner, owner)
        got = asyncio.run(over_stdio(command, repo, state))
        check_outcome(got, repo)
        # stdin closed: the server deleted its sandbox before exiting (a runtime that died
        # would leave it `lost`).
        after = sandboxes_after_restart(state, owner)
        states = {s["id"]: s["state"] for s in after}
        assert states.get(got["sid"]) == "stopped", after
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_stdio_server_drives_edit_test_commit_and_cleans_up_on_close():
    need_sdk()
    run_stdio([server_binary()], owner=None)


def test_stdio_server_works_as_uid_65534():
    need_sdk()
    need(os.geteuid() == 0, "root (the test re-runs the server as uid 65534)")
    need(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    probe = subprocess.run(AS_NOBODY + [server_binary(), "--version"], capture_output=True)
    need(probe.returncode == 0, f"a lockbox binary uid 65534 can run ({server_binary()})")
    run_stdio(AS_NOBODY + [server_binary()], owner=65534)


async def ask_beyond_the_ceiling(command: list[str], state: str, hostwrite: str) -> list:
    """Issue 32's reproduction through the SDK: each grant beyond the default ceiling."""
    params = StdioServerParameters(command=command[0], args=command[1:] + ["mcp", "--state-dir", state])
    asks = [
        {"default_reads": False, "fs_readable": ["/etc", "/usr", "/lib", "/lib64", "/bin", "/root"],
         "fs_writable": [hostwrite], "net": "host"},
        {"fs_writable": [hostwrite]},
        {"net": "host"},
    ]
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return [await session.call_tool("create_sandbox", ask) for ask in asks]


@pytest.mark.parametrize("as_nobody", [False, True])
def test_issue_32_an_agent_cannot_grant_itself_host_paths_or_the_host_network(as_nobody):
    need_sdk()
    command = [server_binary()]
    if as_nobody:
        need(os.geteuid() == 0, "root (the test re-runs the server as uid 65534)")
        need(shutil.which("setpriv") is not None, "setpriv (util-linux)")
        command = AS_NOBODY + command
    root = tempfile.mkdtemp(prefix="lockbox-mcp-ceiling-")
    try:
        hostwrite = os.path.join(root, "hostwrite")
        state = os.path.join(root, "state")
        os.mkdir(hostwrite)
        os.mkdir(state)
        if as_nobody:
            for path in (root, hostwrite, state):
                os.chown(path, 65534, 65534)
        results = asyncio.run(ask_beyond_the_ceiling(command, state, hostwrite))
        fields = []
        for result in results:
            assert is_error(result), text(result)
            error = structured(result)
            assert error["code"] == "BEYOND_CEILING", error
            assert "ceiling" in error["message"], error
            fields.append(error["details"]["field"])
        assert fields == ["fs_readable", "fs_writable", "net"]
        assert os.listdir(hostwrite) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def over_http(url: str, token: str, workdir: str) -> dict:
    import httpx2 as httpx_mod  # the SDK's HTTP client
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx_mod.AsyncClient(headers=headers, timeout=60) as client:
        async with streamable_http_client(url, http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await edit_test_commit(session, workdir)


def test_http_server_drives_edit_test_commit_behind_the_token():
    need_sdk()
    root = tempfile.mkdtemp(prefix="lockbox-mcp-http-")
    repo = make_repo(root)
    server = start_server("--allow-workdir", repo)
    try:
        # No token, or a wrong one: 401 before any MCP.
        body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
        for auth in (None, "Bearer not-the-token-0123456789"):
            headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
            if auth:
                headers["Authorization"] = auth
            req = urllib.request.Request(server.base + "/mcp", data=body, headers=headers, method="POST")
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(req, timeout=10)
            assert caught.value.code == 401
        got = asyncio.run(over_http(server.base + "/mcp", server.token, repo))
        check_outcome(got, repo)
    finally:
        stop_server(server)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
