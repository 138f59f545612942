/* Trace lockbox's init (pid 1 inside) or the host victim. */
#include "attack.h"
#include <sys/ptrace.h>

int main(void) {
    pid_t victim = atoi(env("VICTIM"));
    MUST_FAIL("PTRACE_ATTACH init", EPERM, ptrace(PTRACE_ATTACH, 1, 0, 0));
    MUST_FAIL("PTRACE_SEIZE init", EPERM, ptrace(PTRACE_SEIZE, 1, 0, 0));
    MUST_FAIL("PTRACE_ATTACH host victim", ESRCH, ptrace(PTRACE_ATTACH, victim, 0, 0));
    return finish();
}
