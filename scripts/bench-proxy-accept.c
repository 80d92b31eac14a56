/* What the proxy port adds to accepting a connection: the kernel lookup of the client
 * socket's owner (NETLINK_SOCK_DIAG) and the /proc scan for its process. Build and run:
 *   cc -O2 scripts/bench-proxy-accept.c Sources/CAuthBrokerSystem/system.c \
 *      -I Sources/CAuthBrokerSystem/include -o /tmp/bench-proxy-accept && /tmp/bench-proxy-accept
 * Figures: bench-results/NOTES.md. */
#include "CAuthBrokerSystem.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0}; a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(l, (struct sockaddr *)&a, sizeof a); listen(l, 4);
    socklen_t n = sizeof a; getsockname(l, (struct sockaddr *)&a, &n);
    int c = socket(AF_INET, SOCK_STREAM, 0); connect(c, (struct sockaddr *)&a, sizeof a);
    struct sockaddr_in ca; n = sizeof ca; getsockname(c, (struct sockaddr *)&ca, &n);
    int s = accept(l, NULL, NULL); (void)s;
    uint32_t uid; uint64_t inode; int32_t pid;
    int rounds = 20000;
    double t0 = now();
    for (int i = 0; i < rounds; i++) {
        if (cab_tcp_socket_owner(AF_INET, (uint8_t *)&ca.sin_addr, ntohs(ca.sin_port), (uint8_t *)&a.sin_addr, ntohs(a.sin_port), &uid, &inode) != 0) { puts("fail"); return 1; }
    }
    double t1 = now();
    int scans = 200;
    for (int i = 0; i < scans; i++) { if (cab_socket_inode_pid(inode, uid, &pid) != 0) { puts("nopid"); return 1; } }
    double t2 = now();
    int procs = 0; FILE *p = popen("ls /proc | grep -c '^[0-9]'", "r"); fscanf(p, "%d", &procs); pclose(p);
    printf("owner lookup: %.2f us each (%d rounds)\npid scan: %.1f us each (%d processes on the machine, %d rounds)\n", (t1 - t0) / rounds * 1e6, rounds, (t2 - t1) / scans * 1e6, procs, scans);
    return 0;
}
