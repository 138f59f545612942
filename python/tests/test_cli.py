"""``pip install ./python`` alone gives the ``lockbox`` command (the CLI linked into the
extension, ``lockbox._cli``): it runs sandboxes, passes exit codes through, and serves."""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

LOCKBOX = Path(sys.executable).parent / "lockbox"


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(LOCKBOX), *args], capture_output=True, text=True, timeout=60, **kw)


def test_the_wheel_installs_the_lockbox_command_and_it_runs_sandboxes():
    assert LOCKBOX.exists(), "pip install put no lockbox script next to python"
    out = run("run", "--", "sh", "-c", "echo hi from $(hostname); exit 3")
    assert out.returncode == 3, out
    assert out.stdout == "hi from lockbox\n", out
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("lockbox "), out
    out = run("run", "true")
    assert out.returncode == 2 and "hint: the command goes after `--`" in out.stderr, out


def test_the_wheels_lockbox_serves_sandboxes_with_the_embedded_agent(tmp_path):
    env = {**os.environ, "LOCKBOX_STATE_DIR": str(tmp_path / "state")}
    server = subprocess.Popen(
        [str(LOCKBOX), "serve", "--listen", "127.0.0.1:0", "--print-token"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        hello = json.loads(server.stdout.readline())
        api, auth = f"http://{hello['listen']}", {"Authorization": f"Bearer {hello['token']}"}

        def post(path: str, body: dict) -> dict:
            req = urllib.request.Request(api + path, data=json.dumps(body).encode(), method="POST",
                                         headers={**auth, "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())

        box = post("/v1/sandboxes", {})
        done = post(f"/v1/sandboxes/{box['id']}/exec", {"command": "echo agent ok"})
        assert done["exit_code"] == 0 and done["stdout"] == "agent ok\n", done
    finally:
        server.terminate()
        server.wait(timeout=30)
