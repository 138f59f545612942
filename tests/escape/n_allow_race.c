/* Race the connect address: while connect() runs on an allowed address, a second thread
   rewrites it to a denied one (the host's own address, and a loopback address no rule
   names). The supervisor must act on its own copy: every connection that succeeds must be
   to the allowed pair, and the denied services get nothing (the test checks them). */
#include "attack.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

static struct sockaddr_in shared_addr;
static struct sockaddr_in allowed, denied_host, denied_lo;
static atomic_int stop;

static void *flipper(void *arg) {
    (void)arg;
    volatile struct sockaddr_in *a = &shared_addr;
    while (!atomic_load(&stop)) {
        a->sin_addr = denied_host.sin_addr;
        a->sin_port = denied_host.sin_port;
        a->sin_addr = allowed.sin_addr;
        a->sin_port = allowed.sin_port;
        a->sin_addr = denied_lo.sin_addr;
        a->sin_port = denied_lo.sin_port;
        a->sin_addr = allowed.sin_addr;
        a->sin_port = allowed.sin_port;
    }
    return 0;
}

static void set(struct sockaddr_in *a, const char *ip, const char *port) {
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_port = htons(atoi(port));
    inet_pton(AF_INET, ip, &a->sin_addr);
}

int main(void) {
    set(&allowed, "127.0.0.2", env("ALLOW_TCP"));
    set(&denied_host, env("HOSTIP"), env("TCP_ANY"));
    set(&denied_lo, "127.0.0.3", env("DENY_TCP"));
    shared_addr = allowed;
    pthread_t t;
    pthread_create(&t, 0, flipper, 0);
    int ok = 0, refused = 0;
    for (int i = 0; i < 400; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0) return 3;
        if (connect(s, (struct sockaddr *)&shared_addr, sizeof shared_addr) == 0) {
            struct sockaddr_in peer;
            socklen_t len = sizeof peer;
            getpeername(s, (struct sockaddr *)&peer, &len);
            if (peer.sin_addr.s_addr != allowed.sin_addr.s_addr || peer.sin_port != allowed.sin_port) {
                printf("ESCAPED: connect %d reached %s:%d\n", i, inet_ntoa(peer.sin_addr), ntohs(peer.sin_port));
                escaped = 1;
            }
            ok++;
        } else if (errno == EACCES || errno == ECONNREFUSED) {
            refused++;
        } else {
            printf("WRONG: connect %d failed with %s\n", i, strerror(errno));
            wrong = 1;
        }
        close(s);
    }
    atomic_store(&stop, 1);
    pthread_join(t, 0);
    printf("ok: %d connections to the allowed pair, %d refused\n", ok, refused);
    if (ok == 0) {
        printf("WRONG: the allowed pair was never reached (the race proves nothing)\n");
        wrong = 1;
    }
    return finish();
}
