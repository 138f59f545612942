"""Connect to IP literals lockbox never answered under a names-only allow-list: the allowed
name's address before anything was resolved, the host's side of the test network, another
address of the test range; then the answered address on a port no rule names."""
import errno
import os
import socket
from lib import must_fail, must_work, finish, resolve

ip, host_side = os.environ["NSIP"], os.environ["NSHOST"]
for addr in [(ip, 443), (ip, 80), (host_side, 443), ("198.18.0.1", 443)]:
    must_fail(f"connect to {addr[0]}:{addr[1]} (never answered)", lambda: socket.create_connection(addr, timeout=3), errno.EACCES)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
must_fail(f"sendto {ip}:53 (never answered)", lambda: u.sendto(b"x", (ip, 53)), errno.EACCES)
must_work("allowed.test is answered", lambda: resolve("allowed.test"))
must_work(f"connect to {ip}:443 once answered", lambda: socket.create_connection((ip, 443), timeout=3).close())
must_fail(f"connect to {ip}:22 (answered address, port no rule names)", lambda: socket.create_connection((ip, 22), timeout=3), errno.EACCES)
finish()
