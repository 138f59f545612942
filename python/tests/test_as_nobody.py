"""The SDK run by an unprivileged user (uid 65534): a transaction and sandboxed function
calls, from a child interpreter started with setpriv (when the tests run as root)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from conftest import need

SCRIPT = r"""
import json, operator, os, sys, time
from lockbox import Sandbox
from lockbox.executor import SandboxExecutor
ws = sys.argv[1]
box = Sandbox(workdir=ws, timeout=30, state_dir=os.path.join(os.path.dirname(ws), "state"))
out = (box.cmd(["sh", "-c", "id -u > who; echo a > a.txt"]) | box.cmd(["sh", "-c", "exit 0"])).run_transactional()
bad = box.cmd(["sh", "-c", "echo b > b.txt; exit 1"]).run_transactional()
missing = box.cmd(["nosuchprog"]).run()
ex = SandboxExecutor(timeout=2, python="/usr/bin/python3", pickler="pickle")
ok = ex.secure_execute(operator.add, 1, 2)
slow = ex.secure_execute(time.sleep, 30)
print(json.dumps({"committed": out.committed, "bad": bad.committed, "ok": [ok.status, ok.result],
                  "slow": slow.status, "missing": [missing.returncode, missing.stages[0].stderr.splitlines()[0]]}))
"""


def test_transactions_and_the_executor_work_as_uid_65534():
    need(os.geteuid() == 0, "root (the test re-runs as uid 65534)")
    need(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    probe = subprocess.run(as_nobody + [sys.executable, "-c", "import lockbox"], capture_output=True)
    need(probe.returncode == 0, f"a Python with lockbox that uid 65534 can run ({sys.executable}: "
         f"{probe.stderr.decode().strip()[-200:]}); scripts/test.sh builds one from /usr/bin/python3")
    root = tempfile.mkdtemp(prefix="lockbox-nobody-")
    try:
        ws = os.path.join(root, "repo")
        os.mkdir(ws)
        for p in (root, ws):
            os.chown(p, 65534, 65534)
        res = subprocess.run(as_nobody + [sys.executable, "-c", SCRIPT, ws], capture_output=True,
                             text=True, cwd=root, timeout=300)
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout.strip().splitlines()[-1])
        assert got == {"committed": True, "bad": False, "ok": ["ok", 3], "slow": "timeout",
                       "missing": [127, "lockbox: nosuchprog: command not found inside the sandbox"]}
        with open(os.path.join(ws, "who")) as f:
            assert f.read().strip() == "65534"
        assert not os.path.exists(os.path.join(ws, "b.txt"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
