/* Load or unload kernel code. */
#include "attack.h"

int main(void) {
    static char image[64];
    MUST_FAIL("init_module", EPERM, syscall(SYS_init_module, image, sizeof image, ""));
    int fd = open("/dev/null", O_RDONLY);
    MUST_FAIL("finit_module", EPERM, syscall(SYS_finit_module, fd, "", 0));
    MUST_FAIL("delete_module(ext4)", EPERM, syscall(SYS_delete_module, "ext4", O_NONBLOCK));
    return finish();
}
