/* A new user namespace gives every capability back (and most kernel exploits start
   there); other namespaces need a capability. */
#include "attack.h"
#include <sched.h>

int main(void) {
    MUST_FAIL("unshare(NEWUSER)", EPERM, unshare(CLONE_NEWUSER));
    MUST_FAIL("unshare(NEWUSER|NEWNS)", EPERM, unshare(CLONE_NEWUSER | CLONE_NEWNS));
    MUST_FAIL("clone(NEWUSER)", EPERM, syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0));
    MUST_FAIL("clone3", ENOSYS, syscall(SYS_clone3, NULL, 0));
    MUST_FAIL("unshare(NEWNS)", EPERM, unshare(CLONE_NEWNS));
    MUST_FAIL("unshare(NEWPID)", EPERM, unshare(CLONE_NEWPID));
    MUST_FAIL("unshare(NEWNET)", EPERM, unshare(CLONE_NEWNET));
    return finish();
}
