"""Send datagrams to the host's loopback UDP service; the test checks it got none."""
import socket
from lib import finish, env

port = int(env("UDP4"))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(5):
    try:
        s.sendto(b"lockbox-escape", ("127.0.0.1", port))
    except OSError as e:
        print("send:", e)
s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
try:
    s6.sendto(b"lockbox-escape", ("::ffff:127.0.0.1", port))
except OSError as e:
    print("send6:", e)
finish()
