"""Domain fronting: connect to an allowed name's address (answered by lockbox's resolver)
and ask TLS for another name in the ClientHello's SNI, the way a shared CDN address is
abused; the relay must reset the connection before any byte reaches the server."""
import errno
from lib import must_fail, must_work, finish, resolve, exchange, http_get

ECONNRESET = errno.ECONNRESET
ip = must_work("allowed.test is answered", lambda: resolve("allowed.test"))[0]
must_work("TLS to allowed.test asking for allowed.test",
          lambda: exchange((ip, 443), http_get("allowed.test"), "allowed.test", tls=True))
for sni in ["other.test", "allowed.test.other.test", "xallowed.test", "allowed.testx",
            "sub.allowed.test"]:
    must_fail(f"TLS to allowed.test's address asking for {sni}",
              lambda: exchange((ip, 443), http_get("allowed.test"), sni, tls=True), ECONNRESET)
# The same, with the allowed name in the request's Host inside the tunnel: what is checked is
# the name TLS asks for, so the fronted name in SNI is refused whatever the Host says.
must_fail("TLS asking for other.test, Host: allowed.test inside",
          lambda: exchange((ip, 443), http_get("allowed.test"), "other.test", tls=True), ECONNRESET)
finish()
