"""With --net host the host's abstract unix sockets share the namespace: Landlock's scope
(ABI >= 6) must still refuse connecting to a socket outside the sandbox."""
import errno
import socket
from lib import must_fail, finish, env

def connect(addr):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(addr)

must_fail("abstract socket with --net host", lambda: connect("\0" + env("ABSTRACT")), errno.EPERM)
finish()
