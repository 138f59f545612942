/* Unmount what lockbox mounted, to uncover what lies beneath. */
#include "attack.h"
#include <sys/mount.h>

int main(void) {
    MUST_FAIL("umount /proc/sys", EPERM, umount2("/proc/sys", MNT_DETACH));
    MUST_FAIL("umount /proc", EPERM, umount2("/proc", MNT_DETACH));
    MUST_FAIL("umount /etc", EPERM, umount2("/etc", MNT_DETACH));
    MUST_FAIL("umount /", EPERM, umount2("/", MNT_DETACH));
    return finish();
}
