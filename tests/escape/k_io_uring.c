/* io_uring performs operations seccomp never sees. */
#include "attack.h"

int main(void) {
    static char params[120];
    MUST_FAIL("io_uring_setup", EPERM, syscall(SYS_io_uring_setup, 8, params));
    MUST_FAIL("io_uring_enter", EPERM, syscall(SYS_io_uring_enter, 3, 1, 0, 0, NULL, 0));
    MUST_FAIL("io_uring_register", EPERM, syscall(SYS_io_uring_register, 3, 0, NULL, 0));
    return finish();
}
