"""RFC example 4: parallel agents on disjoint subsystems, then the tests on their merged
work; conflicting writes abort (ConflictPolicy.FAIL)."""

from _common import BASE_READ, NO_PYC, tool, workspace_from_argv

from lockbox import ConflictPolicy, Gather, Sandbox, TxnOutcome


def main(workspace: str, backend_file: str = "main.txt", backend_part: str = "api") -> TxnOutcome:
    # Each agent may write only its own part of the workspace (a write elsewhere fails).
    frontend = Sandbox(workdir=workspace, fs_readable=BASE_READ, fs_writable=[f"{workspace}/web"])
    backend = Sandbox(workdir=workspace, fs_readable=BASE_READ,
                      fs_writable=[f"{workspace}/{backend_part}"])
    test = Sandbox(workdir=workspace, fs_readable=BASE_READ + [workspace], env=NO_PYC)
    # backend_file="../web/main.txt" makes the backend agent stray into web/: refused, the
    # transaction aborts. Allowed everywhere (backend_part="."), both agents write
    # web/main.txt: a conflict.
    result = (
        Gather()
        .source("frontend_agent", frontend.cmd(tool("agent.py") + ["web"]))
        .source("backend_agent", backend.cmd(tool("agent.py") + ["api", backend_file]))
        .consumer(test.cmd(tool("run_tests.py")))
        .with_conflict_policy(ConflictPolicy.FAIL)
        .run_transactional()
    )
    if not result.committed:
        if result.conflicts:
            for c in result.conflicts:
                print(f"CONFLICT {c.path} written by {c.stages}")
        else:
            print(f"failed: {result.abort_reason}")
    return result


if __name__ == "__main__":
    print(main(workspace_from_argv()).committed)
