"""RFC example 2: preview before commit, context-managed. The changes are shown; the
commit happens only if approved (here: `approve` decides instead of input())."""

from collections.abc import Callable

from _common import BASE_READ, NO_PYC, tool, workspace_from_argv

from lockbox import Sandbox


def main(workspace: str, approve: Callable[[], bool] = lambda: input("apply? [y/N] ").lower() == "y") -> bool:
    planner = Sandbox(workdir=workspace, fs_readable=BASE_READ + [workspace], env=NO_PYC)
    editor = Sandbox(workdir=workspace, fs_readable=BASE_READ, fs_writable=[workspace])
    tester = Sandbox(workdir=workspace, fs_readable=BASE_READ + [workspace], env=NO_PYC)
    pipeline = (
        planner.cmd(tool("plan.py"))
        | editor.cmd(tool("apply_patch.py"))
        | tester.cmd(tool("run_tests.py"))
    )
    with pipeline.transaction() as txn:
        txn.run()
        if not txn.all_succeeded():
            raise RuntimeError("stage failed; context exit will abort")
        print(f"would change {len(txn.changes)} paths:")
        for c in txn.changes:
            print(f"  {c.kind} {c.path}")
        if approve():
            txn.commit()
    # leaving the `with` block without committing aborts; exceptions also abort.
    assert txn.outcome is not None
    return txn.outcome.committed


if __name__ == "__main__":
    main(workspace_from_argv())
