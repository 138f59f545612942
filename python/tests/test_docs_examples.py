"""Every Python example of README.md and docs/*.md runs as written, with the installed SDK.

The convention is docs/architecture.md's "Examples in these docs" (and the top of
crates/lockbox-cli/tests/it/doc_examples.rs, which runs the shell examples): a fenced block
marked ``python`` runs in a fresh copy of tests/docs-scratch/ (``$HOME`` in ``home/``,
``$LOCKBOX_STATE_DIR`` in ``state/``) with this interpreter and must exit 0, unless the line
just before its fence says ``<!-- example: exit N -->`` or ``<!-- example: no-run (REASON) -->``.
Each runs as the current user and, when that is root, again as uid 65534.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import need, settle

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MARKER = re.compile(r"<!-- example: (?:exit (-?\d+)|no-run \((.+)\)) -->")


def blocks(name: str, text: str, lang: str = "python"):
    """(where, expected exit code or None for no-run, body) of each ``lang`` block."""
    lines = text.splitlines()
    out = []
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("```"):
            i += 1
            continue
        start, info = i, lines[i].strip()[3:].strip()
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        i += 1
        if info != lang:
            continue
        before = lines[start - 1].strip() if start else ""
        expected = 0
        if before.startswith("<!-- example"):
            m = MARKER.fullmatch(before)
            assert m, f"{name}:{start + 1}: unknown example marker {before!r}"
            expected = int(m.group(1)) if m.group(1) is not None else None
        out.append((f"{name}:{start + 1}", expected, "\n".join(body) + "\n"))
    return out


def documents():
    names = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    for name in names:
        with open(os.path.join(ROOT, name)) as f:
            yield name, f.read()


EXAMPLES = [b for name, text in documents() for b in blocks(name, text)]
RUNNABLE = [b for b in EXAMPLES if b[1] is not None]


def test_the_docs_have_python_examples_that_run():
    assert len(RUNNABLE) >= 4, [b[0] for b in EXAMPLES]


AS_NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def run_example(where, expected, body, root, as_nobody=False):
    """Runs one example in a fresh scratch directory under `root`; fails naming `where`."""
    scratch = os.path.join(root, "scratch")
    shutil.copytree(os.path.join(ROOT, "tests", "docs-scratch"), scratch)
    os.makedirs(os.path.join(scratch, "home", ".cache", "pip"))
    # The examples' own temporary directories (tempfile.mkdtemp()) go under `root` too.
    os.makedirs(os.path.join(scratch, "tmp"))
    env = dict(os.environ, HOME=os.path.join(scratch, "home"),
               LOCKBOX_STATE_DIR=os.path.join(scratch, "state"),
               TMPDIR=os.path.join(scratch, "tmp"))
    prefix = []
    if as_nobody:
        prefix = AS_NOBODY
        subprocess.run(["chown", "-R", "65534:65534", root], check=True)
    settle()
    res = subprocess.run(prefix + [sys.executable, "-c", body], cwd=scratch, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == expected, (
        f"{where}: exited {res.returncode}, the doc says {expected}\n{body}\n"
        f"--- stdout:\n{res.stdout}--- stderr:\n{res.stderr}")


@pytest.mark.parametrize("where,expected,body", RUNNABLE, ids=[b[0] for b in RUNNABLE])
def test_the_python_example_exits_as_documented(where, expected, body, tmp_path):
    run_example(where, expected, body, str(tmp_path))


@pytest.mark.parametrize("where,expected,body", RUNNABLE, ids=[b[0] for b in RUNNABLE])
def test_the_python_example_exits_as_documented_as_uid_65534(where, expected, body):
    need(os.geteuid() == 0, "root (the test re-runs as uid 65534)")
    need(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    probe = subprocess.run(AS_NOBODY + [sys.executable, "-c", "import lockbox"], capture_output=True)
    need(probe.returncode == 0, f"a Python with lockbox that uid 65534 can run ({sys.executable})")
    root = tempfile.mkdtemp(prefix="lockbox-docs-")
    try:
        run_example(where, expected, body, root, as_nobody=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_an_example_that_fails_is_reported_where_it_is(tmp_path):
    doc = "# t\n\n```python\nraise SystemExit(2)\n```\n\n<!-- example: exit 2 -->\n```python\nraise SystemExit(2)\n```\n"
    found = blocks("t.md", doc)
    assert [(w, e) for w, e, _ in found] == [("t.md:3", 0), ("t.md:8", 2)]
    with pytest.raises(AssertionError, match=r"t\.md:3: exited 2, the doc says 0"):
        run_example(*found[0], str(tmp_path / "a"))
    run_example(*found[1], str(tmp_path / "b"))
