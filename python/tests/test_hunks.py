"""Committing some hunks of a file: a sandbox's (`Sandbox.open` in process and `Client` on a
live `lockbox serve`, which must behave alike: `diff`, `commit(hunks=...)`), and a kept branch
that a real `lockbox run --workdir --on-exit keep` left in the server's state directory
(`Client.branches`, `branch_diff`, `branch_commit`, `branch_abort`)."""

import json
import os
import shutil
import subprocess
import tempfile

import pytest
from conftest import need, settle
from test_client import server_binary

from lockbox import Client, Sandbox
from lockbox.errors import ServerError

OLD = "".join(f"{i}\n" for i in range(1, 13))
EDIT = "sed -i 's/^1$/one/; s/^12$/twelve/' f && echo G > g"


@pytest.fixture(scope="module")
def served():
    """A live `lockbox serve` whose state directory the test knows: (url, token, state)."""
    binary = server_binary()
    need(os.path.exists(binary), f"the lockbox binary ({binary}; cargo build -p lockbox-cli)")
    state = tempfile.mkdtemp(prefix="lockbox-serve-hunks-")
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--print-token"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = json.loads(proc.stdout.readline())
        yield f"http://{line['listen']}", line["token"], state
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def repo(tmp_path):
    w = tmp_path / "repo"
    w.mkdir()
    (w / "f").write_text(OLD)
    (w / "g").write_text("g\n")
    settle()
    return w


@pytest.fixture(params=["local", "remote"])
def open_box(request, tmp_path):
    if request.param == "local":
        return lambda **kw: Sandbox.open(state_dir=tmp_path / "state", **kw)
    url, token, _ = request.getfixturevalue("served")
    return lambda **kw: Client(url, token).create(**kw)


def test_a_sandbox_commits_some_hunks_alike_locally_and_remotely(open_box, repo):
    with open_box(workdir=str(repo)) as box:
        assert box.exec(EDIT).exit_code == 0
        d = box.diff("f")
        assert d["kind"] == "text" and [h["index"] for h in d["hunks"]] == [0, 1]
        assert d["hunks"][0]["header"] == "@@ -1,4 +1,4 @@"
        assert d["hunks"][0]["lines"][:2] == [{"op": "-", "text": "1"}, {"op": "+", "text": "one"}]
        with pytest.raises(ServerError) as e:
            box.commit(hunks={"f": [0, 7]})
        assert e.value.code == "BAD_HUNK" and e.value.status == 400
        done = box.commit(only=["g"], hunks={"f": [1]})
        assert done["remaining"] == 1
        assert (repo / "f").read_text() == OLD.replace("12\n", "twelve\n")
        assert (repo / "g").read_text() == "G\n"
        # The other hunk is what is left; accepting none leaves the file as it is.
        assert len(box.diff("f")["hunks"]) == 1
        box.commit(hunks={"f": []})
        assert (repo / "f").read_text() == OLD.replace("12\n", "twelve\n")
        box.commit(hunks={"f": [0]})
        assert (repo / "f").read_text() == OLD.replace("1\n2\n", "one\n2\n").replace("12\n", "twelve\n")
        assert box.changes() == []


def test_a_kept_branch_of_lockbox_run_is_reviewed_and_committed_over_http(served, repo):
    url, token, state = served
    run = subprocess.run([server_binary(), "run", "--state-dir", state, "--workdir", str(repo), "--on-exit", "keep",
                          "--", "sh", "-c", EDIT], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    client = Client(url, token)
    [b] = client.branches()
    assert b["state"] == "kept" and b["changes"] == 2 and b["command"][:2] == ["sh", "-c"]
    detail = client.branch(b["id"])
    assert [str(c.path) for c in detail["change_list"]] == ["f", "g"]
    assert len(client.branch_diff(b["id"], "f")["hunks"]) == 2
    done = client.branch_commit(b["id"], hunks={"f": [0]}, exclude=["g"])
    assert done["remaining"] == 2
    assert (repo / "f").read_text().startswith("one\n2\n") and (repo / "f").read_text().endswith("\n12\n")
    assert (repo / "g").read_text() == "g\n"
    # A host edit of g since the branch began: committing g is refused, f's rest is not.
    settle()
    (repo / "g").write_text("host\n")
    with pytest.raises(ServerError) as e:
        client.branch_commit(b["id"])
    assert e.value.code == "CONFLICT" and e.value.status == 409
    assert e.value.details == {"paths": ["g"]}
    done = client.branch_commit(b["id"], only=["f"], rest="drop")
    assert done["remaining"] == 0
    assert (repo / "f").read_text() == OLD.replace("1\n2\n", "one\n2\n").replace("12\n", "twelve\n")
    assert (repo / "g").read_text() == "host\n"
    assert client.branches() == []


def test_abort_removes_a_kept_branch(served, repo):
    url, token, state = served
    run = subprocess.run([server_binary(), "run", "--state-dir", state, "--workdir", str(repo), "--on-exit", "keep",
                          "--", "sh", "-c", EDIT], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    client = Client(url, token)
    [b] = client.branches()
    assert client.branch_abort(b["id"]) == {"aborted": True}
    assert client.branches() == []
    with pytest.raises(ServerError) as e:
        client.branch_diff(b["id"], "f")
    assert e.value.code == "BRANCH_NOT_FOUND" and e.value.status == 404
    assert (repo / "f").read_text() == OLD


def test_local_client_reviews_the_branch_a_closed_sandbox_kept(repo, tmp_path):
    from lockbox import LocalClient

    state = tmp_path / "state"
    with Sandbox.open(workdir=str(repo), state_dir=state, on_exit="keep") as box:
        assert box.exec(EDIT).exit_code == 0
    client = LocalClient(state)
    [b] = client.branches()
    assert b["state"] == "kept" and b["changes"] == 2
    assert [h["index"] for h in client.branch_diff(b["id"], "f")["hunks"]] == [0, 1]
    client.branch_commit(b["id"], hunks={"f": [0], "g": []}, rest="drop")
    assert (repo / "f").read_text().startswith("one\n") and (repo / "g").read_text() == "g\n"
    assert client.branches() == []
