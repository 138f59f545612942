/* Fork until the process limit stops it; every child sleeps. The command then exits and
   the sandbox must take every child with it (the test checks none is left). */
#include "attack.h"
#include <sys/wait.h>

int main(void) {
    for (int i = 0; i < 100000; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            sleep(300);
            _exit(0);
        }
        if (pid < 0) {
            printf("ok: fork stopped after %d children: %s\n", i, strerror(errno));
            printf("BLOCKED\n");
            return 0;
        }
    }
    printf("ESCAPED: 100000 forks\n");
    return 1;
}
