/* Open descriptors until the limit, then try to raise the limit. */
#include "attack.h"
#include <sys/resource.h>

int main(void) {
    int n = 0;
    while (open("/dev/null", O_RDONLY) >= 0) {
        if (++n > 100000) {
            printf("ESCAPED: 100000 descriptors\n");
            return 1;
        }
    }
    printf("ok: open stopped after %d: %s\n", n, strerror(errno));
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max = rl.rlim_max * 2;
    MUST_FAIL("raise RLIMIT_NOFILE hard limit", EPERM, setrlimit(RLIMIT_NOFILE, &rl));
    return finish();
}
