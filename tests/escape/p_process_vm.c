/* Read or write another process's memory; steal its descriptors. */
#include "attack.h"
#include <sys/uio.h>

int main(void) {
    pid_t victim = atoi(env("VICTIM"));
    char buf[8] = {0};
    struct iovec local = {buf, sizeof buf}, remote = {(void *)0x400000, sizeof buf};
    MUST_FAIL("process_vm_writev(init)", EPERM, process_vm_writev(1, &local, 1, &remote, 1, 0));
    MUST_FAIL("process_vm_writev(victim)", EPERM, process_vm_writev(victim, &local, 1, &remote, 1, 0));
    MUST_FAIL("process_vm_readv(init)", EPERM, process_vm_readv(1, &local, 1, &remote, 1, 0));
    MUST_FAIL("process_vm_readv(victim)", ESRCH, process_vm_readv(victim, &local, 1, &remote, 1, 0));
    int pidfd = syscall(SYS_pidfd_open, 1, 0);
    MUST_FAIL("pidfd_getfd(init, 0)", EPERM, syscall(SYS_pidfd_getfd, pidfd, 0, 0));
    MUST_FAIL("pidfd_open(victim)", ESRCH, syscall(SYS_pidfd_open, victim, 0));
    return finish();
}
