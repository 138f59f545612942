"""Credentials that never enter a long-lived sandbox: ``Sandbox.open(credentials=...,
http_auth=..., http_allow=...)`` (the values read by this process into its local runtime)
and the refusals. The requests themselves (the real header reaching a real HTTPS server) are
tested against ``lockbox serve`` in crates/lockbox-cli/tests/it/net_credentials.rs, which makes
the server's network namespace."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from conftest import need

from lockbox import Sandbox
from lockbox.errors import ServerError, UsageError

SECRET = "py-s3cr3t-never-inside"
VAR = "LBX_PY_TEST_SECRET"


def test_open_with_a_credential_trusts_the_sandboxs_ca_and_never_holds_the_value(tmp_path, monkeypatch):
    monkeypatch.setenv(VAR, SECRET)
    with Sandbox.open(net_allow=["api.test:443"], credentials={"API": f"env:{VAR}"},
                      http_auth=["api.test bearer API"], http_allow=["GET api.test/v1"],
                      state_dir=tmp_path / "state") as box:
        r = box.exec("env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'; "
                     "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt")
        assert r.exit_code == 0, r.stderr
        assert "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" in r.stdout
        assert int(r.stdout.split()[-1]) >= 1, "the sandbox's bundle holds its CA"
        assert SECRET not in r.stdout and VAR not in r.stdout


def test_bad_credentials_and_rules_are_refused_naming_what_is_wrong(tmp_path, monkeypatch):
    state = tmp_path / "state"
    monkeypatch.delenv("LBX_PY_NOT_SET", raising=False)
    with pytest.raises(UsageError) as e:
        Sandbox.open(net_allow=["api.test:443"], credentials={"API": "env:LBX_PY_NOT_SET"},
                     http_auth=["api.test bearer API"], state_dir=state)
    assert "API" in str(e.value) and "LBX_PY_NOT_SET" in str(e.value)
    monkeypatch.setenv(VAR, SECRET)
    with pytest.raises(UsageError) as e:
        Sandbox.open(net_allow=["api.test:443"], credentials={"API": f"env:{VAR}"}, env_pass=[VAR],
                     http_auth=["api.test bearer API"], state_dir=state)
    assert VAR in str(e.value)
    with pytest.raises(UsageError):
        Sandbox.open(credentials={"API": SECRET}, state_dir=state)
    with pytest.raises(ServerError) as e:
        Sandbox.open(net_allow=["api.test:443"], http_auth=["api.test bearer NOPE"], state_dir=state)
    assert e.value.status == 400 and "NOPE" in str(e.value)
    with pytest.raises(ServerError) as e:
        Sandbox.open(net_allow=["other.test:443"], credentials={"API": f"env:{VAR}"},
                     http_auth=["api.test bearer API"], state_dir=state)
    assert e.value.status == 400 and "api.test" in str(e.value)
    assert SECRET not in str(e.value)


NOBODY = r"""
import json, sys
from lockbox import Sandbox
with Sandbox.open(net_allow=["api.test:443"], credentials={"API": "env:LBX_PY_TEST_SECRET"},
                  http_auth=["api.test bearer API"], state_dir=sys.argv[1]) as box:
    r = box.exec("id -u; env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'")
print(json.dumps({"code": r.exit_code, "out": r.stdout}))
"""


def test_open_with_a_credential_works_as_uid_65534():
    need(os.geteuid() == 0, "root (the test re-runs as uid 65534)")
    need(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    probe = subprocess.run(as_nobody + [sys.executable, "-c", "import lockbox"], capture_output=True)
    need(probe.returncode == 0, f"a Python with lockbox that uid 65534 can run ({sys.executable})")
    root = tempfile.mkdtemp(prefix="lockbox-nobody-cred-")
    try:
        os.chown(root, 65534, 65534)
        res = subprocess.run(as_nobody + [sys.executable, "-c", NOBODY, os.path.join(root, "state")],
                             capture_output=True, text=True, cwd=root, timeout=300,
                             env=dict(os.environ, LBX_PY_TEST_SECRET=SECRET))
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout.strip().splitlines()[-1])
        assert got["code"] == 0 and got["out"].startswith("65534\n"), got
        assert "SSL_CERT_FILE=" in got["out"] and SECRET not in got["out"], got
    finally:
        shutil.rmtree(root, ignore_errors=True)
