/* A 64-bit process entering the kernel through int 0x80 uses the i386 syscall table, where
   the numbers mean other calls: a deny list keyed on x86_64 numbers would not see it. The
   filter must kill the process (SIGSYS) before the call runs. i386 20 is getpid. */
#include "attack.h"

int main(void) {
    long ret;
    printf("trying int 0x80\n");
    fflush(stdout);
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory");
    printf("ESCAPED: int 0x80 returned %ld\n", ret);
    return 1;
}
