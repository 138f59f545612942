"""What running E2B's own SDK test suite against lockbox turned up (docs/e2b.md, "E2B's own
SDK tests"): each case is a call as that suite makes it, through the unmodified SDK."""

import asyncio
import threading
import datetime
import gzip
import io
import uuid

import pytest

from e2b_util import E2B_SDK, e2b_server, envd_route, need  # noqa: F401 (a fixture)

try:
    from e2b import AsyncSandbox, Sandbox, SandboxQuery, Template
    from e2b_code_interpreter import Sandbox as CodeSandbox
except ImportError:
    need(False, E2B_SDK)


def test_listing_started_after_takes_python_isoformat_with_an_offset(e2b_server):
    # The SDK sends `datetime.isoformat()`: microseconds and `+00:00`, not `Z`.
    before = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=1)
    tag = f"after-{uuid.uuid4().hex[:8]}"
    sbx = Sandbox.create(metadata={"suite": tag})
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, started_after=before))
        assert [s.sandbox_id for s in found.next_items()] == [sbx.sandbox_id]
        later = datetime.datetime.now(datetime.timezone(datetime.timedelta(hours=2))) \
            + datetime.timedelta(minutes=1)
        none = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, started_after=later))
        assert none.next_items() == []
    finally:
        sbx.kill()


def test_the_built_in_templates_exist_and_unknown_ones_do_not(e2b_server):
    assert Template.exists("base") is True
    assert Template.exists("code-interpreter-v1") is True
    assert Template.exists(f"nonexistent-{uuid.uuid4()}") is False


def test_gzip_uploads_are_decoded(e2b_server):
    sbx = Sandbox.create()
    try:
        text = "compressible " * 10_000
        sbx.files.write("gz.txt", text, gzip=True)
        assert sbx.files.read("gz.txt") == text
        assert sbx.files.read("gz.txt", gzip=True) == text
        sbx.files.write("gz.bin", io.BytesIO(b"\x00\x01" * 50_000), gzip=True)
        assert bytes(sbx.files.read("gz.bin", format="bytes")) == b"\x00\x01" * 50_000
        sbx.files.write_files([{"path": "a.txt", "data": "a"}, {"path": "b.txt", "data": "b"}],
                             gzip=True)
        assert sbx.commands.run("cat a.txt b.txt").stdout == "ab"
    finally:
        sbx.kill()


def test_a_truncated_gzip_upload_is_refused_and_writes_nothing(e2b_server):
    import httpx
    sbx = Sandbox.create()
    try:
        whole = gzip.compress(b"x" * 100_000)
        r = httpx.post(f"{sbx.envd_api_url}/files", params={"path": "/tmp/cut.txt"},
                       content=whole[: len(whole) // 2],
                       headers={"Content-Type": "application/octet-stream",
                                "Content-Encoding": "gzip",
                                **envd_route(sbx.sandbox_id, sbx._envd_access_token)})
        assert 400 <= r.status_code < 500, r.text
        assert not sbx.files.exists("/tmp/cut.txt")
        r = httpx.post(f"{sbx.envd_api_url}/files", params={"path": "/tmp/br.txt"},
                       content=b"x", headers={"Content-Type": "application/octet-stream",
                                              "Content-Encoding": "br",
                                              **envd_route(sbx.sandbox_id,
                                                           sbx._envd_access_token)})
        assert r.status_code == 415, r.text
    finally:
        sbx.kill()


def test_the_async_sdk_uploads_gzip_too(e2b_server):
    async def go():
        sbx = await AsyncSandbox.create()
        try:
            await sbx.files.write("agz.txt", "async " * 1000, gzip=True)
            assert await sbx.files.read("agz.txt") == "async " * 1000
        finally:
            await sbx.kill()
    asyncio.run(go())


def test_a_run_whose_sandbox_is_killed_raises_the_sdks_killed_error(e2b_server):
    from e2b import TimeoutException
    sbx = CodeSandbox.create()
    timer = threading.Timer(1.0, sbx.kill)
    timer.start()
    try:
        # E2B's connection drops with its sandbox; a run that ended normally (with an
        # "interpreter died" error) would not tell the caller the sandbox is gone.
        with pytest.raises(TimeoutException, match="killed while the request was in progress"):
            sbx.run_code("import time; time.sleep(120)", timeout=120)
    finally:
        timer.cancel()
        sbx.kill()


def test_a_run_whose_interpreter_dies_in_a_live_sandbox_still_ends_normally(e2b_server):
    sbx = CodeSandbox.create()
    try:
        died = sbx.run_code("import os; os._exit(3)")
        assert died.error is not None
        assert sbx.run_code("1 + 1").text == "2"
    finally:
        sbx.kill()


def test_signed_file_urls_work_without_routing_headers_until_they_expire(e2b_server):
    import json
    import urllib.error
    import urllib.request
    sbx = Sandbox.create(secure=True)
    other = Sandbox.create(secure=True)
    try:
        sbx.files.write("signed.txt", "signed content")
        other.files.write("signed.txt", "the other sandbox's")
        # The URL is E2B_SANDBOX_URL plus the query: the signature names the sandbox.
        with urllib.request.urlopen(sbx.download_url("signed.txt", "user")) as resp:
            assert resp.read() == b"signed content"
        with urllib.request.urlopen(sbx.download_url("signed.txt", "user", 60)) as resp:
            assert resp.read() == b"signed content"
        with urllib.request.urlopen(other.download_url("signed.txt")) as resp:
            assert resp.read() == b"the other sandbox's"
        up = urllib.request.Request(sbx.upload_url("up.txt", "user", 60), method="POST",
                                    data=b"uploaded", headers={
                                        "Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(up) as resp:
            assert resp.status == 200
        assert sbx.files.read("up.txt") == "uploaded"
        # A multipart body names its files' paths: a signed URL writes its own path only.
        import httpx
        two = httpx.post(sbx.upload_url("up.txt", "user"), files=[
            ("file", ("up.txt", b"mine")), ("file", ("/tmp/elsewhere.txt", b"not mine"))])
        assert two.status_code == 401, two.text
        assert sbx.files.read("up.txt") == "uploaded"
        assert not sbx.files.exists("/tmp/elsewhere.txt")
        one = httpx.post(sbx.upload_url("up.txt", "user"), files=[("file", ("up.txt", b"mine"))])
        assert one.status_code == 200, one.text
        assert sbx.files.read("up.txt") == "mine"

        with pytest.raises(urllib.error.HTTPError) as expired:
            urllib.request.urlopen(sbx.download_url("signed.txt", "user", -120))
        assert expired.value.code == 401
        assert json.loads(expired.value.read()) == {
            "code": 401, "message": "signature is already expired"}
        # A signature is for its path and operation only.
        url = sbx.download_url("signed.txt", "user")
        with pytest.raises(urllib.error.HTTPError) as other_path:
            urllib.request.urlopen(url.replace("signed.txt", "up.txt"))
        assert other_path.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as as_upload:
            urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b"x"))
        assert as_upload.value.code == 401
        # With the routing headers, a wrong signature is refused too.
        bad = urllib.request.Request(url[:-4] + "AAAA", headers=envd_route(sbx.sandbox_id))
        with pytest.raises(urllib.error.HTTPError) as wrong:
            urllib.request.urlopen(bad)
        assert wrong.value.code == 401
    finally:
        sbx.kill()
        other.kill()


def test_the_interpreters_python_and_javascript_contexts_are_listed_first(e2b_server):
    import shutil
    sbx = CodeSandbox.create()
    try:
        made = sbx.create_code_context()
        listed = sbx.list_code_contexts()
        languages = [c.language for c in listed]
        assert "python" in languages
        if shutil.which("node"):
            assert "javascript" in languages
        # As E2B's: the one a caller made comes after the built-in ones.
        assert listed[-1].id == made.id
        assert sbx.run_code("21 * 2").text == "42"
        assert len(sbx.list_code_contexts()) == len(listed)
    finally:
        sbx.kill()
