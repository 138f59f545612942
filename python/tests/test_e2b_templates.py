"""E2B templates built by the unmodified `e2b` SDK become lockbox images (issue 30 item 5):
`Template().from_image(...).copy(...).run_cmd(...)` and `Template.build(...)` against a live
`lockbox serve` (run as root and as uid 65534), then a sandbox of lockbox's own API on the
image shows what the steps did. The base image is an OCI layout of busybox-static and
bash-static (test_image.py), so no registry or network is needed."""

import json
import os
import shutil
import subprocess
import tempfile

import pytest
from conftest import need
from test_client import server_binary
from test_image import busybox_layout

from lockbox import Client

try:
    import e2b
except ImportError:
    e2b = None


@pytest.fixture(scope="module", params=["caller", "nobody"])
def server(request):
    """A `lockbox serve` as this user or as uid 65534, and a world-readable scratch dir."""
    binary = server_binary()
    need(os.path.exists(binary), f"the lockbox binary ({binary}; cargo build -p lockbox-cli)")
    prefix = []
    if request.param == "nobody":
        need(os.geteuid() == 0, "root (to serve as uid 65534)")
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    root = tempfile.mkdtemp(prefix="lockbox-e2b-templates-")
    os.chmod(root, 0o755)
    state = os.path.join(root, "state")
    os.mkdir(state)
    if prefix:
        os.chown(state, 65534, 65534)
    proc = subprocess.Popen([*prefix, binary, "serve", "--listen", "127.0.0.1:0", "--state-dir", state,
                             "--print-token"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "HOME": state})
    try:
        line = json.loads(proc.stdout.readline())
        yield f"http://{line['listen']}", line["token"], root
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def layout(server):
    """The busybox OCI layout (`oci:DIR:v1`), where the server's user can read it."""
    need(os.path.exists("/bin/busybox") and os.path.exists("/bin/bash-static"),
         "busybox-static and bash-static (Debian packages) for the image")
    path = tempfile.mkdtemp(dir=server[2])
    os.chmod(path, 0o755)
    shutil.rmtree(path)
    ref = busybox_layout(path)
    subprocess.run(["chmod", "-R", "a+rX", path], check=True)
    return ref


@pytest.fixture()
def e2b_env(server, monkeypatch):
    need(e2b is not None, "the e2b SDK (pip install e2b==2.63.0)")
    url, token, _ = server
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", token)
    monkeypatch.setenv("E2B_DOMAIN", "lockbox.test")
    return url, token


def test_a_template_built_by_the_sdk_is_an_image_lockbox_runs(e2b_env, layout, tmp_path):
    ctx = tmp_path / "ctx"
    (ctx / "app").mkdir(parents=True)
    (ctx / "app" / "main.sh").write_text("echo from-copy\n")
    (ctx / "config.txt").write_text("key=value\n")
    logs = []
    template = (
        e2b.Template(file_context_path=str(ctx))
        .from_image(layout)
        .copy("app", "/opt/app")
        .copy("config.txt", "/etc/app.conf", mode=0o600)
        .set_envs({"GREETING": "hi"})
        .set_workdir("/work")
        .run_cmd("echo \"$GREETING\" > built.txt && sh /opt/app/main.sh >> built.txt")
    )
    info = e2b.Template.build(template, "e2b-demo:v1", on_build_logs=logs.append)
    assert info.template_id == "e2b-demo" and info.name == "e2b-demo:v1"
    assert any("RUN" in str(entry.message) for entry in logs), [e.message for e in logs]

    client = Client(*e2b_env[:2])
    with client.create(image="e2b-demo:v1") as box:
        r = box.exec("cat /work/built.txt; cat /etc/app.conf; ls -ln /etc/app.conf | head -c 10; echo; echo GREETING=$GREETING")
        assert r.exit_code == 0, r.stderr
        # set_envs is build-time only, as in E2B: the image's own GREETING is back.
        assert r.stdout == "hi\nfrom-copy\nkey=value\n-rw-------\nGREETING=from-image\n"

    # An unchanged template rebuilds from the cache.
    again = []
    e2b.Template.build(template, "e2b-demo:v1", on_build_logs=again.append)
    assert any("CACHED" in str(entry.message) for entry in again), [e.message for e in again]


def test_a_failing_step_fails_the_build_and_names_it(e2b_env, layout):
    template = e2b.Template().from_image(layout).run_cmd("true").run_cmd("exit 3")
    with pytest.raises(e2b.BuildException) as err:
        e2b.Template.build(template, "e2b-broken")
    assert "exited with code 3" in str(err.value)
    assert not e2b.Template.exists("e2b-broken")


def test_a_sandbox_of_a_template_has_its_start_command_running_once_ready(e2b_env, layout):
    start = "sh -c 'echo up > /work/started; exec busybox sleep 600'"
    template = e2b.Template().from_image(layout).set_start_cmd(start, e2b.wait_for_file("/work/started"))
    e2b.Template.build(template, "e2b-started")
    sbx = e2b.Sandbox.create("e2b-started", timeout=60)
    try:
        # Ready when the create returns: the start command wrote its file and still runs.
        assert sbx.files.read("/work/started") == "up\n"
        running = [" ".join([p.cmd, *p.args]) for p in sbx.commands.list()]
        assert any("busybox sleep 600" in c for c in running), running
    finally:
        sbx.kill()


def test_a_ready_command_that_never_passes_fails_the_create_clearly(e2b_env, layout):
    template = e2b.Template().from_image(layout).set_start_cmd("busybox sleep 600", e2b.wait_for_file("/never"))
    e2b.Template.build(template, "e2b-never-ready")
    # Bounded by the sandbox's timeout here (50 s at most).
    with pytest.raises(e2b.SandboxException) as err:
        e2b.Sandbox.create("e2b-never-ready", timeout=3)
    assert "ready command" in str(err.value) and "the sandbox was deleted" in str(err.value)
    assert e2b.Sandbox.list().next_items() == []


def test_template_calls_need_the_api_key(e2b_env, monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", "wrong")
    with pytest.raises(e2b.AuthenticationException):
        e2b.Template.build(e2b.Template().from_image("oci:/x:v1").run_cmd("true"), "e2b-denied")


def test_a_built_template_moves_to_another_name_through_its_archive_and_starts_the_same(e2b_env, layout):
    """`GET /templates/{id}/archive` and `PUT /templates/{id}/archive?digest=` (what a fleet's
    router copies a template with, docs/e2b.md "Templates"): the archive names its digest,
    carries the start command, and loads back under another name with the same image id; a
    body that is not the digest's, a bad digest and a missing template are refused, and
    nothing is kept of them; both need the API key."""
    import http.client
    import urllib.parse

    url, token = e2b_env
    start = "sh -c 'echo up > /work/started; exec busybox sleep 600'"
    template = e2b.Template().from_image(layout).run_cmd("echo moved > /work/moved.txt").set_start_cmd(
        start, e2b.wait_for_file("/work/started"))
    e2b.Template.build(template, "e2b-mover:v2")
    parsed = urllib.parse.urlsplit(url)

    def call(method, path, body=None, key=token):
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers={"X-API-Key": key} if key else {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    status, headers, archive = call("GET", "/templates/e2b-mover/archive?tag=v2")
    assert status == 200 and int(headers["content-length"]) == len(archive), headers
    digest = headers["docker-content-digest"]
    import hashlib
    assert digest == "sha256:" + hashlib.sha256(archive).hexdigest()  # noqa: S324
    assert "lockbox-template-start" in headers
    assert call("GET", "/templates/e2b-mover/archive?tag=v2", key="wrong")[0] == 401
    assert call("GET", "/templates/e2b-nothing/archive")[0] == 404

    # Refused, and nothing kept: a cut body, a bad digest, no key.
    cut = call("PUT", f"/templates/e2b-moved/archive?tag=v1&digest={digest}", archive[: len(archive) // 2])
    assert cut[0] == 422 and b"tampered or cut" in cut[2], cut
    # (Refused before the body is read: a small one, so the refusal is read, not a broken pipe.)
    assert call("PUT", "/templates/e2b-moved/archive?tag=v1&digest=sha256:12", b"x")[0] == 400
    assert call("PUT", f"/templates/e2b-moved/archive?tag=v1&digest={digest}", b"x", key=None)[0] == 401
    assert not e2b.Template.exists("e2b-moved:v1")

    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    conn.request("PUT", f"/templates/e2b-moved/archive?tag=v1&digest={digest}", body=archive,
                 headers={"X-API-Key": token, "Lockbox-Template-Start": headers["lockbox-template-start"]})
    resp = conn.getresponse()
    moved = json.loads(resp.read())
    conn.close()
    assert resp.status == 201, moved
    assert moved["name"] == "e2b-moved:v1" and moved["image"].startswith("sha256:")
    assert e2b.Template.exists("e2b-moved:v1")
    sbx = e2b.Sandbox.create("e2b-moved:v1", timeout=60)
    try:
        assert sbx.files.read("/work/moved.txt") == "moved\n"
        assert sbx.files.read("/work/started") == "up\n"  # its start command came along
    finally:
        sbx.kill()
