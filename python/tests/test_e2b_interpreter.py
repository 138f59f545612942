"""The code interpreter's protocol (port 49999 of an E2B sandbox, issue 30 item 4) on lockbox's
code contexts, read with the unmodified `e2b-code-interpreter` package's own parser
(`parse_output`): state kept between runs, stdout, a matplotlib figure as a PNG result, the
last expression as the main result, errors, execution counts, and bash contexts."""

import json
import sys
import urllib.error
import urllib.request

import pytest
from conftest import need
from test_client import server  # noqa: F401 - the fixture

from lockbox import Client

try:
    from e2b_code_interpreter.models import Execution, parse_output
except ImportError:
    Execution = parse_output = None

VENV_PATH = f"{sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin"


@pytest.fixture()
def box(server):  # noqa: F811 - the fixture
    need(parse_output is not None, "e2b-code-interpreter (pip install e2b-code-interpreter==2.11.5)")
    client = Client(*server)
    with client.create(fs_readable=[sys.prefix], env={"PATH": VENV_PATH}) as b:
        yield server[0], b.id


def call(box, method, path, body=None):
    url, sandbox = box
    req = urllib.request.Request(url + path, method=method,  # noqa: S310 - http to the test server
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", "E2b-Sandbox-Id": sandbox,
                                          "E2b-Sandbox-Port": "49999"})
    with urllib.request.urlopen(req) as r:  # noqa: S310
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def run(box, **body):
    status, ctype, text = call(box, "POST", "/execute", body)
    assert status == 200 and ctype == "application/x-ndjson"
    execution = Execution()
    for line in text.splitlines():
        parse_output(execution, line)
    assert text.splitlines()[-1] == '{"type":"end_of_execution"}'
    return execution


def test_runs_keep_state_and_stream_output_results_and_errors(box):
    first = run(box, code="x = 41\nprint('hi')")
    assert first.logs.stdout == ["hi\n"] and first.error is None and first.execution_count == 1
    second = run(box, code="x + 1")
    assert second.text == "42" and second.results[0].is_main_result and second.execution_count == 2
    failed = run(box, code="1/0")
    assert failed.error.name == "ZeroDivisionError" and "division by zero" in failed.error.value
    assert "Traceback" in failed.error.traceback


def test_a_matplotlib_figure_is_a_png_result(box):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        need(False, "matplotlib in the test venv")
    ex = run(box, code="import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1 and pngs[0].startswith("iVBORw0KGgo")  # base64 of the PNG signature


def test_contexts_are_created_listed_restarted_and_deleted(box):
    status, _, text = call(box, "POST", "/contexts", {"language": "bash", "cwd": "/tmp"})
    ctx = json.loads(text)
    assert status == 200 and ctx["language"] == "bash" and ctx["cwd"] == "/tmp"
    assert run(box, code="cd /; A=5; echo $((A+1))", context_id=ctx["id"]).logs.stdout == ["6\n"]
    assert run(box, code="echo ${A:-unset} $PWD", context_id=ctx["id"]).logs.stdout == ["5 /\n"]
    assert ctx["id"] in [c["id"] for c in json.loads(call(box, "GET", "/contexts")[2])]
    assert call(box, "POST", f"/contexts/{ctx['id']}/restart")[0] == 204
    assert run(box, code="echo ${A:-unset} $PWD", context_id=ctx["id"]).logs.stdout == ["unset /tmp\n"]
    assert call(box, "DELETE", f"/contexts/{ctx['id']}")[0] == 204
    with pytest.raises(urllib.error.HTTPError) as gone:
        call(box, "POST", "/execute", {"code": "echo", "context_id": ctx["id"]})
    assert gone.value.code == 404
    # A language without a context has a default one of its own.
    assert run(box, code="echo from-bash", language="bash").logs.stdout == ["from-bash\n"]


def test_bad_requests_are_clear_errors(box):
    for body, field in (({"code": "1", "language": "cobol"}, "cobol"),
                        ({"code": "1", "env_vars": {"A": "1"}}, "env_vars")):
        with pytest.raises(urllib.error.HTTPError) as err:
            call(box, "POST", "/execute", body)
        assert err.value.code == 400 and field in err.value.read().decode()
