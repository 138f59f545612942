/* Use a descriptor the caller leaked (lockbox is started with a host directory open on fd 9,
   not close-on-exec) to reach the host through openat(fd, ...). */
#include "attack.h"
#include <dirent.h>

int main(void) {
    for (int fd = 3; fd < 4096; fd++) {
        if (fcntl(fd, F_GETFD) >= 0) {
            char link[64], target[512] = "";
            snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
            readlink(link, target, sizeof target - 1);
            printf("ESCAPED: descriptor %d is open (%s)\n", fd, target);
            escaped = 1;
            MUST_FAIL("openat(leaked, secret)", 0, openat(fd, "secret", O_RDONLY));
        }
    }
    MUST_FAIL("openat(9, secret)", EBADF, openat(9, "secret", O_RDONLY));
    MUST_FAIL("fchdir(9)", EBADF, fchdir(9));
    return finish();
}
