"""Under --net-allow, reach an allowed host on a port (or protocol) no rule names."""
import errno
import socket
from lib import must_fail, must_work, connect, finish, env

allow, deny_port = int(env("ALLOW_TCP")), int(env("DENY_PORT"))
hostip, tcp_any, udp_any = env("HOSTIP"), int(env("TCP_ANY")), int(env("UDP_ANY"))
V4 = socket.AF_INET

must_work("127.0.0.2:ALLOW_TCP (the allowed pair)", lambda: connect(V4, ("127.0.0.2", allow)))
# Loopback destinations no rule names stay in the sandbox's own namespace: nothing listens.
must_fail("127.0.0.2, another port", lambda: connect(V4, ("127.0.0.2", deny_port)), errno.ECONNREFUSED)
for p in range(deny_port - 2, deny_port + 3):
    if p not in (allow, deny_port):
        must_fail(f"127.0.0.2:{p}", lambda: connect(V4, ("127.0.0.2", p)), errno.ECONNREFUSED)
# The host's address is allowed for UDP on one port only: TCP to it, on that port or
# another, is refused by the supervisor.
must_fail("HOSTIP, TCP on the UDP-only port", lambda: connect(V4, (hostip, udp_any)), errno.EACCES)
must_fail("HOSTIP, TCP on another port", lambda: connect(V4, (hostip, tcp_any)), errno.EACCES)
must_fail("HOSTIP, the allowed TCP port of another address", lambda: connect(V4, (hostip, allow)), errno.EACCES)
u = socket.socket(V4, socket.SOCK_DGRAM)
must_fail("HOSTIP, UDP on another port", lambda: u.sendto(b"x", (hostip, tcp_any)), errno.EACCES)
finish()
