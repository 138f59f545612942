/* Network probe run inside lockbox by tests/net.rs. Prints one line per check:
 * "ok <reply>" or "err <errno name>".
 *   tcp HOST PORT        blocking connect, send "ping", print the server's reply
 *   tcpnb HOST PORT      the same with a non-blocking connect (EINPROGRESS + poll)
 *   udp HOST PORT        sendto "ping" twice (the second on the installed host socket),
 *                        wait 2 s for a reply
 *   tcpmsg HOST PORT     from a process with two threads: connect, then "ping" with sendmsg
 *                        in two iovecs (calls the supervisor performs itself)
 *   udpc HOST PORT       connect, send, wait 2 s for a reply
 *   inside               serve TCP on 127.0.0.1 inside the sandbox and connect to it
 *   race GOOD BAD PORTG PORTB N   N connects to GOOD:PORTG while another thread and a
 *                        process sharing the memory keep rewriting the address to BAD:PORTB;
 *                        prints "connected C good G reached-bad K" (K: replies from BAD's server)
 *   race1 ...            the same with only the process rewriting (a single-threaded caller)
 *   listener             try to install a seccomp filter with a listener of our own
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static socklen_t addr_of(const char *host, int port, struct sockaddr_storage *ss) {
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a = (void *)ss;
    struct sockaddr_in6 *b = (void *)ss;
    if (inet_pton(AF_INET, host, &a->sin_addr) == 1) {
        a->sin_family = AF_INET;
        a->sin_port = htons(port);
        return sizeof *a;
    }
    if (inet_pton(AF_INET6, host, &b->sin6_addr) == 1) {
        b->sin6_family = AF_INET6;
        b->sin6_port = htons(port);
        return sizeof *b;
    }
    fprintf(stderr, "bad address %s\n", host);
    exit(2);
}

static int fail(void) {
    printf("err %s\n", strerrorname_np(errno));
    return 0;
}

static int reply(int s) {
    char buf[64] = {0};
    struct pollfd p = {s, POLLIN, 0};
    if (poll(&p, 1, 2000) != 1) { errno = ETIMEDOUT; return fail(); }
    ssize_t n = recv(s, buf, sizeof buf - 1, 0);
    if (n < 0) return fail();
    printf("ok %s\n", buf);
    return 0;
}

static int tcp(const char *host, int port, int nonblocking) {
    struct sockaddr_storage ss;
    socklen_t len = addr_of(host, port, &ss);
    int s = socket(ss.ss_family, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
    if (connect(s, (void *)&ss, len) < 0) {
        if (!nonblocking || errno != EINPROGRESS) return fail();
        struct pollfd p = {s, POLLOUT, 0};
        poll(&p, 1, 3000);
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err) { errno = err; return fail(); }
    }
    if (send(s, "ping", 4, 0) < 0) return fail();
    return reply(s);
}

static int udp(const char *host, int port, int connected) {
    struct sockaddr_storage ss;
    socklen_t len = addr_of(host, port, &ss);
    int s = socket(ss.ss_family, SOCK_DGRAM, 0);
    if (connected) {
        if (connect(s, (void *)&ss, len) < 0) return fail();
        if (send(s, "ping", 4, 0) < 0) return fail();
    } else if (sendto(s, "ping", 4, 0, (void *)&ss, len) < 0 ||
               sendto(s, "ping", 4, 0, (void *)&ss, len) < 0) {
        return fail();
    }
    return reply(s);
}

static void *sleeper(void *arg) {
    (void)arg;
    sleep(60);
    return NULL;
}

static int tcpmsg(const char *host, int port) {
    pthread_t t;
    pthread_create(&t, NULL, sleeper, NULL);
    struct sockaddr_storage ss;
    socklen_t len = addr_of(host, port, &ss);
    int s = socket(ss.ss_family, SOCK_STREAM, 0);
    if (connect(s, (void *)&ss, len) < 0) return fail();
    struct iovec iov[2] = {{"pi", 2}, {"ng", 2}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t n = sendmsg(s, &msg, 0);
    if (n != 4) { if (n >= 0) errno = EMSGSIZE; return fail(); }
    return reply(s);
}

static int inside(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(l, (void *)&a, len) < 0 || listen(l, 1) < 0) return fail();
    getsockname(l, (void *)&a, &len);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, len) < 0) return fail();
    int s = accept(l, NULL, NULL);
    send(s, "inside", 6, 0);
    return reply(c);
}

static volatile struct sockaddr_in *shared;
static struct sockaddr_storage good_ss, bad_ss;
static struct sockaddr_in good, bad;
static volatile int stop;

static void *flipper(void *arg) {
    (void)arg;
    for (unsigned i = 0; !stop; i++)
        *shared = (i & 1) ? bad : good;
    return NULL;
}

static int race(const char *g, const char *b, int pg, int pb, int n, int threaded) {
    addr_of(g, pg, &good_ss);
    addr_of(b, pb, &bad_ss);
    memcpy(&good, &good_ss, sizeof good);
    memcpy(&bad, &bad_ss, sizeof bad);
    shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    *shared = good;
    pid_t child = fork();
    if (child == 0) {
        for (unsigned i = 0;; i++)
            *shared = (i & 2) ? good : bad;
    }
    pthread_t t;
    if (threaded)
        pthread_create(&t, NULL, flipper, NULL);
    int reached_bad = 0, connected = 0, reached_good = 0;
    for (int i = 0; i < n; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (const void *)shared, sizeof *shared) == 0) {
            connected++;
            send(s, "ping", 4, MSG_NOSIGNAL);
            char buf[16] = {0};
            struct pollfd p = {s, POLLIN, 0};
            if (poll(&p, 1, 1000) == 1 && recv(s, buf, sizeof buf - 1, 0) > 0 &&
                strcmp(buf, "bad") == 0)
                reached_bad++;
            if (!strcmp(buf, "good"))
                reached_good++;
        }
        close(s);
    }
    stop = 1;
    if (threaded)
        pthread_join(t, NULL);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    printf("connected %d good %d reached-bad %d\n", connected, reached_good, reached_bad);
    return 0;
}

static int listener(void) {
    struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF);
    struct sock_fprog prog = {1, &allow};
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    long fd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    if (fd < 0) return fail();
    printf("ok listener\n");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && !strcmp(argv[1], "inside")) return inside();
    if (argc == 2 && !strcmp(argv[1], "listener")) return listener();
    if (argc == 4 && !strcmp(argv[1], "tcp")) return tcp(argv[2], atoi(argv[3]), 0);
    if (argc == 4 && !strcmp(argv[1], "tcpnb")) return tcp(argv[2], atoi(argv[3]), 1);
    if (argc == 4 && !strcmp(argv[1], "udp")) return udp(argv[2], atoi(argv[3]), 0);
    if (argc == 4 && !strcmp(argv[1], "tcpmsg")) return tcpmsg(argv[2], atoi(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "udpc")) return udp(argv[2], atoi(argv[3]), 1);
    if (argc == 7 && !strcmp(argv[1], "race"))
        return race(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), 1);
    if (argc == 7 && !strcmp(argv[1], "race1"))
        return race(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), 0);
    fprintf(stderr, "usage: see probe.c\n");
    return 2;
}
