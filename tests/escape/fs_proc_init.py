"""Reach lockbox's init (pid 1, outside the command's domain) through /proc."""
import os
from lib import must_fail, finish

def read(path):
    with open(path, "rb") as f:
        return f.read(16)

must_fail("init mem", lambda: read("/proc/1/mem"))
must_fail("init environ", lambda: read("/proc/1/environ"))
# Listing /proc/1/fd shows descriptor numbers only (the init is non-dumpable, so its /proc
# entries belong to the sandbox's uid 0: a root caller may list them); where they point is
# what must stay closed.
must_fail("init fd 0 target", lambda: os.readlink("/proc/1/fd/0"))
must_fail("init's fd 0 reopened", lambda: read("/proc/1/fd/0"))
must_fail("init map_files", lambda: os.listdir("/proc/1/map_files"))
finish()
