/* bench/net helper. Server and client of the network benchmark:
 *   netbench serve IP PORT          accept forever; read and discard until EOF, then close
 *   netbench connect IP PORT N      N sequential connect+close; prints mean microseconds
 *   netbench bulk IP PORT MIB       send MIB MiB on one connection; prints MiB/s
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static struct sockaddr_in addr(const char *ip, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    struct sockaddr_in a = addr(argv[2], atoi(argv[3]));
    static char buf[1 << 20];
    if (!strcmp(argv[1], "serve")) {
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (void *)&a, sizeof a) || listen(l, 512)) { perror("bind"); return 1; }
        for (;;) {
            int c = accept(l, NULL, NULL);
            while (read(c, buf, sizeof buf) > 0) {}
            close(c);
        }
    }
    if (argc < 5) return 2;
    long n = atol(argv[4]);
    if (!strcmp(argv[1], "connect")) {
        double t0 = now();
        for (long i = 0; i < n; i++) {
            int s = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(s, (void *)&a, sizeof a)) { perror("connect"); return 1; }
            close(s);
        }
        printf("%.1f\n", (now() - t0) / n * 1e6);
        return 0;
    }
    if (!strcmp(argv[1], "bulk")) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (void *)&a, sizeof a)) { perror("connect"); return 1; }
        memset(buf, 'x', sizeof buf);
        double t0 = now();
        for (long i = 0; i < n; i++)
            for (size_t off = 0; off < sizeof buf;) {
                ssize_t w = write(s, buf + off, sizeof buf - off);
                if (w <= 0) { perror("write"); return 1; }
                off += w;
            }
        shutdown(s, SHUT_WR);
        while (read(s, buf, sizeof buf) > 0) {}
        printf("%.0f\n", n / (now() - t0));
        return 0;
    }
    return 2;
}
