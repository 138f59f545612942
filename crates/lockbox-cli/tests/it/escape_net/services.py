"""The escape corpus's outside world for the egress-by-name attacks (`n_name_*`, `n_cred_*`),
run by tests/escape_net/names.rs inside a network namespace of the test's (argv[1]: the
address servers listen on). Every connection and query is logged to argv[2], one line each,
so the test can tell what reached the outside:

  tls SNI            a TLS connection whose ClientHello arrived (SNI `-` when it had none)
  tls-request HOST CREDENTIAL   an HTTPS request on it (CREDENTIAL: `real` when its
                     Authorization is `Bearer ` + the secret of argv[5], else `none`/`other`)
  http HOST          a plain HTTP request head (HOST `-` without one)
  PORT nothing       a connection on which no byte ever arrived (what lockbox's refusals do)
  dns-udp NAME / dns-tcp NAME   a query this resolver was asked (it answers A with argv[1])

argv[3], argv[4]: the TLS server's certificate (from the test's CA) and key."""
import socket
import ssl
import struct
import sys
import threading

ip, log, cert, key, secret_file = sys.argv[1:6]
secret = open(secret_file).read().strip()
lock = threading.Lock()


def note(line):
    with lock, open(log, "a") as f:
        f.write(line + "\n")


def arrived(c):
    """Whether any byte arrives (peeked, so the handshake still sees it)."""
    c.settimeout(5)
    try:
        return bool(c.recv(1, socket.MSG_PEEK))
    except OSError:
        return False


def head_of(read):
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = read(4096)
        if not chunk:
            break
        data += chunk
    lines = data.decode(errors="replace").split("\r\n")
    fields = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip().lower()] = v.strip()
    return lines[0], fields


def tls_conn(c, ctx):
    if not arrived(c):
        note("443 nothing")
        c.close()
        return
    try:
        s = ctx.wrap_socket(c, server_side=True)
    except OSError:
        note(f"tls {getattr(c, 'asked', None) or '-'} (handshake failed)")
        c.close()
        return
    note(f"tls {getattr(s, 'asked', None) or '-'}")
    try:
        first, fields = head_of(s.recv)
        if first:
            auth = fields.get("authorization")
            cred = "none" if auth is None else ("real" if auth == f"Bearer {secret}" else "other")
            note(f"tls-request {fields.get('host', '-')} {cred}")
            s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
        s.close()
    except OSError:
        s.close()


def http_conn(c):
    if not arrived(c):
        note("80 nothing")
        c.close()
        return
    try:
        _, fields = head_of(c.recv)
        note(f"http {fields.get('host', '-')}")
        c.sendall(b"HTTP/1.0 200 OK\r\n\r\nhttp-ok\n")
    except OSError:
        pass
    c.close()


def serve(port, handle):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((ip, port))
    l.listen(64)
    while True:
        c, _ = l.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


def answer(q, how):
    at, labels = 12, []
    while at < len(q) and q[at]:
        labels.append(q[at + 1:at + 1 + q[at]].decode(errors="replace"))
        at += 1 + q[at]
    note(f"dns-{how} {'.'.join(labels)}")
    qtype = struct.unpack(">H", q[at + 1:at + 3])[0] if at + 3 <= len(q) else 0
    answers = b""
    if qtype == 1:
        answers = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(ip)
    header = q[:2] + b"\x81\x80" + struct.pack(">HHHH", 1, 1 if answers else 0, 0, 0)
    return header + q[12:at + 5] + answers


def dns_udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((ip, 53))
    while True:
        q, peer = u.recvfrom(4096)
        u.sendto(answer(q, "udp"), peer)


def dns_tcp_conn(c):
    try:
        c.settimeout(5)
        n = struct.unpack(">H", c.recv(2))[0]
        q = b""
        while len(q) < n:
            chunk = c.recv(n - len(q))
            if not chunk:
                break
            q += chunk
        r = answer(q, "tcp")
        c.sendall(struct.pack(">H", len(r)) + r)
    except (OSError, struct.error):
        note("53 nothing")
    c.close()


ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)


def asked(sock, name, _ctx):
    sock.asked = name


ctx.sni_callback = asked
for port, handle in [(443, lambda c: tls_conn(c, ctx)), (80, http_conn), (53, dns_tcp_conn)]:
    threading.Thread(target=serve, args=(port, handle), daemon=True).start()
open(log, "a").close()
print("ready", flush=True)
dns_udp()
