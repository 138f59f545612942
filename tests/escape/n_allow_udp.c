/* Unconnected UDP to non-allowed destinations under --net-allow: sendto, sendmsg and
   sendmmsg, on a fresh socket and on a host socket the supervisor made for an allowed
   destination (a batch mixing allowed and denied destinations included). */
#include "attack.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static struct sockaddr_in addr(const char *ip, const char *port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(port));
    inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
}

static long send_msg(int s, struct sockaddr_in *to) {
    char byte = 'x';
    struct iovec iov = {&byte, 1};
    struct msghdr m = {0};
    m.msg_name = to;
    m.msg_namelen = sizeof *to;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    return sendmsg(s, &m, 0);
}

static long send_mmsg(int s, struct sockaddr_in *a, struct sockaddr_in *b) {
    static char byte = 'x';
    static struct iovec iov = {&byte, 1};
    struct mmsghdr v[2];
    memset(v, 0, sizeof v);
    v[0].msg_hdr.msg_name = a;
    v[0].msg_hdr.msg_namelen = sizeof *a;
    v[0].msg_hdr.msg_iov = &iov;
    v[0].msg_hdr.msg_iovlen = 1;
    v[1] = v[0];
    v[1].msg_hdr.msg_name = b;
    return sendmmsg(s, v, 2, 0);
}

int main(void) {
    struct sockaddr_in allowed = addr("127.0.0.2", env("ALLOW_UDP"));
    struct sockaddr_in host = addr(env("HOSTIP"), env("UDP_ANY"));
    struct sockaddr_in lo = addr("127.0.0.3", env("DENY_UDP"));
    struct sockaddr *h = (struct sockaddr *)&host;
    int fresh = socket(AF_INET, SOCK_DGRAM, 0);
    MUST_FAIL("sendto the host's address", EACCES, sendto(fresh, "x", 1, 0, h, sizeof host));
    MUST_FAIL("sendmsg to the host's address", EACCES, send_msg(fresh, &host));
    MUST_FAIL("sendmmsg to the host's address", EACCES, send_mmsg(fresh, &host, &host));
    MUST_FAIL("sendmmsg denied then allowed", EACCES, send_mmsg(fresh, &host, &allowed));
    /* The host socket of an allowed destination. */
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (sendto(s, "x", 1, 0, (struct sockaddr *)&allowed, sizeof allowed) != 1) {
        printf("WRONG: control sendto the allowed pair failed: %s\n", strerror(errno));
        wrong = 1;
    }
    MUST_FAIL("host socket: sendto the host's address", EACCES, sendto(s, "x", 1, 0, h, sizeof host));
    MUST_FAIL("host socket: sendto 127.0.0.3", EACCES,
              sendto(s, "x", 1, 0, (struct sockaddr *)&lo, sizeof lo));
    MUST_FAIL("host socket: sendmsg to the host's address", EACCES, send_msg(s, &host));
    MUST_FAIL("host socket: sendmmsg denied then allowed", EACCES, send_mmsg(s, &host, &allowed));
    long n = send_mmsg(s, &allowed, &host);
    if (n == 2) {
        printf("ESCAPED: sendmmsg sent the denied second message\n");
        escaped = 1;
    } else {
        printf("ok: sendmmsg allowed then denied sent %ld\n", n);
    }
    MUST_FAIL("host socket: connect to the host's address", EACCES, connect(s, h, sizeof host));
    /* A mapped IPv6 destination on an IPv6 socket. */
    int s6 = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 m6;
    memset(&m6, 0, sizeof m6);
    m6.sin6_family = AF_INET6;
    m6.sin6_port = host.sin_port;
    m6.sin6_addr.s6_addr[10] = 0xff;
    m6.sin6_addr.s6_addr[11] = 0xff;
    memcpy(&m6.sin6_addr.s6_addr[12], &host.sin_addr, 4);
    MUST_FAIL("sendto ::ffff:HOSTIP", EACCES, sendto(s6, "x", 1, 0, (struct sockaddr *)&m6, sizeof m6));
    return finish();
}
