/* bench/net helper for HTTPS (issue 17: the intercepted mode). Server and client:
 *   tlsbench serve IP PORT CERT KEY       HTTP/1.1 over TLS, a thread per connection, kept
 *                                         alive: `GET /` answers 2 bytes, `POST /` reads its
 *                                         Content-Length body, `GET /down/MIB` sends MIB MiB
 *   tlsbench connect HOST PORT NAME N     N sequential new connections, each: TCP connect, TLS
 *                                         handshake (SNI NAME, certificate verified for NAME),
 *                                         `GET /`, read the whole response, reset; mean µs
 *   tlsbench request HOST PORT NAME N     one connection, then N `GET /` on it; mean µs
 *   tlsbench up HOST PORT NAME MIB        one connection, `POST /` of MIB MiB (1 MiB writes)
 *                                         until the response; MiB/s
 *   tlsbench down HOST PORT NAME MIB      one connection, `GET /down/MIB` read to its end; MiB/s
 * HOST is resolved once (getaddrinfo); NAME is what TLS asks for and verifies (SNI, Host). The
 * client trusts OpenSSL's default paths, so `SSL_CERT_FILE` chooses the CA: the bench's own for
 * the direct path, lockbox's per-sandbox bundle (set by lockbox) under interception. No session
 * resumption: every connection is a full handshake. TLS 1.3, X25519, whatever the peer's
 * certificate is (the bench makes ECDSA P-256 ones; so does lockbox).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MIB (1 << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what) {
    fprintf(stderr, "tlsbench: %s\n", what);
    ERR_print_errors_fp(stderr);
    exit(1);
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

/* Reads a response or request head into buf (NUL-terminated); returns its length, with any
 * body bytes read past it in *extra. */
static int read_head(SSL *s, char *buf, int cap, int *extra) {
    int n = 0;
    for (;;) {
        int r = SSL_read(s, buf + n, cap - 1 - n);
        if (r <= 0) return -1;
        n += r;
        buf[n] = 0;
        char *end = strstr(buf, "\r\n\r\n");
        if (end) {
            int head = end + 4 - buf;
            *extra = n - head;
            return head;
        }
        if (n >= cap - 1) return -1;
    }
}

static long content_length(const char *head) {
    const char *p = strcasestr(head, "\r\ncontent-length:");
    return p ? atol(p + 17) : 0;
}

/* Reads and discards n bytes. */
static int drain(SSL *s, long n) {
    static __thread char sink[64 * 1024];
    while (n > 0) {
        int r = SSL_read(s, sink, n < (long)sizeof sink ? (int)n : (int)sizeof sink);
        if (r <= 0) return -1;
        n -= r;
    }
    return 0;
}

static int write_all(SSL *s, const char *p, long n) {
    while (n > 0) {
        int w = SSL_write(s, p, n > 16 * MIB ? 16 * MIB : (int)n);
        if (w <= 0) return -1;
        p += w;
        n -= w;
    }
    return 0;
}

static SSL_CTX *server_ctx;

static void *serve_one(void *arg) {
    int fd = (int)(long)arg, one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    SSL *s = SSL_new(server_ctx);
    SSL_set_fd(s, fd);
    static char data[MIB];
    char head[16384];
    if (SSL_accept(s) == 1) {
        for (;;) {
            int extra, n = read_head(s, head, sizeof head, &extra);
            if (n < 0) break;
            long body = content_length(head) - extra;
            if (body > 0 && drain(s, body)) break;
            long down = strncmp(head, "GET /down/", 10) ? 0 : atol(head + 10);
            char resp[128];
            int len = snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\nContent-Length: %ld\r\n\r\n%s",
                               down ? down * MIB : 2L, down ? "" : "ok");
            if (write_all(s, resp, len)) break;
            for (long i = 0; i < down; i++)
                if (write_all(s, data, MIB)) goto done;
        }
    }
done:
    SSL_free(s);
    close(fd);
    return NULL;
}

static SSL *client(SSL_CTX *ctx, struct sockaddr_in *a, const char *name, int *fd) {
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (connect(*fd, (void *)a, sizeof *a)) { perror("connect"); exit(1); }
    setsockopt(*fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    SSL *s = SSL_new(ctx);
    SSL_set_fd(s, *fd);
    SSL_set_tlsext_host_name(s, name);
    SSL_set1_host(s, name);
    if (SSL_connect(s) != 1) die("handshake");
    return s;
}

/* One `GET /` and its whole response. */
static void get(SSL *s, const char *name) {
    char req[512], head[16384];
    int n = snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", name), extra;
    if (write_all(s, req, n)) die("write");
    if (read_head(s, head, sizeof head, &extra) < 0) die("read response");
    if (strncmp(head, "HTTP/1.1 200", 12)) { fprintf(stderr, "%s", head); die("status"); }
    if (drain(s, content_length(head) - extra)) die("read body");
}

/* Close with a reset, as netbench does: no TIME_WAIT pile-up on the one address. */
static void reset(SSL *s, int fd) {
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    SSL_free(s);
    close(fd);
}

int main(int argc, char **argv) {
    if (argc < 6) return 2;
    struct sockaddr_in a = addr(argv[2], atoi(argv[3]));
    if (!strcmp(argv[1], "serve")) {
        server_ctx = SSL_CTX_new(TLS_server_method());
        if (!server_ctx || SSL_CTX_use_certificate_chain_file(server_ctx, argv[4]) != 1 ||
            SSL_CTX_use_PrivateKey_file(server_ctx, argv[5], SSL_FILETYPE_PEM) != 1)
            die("server certificate");
        SSL_CTX_set_session_cache_mode(server_ctx, SSL_SESS_CACHE_OFF);
        SSL_CTX_set_num_tickets(server_ctx, 0);
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (void *)&a, sizeof a) || listen(l, 512)) { perror("bind"); return 1; }
        for (;;) {
            int c = accept(l, NULL, NULL);
            if (c < 0) continue;
            pthread_t t;
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            if (pthread_create(&t, &attr, serve_one, (void *)(long)c)) close(c);
            pthread_attr_destroy(&attr);
        }
    }
    if (argc < 6) return 2;
    const char *name = argv[4];
    long n = atol(argv[5]);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx || SSL_CTX_set_default_verify_paths(ctx) != 1) die("trust store");
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    int fd;
    if (!strcmp(argv[1], "connect")) {
        double t0 = now();
        for (long i = 0; i < n; i++) {
            SSL *s = client(ctx, &a, name, &fd);
            get(s, name);
            reset(s, fd);
        }
        printf("%.1f\n", (now() - t0) / n * 1e6);
        return 0;
    }
    SSL *s = client(ctx, &a, name, &fd);
    if (!strcmp(argv[1], "request")) {
        get(s, name); /* the first request may set up the way through (lockbox's upstream) */
        double t0 = now();
        for (long i = 0; i < n; i++) get(s, name);
        printf("%.1f\n", (now() - t0) / n * 1e6);
        return 0;
    }
    char head[16384];
    int extra;
    double t0 = now();
    if (!strcmp(argv[1], "up")) {
        static char data[MIB];
        memset(data, 'x', sizeof data);
        int k = snprintf(head, sizeof head, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Length: %ld\r\n\r\n",
                         name, n * MIB);
        if (write_all(s, head, k)) die("write");
        for (long i = 0; i < n; i++)
            if (write_all(s, data, MIB)) die("write");
        if (read_head(s, head, sizeof head, &extra) < 0) die("read response");
        if (drain(s, content_length(head) - extra)) die("read body");
    } else if (!strcmp(argv[1], "down")) {
        int k = snprintf(head, sizeof head, "GET /down/%ld HTTP/1.1\r\nHost: %s\r\n\r\n", n, name);
        if (write_all(s, head, k)) die("write");
        if (read_head(s, head, sizeof head, &extra) < 0) die("read response");
        if (content_length(head) != n * MIB) die("response length");
        if (drain(s, n * MIB - extra)) die("read body");
    } else {
        return 2;
    }
    printf("%.0f\n", n / (now() - t0));
    return 0;
}
