/* Plant a setuid (or setgid) executable in the writable grant, for the host to run later:
   for a root caller it would be a setuid-root binary. The host check also walks the grant. */
#include "attack.h"
#include <sys/sysmacros.h>

int main(void) {
    if (chdir(env("WORK")) != 0) return 3;
    int fd = open("plain", O_CREAT | O_WRONLY, 0755);
    if (fd < 0) return 3;
    MUST_FAIL("chmod 4755", EPERM, chmod("plain", 04755));
    MUST_FAIL("chmod 2755", EPERM, chmod("plain", 02755));
    MUST_FAIL("fchmod 4755", EPERM, fchmod(fd, 04755));
    MUST_FAIL("fchmodat 6755", EPERM, fchmodat(AT_FDCWD, "plain", 06755, 0));
    MUST_FAIL("fchmodat2 4755", EPERM, syscall(452, AT_FDCWD, "plain", 04755, 0));
    MUST_FAIL("fchmod 4755 with high bits", EPERM, syscall(SYS_fchmod, fd, 0xffff000004755L));
    MUST_FAIL("open O_CREAT 4755", EPERM, syscall(SYS_open, "o1", O_CREAT | O_WRONLY, 04755));
    MUST_FAIL("openat O_CREAT 4755", EPERM, openat(AT_FDCWD, "o2", O_CREAT | O_WRONLY, 04755));
    MUST_FAIL("creat 2755", EPERM, creat("o3", 02755));
    MUST_FAIL("mknod S_IFREG|4755", EPERM, mknod("o4", S_IFREG | 04755, 0));
    MUST_FAIL("mknodat S_IFREG|2755", EPERM, mknodat(AT_FDCWD, "o5", S_IFREG | 02755, 0));
    /* openat2's mode is in a struct the filter cannot read: the call answers ENOSYS (for a
       command of the runtime's agent too, which is the one process allowed openat2). */
    struct { unsigned long long flags, mode, resolve; } how = { O_CREAT | O_WRONLY, 04755, 0 };
    MUST_FAIL("openat2 O_CREAT 4755 (mode in memory)", ENOSYS,
              syscall(437, AT_FDCWD, "o6", &how, sizeof how));
    how.mode = 0755;
    MUST_FAIL("openat2 O_CREAT 0755 (any openat2)", ENOSYS,
              syscall(437, AT_FDCWD, "o7", &how, sizeof how));
    close(fd);
    unlink("plain");
    return finish();
}
