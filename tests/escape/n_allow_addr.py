"""Under --net-allow, reach addresses no rule names: another loopback address, the host's
own address, the unspecified address, the host's 127.0.0.1."""
import errno
import socket
from lib import must_fail, must_work, connect, finish, env

allow, deny = int(env("ALLOW_TCP")), int(env("DENY_TCP"))
hostip, tcp_any, tcp4 = env("HOSTIP"), int(env("TCP_ANY")), int(env("TCP4"))
V4 = socket.AF_INET

must_work("127.0.0.2:ALLOW_TCP (the allowed pair)", lambda: connect(V4, ("127.0.0.2", allow)))
must_fail("127.0.0.3", lambda: connect(V4, ("127.0.0.3", deny)), errno.ECONNREFUSED)
must_fail("127.0.0.3 on the allowed port", lambda: connect(V4, ("127.0.0.3", allow)), errno.ECONNREFUSED)
must_fail("127.0.0.1", lambda: connect(V4, ("127.0.0.1", tcp4)), errno.ECONNREFUSED)
must_fail("0.0.0.0 on the allowed port", lambda: connect(V4, ("0.0.0.0", allow)), errno.ECONNREFUSED)
must_fail("the host's address", lambda: connect(V4, (hostip, tcp_any)), errno.EACCES)
must_fail("a public address", lambda: connect(V4, ("1.1.1.1", 443)), errno.EACCES)
must_fail("broadcast", lambda: connect(V4, ("255.255.255.255", allow)), errno.EACCES, errno.ENETUNREACH)
finish()
