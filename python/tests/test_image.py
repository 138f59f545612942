"""Sandboxes on an OCI image from Python (issue 29): ``Client.create(image=...)`` against a
live ``lockbox serve``, and ``Sandbox.open(image=...)`` in this process. The image is made
here as an OCI layout: busybox-static's busybox and bash-static's bash, no glibc at all."""

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile

import pytest
from conftest import need
from test_client import server_binary

from lockbox import Client, Sandbox
from lockbox.errors import LockboxError, ServerError, UsageError


def _blob(layout: str, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return f"sha256:{digest}"


def write_layout(layout: str, layer: bytes, image_config: dict) -> str:
    """Writes an OCI layout at `layout` (made already, with its blobs directory) of one
    uncompressed `layer` and the image config `image_config`, tagged v1; its reference
    (``oci:DIR:v1``)."""
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _blob(layout, config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _blob(layout, layer), "size": len(layer)}],
    }).encode()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _blob(layout, manifest),
        "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    return f"oci:{layout}:v1"


def busybox_layout(layout: str) -> str:
    """An OCI layout at `layout`, tag v1; its reference (``oci:DIR:v1``)."""
    os.makedirs(os.path.join(layout, "blobs", "sha256"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add_dir(name: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)

        def add_file(name: str, host: str) -> None:
            with open(host, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))

        add_dir("bin")
        add_dir("work")
        add_file("bin/busybox", "/bin/busybox")
        add_file("bin/bash", "/bin/bash-static")
        for applet in ("sh", "cat", "ls", "mktemp", "head", "rm", "env", "test"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    return write_layout(layout, buf.getvalue(), {
        "Env": ["PATH=/bin", "GREETING=from-image"], "Cmd": ["sh"], "WorkingDir": "/work"})


@pytest.fixture(scope="module")
def image():
    need(os.path.exists("/bin/busybox") and os.path.exists("/bin/bash-static"),
         "busybox-static and bash-static (apt-get install busybox-static bash-static)")
    tmp = tempfile.mkdtemp(prefix="lockbox-image-")
    try:
        yield busybox_layout(os.path.join(tmp, "lay"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def server():
    binary = server_binary()
    need(os.path.exists(binary), f"the lockbox binary ({binary}; cargo build -p lockbox-cli)")
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


def test_a_remote_sandbox_on_a_busybox_image_runs_with_the_images_env_and_cwd(server, image):
    client = Client(*server)
    with client.create(image=image) as box:
        r = box.exec('echo "$GREETING $PWD"; test -e /lib/x86_64-linux-gnu/libc.so.6 || echo no-glibc')
        assert r.exit_code == 0, r
        assert r.stdout == "from-image /work\nno-glibc\n"
        box.files.write("/work/note.txt", b"hi")
        assert box.files.read("/work/note.txt") == b"hi"
        assert box.exec("cat /work/note.txt").stdout == "hi"
    with pytest.raises(ServerError) as e:
        client.create(image=image.replace(":v1", ":no-such-tag"))
    assert e.value.code == "BAD_REFERENCE"


def test_sandbox_open_runs_on_an_image_in_this_process(tmp_path, image):
    with Sandbox.open(image=image, state_dir=tmp_path / "state") as box:
        r = box.exec('echo "$GREETING"; busybox true && echo busybox')
        assert r.stdout == "from-image\nbusybox\n", r


def test_transaction_stages_run_on_an_image_and_commit_together(tmp_path, image):
    state, work = tmp_path / "state", tmp_path / "proj"
    work.mkdir()
    on_image = Sandbox(work, image=image, state_dir=state)
    on_host = Sandbox(work, state_dir=state)
    script = "echo $GREETING > greeting; test -e /usr/bin || echo no-host-usr > where; pwd"
    out = (on_image.cmd(["sh", "-c", script]) | on_host.cmd(["sh", "-c", "cat; test -e /usr/bin && echo host"])).run_transactional()
    assert out.committed, out
    # The image's Env, none of the host's userland, the workdir at its own path as the cwd;
    # the next stage, on the host, read its stdout.
    assert (work / "greeting").read_text() == "from-image\n"
    assert (work / "where").read_text() == "no-host-usr\n"
    assert out.stdout == f"{work}\nhost\n".encode()

    # An image the store cannot find (a tag the layout lacks): nothing runs, the error names
    # the stage and the image.
    missing = Sandbox(work, image=image.replace(":v1", ":no-such-tag"), state_dir=state)
    with pytest.raises(LockboxError) as e:
        missing.cmd(["sh", "-c", "echo x > x"]).run_transactional()
    assert e.value.code == "BAD_REFERENCE", e.value
    assert "stage 1" in str(e.value) and "no-such-tag" in str(e.value), e.value
    assert not (work / "x").exists()

    # Without a transaction, images are refused up front.
    with pytest.raises(UsageError):
        on_image.cmd(["true"]).run()


def python_layout(layout: str) -> str:
    """An OCI layout of the host's own Python (its binary, its standard library and the
    shared libraries they load, found with ldd), tag v1; its reference."""
    os.makedirs(os.path.join(layout, "blobs", "sha256"))
    python = os.path.realpath("/usr/bin/python3")
    stdlib = os.path.dirname(os.__file__)
    skip = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "pydoc_data", "site-packages",
            "dist-packages", "__pycache__", "turtledemo"}
    files = [python]
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith("config-")]
        files += [os.path.join(root, n) for n in names]
    libs = set()
    for binary in [python] + [f for f in files if f.endswith(".so")]:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
            if path.startswith("/"):
                libs.add(path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made = set()
        for path in sorted(set(files) | libs):
            parts = path.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in made:
                    made.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            if not os.path.isfile(path):
                continue
            with open(os.path.realpath(path), "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(path.strip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for d in ("tmp",):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
    return write_layout(layout, buf.getvalue(), {"Env": ["PATH=/usr/bin"]})


def test_an_executor_runs_calls_on_an_image_with_its_interpreter(tmp_path):
    import operator

    from lockbox.executor import SandboxExecutor

    need(shutil.which("ldd") is not None, "ldd (libc-bin)")
    image = python_layout(str(tmp_path / "lay"))
    box = Sandbox(image=image, state_dir=tmp_path / "state")
    python = os.path.realpath("/usr/bin/python3")
    ex = SandboxExecutor(policy=box, python=python, timeout=60)
    r = ex.secure_execute(operator.add, 2, 3)
    assert r.ok and r.result == 5, r
    # The image's root, not the host's: its Python alone (no /usr/share, no /etc/passwd).
    r = ex.secure_execute(os.path.exists, "/usr/share")
    assert r.ok and r.result is False, r
    r = ex.secure_execute(os.path.exists, stdlib := os.path.dirname(os.__file__))
    assert r.ok and r.result is True, (stdlib, r)
    # This process's interpreter is not the image's: python= is required.
    with pytest.raises(UsageError):
        SandboxExecutor(policy=box)
