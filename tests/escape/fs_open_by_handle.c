/* "Shocker": open a host file by a forged handle, bypassing every path-based wall. */
#include "attack.h"

struct handle {
    unsigned int handle_bytes;
    int handle_type;
    unsigned char f_handle[8];
};

int main(void) {
    struct handle h = {.handle_bytes = 8, .handle_type = 1}; /* ext4/xfs: inode 2 = root */
    h.f_handle[0] = 2;
    int mount_id;
    MUST_FAIL("name_to_handle_at(work)", EPERM,
              syscall(SYS_name_to_handle_at, AT_FDCWD, env("WORK"), &h, &mount_id, 0));
    int fd = open("/", O_RDONLY | O_DIRECTORY);
    MUST_FAIL("open_by_handle_at(forged root inode)", EPERM,
              syscall(SYS_open_by_handle_at, fd, &h, O_RDONLY));
    return finish();
}
