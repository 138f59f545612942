/* Shared by the C attacks: each step must fail, with the errno the wall gives. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static int escaped, wrong;

/* `call` must fail (return < 0) with errno `want` (0: any errno). */
#define MUST_FAIL(desc, want, call)                                                     \
    do {                                                                                \
        errno = 0;                                                                      \
        long r_ = (long)(call);                                                         \
        int e_ = errno;                                                                 \
        if (r_ >= 0) {                                                                  \
            printf("ESCAPED: %s succeeded (%ld)\n", desc, r_);                          \
            escaped = 1;                                                                \
        } else if ((want) != 0 && e_ != (want)) {                                       \
            printf("WRONG: %s failed with %s, expected %s\n", desc, strerror(e_),       \
                   strerror(want));                                                     \
            wrong = 1;                                                                  \
        } else {                                                                        \
            printf("ok: %s: %s\n", desc, strerror(e_));                                 \
        }                                                                               \
        fflush(stdout);                                                                 \
    } while (0)

static const char *env(const char *name) {
    const char *v = getenv(name);
    if (!v) {
        printf("WRONG: %s not set\n", name);
        exit(3);
    }
    return v;
}

static int finish(void) {
    if (escaped) {
        printf("ESCAPED\n");
        return 1;
    }
    if (wrong) return 2;
    printf("BLOCKED\n");
    return 0;
}
