"""What `lockbox serve` gives the review console besides sandboxes and branches, against the
real binary: the transactions a `lockbox pipeline --prepare` left in the server's state
directory (`GET /v1/transactions[/{id}]`), and journal runs (`--journal`; without it an empty
list)."""

import json
import subprocess

import pytest
from conftest import need, settle

import console_util


@pytest.fixture
def server(tmp_path):
    binary = console_util.server_binary()
    need(console_util.os.path.exists(binary), f"the lockbox binary ({binary})")
    state = tmp_path / "state"
    s = console_util.start_server(state_dir=str(state))
    try:
        yield s
    finally:
        console_util.stop_server(s, remove_state=False)


def test_a_prepared_pipeline_is_listed_and_shown(server, tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "a.txt").write_text("old\n")
    settle()
    out = subprocess.run(
        [console_util.server_binary(), "pipeline", "--workdir", str(wd), "--state-dir",
         server.state_dir, "--prepare", "--stage", "echo new > a.txt"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    txn_id = out.stdout.strip()

    status, body, _ = server.api("GET", "/v1/transactions")
    assert status == 200
    [txn] = body["transactions"]
    assert txn["id"] == txn_id
    assert txn["kind"] == "pipeline" and txn["state"] == "prepared"
    assert txn["stages"][0]["exit_code"] == 0
    assert txn["meaning"].startswith("prepared")

    status, one, _ = server.api("GET", f"/v1/transactions/{txn_id}")
    assert status == 200 and one == txn
    # The same record as the CLI shows, plus when it began.
    shown = subprocess.run([console_util.server_binary(), "txn", "show", txn_id, "--state-dir",
                            server.state_dir], capture_output=True, text=True, timeout=60)
    assert one.pop("created").endswith("Z")
    assert json.loads(shown.stdout) == one

    status, missing, _ = server.api("GET", "/v1/transactions/t1-1-1")
    assert status == 404 and missing["code"] == "TXN_NOT_FOUND"
    assert (wd / "a.txt").read_text() == "old\n", "prepared, not committed"


def test_journal_runs_without_a_journal_are_an_empty_list(server):
    status, body, _ = server.api("GET", "/v1/journal/runs")
    assert status == 200
    assert body == {"journal": None, "runs": []}
    status, err, _ = server.api("GET", "/v1/journal/runs/agent-1")
    assert status == 404 and err["code"] == "NO_JOURNAL"


def test_serve_refuses_a_journal_that_does_not_exist(tmp_path):
    out = subprocess.run(
        [console_util.server_binary(), "serve", "--listen", "127.0.0.1:0", "--state-dir",
         str(tmp_path / "state"), "--journal", f"sqlite:{tmp_path / 'none.db'}"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--journal" in out.stderr and "none.db" in out.stderr
