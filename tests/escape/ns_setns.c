/* Join another namespace: the sandbox's own (harmless if it worked, but setns is denied),
   and the init's, which leads back to nothing; any setns is an escape route when a
   descriptor of a host namespace is reachable. */
#include "attack.h"
#include <sched.h>

int main(void) {
    const char *ns[] = {"mnt", "user", "net", "pid", "uts", "ipc", "cgroup"};
    for (unsigned i = 0; i < sizeof ns / sizeof *ns; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/ns/%s", ns[i]);
        int fd = open(path, O_RDONLY);
        MUST_FAIL(path, EPERM, setns(fd, 0));
        snprintf(path, sizeof path, "/proc/1/ns/%s", ns[i]);
        MUST_FAIL(path, EACCES, open(path, O_RDONLY));
    }
    return finish();
}
