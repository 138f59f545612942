/* Replace the running kernel. */
#include "attack.h"

int main(void) {
    MUST_FAIL("kexec_load", EPERM, syscall(SYS_kexec_load, 0, 0, NULL, 0));
    int fd = open("/dev/null", O_RDONLY);
    MUST_FAIL("kexec_file_load", EPERM, syscall(SYS_kexec_file_load, fd, fd, 1, "", 0));
    return finish();
}
