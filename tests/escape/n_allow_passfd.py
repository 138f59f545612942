"""Connect or send to non-allowed destinations on host sockets handed in with --pass-fd
(unconnected TCP on fd 10, UDP on fd 11, both in the host's network namespace)."""
import errno
import os
import socket
from lib import must_fail, must_work, connect, finish, env

allow, allow_udp, deny, deny_udp = (int(env(k)) for k in ("ALLOW_TCP", "ALLOW_UDP", "DENY_TCP", "DENY_UDP"))
hostip, tcp_any, udp_any, tcp4 = env("HOSTIP"), int(env("TCP_ANY")), int(env("UDP_ANY")), int(env("TCP4"))
V4 = socket.AF_INET

def tcp():
    # A duplicate each time: a socket object closes its descriptor when collected.
    return socket.socket(fileno=os.dup(10))

udp = socket.socket(fileno=11)
# Loopback addresses on a host socket would be the host's loopback: refused unless named.
must_fail("passed TCP to 127.0.0.3", lambda: connect(V4, ("127.0.0.3", deny), tcp()), errno.EACCES)
must_fail("passed TCP to 127.0.0.1", lambda: connect(V4, ("127.0.0.1", tcp4), tcp()), errno.EACCES)
must_fail("passed TCP to the host's address", lambda: connect(V4, (hostip, tcp_any), tcp()), errno.EACCES)
must_fail("passed UDP to 127.0.0.3", lambda: udp.sendto(b"x", ("127.0.0.3", deny_udp)), errno.EACCES)
must_fail("passed UDP to the host's address", lambda: udp.sendto(b"x", (hostip, udp_any)), errno.EACCES)
must_fail("passed UDP connect to the host's address", lambda: udp.connect((hostip, udp_any)), errno.EACCES)
# The allowed destinations work on them, performed by the supervisor.
must_work("passed UDP to the allowed pair", lambda: udp.sendto(b"x", ("127.0.0.2", allow_udp)))
t = tcp()
must_work("passed TCP to the allowed pair", lambda: connect(V4, ("127.0.0.2", allow), t))
must_fail("passed TCP re-pointed at the host's address", lambda: connect(V4, (hostip, tcp_any), t), errno.EACCES, errno.EISCONN)

def disconnect(s):
    """connect(AF_UNSPEC): would dissolve the allowed association."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    addr = ctypes.create_string_buffer(16)
    if libc.connect(s.fileno(), addr, 16) < 0:
        e = ctypes.get_errno()
        raise OSError(e, "connect(AF_UNSPEC)")
    return 0

must_fail("passed UDP disconnected (AF_UNSPEC) after use", lambda: disconnect(udp), errno.EACCES)
finish()
