"""What the examples share: a throwaway workspace with a tiny project, and the stand-ins
for the LLM and the agents (in ./bin), visible read-only inside the sandboxes."""

import os
import sys
import tempfile

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")
BASE_READ = ["/usr", "/lib", "/lib64", "/bin", "/etc", BIN]
NO_PYC = {"PYTHONDONTWRITEBYTECODE": "1"}  # keep __pycache__ out of the change set
PYTHON = "/usr/bin/python3"  # the system's: a sandbox sees /usr, not a virtualenv


def make_workspace() -> str:
    """A temporary repository with calc.py, and a state directory next to it."""
    root = tempfile.mkdtemp(prefix="lockbox-example-")
    ws = os.path.join(root, "repo")
    os.mkdir(ws)
    with open(os.path.join(ws, "calc.py"), "w") as f:
        f.write("def add(a, b):\n    return a + b\n")
    if not os.environ.get("LOCKBOX_STATE_DIR"):
        os.environ["LOCKBOX_STATE_DIR"] = os.path.join(root, "state")
    return ws


def tool(name: str) -> list[str]:
    """argv running the stand-in `name` from ./bin."""
    return [PYTHON, os.path.join(BIN, name)]


def workspace_from_argv() -> str:
    """The workspace given as the first argument, else a new temporary one (printed, so
    you can look at what the example did and remove it)."""
    if len(sys.argv) > 1:
        return sys.argv[1]
    ws = make_workspace()
    print(f"workspace: {ws} (state: {os.environ['LOCKBOX_STATE_DIR']})")
    return ws
