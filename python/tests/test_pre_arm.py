"""Plain runs of one command handed to the SDK's pre-arm helper (docs/pre-arm.md, "From the
Python SDK"): the same result as a direct start, as root and as uid 65534. Each user's
runs happen in a child interpreter with a helper directory of its own."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from conftest import need

SCRIPT = r"""
import json, os, subprocess, sys, time
from lockbox import Sandbox

cli = [sys.executable, "-m", "lockbox._cli", "pre-arm"]


def wait_armed():
    # Until each policy the helper keeps has its full count of spares. (The timeout is
    # not part of a spare: the helper supervises it, so both boxes share one policy.)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = subprocess.run(cli + ["status", "--json"], capture_output=True, text=True).stdout
        status = json.loads(out) if out else {}
        kept = status.get("policies", [])
        if kept and all(p["spares"] == status["spares_per_policy"] for p in kept):
            return
        time.sleep(0.05)
    raise SystemExit(f"the helper did not arm its spares in 30 s: {out}")


def run(box, argv, stdin, switch):
    os.environ["LOCKBOX_PRE_ARM"] = switch
    r = box.cmd(argv, stdin=stdin).run()
    s = r.stages[0]
    return {"code": r.returncode, "out": r.stdout.decode(), "err": s.stderr, "signal": s.signal,
            "timed_out": s.timed_out, "setup_error": s.setup_error, "pre_armed": s.pre_armed}


subprocess.run(cli + ["start", "--idle", "2m"], check=True, stdout=subprocess.DEVNULL)
helper = json.loads(subprocess.run(cli + ["status", "--json"], capture_output=True).stdout)["pid"]
try:
    plain, timed = Sandbox(), Sandbox(timeout=0.5)
    for box in (plain, timed):
        run(box, ["true"], None, "1")  # no spare yet: started directly, and the helper arms some
    cases = [
        (plain, ["sh", "-c", "echo out; echo err >&2; id -u; exit 3"], None),
        (plain, ["cat"], b"fed through stdin"),
        (plain, ["nosuchprog"], None),
        (plain, ["sh", "-c", "kill -9 $$"], None),
        (timed, ["sleep", "5"], None),
        # More than a pipe holds, on both outputs, and through stdin.
        (plain, ["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a; head -c 200000 /dev/zero | tr '\\0' b >&2"], None),
        (plain, ["cat"], b"x" * 300000),
    ]
    results = []
    for box, argv, stdin in cases:
        wait_armed()
        results.append([run(box, argv, stdin, "1"), run(box, argv, stdin, "0")])
finally:
    subprocess.run(cli + ["stop"], stdout=subprocess.DEVNULL)
# The helper ends, with its spares, once asked to.
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        os.kill(helper, 0)
    except ProcessLookupError:
        break
    time.sleep(0.05)
else:
    raise SystemExit(f"the helper (pid {helper}) still runs 10 s after pre-arm stop")
print(json.dumps(results))
"""


def _run_as(prefix: list[str], uid: int) -> None:
    root = tempfile.mkdtemp(prefix="lockbox-pre-arm-")
    try:
        helper_dir = os.path.join(root, "pre-arm")
        os.mkdir(helper_dir, 0o700)
        for p in (root, helper_dir):
            os.chown(p, uid, uid)
        env = dict(os.environ, LOCKBOX_PRE_ARM_DIR=helper_dir)
        res = subprocess.run([*prefix, sys.executable, "-c", SCRIPT], capture_output=True,
                             text=True, cwd=root, env=env, timeout=300)
        assert res.returncode == 0, res.stderr
        pairs = json.loads(res.stdout.strip().splitlines()[-1])
        for armed, direct in pairs:
            assert armed.pop("pre_armed") is True, (armed, direct)
            assert direct.pop("pre_armed") is False, (armed, direct)
            assert armed == direct
        (out, fed, missing, killed, slow, big, big_fed) = (p[0] for p in pairs)
        assert out == {"code": 3, "out": f"out\n{uid}\n", "err": "err\n", "signal": None,
                       "timed_out": False, "setup_error": None}
        assert fed["out"] == "fed through stdin"
        assert missing["code"] == 127
        assert missing["err"].startswith("lockbox: nosuchprog: command not found inside the sandbox")
        assert (killed["code"], killed["signal"]) == (137, 9)
        assert (slow["code"], slow["timed_out"]) == (124, True)
        assert (big["out"], big["err"]) == ("a" * 300000, "b" * 200000)
        assert big_fed["out"] == "x" * 300000
        # The helper ended with `pre-arm stop` (the script waited): its socket went with it.
        assert [n for n in os.listdir(helper_dir) if n.endswith(".sock")] == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_plain_run_handed_to_the_pre_arm_helper_ends_as_a_direct_start_does():
    _run_as([], os.geteuid())


FIRST_USE = r"""
import json, os, subprocess, sys, time
from lockbox import Sandbox

os.environ["LOCKBOX_PRE_ARM"] = "1"
cli = [sys.executable, "-m", "lockbox._cli", "pre-arm"]
Sandbox().cmd(["true"]).run()  # no helper: starts directly, and starts one, a child of ours
deadline = time.monotonic() + 30
while True:
    out = subprocess.run(cli + ["status", "--json"], capture_output=True, text=True).stdout
    status = json.loads(out) if out else {}
    if status.get("running"):
        break
    assert time.monotonic() < deadline, "no helper was started"
    time.sleep(0.05)
helper = status["pid"]
with open(f"/proc/{helper}/stat") as f:
    assert int(f.read().rsplit(") ", 1)[1].split()[1]) == os.getpid()
subprocess.run(cli + ["stop"], stdout=subprocess.DEVNULL)
deadline = time.monotonic() + 10
while os.path.exists(f"/proc/{helper}"):  # a zombie would stay
    assert time.monotonic() < deadline, open(f"/proc/{helper}/status").read()[:120]
    time.sleep(0.05)
print("reaped")
"""


def test_a_helper_started_on_first_use_is_reaped_when_it_ends():
    root = tempfile.mkdtemp(prefix="lockbox-pre-arm-")
    try:
        helper_dir = os.path.join(root, "pre-arm")
        os.mkdir(helper_dir, 0o700)
        env = dict(os.environ, LOCKBOX_PRE_ARM_DIR=helper_dir)
        res = subprocess.run([sys.executable, "-c", FIRST_USE], capture_output=True, text=True,
                             cwd=root, env=env, timeout=120)
        assert (res.returncode, res.stdout.strip()) == (0, "reaped"), res.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_lockbox_pre_arm_value_neither_on_nor_off_is_a_usage_error(monkeypatch):
    from lockbox import Sandbox
    from lockbox.errors import UsageError

    monkeypatch.setenv("LOCKBOX_PRE_ARM", "maybe")
    with pytest.raises(UsageError, match=r"LOCKBOX_PRE_ARM=maybe: expected 1 \(pre-arm\) or 0"):
        Sandbox().cmd(["true"]).run()


def test_a_plain_run_whose_sandbox_cannot_be_set_up_says_why(monkeypatch):
    from lockbox import Sandbox

    monkeypatch.setenv("LOCKBOX_PRE_ARM", "0")
    stage = Sandbox(cwd="/nonexistent/dir").cmd(["true"]).run().stages[0]
    assert (stage.exit_code, stage.pre_armed) == (125, False)
    assert stage.setup_error is not None
    assert stage.setup_error.startswith("changing to the working directory /nonexistent/dir")


def test_pre_armed_runs_work_as_uid_65534():
    need(os.geteuid() == 0, "root (the test re-runs as uid 65534)")
    need(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    probe = subprocess.run([*as_nobody, sys.executable, "-c", "import lockbox"], capture_output=True,
                           cwd="/")
    need(probe.returncode == 0, f"a Python with lockbox that uid 65534 can run ({sys.executable}: "
         f"{probe.stderr.decode().strip()[-200:]})")
    _run_as(as_nobody, 65534)
