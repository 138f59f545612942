"""Connect to the host's unix sockets: a path socket (outside the grants) and an abstract
one (abstract sockets belong to the network namespace)."""
import errno
import socket
from lib import must_fail, finish, env

def connect(addr):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(addr)

must_fail("path socket", lambda: connect(env("SOCK")), errno.ENOENT)
must_fail("abstract socket", lambda: connect("\0" + env("ABSTRACT")), errno.ECONNREFUSED)
must_fail("/run/dbus", lambda: connect("/run/dbus/system_bus_socket"), errno.ENOENT)
must_fail("docker.sock", lambda: connect("/var/run/docker.sock"), errno.ENOENT)
finish()
