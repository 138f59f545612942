"""Raw DNS to an outside resolver instead of lockbox's: the test network's own DNS server
(on the address lockbox answered for allowed.test, so that address is open, on other ports)
over UDP and TCP, and a query's answer used anyway. Only lockbox's resolver may be asked."""
import errno
import socket
from lib import must_fail, must_work, finish, resolve, dns_udp, dns_tcp, dns_query

ip = must_work("allowed.test is answered", lambda: resolve("allowed.test"))[0]
outside = (ip, 53)
must_fail(f"ask {ip}:53 over UDP about other.test", lambda: dns_udp(dns_query("other.test"), outside), errno.EACCES)
must_fail(f"ask {ip}:53 over TCP about other.test", lambda: dns_tcp(dns_query("other.test"), outside), errno.EACCES)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
must_fail(f"sendmsg a query to {ip}:53", lambda: u.sendmsg([dns_query("x.other.test")], [], 0, outside), errno.EACCES)
must_fail(f"connect a UDP socket to {ip}:53", lambda: u.connect(outside), errno.EACCES)
finish()
