"""Reach the outside world: a public address, the host's own non-loopback address."""
import errno
import socket
from lib import must_fail, finish, env

def connect(family, addr):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(addr)

unreachable = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL)
must_fail("1.1.1.1:443", lambda: connect(socket.AF_INET, ("1.1.1.1", 443)), *unreachable)
must_fail("[2606:4700::1111]:443", lambda: connect(socket.AF_INET6, ("2606:4700::1111", 443)), *unreachable)
host_ip = env("HOSTIP")
if host_ip:
    must_fail(f"host {host_ip}", lambda: connect(socket.AF_INET, (host_ip, int(env("TCP_ANY")))), *unreachable, errno.ECONNREFUSED)
must_fail("DNS over UDP", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)), *unreachable)
finish()
