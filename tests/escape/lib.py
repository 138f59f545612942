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
