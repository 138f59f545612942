"""The RFC's four examples (examples/), run end to end with the stand-in LLM and agents."""

import os

from conftest import settle, tree

import example1_agent_loop
import example2_preview
import example3_test_and_merge
import example4_parallel_agents


def test_example1_agent_loop_merges_a_good_step(ws):
    assert example1_agent_loop.main(str(ws))
    assert "def mul" in (ws / "calc.py").read_text()


def test_example1_agent_loop_rolls_back_when_a_stage_fails(ws):
    (ws / "calc.py").unlink()  # the planner finds nothing to plan on and fails
    (ws / "other.py").write_text("x = 1\n")
    settle()
    before = tree(ws)
    assert not example1_agent_loop.main(str(ws))
    assert tree(ws) == before


def test_example2_preview_commits_only_when_approved(ws, capsys):
    assert not example2_preview.main(str(ws), approve=lambda: False)
    assert "def mul" not in (ws / "calc.py").read_text()
    assert "modified calc.py" in capsys.readouterr().out
    assert example2_preview.main(str(ws), approve=lambda: True)
    assert "def mul" in (ws / "calc.py").read_text()


def test_example3_test_and_merge_rejects_a_bad_patch_byte_identically(ws):
    before = tree(ws)
    bad = "+++ b/calc.py\n+def add(a, b):\n+    return 0\n"
    assert not example3_test_and_merge.main(str(ws), bad)
    assert tree(ws) == before
    assert example3_test_and_merge.main(str(ws))
    assert "def mul" in (ws / "calc.py").read_text()


def test_example4_parallel_agents_merge_disjoint_work(ws):
    out = example4_parallel_agents.main(str(ws))
    assert out.committed
    assert os.path.exists(ws / "web" / "main.txt") and os.path.exists(ws / "api" / "main.txt")


def test_example4_an_agent_straying_outside_its_part_is_refused(ws, capsys):
    before = tree(ws)
    out = example4_parallel_agents.main(str(ws), backend_file="../web/main.txt")
    assert not out.committed and not out.conflicts
    assert out.abort_reason.reason == "stage_failed" and out.abort_reason.name == "backend_agent"
    assert "Read-only file system" in out.stages[1].stderr
    assert tree(ws) == before


def test_example4_parallel_agents_report_a_conflict(ws, capsys):
    before = tree(ws)
    out = example4_parallel_agents.main(str(ws), backend_file="../web/main.txt", backend_part=".")
    assert not out.committed and [c.path for c in out.conflicts] == ["web/main.txt"]
    assert "CONFLICT web/main.txt written by ['frontend_agent', 'backend_agent']" in capsys.readouterr().out
    assert tree(ws) == before
