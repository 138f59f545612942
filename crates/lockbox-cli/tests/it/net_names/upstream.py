"""A test network's services, run inside its namespace by tests/net_names.rs: TCP servers
on 8443 and 8080 that greet with `hello-<port>`, and a DNS server on 53 (UDP) that answers
every A query with this host's address and logs each name asked to argv[2].

With argv[3:6] = CERT KEY CONNS: a TLS server on 9443 answering `tls-ok <sni>` and an HTTP/1
server on 8081 answering `http-ok <Host>` (an HTTP/1.0 request is answered only once the
client shut its sending side); each logs `<port> data` or `<port> nothing` (no byte ever
arrived) per connection to CONNS."""
import os
import socket
import ssl
import struct
import sys
import threading

ip, log = sys.argv[1], sys.argv[2]
lock = threading.Lock()


def note(conns, line):
    with lock, open(conns, "a") as f:
        f.write(line + "\n")


def arrived(c):
    """Whether any byte arrives (peeked, so the handshake still sees it)."""
    c.settimeout(5)
    try:
        return bool(c.recv(1, socket.MSG_PEEK))
    except OSError:
        return False


def tls_conn(c, ctx, conns):
    if not arrived(c):
        note(conns, "9443 nothing")
        c.close()
        return
    note(conns, "9443 data")
    try:
        s = ctx.wrap_socket(c, server_side=True)
        s.recv(64)
        s.sendall(f"tls-ok {getattr(s, 'asked', None)}\n".encode())
        s.close()
    except OSError:
        c.close()


def http_conn(c, conns):
    if not arrived(c):
        note(conns, "8081 nothing")
        c.close()
        return
    note(conns, "8081 data")
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = c.recv(4096)
            if not chunk:
                break
            data += chunk
        head = data.decode(errors="replace").split("\r\n")
        if head[0].endswith("HTTP/1.0"):
            while c.recv(4096):
                pass
        host = next((l.split(":", 1)[1].strip() for l in head if l.lower().startswith("host:")), None)
        c.sendall(f"HTTP/1.0 200 OK\r\n\r\nhttp-ok {host}\n".encode())
        c.close()
    except OSError:
        c.close()


def serve_named(port, handle):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((ip, port))
    l.listen(64)
    while True:
        c, _ = l.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


if len(sys.argv) > 5:
    cert, key, conns = sys.argv[3:6]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    def asked(sock, name, _ctx):
        sock.asked = name

    ctx.sni_callback = asked
    threading.Thread(target=serve_named, args=(9443, lambda c: tls_conn(c, ctx, conns)), daemon=True).start()
    threading.Thread(target=serve_named, args=(8081, lambda c: http_conn(c, conns)), daemon=True).start()


def serve(port):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((ip, port))
    l.listen(64)
    while True:
        c, _ = l.accept()
        c.sendall(f"hello-{port}\n".encode())
        c.close()


def dns():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((ip, 53))
    while True:
        q, peer = u.recvfrom(4096)
        at, labels = 12, []
        while q[at]:
            labels.append(q[at + 1:at + 1 + q[at]].decode(errors="replace"))
            at += 1 + q[at]
        qtype = struct.unpack(">H", q[at + 1:at + 3])[0]
        question = q[12:at + 5]
        with open(log, "a") as f:
            f.write(".".join(labels) + "\n")
        answers = b""
        if qtype == 1:
            answers = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(ip)
        header = q[:2] + b"\x81\x80" + struct.pack(">HHHH", 1, 1 if answers else 0, 0, 0)
        u.sendto(header + question + answers, peer)


for port in (8443, 8080):
    threading.Thread(target=serve, args=(port,), daemon=True).start()
open(log, "a").close()
print("ready", flush=True)
dns()
