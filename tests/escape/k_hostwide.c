/* Host-wide state: clock, reboot, swap, accounting, hostname, kernel log, quotas, NUMA,
   secret memory, page-cache probing, LSM labels. The test also checks the host's hostname. */
#include "attack.h"
#include <sys/time.h>
#include <sys/timex.h>
#include <linux/reboot.h>
#include <time.h>

int main(void) {
    struct timeval tv = {0};
    struct timespec ts = {0};
    struct timex tx = {.modes = ADJ_OFFSET, .offset = 1000};
    MUST_FAIL("settimeofday", EPERM, settimeofday(&tv, NULL));
    MUST_FAIL("clock_settime", EPERM, clock_settime(CLOCK_REALTIME, &ts));
    MUST_FAIL("adjtimex", EPERM, syscall(SYS_adjtimex, &tx));
    MUST_FAIL("clock_adjtime", EPERM, syscall(SYS_clock_adjtime, CLOCK_REALTIME, &tx));
    MUST_FAIL("reboot(CAD_OFF)", EPERM,
              syscall(SYS_reboot, LINUX_REBOOT_MAGIC1, LINUX_REBOOT_MAGIC2, LINUX_REBOOT_CMD_CAD_OFF, NULL));
    MUST_FAIL("swapoff", EPERM, syscall(SYS_swapoff, "/tmp/x"));
    MUST_FAIL("acct", EPERM, syscall(SYS_acct, "/tmp/acct"));
    MUST_FAIL("sethostname", EPERM, sethostname("pwned", 5));
    MUST_FAIL("syslog(READ_ALL)", EPERM, syscall(SYS_syslog, 3, (char[64]){0}, 64));
    MUST_FAIL("quotactl_fd", EPERM, syscall(443, 0, 0, 0, NULL));
    MUST_FAIL("set_mempolicy", EPERM, syscall(SYS_set_mempolicy, 0, NULL, 0));
    MUST_FAIL("memfd_secret", EPERM, syscall(447, 0));
    int fd = open("/etc/passwd", O_RDONLY);
    char cs[64];
    struct { unsigned long long off, len; } range = {0, 0};
    MUST_FAIL("cachestat(/etc/passwd)", EPERM, syscall(451, fd, &range, cs, 0));
    MUST_FAIL("lsm_set_self_attr", EPERM, syscall(460, 100, NULL, 0, 0));
    MUST_FAIL("vhangup", EPERM, syscall(SYS_vhangup));
    MUST_FAIL("fanotify_init", EPERM, syscall(SYS_fanotify_init, 0, 0));
    return finish();
}
