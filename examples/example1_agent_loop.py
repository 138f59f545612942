"""RFC example 1: an agent loop, all or nothing. Plan, apply the patch, run the tests; the
workspace changes only if every stage succeeds."""

from _common import BASE_READ, NO_PYC, tool, workspace_from_argv

from lockbox import Sandbox


def main(workspace: str) -> bool:
    planner = Sandbox(workdir=workspace, fs_readable=BASE_READ + [workspace], env=NO_PYC)
    editor = Sandbox(workdir=workspace, fs_readable=BASE_READ, fs_writable=[workspace])
    tester = Sandbox(workdir=workspace, fs_readable=BASE_READ + [workspace], env=NO_PYC,
                     max_processes=20, max_memory="1G")
    result = (
        planner.cmd(tool("plan.py"))
        | editor.cmd(tool("apply_patch.py"))
        | tester.cmd(tool("run_tests.py"))
    ).run_transactional()
    if result.committed:
        print("agent step merged")
    else:
        print(f"rolled back: {result.abort_reason}")
    return result.committed


if __name__ == "__main__":
    main(workspace_from_argv())
