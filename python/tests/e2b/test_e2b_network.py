"""`update_network` through the unmodified E2B SDK, sync and async: E2B's own
`test_update_network_applies_restrictions` and `test_update_network_clears_existing_rules`
(packages/python-sdk/tests/sync/sandbox_sync/test_network.py), against servers on this host
instead of 8.8.8.8 and 1.1.1.1 (CI has no internet). E2B's default network is the host's but
not its loopback (the sandbox's own), so the host's servers listen on its outgoing address."""

import asyncio
import socket

import pytest
from e2b_util import E2B_SDK, e2b_server, need  # noqa: F401 (a fixture)

try:
    from e2b import AsyncSandbox, Sandbox
    from e2b.exceptions import SandboxException
except ImportError:
    need(False, E2B_SDK)


def host_address():
    """The host's outgoing address (connecting a UDP socket sends nothing), if not loopback."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        ip = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


@pytest.fixture
def servers():
    """Two listening TCP sockets on the host's outgoing address and one on its 127.0.0.2:
    (address, port, port, loopback port). A connection completes in the backlog; nothing
    needs to accept it."""
    ip = host_address()
    need(ip is not None, "a non-loopback address on this host")
    socks = [socket.create_server((ip, 0)), socket.create_server((ip, 0)),
             socket.create_server(("127.0.0.2", 0))]
    try:
        yield (ip, socks[0].getsockname()[1], socks[1].getsockname()[1], socks[2].getsockname()[1])
    finally:
        for s in socks:
            s.close()


def reach(ip: str, port: int) -> str:
    return f"bash -c 'echo > /dev/tcp/{ip}/{port}' 2>/dev/null && echo ok || echo refused"


def test_update_network_applies_restrictions(e2b_server, servers):
    ip, port, other, _ = servers
    sbx = Sandbox.create()
    try:
        assert sbx.commands.run(reach(ip, port)).stdout == "ok\n"
        # lockbox's specs take a port: the same host's other server is another destination.
        sbx.update_network({"deny_out": [f"{ip}:{port}"]})
        assert sbx.commands.run(reach(ip, port)).stdout == "refused\n"
        assert sbx.commands.run(reach(ip, other)).stdout == "ok\n"
    finally:
        sbx.kill()


def test_update_network_clears_existing_rules(e2b_server, servers):
    ip, port, _, loopback = servers
    sbx = Sandbox.create(network={"deny_out": ["0.0.0.0/0"], "allow_out": ["127.0.0.2"]})
    try:
        assert sbx.commands.run(reach("127.0.0.2", loopback)).stdout == "ok\n"
        assert sbx.commands.run(reach(ip, port)).stdout == "refused\n"
        # An empty update clears allow_out / deny_out entirely.
        sbx.update_network({})
        assert sbx.commands.run(reach(ip, port)).stdout == "ok\n"
        assert sbx.get_info().allow_internet_access is not False
    finally:
        sbx.kill()


def test_a_sandbox_created_without_internet_keeps_it(e2b_server):
    sbx = Sandbox.create(allow_internet_access=False)
    try:
        with pytest.raises(SandboxException) as refused:
            sbx.update_network({})
        assert str(refused.value).startswith("409"), refused.value
        assert "fixed for its life" in str(refused.value)
        assert sbx.is_running()
    finally:
        sbx.kill()


def test_the_async_sdk_applies_and_clears_network_rules(e2b_server, servers):
    ip, port, _, _ = servers

    async def scenario():
        sbx = await AsyncSandbox.create()
        try:
            assert (await sbx.commands.run(reach(ip, port))).stdout == "ok\n"
            await sbx.update_network({"deny_out": [ip]})
            assert (await sbx.commands.run(reach(ip, port))).stdout == "refused\n"
            await sbx.update_network({"allow_internet_access": False})
            assert (await sbx.commands.run(reach(ip, port))).stdout == "refused\n"
            await sbx.update_network({})
            assert (await sbx.commands.run(reach(ip, port))).stdout == "ok\n"
        finally:
            await sbx.kill()

    asyncio.run(scenario())
