"""Connect to the host's loopback TCP services (IPv4, IPv6, IPv4-mapped IPv6)."""
import errno
import socket
from lib import must_fail, finish, env

port4, port6 = int(env("TCP4")), int(env("TCP6"))

def connect(family, addr):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(addr)
    return s.getpeername()

refused = (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EADDRNOTAVAIL, errno.EHOSTUNREACH)
must_fail("127.0.0.1", lambda: connect(socket.AF_INET, ("127.0.0.1", port4)), *refused)
must_fail("localhost", lambda: connect(socket.AF_INET, ("localhost", port4)), *refused)
must_fail("[::1]", lambda: connect(socket.AF_INET6, ("::1", port6)), *refused)
must_fail("[::ffff:127.0.0.1]", lambda: connect(socket.AF_INET6, ("::ffff:127.0.0.1", port4)), *refused)
finish()
