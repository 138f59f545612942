"""The Ray backend on a real local Ray cluster: calls run in lockbox sandboxes on Ray
actors, actors are reused, a timeout kills the sandbox and leaves the actor usable."""

import os
import time

import pytest
from conftest import need

try:
    import ray
except ImportError:
    ray = None


@pytest.fixture(scope="module")
def cluster():
    need(ray is not None, "ray (pip install ray)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def where():
    return {"pid": os.getpid(), "sandboxed": os.environ.get("LOCKBOX_IN_SANDBOX")}


def sleeps():
    time.sleep(60)


def test_ray_calls_run_sandboxed_on_reused_actors(cluster):
    from lockbox.ray import RaySandboxPool

    with RaySandboxPool(1, timeout=60) as pool:
        actor = pool._idle.queue[0]
        a = pool.secure_execute(where)
        b = pool.secure_execute(where)
        assert a.ok and b.ok, (a, b)
        # Its own pid namespace: the sandbox init is pid 1, the interpreter one of the next
        # few (pid 2 is the helper that made the network namespace).
        assert a.result["sandboxed"] == "1" and 1 < a.result["pid"] < 10, a.result
        assert pool._idle.queue[0] is actor, "the actor was reused"


def test_ray_timeout_kills_the_sandbox_and_the_actor_stays_usable(cluster):
    from lockbox.ray import RaySandboxPool

    with RaySandboxPool(1, timeout=1) as pool:
        assert pool.secure_execute(sleeps).status == "timeout"
        assert pool.secure_execute(where).ok


def test_sandbox_run_decorator_with_ray(cluster):
    from lockbox.executor import sandbox_run

    @sandbox_run(timeout=60, sandbox_type="ray")
    def add(a, b):
        return a + b

    assert add(2, 3).result == 5
