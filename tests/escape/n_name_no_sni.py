"""A TLS ClientHello without SNI (no server_name extension, as a client connecting by address
sends) to an allowed name's address: a server behind a shared address would pick its
default name, which lockbox never checked. The relay must refuse it."""
import errno
from lib import must_fail, must_work, finish, resolve, exchange, http_get

ip = must_work("allowed.test is answered", lambda: resolve("allowed.test"))[0]
must_fail("TLS without server_name to allowed.test's address",
          lambda: exchange((ip, 443), http_get("allowed.test"), None, tls=True), errno.ECONNRESET)
# Python sends no SNI for an address given as the server name.
must_fail(f"TLS asking for the address {ip} itself (no SNI sent)",
          lambda: exchange((ip, 443), http_get(ip), ip, tls=True), errno.ECONNRESET)
must_work("TLS to allowed.test with its SNI still works",
          lambda: exchange((ip, 443), http_get("allowed.test"), "allowed.test", tls=True))
finish()
