"""Issue 15: file names are bytes. A sandbox that writes ``caf\\xe9.txt`` (not UTF-8) gets it
listed and committed exactly, in transactions and in long-lived sandboxes; names with
newlines or escape sequences print as one quoted line (``str(change)``); as root and as
uid 65534."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from conftest import need, settle
from test_client import server  # noqa: F401 - the live `lockbox serve` fixture

from lockbox import Client, Gather, Sandbox, quote_name
from lockbox._names import from_json, to_json

LATIN1 = b"caf\xe9.txt"
WRITE = ["python3", "-c", 'open(b"caf\\xe9.txt", "wb").write(b"x")']


def test_names_round_trip_through_the_json_form_and_quote_like_the_cli():
    for raw in [b"a/b.txt", "é/名前".encode(), LATIN1, b"\xff\xfe", b"n\nM a.txt"]:
        name = os.fsdecode(raw)
        assert os.fsencode(from_json(json.loads(json.dumps(to_json(name))))) == raw
    assert to_json(os.fsdecode(LATIN1)) == {"bytes": "Y2Fm6S50eHQ="}
    assert to_json("é") == "é"
    assert quote_name("src/main.rs") == "src/main.rs"
    assert quote_name("é.txt") == "é.txt"
    assert quote_name(os.fsdecode(LATIN1)) == '"caf\\351.txt"'
    assert quote_name("n\nM a.txt") == '"n\\nM a.txt"'
    assert quote_name("e\x1b[1A\x1b[2K\r") == '"e\\033[1A\\033[2K\\r"'
    assert quote_name('q"b\\') == '"q\\"b\\\\"'
    assert quote_name("rlo\u202etxt") == '"rlo\\342\\200\\256txt"'
    with pytest.raises(ValueError):
        from_json({"bytes": "YQ==", "more": 1})


def test_a_pipeline_lists_and_commits_a_name_that_is_not_utf8(ws):
    box = Sandbox(workdir=str(ws), timeout=30)
    dry = box.cmd(WRITE).dry_run()
    assert [os.fsencode(c.path) for c in dry.changes] == [LATIN1]
    assert str(dry.changes[0]) == 'A "caf\\351.txt"'
    assert not os.path.exists(os.path.join(os.fsencode(str(ws)), LATIN1))

    out = box.cmd(WRITE).run_transactional()
    assert out.committed, out
    assert [os.fsencode(c.path) for c in out.changes] == [LATIN1]
    with open(os.path.join(str(ws), out.changes[0].path), "rb") as f:
        assert f.read() == b"x"

    g = Gather().source("a", box.cmd(["sh", "-c", "printf y > \"$(printf 'g\\377')\""]))
    out = g.run_transactional()
    assert out.committed, out
    assert [os.fsencode(c.path) for c in out.changes] == [b"g\xff"]


def test_a_forging_name_is_one_quoted_line():
    with tempfile.TemporaryDirectory() as root:
        ws = os.path.join(root, "w")
        os.mkdir(ws)
        with open(os.path.join(ws, "important.txt"), "w") as f:
            f.write("keep\n")
        settle()
        box = Sandbox(workdir=ws, timeout=30, state_dir=os.path.join(root, "state"))
        script = "printf 1 > \"$(printf 'n\\nM a.txt')\"; printf 2 > \"$(printf 'e\\033[2K\\r')\"; rm important.txt"
        lines = [str(c) for c in box.cmd(["sh", "-c", script]).dry_run().changes]
        # Sorted bytewise; each change one line, the real deletion intact.
        assert lines == ['A "e\\033[2K\\r"', "D important.txt", 'A "n\\nM a.txt"'], lines


def test_a_workdir_whose_name_is_not_utf8_runs_transactions():
    with tempfile.TemporaryDirectory() as root:
        ws = os.fsdecode(os.path.join(os.fsencode(root), b"w\xe9"))
        os.mkdir(ws)
        settle()
        box = Sandbox(workdir=ws, timeout=30, state_dir=os.path.join(root, "state"))
        out = box.cmd(["sh", "-c", "echo n > n.txt"]).run_transactional()
        assert out.committed, out
        with open(os.path.join(ws, "n.txt")) as f:
            assert f.read() == "n\n"


@pytest.fixture(params=["local", "remote"])
def open_box(request, tmp_path):
    """Opens a sandbox in process or on a live `lockbox serve` (as test_open.py does)."""
    if request.param == "local":
        return lambda **kw: Sandbox.open(state_dir=tmp_path / "state", **kw)
    url, token = request.getfixturevalue("server")
    return lambda **kw: Client(url, token).create(**kw)


def test_a_long_lived_sandbox_lists_and_commits_a_name_that_is_not_utf8(open_box, ws):
    with open_box(workdir=str(ws)) as box:
        assert box.exec("printf x > \"$(printf 'caf\\351.txt')\"").exit_code == 0
        changes = box.changes()
        assert [os.fsencode(c.path) for c in changes] == [LATIN1]
        box.commit(only=[changes[0].path])
        with open(os.path.join(os.fsencode(str(ws)), LATIN1), "rb") as f:
            assert f.read() == b"x"


AS_NOBODY = r"""
import json, os, sys
from lockbox import Sandbox
ws = sys.argv[1]
box = Sandbox(workdir=ws, timeout=30, state_dir=os.path.join(os.path.dirname(ws), "state"))
out = box.cmd(["python3", "-c", 'open(b"caf\\xe9.txt", "wb").write(b"x")']).run_transactional()
print(json.dumps({"committed": out.committed, "paths": [os.fsencode(c.path).hex() for c in out.changes],
                  "shown": [str(c) for c in out.changes]}))
"""


def test_a_name_that_is_not_utf8_commits_as_uid_65534():
    need(os.geteuid() == 0, "root (the test re-runs as uid 65534)")
    need(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    probe = subprocess.run(as_nobody + [sys.executable, "-c", "import lockbox"], capture_output=True)
    need(probe.returncode == 0, f"a Python with lockbox that uid 65534 can run ({sys.executable})")
    root = tempfile.mkdtemp(prefix="lockbox-nobody-")
    try:
        ws = os.path.join(root, "repo")
        os.mkdir(ws)
        for p in (root, ws):
            os.chown(p, 65534, 65534)
        res = subprocess.run(as_nobody + [sys.executable, "-c", AS_NOBODY, ws], capture_output=True,
                             text=True, cwd=root, timeout=300)
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout.strip().splitlines()[-1])
        assert got == {"committed": True, "paths": [LATIN1.hex()], "shown": ['A "caf\\351.txt"']}
        with open(os.path.join(os.fsencode(ws), LATIN1), "rb") as f:
            assert f.read() == b"x"
    finally:
        shutil.rmtree(root, ignore_errors=True)
