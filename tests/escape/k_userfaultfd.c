/* userfaultfd pauses the kernel mid-copy: a staple of race exploits. */
#include "attack.h"

int main(void) {
    MUST_FAIL("userfaultfd()", EPERM, syscall(SYS_userfaultfd, O_CLOEXEC));
    MUST_FAIL("userfaultfd(UFFD_USER_MODE_ONLY)", EPERM, syscall(SYS_userfaultfd, 1));
    MUST_FAIL("/dev/userfaultfd", ENOENT, open("/dev/userfaultfd", O_RDWR));
    return finish();
}
