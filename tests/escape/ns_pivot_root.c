/* pivot_root to get the old root back (or a new one). */
#include "attack.h"

int main(void) {
    MUST_FAIL("pivot_root(., .)", EPERM, syscall(SYS_pivot_root, ".", "."));
    MUST_FAIL("pivot_root(/tmp, /tmp)", EPERM, syscall(SYS_pivot_root, "/tmp", "/tmp"));
    return finish();
}
