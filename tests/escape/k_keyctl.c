/* Kernel keyrings are not namespaced: the host user's keys live there. */
#include "attack.h"

int main(void) {
    MUST_FAIL("add_key", EPERM, syscall(SYS_add_key, "user", "lockbox", "x", 1, -3 /* session */));
    MUST_FAIL("keyctl(GET_KEYRING_ID, user)", EPERM, syscall(SYS_keyctl, 0, -4, 0));
    MUST_FAIL("request_key", EPERM, syscall(SYS_request_key, "user", "lockbox", NULL, 0));
    return finish();
}
