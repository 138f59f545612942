/* Make the read-only root and grants writable again. */
#include "attack.h"
#include <sys/mount.h>

struct mount_attr_ {
    unsigned long long attr_set, attr_clr, propagation, userns_fd;
};

int main(void) {
    MUST_FAIL("remount / rw", EPERM, mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND, NULL));
    MUST_FAIL("remount /usr rw", EPERM, mount(NULL, "/usr", NULL, MS_REMOUNT | MS_BIND, NULL));
    struct mount_attr_ attr = {.attr_clr = 0x1 /* MOUNT_ATTR_RDONLY */};
    MUST_FAIL("mount_setattr clear RDONLY", EPERM,
              syscall(SYS_mount_setattr, AT_FDCWD, "/", 0x8000 /* AT_RECURSIVE */, &attr, sizeof attr));
    MUST_FAIL("write /usr", 0, open("/usr/lockbox-pwned", O_CREAT | O_WRONLY, 0644));
    return finish();
}
