"""The fleet's node daemons on a real multi-node Ray cluster on this machine
(`ray.cluster_utils.Cluster`, issue 31 item 1): one `lockbox serve` per node, each with its
own state directory and port; a server that dies is restarted by Ray; a node that joins gets
a daemon; a node that leaves is listed lost; `down` leaves no server behind."""

import os
import signal
import time

import pytest
from conftest import need

try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:
    ray = None


def wait_for(what, check, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    need(ray is not None, "ray (pip install ray)")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.add_node(num_cpus=1)
    ray.init(address=c.address, namespace="lockbox-test", log_to_driver=False)
    try:
        yield c, str(tmp_path_factory.mktemp("fleet"))
    finally:
        import lockbox.fleet

        lockbox.fleet.down("lockbox-test")
        ray.shutdown()
        c.shutdown()


def test_one_server_per_node_restarted_joined_and_lost_with_its_node(cluster):
    import lockbox.fleet

    c, root = cluster
    fleet = lockbox.fleet.up(namespace="lockbox-test", state_root=root)
    nodes = fleet.wait(3)
    assert len({n["node_id"] for n in nodes}) == 3 and len({n["url"] for n in nodes}) == 3
    assert {n["state_dir"] for n in nodes} == {os.path.join(root, n["node_id"]) for n in nodes}
    for n in nodes:
        with fleet.client(n["node_id"]).create() as box:
            r = box.exec("echo hi from $(hostname)")
            assert r.exit_code == 0 and r.stdout.startswith("hi from"), r

    # A server that dies comes back (Ray restarts its daemon) on the same state directory.
    victim = nodes[0]
    os.kill(victim["pid"], signal.SIGKILL)
    back = wait_for("the killed node's server to come back", lambda: [
        n for n in fleet.nodes() if n["node_id"] == victim["node_id"] and n["state"] == "up"
        and n["pid"] != victim["pid"]])
    assert back[0]["state_dir"] == victim["state_dir"]
    with fleet.client(victim["node_id"]).create() as box:
        assert box.exec("true").exit_code == 0

    # A node that joins the cluster joins the fleet.
    extra = c.add_node(num_cpus=1)
    nodes = fleet.wait(4)
    joined = [n for n in nodes if n["node_id"] == extra.node_id]
    assert joined, nodes

    # A node that leaves is listed lost with a reason; the others keep working.
    c.remove_node(extra)
    lost = wait_for("the removed node to be listed lost", lambda: [
        n for n in fleet.nodes() if n["node_id"] == extra.node_id and n["state"] == "lost"])
    assert lost[0]["reason"]
    assert not alive(joined[0]["pid"])
    others = [n for n in fleet.nodes() if n["state"] == "up"]
    assert len(others) == 3
    with fleet.client(others[-1]["node_id"]).create() as box:
        assert box.exec("true").exit_code == 0

    # down stops every server.
    pids = [n["pid"] for n in others]
    lockbox.fleet.down("lockbox-test")
    wait_for("every server to stop", lambda: not any(alive(p) for p in pids), timeout=60)
