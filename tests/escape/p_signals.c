/* Signal host processes: the victim by pid, lockbox's init, and the process group the
   command shares with lockbox and the victim (kill(0, ...)), and every process (-1).
   The attack ignores SIGTERM itself; the test checks the victim survived. */
#include "attack.h"

int main(void) {
    pid_t victim = atoi(env("VICTIM"));
    signal(SIGTERM, SIG_IGN);
    MUST_FAIL("kill(victim)", ESRCH, kill(victim, SIGKILL));
    MUST_FAIL("tgkill(victim)", ESRCH, syscall(SYS_tgkill, victim, victim, SIGKILL));
    MUST_FAIL("kill(init, SIGKILL)", EPERM, kill(1, SIGKILL));
    MUST_FAIL("kill(-victim)", ESRCH, kill(-victim, SIGTERM));
    /* These reach the attack itself, so they "succeed"; what matters is who else got it. */
    kill(0, SIGTERM);
    kill(-1, SIGTERM);
    return finish();
}
