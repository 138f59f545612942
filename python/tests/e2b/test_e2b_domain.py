"""`lockbox serve --e2b-domain`: E2B's `{port}-{sandboxID}.{domain}` host form routes to the
sandbox, as E2B's own hosts do."""

import httpx

from e2b_util import E2B_SDK, need, serving

try:
    from e2b import Sandbox
except ImportError:
    need(False, E2B_SDK)


def test_the_sandbox_host_form_reaches_envd_under_the_configured_domain():
    with serving("--e2b-domain", "lockbox.test") as server:
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
