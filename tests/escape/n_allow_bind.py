"""Under --net-allow, serve the host's network: bind or listen on a non-loopback address,
or turn a socket the supervisor connected for us into a listener."""
import errno
import socket
from lib import must_fail, must_work, connect, finish, env

allow, allow_udp, hostip = int(env("ALLOW_TCP")), int(env("ALLOW_UDP")), env("HOSTIP")
hostip6 = env("HOSTIP6")
V4, V6 = socket.AF_INET, socket.AF_INET6

# The sandbox's namespace has loopback only: the host's addresses do not exist in it.
must_fail("bind TCP to the host's address", lambda: socket.socket(V4).bind((hostip, 0)), errno.EADDRNOTAVAIL)
must_fail("bind UDP to the host's address",
          lambda: socket.socket(V4, socket.SOCK_DGRAM).bind((hostip, 0)), errno.EADDRNOTAVAIL)
if hostip6:
    must_fail("bind TCP to the host's IPv6 address", lambda: socket.socket(V6).bind((hostip6, 0)), errno.EADDRNOTAVAIL)
# A socket the supervisor replaced with a host socket cannot become a host listener.
t = socket.socket(V4)
must_work("connect to the allowed pair", lambda: connect(V4, ("127.0.0.2", allow), t))
must_fail("listen on the connected host socket", lambda: t.listen(), errno.EINVAL)
u = socket.socket(V4, socket.SOCK_DGRAM)
must_work("send to the allowed UDP pair", lambda: u.sendto(b"x", ("127.0.0.2", allow_udp)))
must_fail("re-bind the host UDP socket", lambda: u.bind(("0.0.0.0", 0)), errno.EINVAL)
# Listening sockets made in the sandbox live in its namespace: nothing of the host reaches
# them (the test's host check sees no way in either); loopback serving inside works.
srv = socket.socket(V4)
srv.bind(("0.0.0.0", 0))
srv.listen()
must_work("loopback inside reaches the sandbox's own listener",
          lambda: connect(V4, ("127.0.0.1", srv.getsockname()[1])))
finish()
