"""A test network's services, run inside its namespace by tests/net_names.rs: TCP servers
on 8443 and 8080 that greet with `hello-<port>`, and a DNS server on 53 (UDP) that answers
every A query with this host's address and logs each name asked to argv[2]."""
import socket
import struct
import sys
import threading

ip, log = sys.argv[1], sys.argv[2]


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
