"""The function executor: a Python function in a sandboxed interpreter, with ok / error /
timeout / crashed told apart, the whole tree killed, results bounded and unpickled safely."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lockbox import Sandbox
from lockbox.errors import CrashedError, RemoteError, TimeoutError
from lockbox.executor import SandboxExecutor, SandboxPool, sandbox_run, wait_for_cleanup


def add(a, b):
    return a + b


def raises():
    raise ValueError("bad input")


def sleeps():
    time.sleep(60)


def exits():
    os._exit(7)


def sigkills_itself():
    os.kill(os.getpid(), signal.SIGKILL)


def big(n):
    return b"x" * n


def unpicklable():
    return threading.Lock()


def a_class_instance():
    class Custom:
        pass

    return Custom()


def prints_then(fail):
    # Neither stream is flushed here: stdout is block-buffered, and the sandbox is killed
    # as soon as its result is in.
    print("printed inside", end="")
    sys.stderr.write("written to stderr")
    if fail:
        raise ValueError("after printing")
    return "done"


def heartbeat_forever(path, then_return):
    """Starts a detached grandchild that touches `path` every 20 ms, then returns or hangs."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                with open(path, "a") as f:
                    f.write(".")
                time.sleep(0.02)
        os._exit(0)
    while not os.path.exists(path):
        time.sleep(0.01)
    if then_return:
        return "started"
    time.sleep(60)


def grows_after(path, wait=0.3):
    size = os.path.getsize(path)
    time.sleep(wait)
    return os.path.getsize(path) > size


def test_ok_returns_the_value():
    r = SandboxExecutor(timeout=30).secure_execute(add, 2, b=3)
    assert r.status == "ok" and r.ok and r.result == 5 and r.unwrap() == 5


def test_error_carries_the_remote_traceback():
    r = SandboxExecutor(timeout=30).secure_execute(raises)
    assert r.status == "error" and r.error == "builtins.ValueError: bad input"
    # The test's source is not visible inside the sandbox: frames, without source lines.
    assert ", in raises\n" in r.traceback and r.traceback.endswith("ValueError: bad input\n")
    with pytest.raises(RemoteError) as e:
        r.unwrap()
    assert e.value.traceback == r.traceback


def test_timeout_kills_the_call():
    r = SandboxExecutor(timeout=0.5).secure_execute(sleeps)
    assert r.status == "timeout"
    with pytest.raises(TimeoutError):
        r.unwrap()


@pytest.mark.parametrize(("fn", "exit_code", "sig"), [(exits, 7, None), (sigkills_itself, 137, 9)])
def test_crash_is_reported_without_waiting_for_the_timeout(fn, exit_code, sig):
    r = SandboxExecutor(timeout=600).secure_execute(fn)
    assert r.status == "crashed" and r.exit_code == exit_code and r.signal == sig
    assert r.duration < 600
    with pytest.raises(CrashedError):
        r.unwrap()


def test_timeout_kills_the_whole_tree_including_detached_grandchildren(tmp_path):
    beat = tmp_path / "beat"
    ex = SandboxExecutor(timeout=2, policy=Sandbox(fs_writable=[tmp_path]))
    r = ex.secure_execute(heartbeat_forever, str(beat), False)
    assert r.status == "timeout"
    assert not grows_after(beat), "a grandchild survived the sandbox"


def test_returning_kills_the_whole_tree(tmp_path):
    beat = tmp_path / "beat"
    ex = SandboxExecutor(timeout=30, policy=Sandbox(fs_writable=[tmp_path]))
    assert ex.secure_execute(heartbeat_forever, str(beat), True).result == "started"
    wait_for_cleanup()
    assert not grows_after(beat), "a grandchild survived the sandbox"


@pytest.mark.parametrize("fail", [False, True])
def test_with_output_inherit_what_the_function_printed_reaches_the_callers_streams(capfd, fail):
    r = SandboxExecutor(timeout=30, output="inherit").secure_execute(prints_then, fail)
    assert r.status == ("error" if fail else "ok")
    wait_for_cleanup()
    out, err = capfd.readouterr()
    assert "printed inside" in out and "written to stderr" in err


def test_big_results_travel_and_oversized_ones_are_an_error():
    r = SandboxExecutor(timeout=60).secure_execute(big, 20 << 20)
    assert r.ok and len(r.result) == 20 << 20
    r = SandboxExecutor(timeout=60, max_result_bytes=1 << 20).secure_execute(big, 2 << 20)
    assert r.status == "error" and r.error.startswith("ResultTooLarge")


def test_unpicklable_result_is_an_error():
    r = SandboxExecutor(timeout=30).secure_execute(unpicklable)
    assert r.status == "error" and "could not be pickled" in r.error


def test_results_of_arbitrary_classes_are_refused_unless_trusted():
    r = SandboxExecutor(timeout=30).secure_execute(a_class_instance)
    assert r.status == "error" and "not plain data" in r.error
    r = SandboxExecutor(timeout=30, trusted_results=True).secure_execute(a_class_instance)
    assert r.ok and type(r.result).__name__ == "Custom"


def test_the_sandbox_sees_no_host_files_and_no_network(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret")

    def snoop(path):
        import socket

        out = {"file": os.path.exists(path)}
        try:
            socket.create_connection(("1.1.1.1", 53), timeout=1)
            out["net"] = True
        except OSError:
            out["net"] = False
        return out

    r = SandboxExecutor(timeout=30).secure_execute(snoop, str(secret))
    assert r.result == {"file": False, "net": False}


def test_decorator_runs_functions_and_methods_on_a_copy():
    @sandbox_run(timeout=30)
    def double(x):
        return x * 2

    class Scorer:
        def __init__(self):
            self.k = 3
            self.calls = 0

        @sandbox_run(timeout=30)
        def score(self, x):
            self.calls += 1
            return (self.k * x, os.environ.get("LOCKBOX_IN_SANDBOX"), self.calls)

    assert double(21).result == 42
    s = Scorer()
    assert s.score(5).result == (15, "1", 1)
    assert s.calls == 0, "the method ran on a copy"


def test_warm_pool_reuses_nothing_between_calls():
    def count():
        import builtins

        builtins.counter = getattr(builtins, "counter", 0) + 1
        return builtins.counter

    with SandboxPool(2, timeout=30) as pool:
        results = [pool.secure_execute(count) for _ in range(4)]
        assert [r.result for r in results] == [1, 1, 1, 1]
        assert pool.secure_execute(add, 1, 2).result == 3


def test_pool_timeout_and_crash_do_not_break_the_pool():
    with SandboxPool(1, timeout=0.5) as pool:
        assert pool.secure_execute(sleeps).status == "timeout"
        assert pool.secure_execute(exits).status == "crashed"
        assert pool.secure_execute(add, 2, 2).result == 4


def test_sandbox_run_works_for_a_function_of_main_with_only_lockbox_installed(tmp_path):
    # cloudpickle comes with lockbox (a dependency), so a script's own function pickles by
    # value; with plain pickle it would be a PicklingError (__main__ is not importable inside).
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        from lockbox.executor import sandbox_run

        @sandbox_run(timeout=60)
        def double(x):
            return 2 * x

        if __name__ == "__main__":
            r = double(21)
            print(r.status, r.result, r.error)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok 42 None", done.stdout + done.stderr
