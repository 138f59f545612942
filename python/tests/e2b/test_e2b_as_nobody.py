"""The E2B SDK against a `lockbox serve` running as uid 65534 (when the tests run as root)."""

import os

from e2b_util import need, point_sdk_at, restore, start


def test_the_sdk_drives_a_server_running_as_uid_65534():
    need(os.geteuid() == 0, "root (the server runs as uid 65534)")
    try:
        from e2b import Sandbox
    except ImportError:
        need(False, "the e2b SDK (pip install e2b==2.63.0 e2b-code-interpreter==2.11.5)")
    import console_util
    server = start(uid=65534)
    saved = point_sdk_at(server.base, server.token, "2")
    try:
        sbx = Sandbox.create(metadata={"as": "nobody"})
        try:
            sbx.files.write("who.txt", "nobody")
            assert sbx.files.read("who.txt") == "nobody"
            assert [s.sandbox_id for s in Sandbox.list().next_items()] == [sbx.sandbox_id]
        finally:
            sbx.kill()
        assert not sbx.is_running()
    finally:
        restore(saved)
        console_util.stop_server(server)
