/* Push keystrokes into the caller's terminal (stdin is the caller's pty here), which the
   caller's shell would read and run after the sandbox exits. dev.tty.legacy_tiocsti may
   allow it on the host; seccomp must refuse it with EPERM, whatever the high bits of the
   request. */
#include "attack.h"
#include <sys/ioctl.h>
#include <termios.h>

int main(void) {
    if (!isatty(0)) {
        printf("WRONG: stdin is not a terminal\n");
        return 2;
    }
    char c = 'x';
    MUST_FAIL("TIOCSTI on stdin", EPERM, ioctl(0, TIOCSTI, &c));
    MUST_FAIL("TIOCSTI, high bits set", EPERM, syscall(SYS_ioctl, 0, 0xdead00000000UL | TIOCSTI, &c));
    int tty = open("/dev/tty", O_RDWR);
    MUST_FAIL("TIOCSTI on /dev/tty", EPERM, ioctl(tty, TIOCSTI, &c));
    char sel[2] = {2, 0}; /* TIOCL_PASTESEL */
    MUST_FAIL("TIOCLINUX paste", EPERM, ioctl(0, TIOCLINUX, sel));
    return finish();
}
