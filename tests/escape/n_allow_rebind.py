"""DNS rebinding: the allowed name points elsewhere after the sandbox started (the test
rewrites the host's hosts file lockbox resolved from), or an in-sandbox resolver says so.
The pinned address must stay the only one reachable."""
import errno
import os
import socket
import time
from lib import must_fail, must_work, connect, finish, env

name, allow, hostip = env("REBIND_NAME"), int(env("ALLOW_TCP")), env("HOSTIP")
work = env("WORK")
V4 = socket.AF_INET

def resolved():
    return sorted({a[4][0] for a in socket.getaddrinfo(name, allow, V4, socket.SOCK_STREAM)})

def pinned():
    got = resolved()
    if got != ["127.0.0.2"]:
        raise OSError(errno.EINVAL, f"resolves to {got}")
    return got

must_work("the name resolves to the pinned 127.0.0.2", pinned)
must_work("the allowed name:port", lambda: connect(V4, (name, allow)))
open(os.path.join(work, "rebind-ready"), "w").close()
for _ in range(2000):
    if os.path.exists(os.path.join(work, "rebind-go")):
        break
    time.sleep(0.01)
else:
    print("WRONG: the host never rebound the name")
# The host now maps the name to its own address; the sandbox keeps the pinned one.
must_work("after rebinding the name still resolves to 127.0.0.2", pinned)
must_work("after rebinding the name still connects", lambda: connect(V4, (name, allow)))
must_fail("the rebound address on the allowed port", lambda: connect(V4, (hostip, allow)), errno.EACCES)
# What an in-sandbox resolver would answer does not matter either: the rules hold addresses.
def write_hosts():
    with open("/etc/hosts", "a") as f:
        f.write(f"{hostip} {name}\n")
must_fail("rewrite the sandbox's /etc/hosts", write_hosts, errno.EROFS, errno.EACCES, errno.EPERM)
u = socket.socket(V4, socket.SOCK_DGRAM)
must_fail("ask a public DNS server", lambda: u.sendto(b"\0" * 12, ("1.1.1.1", 53)), errno.EACCES)
finish()
