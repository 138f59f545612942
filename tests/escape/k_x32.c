/* x32 syscalls are x86_64 numbers with bit 30 set; x32 mount must kill, not run. */
#include "attack.h"

int main(void) {
    printf("trying x32 mount\n");
    fflush(stdout);
    long r = syscall(0x40000000L | SYS_mount, "tmpfs", "/tmp", "tmpfs", 0, NULL);
    printf("ESCAPED: x32 mount returned %ld (%s)\n", r, strerror(errno));
    return 1;
}
