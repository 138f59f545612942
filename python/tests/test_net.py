"""Network allow- and deny-lists through the SDK: a listed destination on the host's network
is reachable, anything else is refused, for a single command, a pipeline stage, a
transaction stage and a sandboxed function."""

import socket
import threading

import pytest
from conftest import need

from lockbox import Sandbox
from lockbox.errors import UsageError

# Connects to 127.0.0.2:PORT and prints what the server says, or the error's name.
PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("127.0.0.2", int(sys.argv[-1])))
    print(s.recv(64).decode())
except OSError as e:
    print("refused", type(e).__name__)
"""


class Server:
    """A TCP server on the host's 127.0.0.2 that greets every connection with `word`."""

    def __init__(self, word: str) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.2", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.word = word.encode()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.word)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def servers():
    a, b = Server("hello-a"), Server("hello-b")
    yield a, b
    a.close()
    b.close()


def probe(sandbox: Sandbox, port: int) -> str:
    r = sandbox.cmd(["python3", "-c", PROBE, str(port)]).run()
    return r.stdout.decode().strip()


def test_net_allow_reaches_the_listed_destination_and_nothing_else(servers):
    a, b = servers
    sb = Sandbox(net_allow=[f"127.0.0.2:{a.port}"])
    assert probe(sb, a.port) == "hello-a"
    assert probe(sb, b.port).startswith("refused")
    # Without the list the same address is the sandbox's own (empty) loopback.
    assert probe(Sandbox(), a.port).startswith("refused")


def test_net_allow_applies_per_pipeline_stage(servers):
    a, b = servers
    allowed = Sandbox(net_allow=[f"tcp://127.0.0.2:{a.port}"])
    closed = Sandbox()
    r = (allowed.cmd(["python3", "-c", PROBE, str(a.port)])
         | closed.cmd(["python3", "-c", "import sys; sys.stdin.read(); exec(sys.argv[1])", PROBE, str(a.port)])
         ).run()
    assert r.succeeded, r
    assert r.stdout.decode().strip().startswith("refused")
    r = (closed.cmd(["true"]) | allowed.cmd(["python3", "-c", PROBE, str(a.port)])).run()
    assert r.stdout.decode().strip() == "hello-a"


def test_net_allow_applies_to_a_transaction_stage(servers, ws):
    a, _ = servers
    sb = Sandbox(workdir=ws, net_allow=[f"127.0.0.2:{a.port}"])
    out = sb.cmd(["sh", "-c", f"python3 -c '{PROBE}' {a.port} > got.txt"]).run_transactional()
    assert out.committed, out
    assert (ws / "got.txt").read_text().strip() == "hello-a"


def test_net_deny_refuses_the_listed_destination(servers):
    a, _ = servers
    # A deny-list is the host's network minus the list; the host's loopback is never
    # reachable through it, so 127.0.0.2 stays the sandbox's own.
    assert probe(Sandbox(net_deny=["10.0.0.0/8:*"]), a.port).startswith("refused")


def test_sandboxed_function_honours_net_allow(servers):
    from lockbox.executor import SandboxExecutor

    a, b = servers

    def fetch(port):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.2", port))
            return s.recv(64).decode()
        except OSError as e:
            return "refused " + type(e).__name__

    ex = SandboxExecutor(timeout=30, policy=Sandbox(net_allow=[f"127.0.0.2:{a.port}"]))
    assert ex.secure_execute(fetch, a.port).unwrap() == "hello-a"
    assert ex.secure_execute(fetch, b.port).unwrap().startswith("refused")


@pytest.mark.parametrize("spec", ["pypi.org", "pypi.org:http", "ftp://pypi.org:21", "[::1:443", "10.0.0.0/33:1"])
def test_bad_net_specs_raise_usage_error_naming_the_spec_at_construction(spec):
    with pytest.raises(UsageError) as e:
        Sandbox(net_allow=["pypi.org:443", spec])
    assert spec in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(UsageError):
        Sandbox(net_deny=[spec])


def test_net_lists_are_exclusive_and_replace_net_mode():
    with pytest.raises(UsageError):
        Sandbox(net_allow=["pypi.org:443"], net_deny=["10.0.0.0/8:*"])
    with pytest.raises(UsageError):
        Sandbox(net_allow=["pypi.org:443"], net="host")
    with pytest.raises(UsageError):
        Sandbox(net_allow="pypi.org:443")
    assert Sandbox(net_allow=[]).policy()["net"] == "none"
    assert Sandbox(net_allow=["pypi.org:443"]).policy()["net"] == {"allow": ["pypi.org:443"]}
