"""`run_code` with a matplotlib chart through the unmodified `e2b-code-interpreter`, on a server
whose E2B sandboxes start from a profile (`lockbox serve --e2b-profile`) that lets them read
this test venv, so its Python (and matplotlib) is the sandboxes' `python3`."""

import os
import sys
import tempfile

import pytest
from e2b_util import need, serving


@pytest.fixture(scope="module")
def charts_server():
    try:
        import matplotlib  # noqa: F401
        from e2b_code_interpreter import Sandbox  # noqa: F401
    except ImportError:
        need(False, "matplotlib and e2b-code-interpreter==2.11.5 in the test venv")
    profile = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    profile.write(f'[fs]\nread = ["{sys.prefix}"]\n'
                  f'[env]\nset = {{ PATH = "{sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin", FROM_PROFILE = "1" }}\n')
    profile.close()
    try:
        with serving("--e2b-profile", profile.name) as server:
            yield server
    finally:
        os.unlink(profile.name)


def test_a_matplotlib_chart_comes_back_as_a_png_result(charts_server):
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create(envs={"FROM_CREATE": "2"})
    try:
        ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()")
        assert ex.error is None, ex.error
        pngs = [r.png for r in ex.results if r.png]
        assert len(pngs) == 1 and pngs[0].startswith("iVBORw0KGgo"), ex.results  # base64 of PNG's signature
        env = sbx.commands.run("echo $FROM_PROFILE $FROM_CREATE")
        assert env.stdout == "1 2\n"
    finally:
        sbx.kill()


def test_a_bad_profile_is_refused_at_start(tmp_path):
    import console_util

    bad = tmp_path / "bad.toml"
    bad.write_text("[fs]\nreed = []\n")
    with pytest.raises(RuntimeError, match="exited with 2"):
        console_util.start_server("--e2b-profile", str(bad))
