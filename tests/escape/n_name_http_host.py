"""Plain HTTP to an allowed name's address with a disallowed `Host` (and the ways a lenient
server might read another name than lockbox does: no Host, two Hosts, an absolute-form
target naming another host, a name that merely starts like the allowed one)."""
import errno
from lib import must_fail, must_work, finish, resolve, exchange, http_get

ip = must_work("allowed.test is answered", lambda: resolve("allowed.test"))[0]
must_work("HTTP to allowed.test with Host: allowed.test",
          lambda: exchange((ip, 80), http_get("allowed.test")))
heads = {
    "Host: other.test": http_get("other.test"),
    "Host: allowed.test.other.test": http_get("allowed.test.other.test"),
    "Host: other.test:80": http_get("other.test:80"),
    "no Host": b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
    "two Hosts (allowed first)": b"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n",
    "absolute-form http://other.test/ with Host: allowed.test":
        b"GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    "CONNECT other.test:443": b"CONNECT other.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    "a head that does not parse": b"GET / HTTP/1.1\r\nHost allowed.test\r\n\r\n",
}
for desc, head in heads.items():
    must_fail(f"HTTP to allowed.test's address, {desc}",
              lambda: exchange((ip, 80), head), errno.ECONNRESET)
finish()
