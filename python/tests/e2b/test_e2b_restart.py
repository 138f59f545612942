"""A paused sandbox survives a restart of `lockbox serve` through the unmodified E2B SDK
(docs/e2b.md, Pause, resume, fork and snapshots): listed as paused with its metadata,
`Sandbox.connect(id)` resumes it with its files and envs; a running one does not survive."""

import os

from e2b_util import E2B_SDK, need, point_sdk_at, restore, start

try:
    from e2b import Sandbox, SandboxQuery, SandboxState
    from e2b.exceptions import NotFoundException
except ImportError:
    need(False, E2B_SDK)


def test_a_paused_sandbox_is_back_after_the_server_restarts_and_a_running_one_is_not():
    import console_util
    first = start()
    saved = point_sdk_at(first.base, first.token, "1.1")
    second = None
    try:
        sbx = Sandbox.create(metadata={"suite": "restart"}, envs={"COLOUR": "blue"})
        sid = sbx.sandbox_id
        sbx.files.write("/tmp/state.txt", "kept across the restart")
        assert sbx.pause() is True
        running = Sandbox.create().sandbox_id
        console_util.stop_server(first, remove_state=False)

        second = console_util.start_server(state_dir=first.state_dir)
        point_sdk_at(second.base, second.token, "1.1")
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert [(s.sandbox_id, s.metadata) for s in paused] == [(sid, {"suite": "restart"})]
        try:
            Sandbox.connect(running)
            raise AssertionError("a running sandbox survived the restart")
        except NotFoundException:
            pass

        again = Sandbox.connect(sid)
        assert again.sandbox_id == sid
        assert again.files.read("/tmp/state.txt") == "kept across the restart"
        assert again.commands.run("echo $COLOUR").stdout == "blue\n"
        again.kill()
        assert not os.path.exists(os.path.join(first.state_dir, "e2b", "paused", f"{sid}.json"))
    finally:
        restore(saved)
        if second is not None:
            console_util.stop_server(second)
        else:
            console_util.stop_server(first)
