"""Under --net-allow, use IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) of non-allowed
addresses, and of the allowed address on a non-allowed port."""
import errno
import socket
from lib import must_fail, must_work, connect, finish, env

allow, deny, deny_port = int(env("ALLOW_TCP")), int(env("DENY_TCP")), int(env("DENY_PORT"))
hostip, tcp_any = env("HOSTIP"), int(env("TCP_ANY"))
V6 = socket.AF_INET6

must_work("::ffff:127.0.0.2:ALLOW_TCP (the allowed pair, mapped)",
          lambda: connect(V6, ("::ffff:127.0.0.2", allow)))
must_fail("::ffff:127.0.0.3", lambda: connect(V6, ("::ffff:127.0.0.3", deny)), errno.ECONNREFUSED)
must_fail("::ffff:127.0.0.2, another port", lambda: connect(V6, ("::ffff:127.0.0.2", deny_port)), errno.ECONNREFUSED)
must_fail("::ffff:HOSTIP", lambda: connect(V6, ("::ffff:" + hostip, tcp_any)), errno.EACCES)
must_fail("::ffff:HOSTIP on the allowed port", lambda: connect(V6, ("::ffff:" + hostip, allow)), errno.EACCES)
u = socket.socket(V6, socket.SOCK_DGRAM)
must_fail("UDP to ::ffff:HOSTIP", lambda: u.sendto(b"x", ("::ffff:" + hostip, tcp_any)), errno.EACCES)
# IPv4-compatible (::a.b.c.d, deprecated) and NAT64 (64:ff9b::a.b.c.d) forms are other
# IPv6 addresses: not allowed either.
must_fail("::127.0.0.2 (IPv4-compatible)", lambda: connect(V6, ("::127.0.0.2", allow)), errno.EACCES)
must_fail("64:ff9b::127.0.0.2 (NAT64)", lambda: connect(V6, ("64:ff9b::7f00:2", allow)), errno.EACCES)
finish()
