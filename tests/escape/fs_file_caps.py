"""Plant a file capability (security.capability xattr, e.g. cap_setuid+ep) on an executable
in the writable grant, for the host to run later: it needs CAP_SETFCAP, which the sandbox
lacks."""
import errno
import os
import shutil
import struct
from lib import must_fail, finish, env

path = os.path.join(env("WORK"), "capped")
shutil.copy("/bin/true", path)
# VFS_CAP_REVISION_2, effective; permitted = CAP_SETUID (7) | CAP_SYS_ADMIN (21).
cap = struct.pack("<IIIII", 0x02000001, (1 << 7) | (1 << 21), 0, 0, 0)
must_fail("setxattr security.capability", lambda: os.setxattr(path, "security.capability", cap), errno.EPERM)
must_fail("setxattr trusted.x", lambda: os.setxattr(path, "trusted.lockbox", b"1"), errno.EPERM)
os.unlink(path)
finish()
