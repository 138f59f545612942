/* Personality flags that weaken exploit mitigations; modify_ldt (16-bit segments). */
#include "attack.h"
#include <sys/personality.h>

int main(void) {
    MUST_FAIL("READ_IMPLIES_EXEC", EPERM, syscall(SYS_personality, READ_IMPLIES_EXEC));
    MUST_FAIL("ADDR_NO_RANDOMIZE", EPERM, syscall(SYS_personality, ADDR_NO_RANDOMIZE));
    static char ldt[16];
    MUST_FAIL("modify_ldt", EPERM, syscall(SYS_modify_ldt, 1, ldt, sizeof ldt));
    return finish();
}
