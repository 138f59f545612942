/* bench/net helper. Server and client of the network benchmark:
 *   netbench serve IP PORT          accept forever; read and discard until EOF, then close
 *   netbench connect HOST PORT N    N sequential connect + request head + close (reset);
 *                                   prints mean microseconds
 *   netbench bulk HOST PORT MIB     a request head, then MIB MiB on one connection; prints MiB/s
 * HOST is resolved once (getaddrinfo), so a name goes through lockbox's resolver; every
 * connection starts with `GET / HTTP/1.1` + `Host: HOST`, the first flight the relay of a
 * name-allowed connection checks (the server discards it like the rest).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netdb.h>
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

static struct sockaddr_in addr(const char *host, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) == 1) return a;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, NULL, &hints, &res)) { fprintf(stderr, "cannot resolve %s\n", host); exit(1); }
    a.sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return a;
}

static void head(int s, const char *host) {
    char h[512];
    int n = snprintf(h, sizeof h, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host);
    if (write(s, h, n) != n) { perror("write"); exit(1); }
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
            head(s, argv[2]);
            /* Reset, not FIN: thousands of TIME_WAIT connections to one non-loopback
             * address make the kernel's search for a free port the cost measured. */
            struct linger lg = {1, 0};
            setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            close(s);
        }
        printf("%.1f\n", (now() - t0) / n * 1e6);
        return 0;
    }
    if (!strcmp(argv[1], "bulk")) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (void *)&a, sizeof a)) { perror("connect"); return 1; }
        head(s, argv[2]);
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
