/* Socket families that are not network-namespaced: vsock reaches the hypervisor (or, on a
   host, its VMs) whatever the namespace; the kernel crypto API (AF_ALG) is shared by the
   whole host. Bluetooth and NFC exist only in the host's namespace (the kernel refuses them
   elsewhere). */
#include "attack.h"
#include <sys/socket.h>

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef AF_ALG
#define AF_ALG 38
#endif
#define AF_BLUETOOTH_ 31
#define AF_NFC_ 39

int main(void) {
    MUST_FAIL("vsock stream", EAFNOSUPPORT, socket(AF_VSOCK, SOCK_STREAM, 0));
    MUST_FAIL("vsock datagram", EAFNOSUPPORT, socket(AF_VSOCK, SOCK_DGRAM, 0));
    MUST_FAIL("vsock seqpacket", EAFNOSUPPORT, socket(AF_VSOCK, SOCK_SEQPACKET, 0));
    MUST_FAIL("vsock with high bits in the family", EAFNOSUPPORT,
              syscall(SYS_socket, 0xffffffff00000000L | AF_VSOCK, SOCK_STREAM, 0));
    MUST_FAIL("vsock socketpair", 0, socketpair(AF_VSOCK, SOCK_STREAM, 0, (int[2]){0}));
    MUST_FAIL("AF_ALG", EAFNOSUPPORT, socket(AF_ALG, SOCK_SEQPACKET, 0));
    MUST_FAIL("bluetooth (host namespace only)", EAFNOSUPPORT, socket(AF_BLUETOOTH_, SOCK_STREAM, 0));
    MUST_FAIL("NFC (host namespace only)", 0, socket(AF_NFC_, SOCK_SEQPACKET, 0));
    return finish();
}
