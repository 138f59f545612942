"""Shared by the Python attacks: each step must fail with the errno the wall gives."""
import errno
import os
import sys

escaped = False
wrong = False


def must_fail(desc, fn, *errnos):
    global escaped, wrong
    try:
        result = fn()
    except OSError as e:
        if errnos and e.errno not in errnos:
            print(f"WRONG: {desc} failed with {errno.errorcode.get(e.errno, e.errno)}, expected {[errno.errorcode[x] for x in errnos]}")
            wrong = True
        else:
            print(f"ok: {desc}: {e.strerror}")
        return
    print(f"ESCAPED: {desc} succeeded ({result!r})"[:300])
    escaped = True


def finish():
    sys.stdout.flush()
    if escaped:
        print("ESCAPED")
        sys.exit(1)
    if wrong:
        sys.exit(2)
    print("BLOCKED")
    sys.exit(0)


def env(name):
    return os.environ[name]


def must_work(desc, fn):
    """A control step: the allowed path must work, or the attack proves nothing."""
    global wrong
    try:
        result = fn()
    except OSError as e:
        print(f"WRONG: control {desc} failed: {e}")
        wrong = True
        return None
    print(f"ok: control {desc} works")
    return result


def connect(family, addr, sock=None):
    """Connects a new (or the given) TCP socket; returns the peer address."""
    import socket
    s = sock or socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(addr)
    return s.getpeername()


# --- the egress-by-name attacks (n_name_*, n_cred_*): lockbox's resolver and the outside ---

RESOLVER = ("127.0.0.153", 53)  # lockbox's resolver, the sandbox's nameserver


def dns_query(name, qtype=1, qid=0x4242):
    import struct
    labels = b"".join(bytes([len(l)]) + l.encode() for l in name.split("."))
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack(">HH", qtype, 1)


def dns_udp(msg, server=RESOLVER, timeout=3):
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    s.sendto(msg, server)
    try:
        return s.recv(4096)
    except socket.timeout:
        raise OSError(errno.ETIMEDOUT, "no answer")


def dns_tcp(msg, server=RESOLVER):
    import socket
    import struct
    s = socket.create_connection(server, timeout=5)
    s.sendall(struct.pack(">H", len(msg)) + msg)
    data = b""
    while len(data) < 2 or len(data) < 2 + struct.unpack(">H", data[:2])[0]:
        chunk = s.recv(4096)
        if not chunk:
            raise OSError(errno.ECONNRESET, "closed mid-answer")
        data += chunk
    return data[2:]


def a_records(reply):
    """The IPv4 addresses of a reply's answers; OSError(ENOENT) for NXDOMAIN, EPROTO for
    another error code."""
    import socket
    import struct
    rcode = reply[3] & 0xF
    if rcode == 3:
        raise OSError(errno.ENOENT, "NXDOMAIN")
    if rcode != 0:
        raise OSError(errno.EPROTO, f"rcode {rcode}")
    ancount = struct.unpack(">H", reply[6:8])[0]
    at = 12
    while reply[at]:
        at += 1 + reply[at]
    at += 5
    out = []
    for _ in range(ancount):
        at += 2 if reply[at] & 0xC0 == 0xC0 else 0
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", reply[at:at + 10])
        if rtype == 1 and rdlen == 4:
            out.append(socket.inet_ntoa(reply[at + 10:at + 14]))
        at += 10 + rdlen
    return out


def resolve(name):
    """The name's IPv4 addresses, asked of lockbox's resolver."""
    addrs = a_records(dns_udp(dns_query(name)))
    if not addrs:
        raise OSError(errno.ENOENT, "no addresses")
    return addrs


def exchange(addr, first, sni=None, tls=False, timeout=5):
    """Connects to addr, sends `first` (over TLS asking for `sni` when tls), returns the
    first bytes answered. A refusal shows as the reset of the connection: ECONNRESET (an
    end of stream with nothing answered counts as one)."""
    import socket
    import ssl
    s = socket.create_connection(addr, timeout=timeout)
    try:
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            try:
                s = ctx.wrap_socket(s, server_hostname=sni)
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as e:
                raise OSError(errno.ECONNRESET, f"handshake ended: {e}")
        s.sendall(first)
        data = s.recv(4096)
        if not data:
            raise OSError(errno.ECONNRESET, "closed with nothing answered")
        return data
    except ssl.SSLError as e:
        raise OSError(errno.ECONNRESET, f"TLS: {e}")
    finally:
        s.close()


def http_get(host):
    return f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
