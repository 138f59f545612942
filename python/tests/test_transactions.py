"""Transactions through Python: commit, abort on failure, dry run, prepare/commit,
the context manager, garbage-collection abort, gathers and conflict policies."""

import gc
import threading
import warnings

import pytest
from conftest import tree

import lockbox
from lockbox import ConflictPolicy, Gather, Sandbox
from lockbox.errors import (
    ConflictError,
    PolicyError,
    StageFailedError,
    StaleBaseError,
    UsageError,
)


def sh(box: Sandbox, script: str, **kw):
    return box.cmd(["sh", "-c", script], **kw)


def test_pipeline_commits_all_stages_and_later_stages_see_earlier_writes(ws):
    box = Sandbox(workdir=ws, timeout=30)
    out = (
        sh(box, "echo one > a.txt")
        | sh(box, "cat a.txt > b.txt; echo two >> b.txt")
        | sh(box, "cat a.txt b.txt")
    ).run_transactional()
    assert out.committed and out.abort_reason is None
    assert (ws / "b.txt").read_text() == "one\ntwo\n"
    assert out.stdout == b"one\none\ntwo\n"
    assert sorted((c.kind, c.path) for c in out.changes) == [("added", "a.txt"), ("added", "b.txt")]
    assert [s.exit_code for s in out.stages] == [0, 0, 0]


def test_failing_stage_aborts_and_leaves_the_workspace_byte_identical(ws):
    before = tree(ws)
    box = Sandbox(workdir=ws, timeout=30)
    out = (sh(box, "echo x > a.txt; echo changed > base.txt") | sh(box, "echo oops >&2; exit 3")).run_transactional()
    assert not out.committed
    assert out.abort_reason.reason == "stage_failed"
    assert out.abort_reason.name == "stage-2" and out.abort_reason.exit_code == 3
    assert out.stages[1].stderr == "oops\n"
    assert tree(ws) == before


def test_stdin_feeds_the_first_stage(ws):
    box = Sandbox(workdir=ws, timeout=30)
    out = (box.cmd(["sh", "-c", "cat > in.txt"], stdin=b"patch\n") | sh(box, "cat in.txt")).run_transactional()
    assert out.committed and out.stdout == b"patch\n"


def test_timeout_is_reported_and_nothing_commits(ws):
    box = Sandbox(workdir=ws, timeout=0.5, kill_grace=0.1)
    out = sh(box, "echo x > a.txt; sleep 30").run_transactional()
    assert not out.committed and out.abort_reason.reason == "timed_out"
    assert out.stages[0].timed_out and out.stages[0].exit_code == 124
    assert not (ws / "a.txt").exists()


def test_dry_run_reports_changes_and_applies_nothing(ws):
    before = tree(ws)
    box = Sandbox(workdir=ws, timeout=30)
    out = (sh(box, "echo x > new.txt") | sh(box, "rm base.txt")).dry_run()
    assert not out.committed and out.abort_reason.reason == "dry_run"
    assert sorted(str(c) for c in out.changes) == ["A new.txt", "D base.txt"]
    assert tree(ws) == before


def test_prepare_then_commit_applies_and_abort_discards(ws):
    box = Sandbox(workdir=ws, timeout=30)
    p = sh(box, "echo 1 > one.txt").prepare()
    assert p.all_succeeded() and not p.has_conflicts()
    assert [c.path for c in p.changes] == ["one.txt"]
    assert not (ws / "one.txt").exists()
    assert p.commit().committed
    assert (ws / "one.txt").read_text() == "1\n"
    q = sh(box, "echo 2 > two.txt").prepare()
    q.abort()
    assert not (ws / "two.txt").exists() and not q.pending


def test_commit_of_a_failed_transaction_raises_and_applies_nothing(ws):
    box = Sandbox(workdir=ws, timeout=30)
    p = sh(box, "echo x > a.txt; echo lint failed >&2; exit 1").prepare()
    assert not p.all_succeeded()
    with pytest.raises(StageFailedError) as e:
        p.commit()
    assert e.value.exit_code == 1 and not (ws / "a.txt").exists() and not p.pending
    # The message is the CLI's summary: the stage, its exit code and the end of its stderr.
    assert str(e.value).endswith("not committed: stage 1 exited 1: lint failed"), str(e.value)


def test_stale_base_refuses_the_commit(ws):
    box = Sandbox(workdir=ws, timeout=30)
    p = sh(box, "echo sandbox > base.txt").prepare()
    (ws / "base.txt").write_text("host edit\n")
    with pytest.raises(StaleBaseError) as e:
        p.commit()
    assert e.value.code == "STALE_BASE" and e.value.exit_code == 5
    assert (ws / "base.txt").read_text() == "host edit\n"


def test_context_manager_commits_only_when_asked(ws):
    box = Sandbox(workdir=ws, timeout=30)
    pipeline = sh(box, "echo a > a.txt") | sh(box, "echo b > b.txt")
    with pipeline.transaction() as txn:
        txn.run()
        assert txn.all_succeeded() and len(txn.changes) == 2
        txn.commit()
        assert not (ws / "a.txt").exists(), "the commit happens at the end of the block"
    assert txn.outcome.committed and (ws / "b.txt").exists()

    with pipeline.transaction() as txn:
        txn.run()
        (ws / "a.txt").unlink()
    assert not txn.outcome.committed and not (ws / "a.txt").exists()


def test_context_manager_aborts_on_exception_even_after_commit(ws):
    box = Sandbox(workdir=ws, timeout=30)
    with pytest.raises(RuntimeError), sh(box, "echo a > a.txt").transaction() as txn:
        txn.run()
        txn.commit()
        raise RuntimeError("boom")
    assert not (ws / "a.txt").exists() and not txn.outcome.committed


def test_unresolved_prepared_transaction_aborts_when_collected_with_a_resource_warning(ws):
    box = Sandbox(workdir=ws, timeout=30)
    p = sh(box, "echo x > gc.txt").prepare()
    txn_id = p.id
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del p
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and txn_id in str(w.message) for w in caught)
    assert not (ws / "gc.txt").exists()
    import os
    record = os.path.join(os.environ["LOCKBOX_STATE_DIR"], "txns", txn_id, "record.json")
    assert '"aborted"' in open(record).read()


def test_gather_merges_disjoint_sources_and_the_consumer_reads_their_outputs(ws):
    box = Sandbox(workdir=ws, timeout=30)
    out = (
        Gather()
        .source("web", sh(box, "mkdir web; echo w > web/x; echo web-out"))
        .source("api", sh(box, "mkdir api; echo a > api/y; echo api-out"))
        .consumer(sh(box, 'cat web/x api/y "$LOCKBOX_INPUTS/web" "$LOCKBOX_INPUTS/api"'))
        .run_transactional()
    )
    assert out.committed, out.abort_reason
    assert out.stdout == b"w\na\nweb-out\napi-out\n"
    assert (ws / "web" / "x").exists() and (ws / "api" / "y").exists()


def test_gather_conflict_fails_by_default_and_commit_raises_conflict_error(ws):
    box = Sandbox(workdir=ws, timeout=30)
    g = Gather().source("a", sh(box, "echo a > f")).source("b", sh(box, "echo b > f"))
    out = g.with_conflict_policy(ConflictPolicy.FAIL).run_transactional()
    assert not out.committed and out.exit_code == 3
    assert [(c.path, c.stages) for c in out.conflicts] == [("f", ["a", "b"])]
    p = g.prepare()
    assert p.has_conflicts()
    with pytest.raises(ConflictError) as e:
        p.commit()
    assert e.value.conflicts[0].path == "f"
    assert not (ws / "f").exists()


@pytest.mark.parametrize(
    ("policy", "content", "marker"),
    [
        (ConflictPolicy.FIRST_WRITER_WINS, "a\n", False),
        (ConflictPolicy.LAST_WRITER_WINS, "b\n", False),
        (ConflictPolicy.MARKERS, "a\n", True),
    ],
)
def test_gather_conflict_policies_resolve(ws, policy, content, marker):
    box = Sandbox(workdir=ws, timeout=30)
    out = (
        Gather().source("a", sh(box, "echo a > f")).source("b", sh(box, "echo b > f"))
        .with_conflict_policy(policy).run_transactional()
    )
    assert out.committed
    assert (ws / "f").read_text() == content
    assert (ws / "f.lockbox-b").exists() == marker


def test_plain_pipeline_streams_stages_under_their_own_policies(tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    reader = Sandbox(timeout=30)
    writer = Sandbox(fs_writable=[out_dir], timeout=30)
    res = (reader.cmd(["sh", "-c", "echo hello; echo world"]) | writer.cmd(["sh", "-c", f"tr a-z A-Z | tee {out_dir}/o"])).run()
    assert res.succeeded and res.stdout == b"HELLO\nWORLD\n"
    assert (out_dir / "o").read_text() == "HELLO\nWORLD\n"
    denied = reader.cmd(["sh", "-c", f"echo x > {out_dir}/nope"]).run()
    assert denied.returncode != 0 and not (out_dir / "nope").exists()


def test_the_gil_is_released_while_a_sandbox_runs(ws):
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.01)

    box = Sandbox(workdir=ws, timeout=30)
    t = threading.Thread(target=spin)
    t.start()
    ticks.clear()
    res = box.cmd(["sleep", "0.5"]).run()
    during = len(ticks)
    stop.set()
    t.join()
    assert res.succeeded and during > 0


def test_bad_policy_values_raise_policy_error_naming_the_field():
    with pytest.raises(PolicyError) as e:
        Sandbox(max_memory="12Q")
    assert "12Q" in str(e.value)
    with pytest.raises(PolicyError):
        Sandbox(max_memory="10K")


def test_policy_errors_name_the_keyword_and_value_not_the_internal_json():
    with pytest.raises(PolicyError) as e:
        Sandbox(max_processes="ten")
    assert str(e.value).startswith("max_processes: "), str(e.value)
    assert '"ten"' in str(e.value) and "line 1" not in str(e.value), str(e.value)
    assert e.value.details["field"] == "max_processes"
    with pytest.raises(PolicyError) as e:
        Sandbox(env={"A": 1})
    assert str(e.value).startswith("env: ") and "column" not in str(e.value), str(e.value)


def test_sandbox_workdir_is_checked_when_the_sandbox_is_made(tmp_path):
    with pytest.raises(PolicyError) as e:
        Sandbox(workdir=tmp_path / "absent")
    assert str(e.value) == f"workdir {tmp_path / 'absent'}: no such directory"
    (tmp_path / "file").write_text("x")
    with pytest.raises(PolicyError) as e:
        Sandbox.open(workdir=tmp_path / "file")
    assert str(e.value) == f"workdir {tmp_path / 'file'}: not a directory"
    assert e.value.details == {"field": "workdir", "path": str(tmp_path / "file")}


def test_a_missing_program_names_itself_with_exit_127_as_lockbox_run_does():
    res = Sandbox(timeout=30).cmd(["nosuchprog", "arg"]).run()
    assert res.returncode == 127
    assert res.stages[0].stderr.startswith("lockbox: nosuchprog: command not found inside the sandbox\n"), \
        res.stages[0].stderr


def test_stages_of_one_transaction_must_share_the_workdir(tmp_path, ws):
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(UsageError):
        (Sandbox(workdir=ws).cmd(["true"]) | Sandbox(workdir=other).cmd(["true"])).run_transactional()
    with pytest.raises(UsageError):
        Sandbox().cmd(["true"]).run_transactional()


def test_errors_form_one_hierarchy():
    for cls in (lockbox.SetupError, lockbox.ConflictError, lockbox.CommitError, lockbox.errors.ReplayMismatch,
                lockbox.errors.VersionMismatch, lockbox.errors.Fenced, lockbox.errors.TimeoutError):
        assert issubclass(cls, lockbox.LockboxError)


def test_recover_after_a_kept_prepared_transaction_reports_nothing_to_do(ws):
    box = Sandbox(workdir=ws, timeout=30)
    kept = sh(box, "echo k > kept.txt").prepare().keep()
    report = lockbox.recover(ws)
    assert report == {
        "rolled_forward": [],
        "rolled_back": [],
        "abandoned": [],
        "left_prepared": [],
        "removed": [],
        "damaged": [],
    }
    assert kept and not (ws / "kept.txt").exists(), "prepared transactions are left alone"
