"""Harbor (from PyPI, unmodified) runs tasks in lockbox sandboxes: `harbor run` with the oracle
agent over a local dataset of four tasks whose images come from a real `docker-registry` on
loopback, fed by skopeo (issue 30 item 6):

- `net`: needs the network (public); its solution fetches a page from a server on the host;
- `allow`: an allow-list naming that server's address only: the page is reached, the registry
  (another host address) is not;
- `files`: built from its own Dockerfile (FROM the registry's image); its solution writes files
  that its tests check;
- `slow`: its solution outlives the agent timeout; Harbor ends the agent, lockbox kills the
  command's tree, and the tests check the command never got to write its file.

Harbor needs Python 3.12+, so this directory runs in its own venv (scripts/test.sh). It runs as
root and, when root, again as uid 65534 (every path it writes is made for that user).
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import secrets
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

# The `slow` task's command, unique to this run: the check that nothing of it is left must not
# see another process on the machine (a `sleep 300` of someone else's matched `sleep 30`).
SLOW = f"sleep 30.{secrets.randbelow(10**6):06d}"

REQUIRE_ALL = os.environ.get("LOCKBOX_TEST_REQUIRE") == "all"


def need(condition: bool, why: str) -> None:
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required: {why}")
    pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


INSTALL = """#!/bin/sh
# install -d [-m MODE] [-o OWNER] [-g GROUP] DIR...: what images' coreutils would do.
mode=; dirs=
while [ $# -gt 0 ]; do
  case "$1" in
    -d) ;;
    -m) mode="$2"; shift ;;
    -o|-g) shift ;;
    *) dirs="$dirs $1" ;;
  esac
  shift
done
for d in $dirs; do mkdir -p "$d" && { [ -z "$mode" ] || chmod "$mode" "$d"; } || exit 1; done
"""


def busybox_layout(layout: Path) -> None:
    """An OCI layout (tag v1) of busybox-static with every applet, and bash-static: no glibc."""
    (layout / "blobs" / "sha256").mkdir(parents=True)

    def blob(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (layout / "blobs" / "sha256" / digest).write_bytes(data)
        return f"sha256:{digest}"

    applets = subprocess.run(["/bin/busybox", "--list-full"], capture_output=True, text=True,
                             check=True).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "tmp", "root", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for name, host in (("bin/busybox", "/bin/busybox"), ("bin/bash", "/bin/bash-static")):
            data = Path(host).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for name, mode, data in (
            ("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n"),
            ("etc/group", 0o644, b"root:x:0:\nuser:x:1000:\n"),
            # busybox-static has no `install`; Harbor's E2B environment runs `install -d -m`.
            ("usr/bin/install", 0o755, INSTALL.encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        for applet in applets:
            name = applet.lstrip("/")
            if name in ("bin/busybox", "bin/bash", "usr/bin/install") or name.count("/") < 1:
                continue
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, "/bin/busybox"
            tar.addfile(info)
    layer = buf.getvalue()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["sh"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": blob(layer),
                    "size": len(layer)}],
    }).encode()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": blob(manifest),
        "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}
    (layout / "index.json").write_text(json.dumps(index))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')


class Registry:
    """A real `docker-registry` on 127.0.0.1 with the busybox image as `harbor-base:v1`."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        data = root / "registry"
        data.mkdir()
        config = root / "registry.yml"
        config.write_text(textwrap.dedent(f"""\
            version: 0.1
            log:
              level: error
              accesslog:
                disabled: true
            storage:
              filesystem:
                rootdirectory: {data}
            http:
              addr: 127.0.0.1:{self.port}
            """))
        self.proc = subprocess.Popen(["docker-registry", "serve", str(config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc)
        layout = root / "layout"
        busybox_layout(layout)
        policy = root / "policy.json"
        policy.write_text('{"default":[{"type":"insecureAcceptAnything"}]}')
        subprocess.run(["skopeo", "--policy", str(policy), "copy", "-q", "--dest-tls-verify=false",
                        f"oci:{layout}:v1", f"docker://127.0.0.1:{self.port}/harbor-base:v1"],
                       check=True, env={**os.environ, "HOME": str(root), "TMPDIR": str(root)})
        self.image = f"127.0.0.1:{self.port}/harbor-base:v1"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"the answer is 42\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def write_task(root: Path, name: str, *, toml: str, solve: str, test: str,
               dockerfile: str | None = None) -> None:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "tests").mkdir()
    (task / "instruction.md").write_text(f"Task {name}.\n")
    (task / "task.toml").write_text(textwrap.dedent(toml))
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nset -e\n" + textwrap.dedent(solve))
    reward = "/logs/verifier/reward.txt"
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n" + textwrap.dedent(test) + f"\nif [ $? -eq 0 ]; then echo 1 > {reward}; else echo 0 > {reward}; fi\n")
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(textwrap.dedent(dockerfile))


def dataset(root: Path, image: str, page_port: int) -> Path:
    tasks = root / "tasks"
    write_task(tasks, "net", toml=f"""\
        schema_version = "1.4"
        [agent]
        timeout_sec = 120.0
        [verifier]
        timeout_sec = 120.0
        [environment]
        docker_image = "{image}"
        network_mode = "public"
        """, solve=f"""\
        mkdir -p /app
        wget -q -O /app/page.txt http://127.0.0.2:{page_port}/
        """, test="""\
        grep -qx 'the answer is 42' /app/page.txt
        """)
    write_task(tasks, "allow", toml=f"""\
        schema_version = "1.4"
        [agent]
        timeout_sec = 120.0
        [verifier]
        timeout_sec = 120.0
        [environment]
        docker_image = "{image}"
        network_mode = "allowlist"
        allowed_hosts = ["127.0.0.2"]
        """, solve=f"""\
        mkdir -p /app
        wget -q -O /app/page.txt http://127.0.0.2:{page_port}/
        # The registry listens on the host's 127.0.0.1, which the allow-list does not name.
        # (busybox's `wget -T` crashes: bound it with `timeout` instead.)
        if timeout 5 wget -q -O /dev/null http://{image.split("/")[0]}/v2/; then echo reached > /app/leak.txt; fi
        """, test="""\
        grep -qx 'the answer is 42' /app/page.txt && test ! -e /app/leak.txt
        """)
    write_task(tasks, "files", toml="""\
        schema_version = "1.4"
        [agent]
        timeout_sec = 120.0
        [verifier]
        timeout_sec = 120.0
        [environment]
        network_mode = "no-network"
        """, dockerfile=f"""\
        FROM {image}
        RUN mkdir -p /app && echo seed > /app/seed.txt
        WORKDIR /app
        """, solve=f"""\
        cd /app
        for i in 1 2 3; do echo "line $i" >> out.txt; done
        sort -r out.txt > reversed.txt
        # no-network: the host's page is out of reach (it is in `net` and `allow`).
        if timeout 5 wget -q -O /dev/null http://127.0.0.2:{page_port}/; then echo reached > leak.txt; fi
        """, test="""\
        test "$(cat /app/seed.txt)" = seed && \\
        test "$(head -1 /app/reversed.txt)" = "line 3" && \\
        test "$(wc -l < /app/out.txt)" -eq 3 && test ! -e /app/leak.txt
        """)
    write_task(tasks, "slow", toml=f"""\
        schema_version = "1.4"
        [agent]
        timeout_sec = 3.0
        [verifier]
        timeout_sec = 120.0
        [environment]
        docker_image = "{image}"
        network_mode = "no-network"
        """, solve=f"""\
        mkdir -p /app
        {SLOW}
        echo late > /app/late.txt
        """, test=f"""\
        sleep 1; test ! -e /app/late.txt && ! ps -o args | grep -qx '{SLOW}'
        """)
    return tasks


def as_nobody() -> list[str]:
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


@pytest.mark.parametrize("who", ["caller", "nobody"])
def test_harbor_runs_four_tasks_in_lockbox_sandboxes(who: str) -> None:
    need(shutil.which("docker-registry") is not None and shutil.which("skopeo") is not None,
         "docker-registry and skopeo (Debian packages) make the local registry")
    need(os.path.exists("/bin/busybox") and os.path.exists("/bin/bash-static"),
         "busybox-static and bash-static make the image")
    harbor = shutil.which("harbor", path=os.path.dirname(sys.executable))
    need(harbor is not None, "harbor is installed in this venv")
    if who == "nobody":
        need(os.geteuid() == 0, "running as uid 65534 needs root to switch")
    prefix = as_nobody() if who == "nobody" else []

    root = Path(tempfile.mkdtemp(prefix="lockbox-harbor-"))
    os.chmod(root, 0o755)
    (root / "reg").mkdir()
    registry = Registry(root / "reg")
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        work = root / "work"
        work.mkdir()
        tasks = dataset(work, registry.image, server.server_address[1])
        if who == "nobody":
            subprocess.run(["chown", "-R", "65534:65534", str(work)], check=True)
        env = {**os.environ, "HOME": str(work), "LOCKBOX_STATE_DIR": str(work / "state"),
               "XDG_STATE_HOME": str(work / "xdg-state"), "XDG_CACHE_HOME": str(work / "cache"),
               "XDG_DATA_HOME": str(work / "data"), "XDG_CONFIG_HOME": str(work / "config"),
               "TMPDIR": str(work)}
        jobs = work / "jobs"
        out = subprocess.run(
            [*prefix, str(harbor), "run", "--path", str(tasks), "--agent", "oracle",
             "--env", "lockbox.harbor:LockboxEnvironment",
             "--ek", f"state_dir={work / 'state'}",
             "--jobs-dir", str(jobs), "--n-concurrent", "4", "--yes"],
            cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"harbor run failed:\n{out.stdout}\n{out.stderr}"
        results = {}
        for result in jobs.glob("*/*/result.json"):
            data = json.loads(result.read_text())
            results[data["task_name"]] = data
        assert set(results) == {"net", "allow", "files", "slow"}, f"{list(results)}\n{out.stdout}"
        for name, data in results.items():
            rewards = (data.get("verifier_result") or {}).get("rewards") or {}
            assert rewards.get("reward") == 1, f"{name}: {json.dumps(data, indent=1)[:4000]}"
        print({n: (d.get("verifier_result") or {}).get("rewards") for n, d in results.items()})
        slow = results["slow"]
        assert "Timeout" in json.dumps(slow.get("exception_info")), slow.get("exception_info")
        # Every sandbox was deleted: no process of a sandbox is left, nothing held.
        leftover = subprocess.run(["pgrep", "-x", "-f", SLOW], capture_output=True, text=True)
        assert leftover.stdout == "", f"left behind: {leftover.stdout}"
    finally:
        server.shutdown()
        registry.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("who", ["caller", "nobody"])
def test_harbors_own_e2b_environment_runs_on_lockbox_serve(who: str) -> None:
    """Harbor's E2B environment (`--env e2b`, the unmodified E2B SDK inside Harbor) pointed at
    `lockbox serve` by E2B_API_URL/E2B_SANDBOX_URL/E2B_API_KEY: it builds each task's template
    (its Dockerfile, or its docker_image) through lockbox's template API, pins the build, and
    runs the oracle and the tests through envd. E2B sandboxes cannot reach the host's loopback
    (as on E2B), so the network tasks are left out here."""
    need(shutil.which("docker-registry") is not None and shutil.which("skopeo") is not None,
         "docker-registry and skopeo (Debian packages) make the local registry")
    need(os.path.exists("/bin/busybox") and os.path.exists("/bin/bash-static"),
         "busybox-static and bash-static make the image")
    harbor = shutil.which("harbor", path=os.path.dirname(sys.executable))
    need(harbor is not None, "harbor is installed in this venv")
    try:
        import e2b  # noqa: F401
    except ImportError:
        need(False, "harbor's e2b extra (pip install 'harbor[e2b]')")
    if who == "nobody":
        need(os.geteuid() == 0, "running as uid 65534 needs root to switch")
    prefix = as_nobody() if who == "nobody" else []

    root = Path(tempfile.mkdtemp(prefix="lockbox-harbor-e2b-"))
    os.chmod(root, 0o755)
    (root / "reg").mkdir()
    registry = Registry(root / "reg")
    state = root / "state"
    state.mkdir()
    if who == "nobody":
        os.chown(state, 65534, 65534)
    # This package's CLI (what CI installs), or $LOCKBOX_BIN (a cargo build).
    lockbox = [os.environ["LOCKBOX_BIN"]] if os.environ.get("LOCKBOX_BIN") else [sys.executable, "-m", "lockbox._cli"]
    serve = subprocess.Popen([*prefix, *lockbox, "serve", "--listen", "127.0.0.1:0",
                              "--state-dir", str(state), "--print-token"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env={**os.environ, "HOME": str(state)})
    try:
        assert serve.stdout is not None
        listen = json.loads(serve.stdout.readline())
        url = f"http://{listen['listen']}"
        work = root / "work"
        work.mkdir()
        tasks = dataset(work, registry.image, 9)
        for name in ("net", "allow"):
            shutil.rmtree(tasks / name)
        env = {**os.environ, "HOME": str(work), "XDG_STATE_HOME": str(work / "xdg-state"),
               "XDG_CACHE_HOME": str(work / "cache"), "XDG_DATA_HOME": str(work / "data"),
               "XDG_CONFIG_HOME": str(work / "config"), "TMPDIR": str(work),
               "E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": listen["token"],
               "E2B_DOMAIN": "lockbox.test"}
        jobs = work / "jobs"
        out = subprocess.run(
            [str(harbor), "run", "--path", str(tasks), "--agent", "oracle", "--env", "e2b",
             "--jobs-dir", str(jobs), "--n-concurrent", "2", "--yes"],
            cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"harbor run failed:\n{out.stdout}\n{out.stderr}"
        results = {}
        for result in jobs.glob("*/*/result.json"):
            data = json.loads(result.read_text())
            results[data["task_name"]] = data
        assert set(results) == {"files", "slow"}, f"{list(results)}\n{out.stdout}"
        for name, data in results.items():
            rewards = (data.get("verifier_result") or {}).get("rewards") or {}
            assert rewards.get("reward") == 1, f"{name}: {json.dumps(data, indent=1)[:4000]}"
        assert "Timeout" in json.dumps(results["slow"].get("exception_info"))
        assert results["files"].get("exception_info") is None, results["files"]["exception_info"]
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        registry.stop()
        shutil.rmtree(root, ignore_errors=True)
