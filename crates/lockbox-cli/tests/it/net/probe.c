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
 *   flood N HOST PORT    N children (two threads each, so the supervisor performs their
 *                        calls) block in a 1 MiB sendmsg on a full TCP socket, or one in
 *                        four in a connect to a listener whose backlog is full, all inside
 *                        the sandbox, and are killed with SIGKILL; prints "flooded N", waits
 *                        for stdin to close, then checks HOST:PORT as `tcp` does
 *   cmsg HOST PORT       sendmsg of a datagram to HOST:PORT with each control message (and
 *                        MSG_ZEROCOPY on a socket with SO_ZEROCOPY): on a new socket each
 *                        ("r0-"), then on one host socket ("r1-"); one line per case,
 *                        "<case> ok" or "<case> err <errno>", the payload being the case
 *   sockopt              setsockopt of an IPv6 routing header, of IPv4 options and of
 *                        IP_TTL: "<name> ok" or "<name> err <errno>"
 *   bulkmsg              from a process with two threads (the supervisor performs its
 *                        sends), 4 MiB in sendmsg calls of two iovecs to a reader inside that
 *                        starts late; prints the reader's "read N HASH", then "sent N HASH"
 *   sndtimeo             from a process with two threads, sendmsg on a full socket with a
 *                        200 ms SO_SNDTIMEO: "err EAGAIN" once the time is up
 *   starve N HOST PORT   N live children (two threads each) block in sendmsg on a full
 *                        socket inside, more than the supervisor has slots for; meanwhile a
 *                        process with two threads connects to HOST:PORT ("tcp" line) and
 *                        sends 256 KiB in sendmsg calls to a reader inside ("sent N")
 *   unixcred             from a process with two threads, sendmsg on a unix datagram
 *                        socketpair whose receiver has SO_PASSCRED: "err <errno>", or
 *                        "pid mine" / "pid other" for the pid the receiver got
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
#include <linux/sockios.h>
#include <linux/seccomp.h>
#include <sys/ioctl.h>
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

/* Bytes a TCP socket has sent that its peer has not yet acknowledged. */
static int in_flight(int fd) {
    int queued = 0, unsent = 0;
    if (ioctl(fd, SIOCOUTQ, &queued) < 0 || ioctl(fd, SIOCOUTQNSD, &unsent) < 0) return 0;
    return queued - unsent;
}

/* Fills a connected TCP socket's buffers until a send would block, and stays so. The
 * first EAGAIN is not enough: on a loaded machine the loopback's acknowledgements of the
 * last bytes sent arrive later (softirqs deferred), and each frees room again (seen once
 * in CI). So it waits until nothing is in flight (5 s at most) and fills again, until a
 * fill with nothing in flight finds no room. Returns 0, or -1 on an error but EAGAIN. */
static int fill(int fd) {
    static char chunk[1 << 16];
    for (;;) {
        int sent = 0;
        while (send(fd, chunk, sizeof chunk, MSG_DONTWAIT) > 0) sent = 1;
        if (errno != EAGAIN) return -1;
        if (!sent && in_flight(fd) == 0) return 0;
        for (int i = 0; i < 5000 && in_flight(fd) > 0; i++) usleep(1000);
    }
}

static int flood(int n, const char *host, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in b = a;
    socklen_t len = sizeof a;
    /* A listener that never accepts nor reads, and a connection to it whose buffers are
     * full (made single-threaded: the kernel's own path). */
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(l, (void *)&a, len) < 0 || listen(l, 1) < 0) return fail();
    getsockname(l, (void *)&a, &len);
    int full = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(full, (void *)&a, len) < 0) return fail();
    if (fill(full) < 0) return fail();
    /* A listener whose accept queue is full: further connects stay in SYN_SENT. */
    int l2 = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(l2, (void *)&b, len) < 0 || listen(l2, 0) < 0) return fail();
    getsockname(l2, (void *)&b, &len);
    for (int i = 0; i < 4; i++) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        connect(c, (void *)&b, len);
    }
    size_t big = 1 << 20;
    char *data = calloc(1, big);
    for (int i = 0; i < n; i++) {
        int p[2];
        if (pipe(p) < 0) return fail();
        pid_t child = fork();
        if (child == 0) {
            pthread_t t;
            pthread_create(&t, NULL, sleeper, NULL);
            write(p[1], "x", 1);
            if (i % 4 == 3) {
                int c = socket(AF_INET, SOCK_STREAM, 0);
                connect(c, (void *)&b, len);
            } else {
                struct iovec iov = {data, big};
                struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
                sendmsg(full, &m, 0);
            }
            _exit(0);
        }
        char x;
        read(p[0], &x, 1);
        /* Time for the supervisor to take the call (the test counts what it holds). */
        usleep(20000);
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        close(p[0]);
        close(p[1]);
    }
    printf("flooded %d\n", n);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {}
    return tcp(host, port, 0);
}

static void cmsg_case(int s, const char *round, const char *name, const struct sockaddr_storage *ss,
                      socklen_t len, int level, int type, const void *data, size_t dlen, int flags) {
    char ctl[CMSG_SPACE(64)];
    memset(ctl, 0, sizeof ctl);
    char payload[64];
    snprintf(payload, sizeof payload, "%s-%s", round, name);
    struct iovec iov = {payload, strlen(payload)};
    struct msghdr m = {.msg_name = (void *)ss, .msg_namelen = len, .msg_iov = &iov, .msg_iovlen = 1};
    if (dlen) {
        m.msg_control = ctl;
        m.msg_controllen = CMSG_SPACE(dlen);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = level;
        c->cmsg_type = type;
        c->cmsg_len = CMSG_LEN(dlen);
        memcpy(CMSG_DATA(c), data, dlen);
    }
    if (sendmsg(s, &m, flags) < 0)
        printf("%s err %s\n", payload, strerrorname_np(errno));
    else
        printf("%s ok\n", payload);
}

static int cmsgs(const char *host, int port) {
    struct sockaddr_storage ss;
    socklen_t len = addr_of(host, port, &ss);
    int mark = 42, prio_high = 7, ttl = 33, on = 1;
    struct in_pktinfo pktinfo = {0};
    pktinfo.ipi_spec_dst.s_addr = htonl(0x7f000003);
    unsigned char lsrr[8] = {0x83, 7, 4, 127, 0, 0, 3, 0};
    struct ucred cred = {getpid(), getuid(), getgid()};
    int host_socket = socket(AF_INET, SOCK_DGRAM, 0);
    cmsg_case(host_socket, "r1", "first", &ss, len, 0, 0, NULL, 0, 0);
    for (int round = 0; round < 2; round++) {
        const char *r = round ? "r1" : "r0";
#define CASE(name, level, type, data, dlen, flags)                                           \
        do {                                                                                 \
            int s = round ? host_socket : socket(AF_INET, SOCK_DGRAM, 0);                     \
            cmsg_case(s, r, name, &ss, len, level, type, data, dlen, flags);                  \
            if (!round) close(s);                                                            \
        } while (0)
        CASE("plain", 0, 0, NULL, 0, 0);
        CASE("ttl", IPPROTO_IP, IP_TTL, &ttl, sizeof ttl, 0);
        CASE("mark", SOL_SOCKET, SO_MARK, &mark, sizeof mark, 0);
        CASE("priority7", SOL_SOCKET, SO_PRIORITY, &prio_high, sizeof prio_high, 0);
        CASE("pktinfo", IPPROTO_IP, IP_PKTINFO, &pktinfo, sizeof pktinfo, 0);
        CASE("lsrr", IPPROTO_IP, IP_RETOPTS, lsrr, sizeof lsrr, 0);
        CASE("credentials", SOL_SOCKET, SCM_CREDENTIALS, &cred, sizeof cred, 0);
#undef CASE
        int z = socket(AF_INET, SOCK_DGRAM, 0);
        if (round) {
            cmsg_case(z, r, "zc-first", &ss, len, 0, 0, NULL, 0, 0);
        }
        setsockopt(z, SOL_SOCKET, SO_ZEROCOPY, &on, sizeof on);
        cmsg_case(z, r, "zerocopy", &ss, len, 0, 0, NULL, 0, MSG_ZEROCOPY);
        close(z);
    }
    return 0;
}

static int sockopts(void) {
    int s6 = socket(AF_INET6, SOCK_DGRAM, 0);
    /* A segment routing header whose one segment is the first hop. */
    unsigned char srh[24] = {0, 2, 4, 0, 0, 0, 0, 0};
    inet_pton(AF_INET6, "2001:db8::1", srh + 8);
    if (setsockopt(s6, IPPROTO_IPV6, IPV6_RTHDR, srh, sizeof srh) < 0)
        printf("rthdr err %s\n", strerrorname_np(errno));
    else
        printf("rthdr ok\n");
    int s4 = socket(AF_INET, SOCK_DGRAM, 0);
    unsigned char rr[8] = {7, 7, 4, 0, 0, 0, 0, 0}; /* record route: no privilege needed */
    if (setsockopt(s4, IPPROTO_IP, IP_OPTIONS, rr, sizeof rr) < 0)
        printf("ipoptions err %s\n", strerrorname_np(errno));
    else
        printf("ipoptions ok\n");
    int ttl = 9;
    if (setsockopt(s4, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl) < 0)
        printf("ttl err %s\n", strerrorname_np(errno));
    else
        printf("ttl ok\n");
    return 0;
}

/* A listener on the sandbox's loopback and its address. */
static int listen_inside(struct sockaddr_in *a, int backlog) {
    socklen_t len = sizeof *a;
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(l, (void *)a, len) < 0 || listen(l, backlog) < 0) return -1;
    getsockname(l, (void *)a, &len);
    return l;
}

static unsigned long hash(unsigned long h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = h * 31 + p[i];
    return h;
}

static int bulkmsg(void) {
    struct sockaddr_in a;
    int l = listen_inside(&a, 1);
    if (l < 0) return fail();
    pid_t reader = fork();
    if (reader == 0) {
        int s = accept(l, NULL, NULL);
        usleep(300000); /* the sender's buffers fill: its calls must wait */
        static unsigned char buf[1 << 16];
        unsigned long h = 0, n = 0;
        ssize_t r;
        while ((r = read(s, buf, sizeof buf)) > 0) {
            h = hash(h, buf, r);
            n += r;
        }
        printf("read %lu %lx\n", n, h);
        _exit(0);
    }
    pthread_t t;
    pthread_create(&t, NULL, sleeper, NULL);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a) < 0) return fail();
    size_t total = 4 << 20, off = 0;
    unsigned char *data = malloc(total);
    for (size_t i = 0; i < total; i++) data[i] = (unsigned char)(i * 7 % 251);
    while (off < total) {
        size_t left = total - off, first = left / 3;
        struct iovec iov[2] = {{data + off, first}, {data + off + first, left - first}};
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
        ssize_t n = sendmsg(c, &m, 0);
        if (n <= 0) return fail();
        off += n;
    }
    close(c);
    waitpid(reader, NULL, 0);
    printf("sent %zu %lx\n", total, hash(0, data, total));
    return 0;
}

static int sndtimeo(void) {
    struct sockaddr_in a;
    int l = listen_inside(&a, 1);
    if (l < 0) return fail();
    int full = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(full, (void *)&a, sizeof a) < 0) return fail();
    static char chunk[1 << 16];
    if (fill(full) < 0) return fail();
    struct timeval tv = {0, 200000};
    setsockopt(full, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    pthread_t t;
    pthread_create(&t, NULL, sleeper, NULL);
    struct iovec iov = {chunk, 1024};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (sendmsg(full, &m, 0) < 0) return fail();
    printf("sent\n");
    return 0;
}

static int starve(int n, const char *host, int port) {
    struct sockaddr_in a, b;
    int l = listen_inside(&a, 1), l2 = listen_inside(&b, 1);
    if (l < 0 || l2 < 0) return fail();
    int full = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(full, (void *)&a, sizeof a) < 0) return fail();
    static char chunk[1 << 16];
    if (fill(full) < 0) return fail();
    pid_t *children = calloc(n, sizeof *children);
    for (int i = 0; i < n; i++) {
        int p[2];
        if (pipe(p) < 0) return fail();
        children[i] = fork();
        if (children[i] == 0) {
            pthread_t t;
            pthread_create(&t, NULL, sleeper, NULL);
            write(p[1], "x", 1);
            struct iovec iov = {chunk, sizeof chunk};
            struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
            sendmsg(full, &m, 0);
            _exit(0);
        }
        char x;
        read(p[0], &x, 1);
        close(p[0]);
        close(p[1]);
    }
    usleep(200000);
    pid_t reader = fork();
    if (reader == 0) {
        int s = accept(l2, NULL, NULL);
        unsigned long got = 0;
        ssize_t r;
        while ((r = read(s, chunk, sizeof chunk)) > 0) got += r;
        _exit(got == 256 << 10 ? 0 : 1);
    }
    pthread_t t;
    pthread_create(&t, NULL, sleeper, NULL);
    tcp(host, port, 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&b, sizeof b) < 0) return fail();
    static char data[256 << 10];
    size_t off = 0;
    while (off < sizeof data) {
        struct iovec iov = {data + off, sizeof data - off};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        ssize_t k = sendmsg(c, &m, 0);
        if (k <= 0) return fail();
        off += k;
    }
    close(c);
    int status = 1;
    waitpid(reader, &status, 0);
    printf("sent %zu %s\n", off, status == 0 ? "received" : "lost");
    for (int i = 0; i < n; i++) {
        kill(children[i], SIGKILL);
        waitpid(children[i], NULL, 0);
    }
    return 0;
}

static int unixcred(void) {
    int sv[2], on = 1;
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) < 0) return fail();
    setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
    pthread_t t;
    pthread_create(&t, NULL, sleeper, NULL);
    struct iovec iov = {"x", 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (sendmsg(sv[0], &m, 0) < 0) return fail();
    char buf[8], ctl[CMSG_SPACE(sizeof(struct ucred))];
    struct iovec riov = {buf, sizeof buf};
    struct msghdr r = {.msg_iov = &riov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    if (recvmsg(sv[1], &r, 0) < 0) return fail();
    struct cmsghdr *c = CMSG_FIRSTHDR(&r);
    if (!c || c->cmsg_type != SCM_CREDENTIALS) { printf("pid none\n"); return 0; }
    struct ucred cred;
    memcpy(&cred, CMSG_DATA(c), sizeof cred);
    printf("pid %s\n", cred.pid == getpid() ? "mine" : "other");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && !strcmp(argv[1], "inside")) return inside();
    if (argc == 2 && !strcmp(argv[1], "listener")) return listener();
    if (argc == 2 && !strcmp(argv[1], "sockopt")) return sockopts();
    if (argc == 2 && !strcmp(argv[1], "unixcred")) return unixcred();
    if (argc == 2 && !strcmp(argv[1], "bulkmsg")) return bulkmsg();
    if (argc == 2 && !strcmp(argv[1], "sndtimeo")) return sndtimeo();
    if (argc == 5 && !strcmp(argv[1], "flood")) return flood(atoi(argv[2]), argv[3], atoi(argv[4]));
    if (argc == 4 && !strcmp(argv[1], "cmsg")) return cmsgs(argv[2], atoi(argv[3]));
    if (argc == 5 && !strcmp(argv[1], "starve")) return starve(atoi(argv[2]), argv[3], atoi(argv[4]));
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
