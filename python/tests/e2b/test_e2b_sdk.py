"""The E2B SDK's sandbox lifecycle, listing and files against lockbox, sync and async."""

import asyncio
import io
import shutil
import uuid

import pytest

from e2b_util import E2B_SDK, e2b_server, envd_route, eventually, need  # noqa: F401 (a fixture)

try:
    from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState
    from e2b.exceptions import AuthenticationException, SandboxException
except ImportError:
    need(False, E2B_SDK)


def test_a_created_sandbox_runs_until_killed_and_is_then_gone(e2b_server):
    sbx = Sandbox.create(metadata={"purpose": "lifecycle"})
    try:
        assert sbx.is_running()
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.metadata == {"purpose": "lifecycle"}
        assert info.template_id == "base"
    finally:
        assert sbx.kill()
    assert not sbx.is_running()
    assert not Sandbox.kill(sbx.sandbox_id)
    with pytest.raises(SandboxException):
        Sandbox.connect(sbx.sandbox_id)


def test_a_wrong_api_key_is_refused(e2b_server):
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-the-token")


def test_listing_filters_by_metadata_and_pages_with_the_next_token(e2b_server):
    suite = f"list-{uuid.uuid4().hex[:8]}"
    made = [Sandbox.create(metadata={"suite": suite, "n": str(i), "odd key": "a=b&c"})
            for i in range(3)]
    other = Sandbox.create(metadata={"suite": "someone-else"})
    try:
        pages = Sandbox.list(query=SandboxQuery(metadata={"suite": suite, "odd key": "a=b&c"}),
                             limit=2)
        first = pages.next_items()
        assert len(first) == 2
        assert pages.has_next
        second = pages.next_items()
        assert len(second) == 1
        assert not pages.has_next
        ids = {s.sandbox_id for s in first + second}
        assert ids == {s.sandbox_id for s in made}
        running = Sandbox.list(query=SandboxQuery(metadata={"suite": suite},
                                                  state=[SandboxState.RUNNING])).next_items()
        assert len(running) == 3
    finally:
        for s in made + [other]:
            s.kill()


def test_a_short_timeout_really_ends_the_sandbox(e2b_server):
    sbx = Sandbox.create()
    try:
        sbx.set_timeout(2)
        eventually(lambda: not sbx.is_running(), within=60, what="the sandbox ending at its timeout")
        assert sbx.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}
    finally:
        sbx.kill()


def test_connect_reaches_the_same_sandbox_and_extends_its_life(e2b_server):
    sbx = Sandbox.create(timeout=30)
    try:
        sbx.files.write("marker.txt", "here")
        again = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert again.files.read("marker.txt") == "here"
        end = again.get_info().end_at
        assert (end - sbx.get_info().started_at).total_seconds() > 500
    finally:
        sbx.kill()


def test_files_are_written_read_uploaded_and_downloaded(e2b_server):
    sbx = Sandbox.create()
    try:
        info = sbx.files.write("notes/hello.txt", "hello from e2b\n")
        assert info.name == "hello.txt"
        assert sbx.files.read("notes/hello.txt") == "hello from e2b\n"
        blob = bytes(range(256)) * 64
        sbx.files.write("/tmp/blob.bin", io.BytesIO(blob))  # octet-stream upload
        assert bytes(sbx.files.read("/tmp/blob.bin", format="bytes")) == blob
        streamed = b"".join(sbx.files.read("/tmp/blob.bin", format="stream"))
        assert streamed == blob
        many = sbx.files.write_files([
            {"path": "a.txt", "data": "A"},
            {"path": "b/c.txt", "data": b"C"},
        ])
        assert sorted(w.name for w in many) == ["a.txt", "c.txt"]
        assert sbx.files.read("b/c.txt") == "C"
        with pytest.raises(Exception) as missing:
            sbx.files.read("no-such-file")
        assert "does not exist" in str(missing.value) or "not found" in str(missing.value).lower()
    finally:
        sbx.kill()


def test_commands_run_in_the_sandbox(e2b_server):
    sbx = Sandbox.create(envs={"GREETING": "hi"})
    try:
        assert sbx.commands.run("echo hi").stdout == "hi\n"
        assert sbx.commands.run("echo $GREETING").stdout == "hi\n"
    finally:
        sbx.kill()


def test_the_async_sdk_creates_lists_writes_and_kills(e2b_server):
    async def scenario():
        suite = f"async-{uuid.uuid4().hex[:8]}"
        sbx = await AsyncSandbox.create(metadata={"suite": suite})
        try:
            assert await sbx.is_running()
            await sbx.files.write("async.txt", "async")
            assert await sbx.files.read("async.txt") == "async"
            listed = await AsyncSandbox.list(query=SandboxQuery(metadata={"suite": suite})).next_items()
            assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
            await sbx.set_timeout(120)
        finally:
            await sbx.kill()
        assert not await sbx.is_running()
    asyncio.run(scenario())


def test_an_unknown_template_is_a_clear_error(e2b_server):
    with pytest.raises(SandboxException) as err:
        Sandbox.create(template="oci:/nonexistent/lockbox-e2b-template")
    assert "not found" in str(err.value).lower()


def test_the_code_interpreter_runs_python_and_bash_with_results_and_errors(e2b_server):
    try:
        from e2b_code_interpreter import Sandbox as CodeSandbox
    except ImportError:
        need(False, "e2b-code-interpreter==2.11.5")
    sbx = CodeSandbox.create()
    try:
        first = sbx.run_code("x = 40\nprint('side')\nx + 2")
        assert first.error is None, first.error
        assert first.logs.stdout == ["side\n"]
        assert first.text == "42"
        again = sbx.run_code("x * 2")  # the default context keeps its variables
        assert again.text == "80"
        assert (first.execution_count, again.execution_count) == (1, 2)
        # IPython's shell escapes, in the user's home (E2B's).
        shelled = sbx.run_code("!pwd\nx")
        assert (shelled.logs.stdout, shelled.text) == (["/home/user\n"], "40")
        failed = sbx.run_code("1 / 0")
        assert failed.error is not None and failed.error.name == "ZeroDivisionError"
        shell = sbx.run_code("echo from-bash", language="bash")
        assert "".join(shell.logs.stdout) == "from-bash\n"
        if shutil.which("node"):  # E2B's JavaScript: top-level await and ESM imports
            awaited = sbx.run_code("await Promise.resolve('Hello World!')", language="js")
            assert awaited.text == "Hello World!", awaited
            imported = sbx.run_code("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)",
                                    language="js")
            assert imported.logs.stdout == ["function\n"], imported
        ctx = sbx.create_code_context(language="python")
        assert ctx.id in {c.id for c in sbx.list_code_contexts()}
        sbx.run_code("y = 1", context=ctx)
        assert sbx.run_code("y", context=ctx).text == "1"
        sbx.restart_code_context(ctx)
        restarted = sbx.run_code("y", context=ctx)
        assert restarted.error.name == "NameError"
        assert restarted.execution_count == 1  # a restarted context counts afresh
        sbx.remove_code_context(ctx)
        assert ctx.id not in {c.id for c in sbx.list_code_contexts()}
    finally:
        sbx.kill()


def test_run_code_envs_hold_for_that_run_only_over_the_sandboxs_envs(e2b_server):
    # E2B's code interpreter: run_code(envs=...) overrides the sandbox's envs for one run.
    try:
        from e2b_code_interpreter import Sandbox as CodeSandbox
    except ImportError:
        need(False, "e2b-code-interpreter==2.11.5")
    sbx = CodeSandbox.create(envs={"TEST_ENV_VAR": "supertest"})
    try:
        for language, read in [
            ("python", "import os; (os.getenv('TEST_ENV_VAR'), os.getenv('FOO', 'default'))"),
            ("bash", 'echo "$TEST_ENV_VAR ${FOO:-default}"'),
            ("javascript", "`${process.env.TEST_ENV_VAR} ${process.env.FOO || 'default'}`"),
        ]:
            run = sbx.run_code(read, language=language, envs={"TEST_ENV_VAR": "overwrite", "FOO": "bar"})
            after = sbx.run_code(read, language=language)
            assert run.error is None and after.error is None, (language, run.error, after.error)
            seen = [r.text or "".join(r.logs.stdout) for r in (run, after)]
            assert "overwrite" in seen[0] and "bar" in seen[0], (language, seen)
            assert "supertest" in seen[1] and "default" in seen[1], (language, seen)
    finally:
        sbx.kill()


def test_sandbox_requests_need_the_sandbox_token_and_a_live_sandbox(e2b_server):
    import httpx
    sbx = Sandbox.create()
    try:
        url = f"{e2b_server.base}/files"
        route = envd_route(sbx.sandbox_id)
        assert httpx.get(url, params={"path": "x"}, headers=route).status_code == 401
        wrong = {**route, "X-Access-Token": "0" * 64}
        assert httpx.get(url, params={"path": "x"}, headers=wrong).status_code == 401
        gone = envd_route("sb-nosuchsandbox")
        r = httpx.get(f"{e2b_server.base}/health", headers=gone)
        assert r.status_code == 502 and "was not found" in r.json()["message"]
    finally:
        sbx.kill()


def test_no_public_traffic_is_accepted_and_the_interpreter_needs_the_traffic_token(e2b_server):
    # What allowPublicTraffic=False asks for is what every lockbox sandbox does already.
    import httpx
    try:
        from e2b_code_interpreter import Sandbox as CodeSandbox
    except ImportError:
        need(False, "e2b-code-interpreter==2.11.5")
    sbx = CodeSandbox.create(secure=True, network={"allow_public_traffic": False})
    try:
        assert sbx.run_code("x = 1; x").text == "1"
        assert sbx.traffic_access_token
        route = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}
        url = f"{e2b_server.base}/contexts"
        assert httpx.get(url, headers=route).status_code == 401
        token = {**route, "E2B-Traffic-Access-Token": sbx.traffic_access_token}
        assert httpx.get(url, headers=token).status_code == 200
    finally:
        sbx.kill()


def test_unsupported_calls_are_clear_errors_not_server_errors(e2b_server):
    sbx = Sandbox.create(allow_internet_access=False)
    try:
        # (A sandbox created without a network keeps it: test_e2b_network.py.)
        with pytest.raises(SandboxException) as refused:
            sbx.update_network({"egress_proxy": {"address": "proxy.example.com:1080"}})
        assert str(refused.value).startswith("400"), refused.value
        assert "egressProxy" in str(refused.value)
    finally:
        sbx.kill()
    with pytest.raises(SandboxException) as refused:
        Sandbox.create(network={"deny_out": ["10.0.0.0/8"], "allow_out": ["10.1.2.3"]})
    assert "network.allowOut" in str(refused.value)
