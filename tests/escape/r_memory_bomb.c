/* Allocate and touch 4 GiB in 1 MiB steps. Allocation must fail or the sandbox be killed. */
#include "attack.h"

int main(void) {
    for (int i = 0; i < 4096; i++) {
        char *p = malloc(1 << 20);
        if (!p) {
            printf("ok: malloc failed after %d MiB\nBLOCKED\n", i);
            return 0;
        }
        memset(p, 1, 1 << 20);
    }
    printf("ESCAPED: 4 GiB allocated\n");
    return 1;
}
