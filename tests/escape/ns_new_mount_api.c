/* The new mount API (fsopen/fsmount/move_mount/open_tree/fspick/open_tree_attr). */
#include "attack.h"

int main(void) {
    MUST_FAIL("fsopen(tmpfs)", EPERM, syscall(SYS_fsopen, "tmpfs", 0));
    MUST_FAIL("fspick(/)", EPERM, syscall(SYS_fspick, AT_FDCWD, "/", 0));
    MUST_FAIL("open_tree(/usr, CLONE)", EPERM, syscall(SYS_open_tree, AT_FDCWD, "/usr", 1));
    MUST_FAIL("open_tree_attr(/usr)", EPERM, syscall(467, AT_FDCWD, "/usr", 1, NULL, 0));
    MUST_FAIL("fsmount", EPERM, syscall(SYS_fsmount, 3, 0, 0));
    MUST_FAIL("fsconfig", EPERM, syscall(SYS_fsconfig, 3, 6, NULL, NULL, 0));
    MUST_FAIL("move_mount", EPERM, syscall(SYS_move_mount, AT_FDCWD, "/tmp", AT_FDCWD, "/etc", 0));
    return finish();
}
