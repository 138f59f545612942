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
from lockbox.errors import ServerError


def _blob(layout: str, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return f"sha256:{digest}"


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
    layer = buf.getvalue()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin", "GREETING=from-image"], "Cmd": ["sh"], "WorkingDir": "/work"},
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
