/* rawframe IFNAME [HEXFRAME...]: send each frame three times from IFNAME through an AF_PACKET
 * socket, as a job with CAP_NET_RAW could. Built static by tests/support/frames.py and copied
 * into agent containers (the agent image has no compiler or python).
 * Exit 0: sent; 77: the socket was refused (no CAP_NET_RAW); 1: any other failure. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int unhex(const char *text, unsigned char *out, size_t cap) {
    size_t n = strlen(text) / 2;
    if (n > cap || strlen(text) % 2) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned int byte;
        if (sscanf(text + 2 * i, "%2x", &byte) != 1) return -1;
        out[i] = (unsigned char)byte;
    }
    return (int)n;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: rawframe IFNAME [HEXFRAME...]\n"); return 1; }
    int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (fd < 0) {
        fprintf(stderr, "socket: %s\n", strerror(errno));
        return errno == EPERM ? 77 : 1;
    }
    struct sockaddr_ll addr = {0};
    addr.sll_family = AF_PACKET;
    addr.sll_protocol = htons(ETH_P_ALL);
    addr.sll_ifindex = (int)if_nametoindex(argv[1]);
    if (!addr.sll_ifindex || bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        fprintf(stderr, "bind %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    unsigned char frame[2048];
    for (int round = 0; round < 3; round++) {
        for (int i = 2; i < argc; i++) {
            int n = unhex(argv[i], frame, sizeof frame);
            if (n < 0 || send(fd, frame, (size_t)n, 0) != n) {
                fprintf(stderr, "frame %d: %s\n", i - 1, n < 0 ? "bad hex" : strerror(errno));
                return 1;
            }
        }
        usleep(20000);
    }
    printf("sent %d frames\n", 3 * (argc - 2));
    return 0;
}
