/* Mount over the constructed root: a tmpfs, a bind of the grant over /etc, a new proc. */
#include "attack.h"
#include <sys/mount.h>

int main(void) {
    MUST_FAIL("mount tmpfs", EPERM, mount("tmpfs", "/tmp", "tmpfs", 0, NULL));
    MUST_FAIL("bind grant over /etc", EPERM, mount(env("WORK"), "/etc", NULL, MS_BIND, NULL));
    MUST_FAIL("mount proc", EPERM, mount("proc", "/tmp", "proc", 0, NULL));
    MUST_FAIL("make / shared", EPERM, mount(NULL, "/", NULL, MS_SHARED | MS_REC, NULL));
    return finish();
}
