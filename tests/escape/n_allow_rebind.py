"""DNS rebinding: the allowed name resolves to the host's loopback (the test's hosts file
says 127.0.0.2, where a host service listens), then to another address after the sandbox
started (the test rewrites the host's hosts file lockbox resolves from). lockbox's resolver
must leave the loopback answer out and allow nothing for it, answer the new address when
asked, and open only the name's port on it; names off the list get NXDOMAIN."""
import errno
import os
import socket
import struct
import time
from lib import must_fail, must_work, connect, finish, env

name, allow, newip = env("REBIND_NAME"), int(env("ALLOW_TCP")), env("REBIND_TO")
deny_port = int(env("DENY_PORT"))
work = env("WORK")
V4 = socket.AF_INET

def resolved():
    return sorted({a[4][0] for a in socket.getaddrinfo(name, allow, V4, socket.SOCK_STREAM)})

def rcode(qname, tcp=False):
    """Asks lockbox's resolver (the sandbox's nameserver) for qname's A record directly."""
    labels = b"".join(bytes([len(l)]) + l.encode() for l in qname.split("."))
    q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack(">HH", 1, 1)
    if tcp:
        s = socket.create_connection(("127.0.0.153", 53), timeout=5)
        s.sendall(struct.pack(">H", len(q)) + q)
        r = s.recv(4096)[2:]
    else:
        s = socket.socket(V4, socket.SOCK_DGRAM)
        s.settimeout(5)
        s.sendto(q, ("127.0.0.153", 53))
        r = s.recv(4096)
    return r[3] & 0xF

def loopback_answered():
    got = resolved()
    return got  # any address at all is an escape: the only one the name has is loopback

must_fail("the name's loopback answer (127.0.0.2)", loopback_answered)
# The host's 127.0.0.2 service is listening: inside, 127.0.0.2 is the sandbox's own loopback.
must_fail("the host's loopback service the name pointed at", lambda: connect(V4, ("127.0.0.2", allow)), errno.ECONNREFUSED)
open(os.path.join(work, "rebind-ready"), "w").close()
for _ in range(2000):
    if os.path.exists(os.path.join(work, "rebind-go")):
        break
    time.sleep(0.01)
else:
    print("WRONG: the host never rebound the name")

def now_newip():
    got = resolved()
    if got != [newip]:
        raise OSError(errno.EINVAL, f"resolves to {got}")
    return got

# Resolved when asked, not pinned: the new address is answered...
must_work("after rebinding the name resolves to the new address", now_newip)
# ...and opens the name's port only.
must_fail("the new address on a port the name's rule does not list", lambda: connect(V4, (newip, deny_port)), errno.EACCES)
must_fail("the loopback address the name once had", lambda: connect(V4, ("127.0.0.2", allow)), errno.ECONNREFUSED)
def nxdomain(qname, tcp=False):
    code = rcode(qname, tcp)
    if code != 3:
        return f"rcode {code}"
    raise OSError(errno.ENOENT, "NXDOMAIN")
must_fail("a name off the list over UDP", lambda: nxdomain("evil.lockbox.test"))
must_fail("a name off the list over TCP", lambda: nxdomain("evil.lockbox.test", tcp=True))
must_fail("a subdomain of the allowed name", lambda: nxdomain("x." + name))
def write_hosts():
    with open("/etc/hosts", "a") as f:
        f.write(f"{newip} {name}\n")
must_fail("rewrite the sandbox's /etc/hosts", write_hosts, errno.EROFS, errno.EACCES, errno.EPERM)
u = socket.socket(V4, socket.SOCK_DGRAM)
must_fail("ask a public DNS server", lambda: u.sendto(b"\0" * 12, ("1.1.1.1", 53)), errno.EACCES)
finish()
