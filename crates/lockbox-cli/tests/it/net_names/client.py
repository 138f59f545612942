"""The sandbox side of tests/net_names.rs: runs each argument, `op,arg,...`, and prints
`<argument> ok <result>` or `<argument> err <errno or message>`.

  resolve,NAME        getaddrinfo (IPv4), the sorted addresses
  resolve6,NAME       the same for IPv6
  addrconfig,NAME     the same with AI_ADDRCONFIG
  connect,HOST,PORT   TCP connect (HOST a name or an address), the server's first line
  udp,NAME / tcp,NAME an A query sent straight to the nameserver of /etc/resolv.conf:
                      `rcode N [addresses]`
  fan,N,HOST,PORT     N processes connect at once: `{errno: count}` (0: connected)
  swap,A,PA,B,PB      a child connects to A:PA with the address in shared memory, which is
                      rewritten to B:PB while the connect waits: its exit status (errno)
  tls,HOST,PORT,SNI   a TLS handshake asking for SNI (`-`: none; certificates not checked),
                      then the server's first line
  http,HOST,PORT,NAME an HTTP/1.1 GET with `Host: NAME`, the response's last line
  http10,HOST,PORT,NAME the same as HTTP/1.0, the sending side shut after the request
  hold,HOST,PORT,N    N connections held open at once: `<opened> <[(errno, count)]>`, then,
                      all closed, one more: its first line
"""
import socket
import ssl
import struct
import sys
import time


def nameserver():
    for line in open("/etc/resolv.conf"):
        words = line.split()
        if words[:1] == ["nameserver"]:
            return words[1]
    raise OSError("no nameserver")


def skip_name(msg, at):
    while True:
        n = msg[at]
        if n & 0xC0 == 0xC0:
            return at + 2
        if n == 0:
            return at + 1
        at += 1 + n


def query(name, tcp):
    labels = b"".join(bytes([len(l)]) + l.encode() for l in name.split("."))
    q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack(">HH", 1, 1)
    server = (nameserver(), 53)
    if tcp:
        s = socket.create_connection(server, timeout=5)
        s.sendall(struct.pack(">H", len(q)) + q)
        data = b""
        while len(data) < 2 or len(data) < 2 + struct.unpack(">H", data[:2])[0]:
            chunk = s.recv(4096)
            if not chunk:
                raise OSError("closed")
            data += chunk
        msg = data[2:]
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(5)
        s.sendto(q, server)
        msg = s.recv(4096)
    if msg[:2] != b"\x42\x42":
        raise OSError("wrong id")
    rcode = msg[3] & 0xF
    qd, an = struct.unpack(">HH", msg[4:8])
    at = 12
    for _ in range(qd):
        at = skip_name(msg, at) + 4
    addrs = []
    for _ in range(an):
        at = skip_name(msg, at)
        rtype, _, _, rdlen = struct.unpack(">HHIH", msg[at:at + 10])
        at += 10
        if rtype == 1:
            addrs.append(socket.inet_ntoa(msg[at:at + 4]))
        at += rdlen
    return f"rcode {rcode} {sorted(addrs)}"


def fan(n, host, port):
    """`n` processes connect to host:port at once; {errno (0: connected): how many}."""
    import os
    rd, wr = os.pipe()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                socket.create_connection((host, port), timeout=30).close()
            except OSError as e:
                code = e.errno or 1
            os.write(wr, f"{code}\n".encode())
            os._exit(0)
        pids.append(pid)
    os.close(wr)
    for pid in pids:
        os.waitpid(pid, 0)
    counts = {}
    for line in os.fdopen(rd).read().split():
        counts[int(line)] = counts.get(int(line), 0) + 1
    return dict(sorted(counts.items()))


def swap(ip_a, port_a, ip_b, port_b):
    """A child connects with its address in memory shared with this process, which
    rewrites it to ip_b:port_b a second later (while the connect is asked about ip_a):
    the child's exit status, 0 if it connected."""
    import ctypes
    import mmap
    import os
    import time

    def sockaddr(ip, port):
        return struct.pack("=H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(ip) + bytes(8)

    shared = mmap.mmap(-1, 16, mmap.MAP_SHARED)
    shared[:] = sockaddr(ip_a, port_a)
    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        s = socket.socket()
        where = ctypes.addressof(ctypes.c_char.from_buffer(shared))
        rc = libc.connect(s.fileno(), ctypes.c_void_p(where), 16)
        os._exit(0 if rc == 0 else ctypes.get_errno())
    time.sleep(1)
    shared[:] = sockaddr(ip_b, port_b)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


for cmd in sys.argv[1:]:
    op, *a = cmd.split(",")
    try:
        if op in ("resolve", "resolve6"):
            family = socket.AF_INET if op == "resolve" else socket.AF_INET6
            r = sorted({x[4][0] for x in socket.getaddrinfo(a[0], 80, family, socket.SOCK_STREAM)})
        elif op == "addrconfig":
            found = socket.getaddrinfo(a[0], 80, socket.AF_INET, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG)
            r = sorted({x[4][0] for x in found})
        elif op == "connect":
            s = socket.create_connection((a[0], int(a[1])), timeout=5)
            r = s.recv(64).decode().strip()
        elif op == "tls":
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            s = socket.create_connection((a[0], int(a[1])), timeout=5)
            t = ctx.wrap_socket(s, server_hostname=None if a[2] == "-" else a[2])
            t.sendall(b"hi")
            r = t.recv(64).decode().strip()
        elif op in ("http", "http10"):
            s = socket.create_connection((a[0], int(a[1])), timeout=5)
            version = "1.0" if op == "http10" else "1.1"
            s.sendall(f"GET / HTTP/{version}\r\nHost: {a[2]}\r\nConnection: close\r\n\r\n".encode())
            if op == "http10":
                s.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            r = data.decode().strip().splitlines()[-1]
        elif op == "hold":
            held, errs = [], {}
            for _ in range(int(a[2])):
                try:
                    held.append(socket.create_connection((a[0], int(a[1])), timeout=5))
                except OSError as e:
                    errs[e.errno] = errs.get(e.errno, 0) + 1
            for h in held:
                h.close()
            time.sleep(0.5)
            s = socket.create_connection((a[0], int(a[1])), timeout=5)
            r = f"{len(held)} {sorted(errs.items())} {s.recv(64).decode().strip()}"
        elif op in ("udp", "tcp"):
            r = query(a[0], op == "tcp")
        elif op == "fan":
            r = fan(int(a[0]), a[1], int(a[2]))
        elif op == "swap":
            r = swap(a[0], int(a[1]), a[2], int(a[3]))
        else:
            raise SystemExit(f"unknown op {op}")
        print(cmd, "ok", r, flush=True)
    except OSError as e:
        print(cmd, "err", e.errno if isinstance(e.errno, int) and e.errno > 0 else "gai" if isinstance(e, socket.gaierror) else e, flush=True)
