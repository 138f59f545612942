"""RFC example 3: test-and-merge for an LLM-proposed patch. The patch goes in on stdin;
the workspace is byte-identical to before the call if anything failed."""

import subprocess

from _common import BASE_READ, NO_PYC, BIN, tool, workspace_from_argv

from lockbox import Sandbox


def call_llm(prompt: str) -> str:
    """Stand-in for the LLM."""
    del prompt
    return subprocess.run([f"{BIN}/fake-llm"], capture_output=True, text=True, check=True).stdout


def main(workspace: str, patch_text: str | None = None) -> bool:
    if patch_text is None:
        patch_text = call_llm("add a mul function")
    apply = Sandbox(workdir=workspace, fs_readable=BASE_READ, fs_writable=[workspace])
    test = Sandbox(workdir=workspace, fs_readable=BASE_READ + [workspace], env=NO_PYC)
    outcome = (
        apply.cmd(tool("apply_patch.py"), stdin=patch_text.encode())
        | test.cmd(tool("run_tests.py"))
    ).run_transactional()
    return outcome.committed


if __name__ == "__main__":
    print("merged" if main(workspace_from_argv()) else "rejected")
