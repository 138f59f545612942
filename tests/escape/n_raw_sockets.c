/* Raw IP and packet sockets (spoofing, sniffing) and reconfiguring the network. */
#include "attack.h"
#include <sys/socket.h>
#include <netinet/in.h>
#include <linux/if_ether.h>

int main(void) {
    MUST_FAIL("SOCK_RAW ICMP", EPERM, socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
    MUST_FAIL("SOCK_RAW IPv6", EPERM, socket(AF_INET6, SOCK_RAW, IPPROTO_RAW));
    MUST_FAIL("AF_PACKET", EPERM, socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL)));
    return finish();
}
