"""DNS rebinding through lockbox's resolver: allowed names the host's resolver answers with
the host's loopback (loop.test) and a link-local address (ll.test, the cloud metadata
service's), then connecting to what came back. lockbox must leave those answers out, and
the addresses stay closed."""
import errno
import os
import socket
from lib import must_fail, must_work, finish, a_records, dns_udp, dns_tcp, dns_query, resolve

def addresses(name, via):
    got = a_records(via(dns_query(name)))
    if not got:
        raise OSError(errno.ENODATA, "answered with no address")
    return got

must_work("allowed.test is answered", lambda: resolve("allowed.test"))
for name in ["loop.test", "ll.test"]:
    must_fail(f"{name} answered with an address (UDP)", lambda: addresses(name, dns_udp), errno.ENODATA)
    must_fail(f"{name} answered with an address (TCP)", lambda: addresses(name, dns_tcp), errno.ENODATA)
    must_fail(f"getaddrinfo({name})", lambda: socket.getaddrinfo(name, 80, socket.AF_INET),
              socket.EAI_NONAME, socket.EAI_NODATA, socket.EAI_AGAIN)
# The addresses the host answered: the metadata service is not allowed; 127.0.0.1 inside is
# the sandbox's own loopback (nothing listens there), never the host's.
must_fail("connect to 169.254.169.254:80", lambda: socket.create_connection(("169.254.169.254", 80), timeout=3), errno.EACCES)
must_fail(f"connect to 127.0.0.1:{os.environ['TCP4']} (the host's loopback service)",
          lambda: socket.create_connection(("127.0.0.1", int(os.environ["TCP4"])), timeout=3), errno.ECONNREFUSED)
finish()
