"""Under --net-deny (default allow), reach the denied exceptions anyway: by address, as an
IPv4-mapped IPv6 address, over UDP with sendto and sendmsg; and the host's loopback, which
a deny-list never opens."""
import errno
import socket
from lib import must_fail, must_work, connect, finish, env

hostip, tcp_any, udp_any = env("HOSTIP"), int(env("TCP_ANY")), int(env("UDP_ANY"))
tcp4, allow = int(env("TCP4")), int(env("ALLOW_TCP"))
V4, V6 = socket.AF_INET, socket.AF_INET6

must_fail("the denied TCP pair", lambda: connect(V4, (hostip, tcp_any)), errno.EACCES)
must_fail("the denied TCP pair, mapped", lambda: connect(V6, ("::ffff:" + hostip, tcp_any)), errno.EACCES)
u = socket.socket(V4, socket.SOCK_DGRAM)
must_fail("the denied UDP pair (sendto)", lambda: u.sendto(b"x", (hostip, udp_any)), errno.EACCES)
must_fail("the denied UDP pair (sendmsg)", lambda: u.sendmsg([b"x"], [], 0, (hostip, udp_any)), errno.EACCES)
must_fail("the denied UDP pair (connect)", lambda: u.connect((hostip, udp_any)), errno.EACCES)
u6 = socket.socket(V6, socket.SOCK_DGRAM)
must_fail("the denied UDP pair, mapped", lambda: u6.sendto(b"x", ("::ffff:" + hostip, udp_any)), errno.EACCES)
# The host's loopback stays closed under a deny-list.
must_fail("the host's 127.0.0.1", lambda: connect(V4, ("127.0.0.1", tcp4)), errno.ECONNREFUSED)
must_fail("the host's 127.0.0.2", lambda: connect(V4, ("127.0.0.2", allow)), errno.ECONNREFUSED)
must_fail("the host's loopback, mapped", lambda: connect(V6, ("::ffff:127.0.0.1", tcp4)), errno.ECONNREFUSED)
# Control: another port of the same address goes to the host (nothing listens there).
def other_port():
    try:
        connect(V4, (hostip, allow))
    except ConnectionRefusedError:
        return "refused by the host"
    return "connected"
must_work("another port of the denied address reaches the host", other_port)
finish()
