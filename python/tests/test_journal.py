"""The journal through Python: replay without re-running steps, mismatches, fencing,
serialisation errors, async branches, suspend/resume, fork; sqlite, file and PostgreSQL."""

import asyncio
import os
import uuid

import pytest
from conftest import need

from lockbox import journal
from lockbox.errors import (
    Fenced,
    NotSerializable,
    ReplayMismatch,
    StepFailed,
    TerminalRun,
    VersionMismatch,
)


@pytest.fixture(params=["sqlite", "file", "postgres"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'j.db'}"
    if request.param == "file":
        (tmp_path / "jdir").mkdir()
        return f"file:{tmp_path / 'jdir'}"
    pg = os.environ.get("LOCKBOX_TEST_POSTGRES_URL")
    need(bool(pg), "LOCKBOX_TEST_POSTGRES_URL (a PostgreSQL for the journal)")
    return pg


def rid() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


def test_replay_returns_journaled_values_without_running_steps(url):
    j = journal.open(url)
    r = rid()
    calls = []

    def step(v):
        def f():
            calls.append(v)
            return {"v": v, "t": (1, 2)}
        return f

    run = j.start(r, version="v1", metadata={"who": "test"})
    first = [run.record("llm", step(1)), run.record("llm", step(2)), run.record("tool", step(3))]
    assert first[0] == {"v": 1, "t": [1, 2]}, "values round-trip through JSON"
    assert calls == [1, 2, 3]
    calls.clear()
    run = j.start(r, version="v1", metadata={"who": "test"})
    again = [run.record("llm", step(1)), run.record("llm", step(2)), run.record("tool", step(3))]
    assert again == first and calls == []
    assert run.record("new", step(4)) == {"v": 4, "t": [1, 2]} and calls == [4]
    steps = [e["step_id"] for e in j.entries(r) if e["kind"] == "step"]
    assert steps == ["llm", "llm#2", "tool", "new"]


def test_replay_mismatch_carries_the_rust_code(tmp_path):
    j = journal.open(f"sqlite:{tmp_path / 'j.db'}")
    r = rid()
    run = j.start(r)
    run.record("a", lambda: 1)
    run.record("b", lambda: 2)
    run = j.start(r)
    run.record("a", lambda: 1)
    with pytest.raises(ReplayMismatch) as e:
        run.suspend("b")
    assert e.value.code == "REPLAY_MISMATCH" and "b" in str(e.value)


def test_version_mismatch_and_fencing(tmp_path):
    j = journal.open(f"sqlite:{tmp_path / 'j.db'}")
    r = rid()
    old = j.start(r, version="v1")
    with pytest.raises(VersionMismatch):
        j.start(r, version="v2")
    j.start(r, version="v1")
    with pytest.raises(Fenced):
        old.record("x", lambda: 1)


def test_non_json_values_raise_not_serializable_and_journal_nothing(tmp_path):
    j = journal.open(f"sqlite:{tmp_path / 'j.db'}")
    r = rid()
    run = j.start(r)
    with pytest.raises(NotSerializable) as e:
        run.record("llm", lambda: object())
    assert isinstance(e.value, TypeError) and "llm" in str(e.value)
    assert run.record("llm", lambda: "ok") == "ok", "the failed step did not use up its id"


def test_exceptions_rerun_by_default_and_replay_as_step_failed_when_journaled(tmp_path):
    j = journal.open(f"sqlite:{tmp_path / 'j.db'}")
    r = rid()
    run = j.start(r)

    def flaky():
        raise ConnectionError("rate limited")

    with pytest.raises(ConnectionError):
        run.record("llm", flaky)
    assert run.record("llm", lambda: "second try") == "second try"

    def bad():
        raise ValueError("refused")

    with pytest.raises(StepFailed) as e:
        run.record("judge", bad, journal_errors=True)
    assert isinstance(e.value.__cause__, ValueError)
    run = j.start(r)
    assert run.record("llm", flaky) == "second try"
    with pytest.raises(StepFailed) as e:
        run.record("judge", lambda: "never called")
    assert e.value.details["type"] == "ValueError" and e.value.details["message"] == "refused"


def test_sync_parallel_prefixes_branches(tmp_path):
    j = journal.open(f"sqlite:{tmp_path / 'j.db'}")
    r = rid()
    run = j.start(r)
    out = run.parallel({"web": lambda b: b.record("tool", lambda: "w"), "api": lambda b: b.record("tool", lambda: "a")})
    assert out == {"api": "a", "web": "w"}
    ids = [e.get("step_id") for e in j.entries(r)]
    assert "api:tool" in ids and "web:tool" in ids


def test_async_parallel_branches_interleave_and_replay_identically(tmp_path):
    j = journal.open(f"sqlite:{tmp_path / 'j.db'}")
    r = rid()
    live = []

    async def branch(b):
        out = []
        for i in range(3):
            async def step(i=i):
                await asyncio.sleep(0.001)
                live.append((b.prefix, i))
                return i * 10
            out.append(await b.record("step", step))
        return out

    async def main(run):
        return await run.parallel({"x": branch, "y": branch})

    first = asyncio.run(main(j.start(r)))
    assert first == {"x": [0, 10, 20], "y": [0, 10, 20]}
    prefixes = [p for p, _ in live]
    assert prefixes.index("y:") < len(prefixes) - 3, "the branches ran concurrently"
    live.clear()
    again = asyncio.run(main(j.start(r)))
    assert again == first and live == []


def test_async_record_of_a_coroutine_function(tmp_path):
    j = journal.open(f"sqlite:{tmp_path / 'j.db'}")

    async def llm():
        await asyncio.sleep(0)
        return {"answer": 42}

    async def main():
        run = j.start("async-one")
        return await run.record("llm", llm), await run.record_async("llm", lambda: llm())

    assert asyncio.run(main()) == ({"answer": 42}, {"answer": 42})


def test_suspend_resume_complete_and_fork(tmp_path):
    j = journal.open(f"sqlite:{tmp_path / 'j.db'}")
    r = rid()
    run = j.start(r)
    run.record("plan", lambda: "p")
    assert run.suspend("approval", {"plan": "p"}).suspended
    assert j.status(r)["state"] == "suspended"
    j.resume(r, {"ok": True})
    run = j.start(r)
    assert run.record("plan", lambda: "never") == "p"
    assert run.suspend("approval", {"plan": "p"}).value == {"ok": True}
    run.record("apply", lambda: "done")
    run.complete({"result": "done"})
    with pytest.raises(TerminalRun):
        j.start(r)
    fork = j.fork(r, step="apply", new_run_id=r + "-b")
    run = j.start(fork)
    assert run.record("plan", lambda: "never") == "p"
    assert run.record("apply", lambda: "again") == "again"
    assert fork in j.list()
