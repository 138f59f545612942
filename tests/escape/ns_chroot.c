/* The classic chroot escape: chroot into a subdirectory while keeping a descriptor of the
   current root, fchdir back out and walk up past the old root. */
#include "attack.h"
#include <sys/stat.h>

int main(void) {
    int keep = open("/", O_RDONLY | O_DIRECTORY);
    mkdir("/tmp/jail", 0755);
    MUST_FAIL("chroot(/tmp/jail)", EPERM, chroot("/tmp/jail"));
    if (fchdir(keep) == 0) {
        for (int i = 0; i < 64; i++) chdir("..");
    }
    MUST_FAIL("chroot(.)", EPERM, chroot("."));
    MUST_FAIL("secret after walking up", 0, open(env("SECRET"), O_RDONLY));
    return finish();
}
