"""`lockbox serve --e2b-domain`: E2B's `{port}-{sandboxID}.{domain}` host form routes to the
sandbox, as E2B's own hosts do."""

import httpx

from e2b_util import need, point_sdk_at, restore, start

try:
    from e2b import Sandbox
except ImportError:
    need(False, "the e2b SDK (pip install e2b==2.63.0 e2b-code-interpreter==2.11.5)")


def test_the_sandbox_host_form_reaches_envd_under_the_configured_domain():
    import console_util
    server = start("--e2b-domain", "lockbox.test")
    saved = point_sdk_at(server.base, server.token, "1.1")
    try:
        sbx = Sandbox.create()
        try:
            sbx.files.write("via-host.txt", "routed")
            token = sbx._envd_access_token
            port = server.base.rsplit(":", 1)[1]
            host = {"Host": f"49983-{sbx.sandbox_id}.lockbox.test:{port}", "X-Access-Token": token}
            r = httpx.get(f"{server.base}/files", params={"path": "via-host.txt"}, headers=host)
            assert r.status_code == 200 and r.text == "routed"
            other = {"Host": f"49983-{sbx.sandbox_id}.elsewhere.test", "X-Access-Token": token}
            # Not a sandbox host: lockbox's own API answers (and wants its token).
            assert httpx.get(f"{server.base}/files", headers=other).status_code in (401, 404)
        finally:
            sbx.kill()
    finally:
        restore(saved)
        console_util.stop_server(server)
