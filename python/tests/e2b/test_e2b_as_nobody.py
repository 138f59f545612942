"""The E2B SDK against a `lockbox serve` running as uid 65534 (when the tests run as root)."""

import os

from e2b_util import E2B_SDK, need, serving


def test_the_sdk_drives_a_server_running_as_uid_65534():
    need(os.geteuid() == 0, "root (the server runs as uid 65534)")
    try:
        from e2b import Sandbox
    except ImportError:
        need(False, E2B_SDK)
    with serving(uid=65534, http_version="2"):
        sbx = Sandbox.create(metadata={"as": "nobody"})
        try:
            sbx.files.write("who.txt", "nobody")
            assert sbx.files.read("who.txt") == "nobody"
            assert [s.sandbox_id for s in Sandbox.list().next_items()] == [sbx.sandbox_id]
            # Pause and resume (snapshots in the server's state directory), and fork.
            assert sbx.pause()
            sbx.connect()
            assert sbx.files.read("who.txt") == "nobody"
            forks = sbx.fork(count=1)
            try:
                assert forks[0].files.read("who.txt") == "nobody"
            finally:
                forks[0].kill()
            snap = sbx.create_snapshot()
            other = Sandbox.create(snap.snapshot_id)
            try:
                assert other.files.read("who.txt") == "nobody"
            finally:
                other.kill()
            assert Sandbox.delete_snapshot(snap.snapshot_id)
        finally:
            sbx.kill()
        assert not sbx.is_running()
