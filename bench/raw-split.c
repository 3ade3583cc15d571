/*
 * raw-split - the floor for a large message over several TCP rails: a
 * ping-pong of one SIZE-byte message split into equal parts, one per
 * connection (one per address given), written and read concurrently by a
 * single thread with poll(2). No protocol, no copies beyond the kernel's.
 * Issue 9's target 4 (4 MiB over 2 rails at most 0.52 x one rail) is
 * judged against what this reaches on the same testbed.
 *
 * Written for the multirail project. Build and run (testbed `mr`):
 *   cc -O2 -o /tmp/raw-split bench/raw-split.c
 *   ip netns exec mr-host1 /tmp/raw-split server 4194304 100 10.77.0.2 10.77.1.2 &
 *   ip netns exec mr-host0 /tmp/raw-split client 4194304 100 10.77.0.2 10.77.1.2
 * (one address: one rail). Both sides list the server's addresses; the
 * k-th uses port 15000 + k. Prints the one-way time (round trip / 2) of
 * ITERATIONS round trips after 10 untimed ones.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_RAILS 8
#define WARMUP 10
#define BASE_PORT 15000

static int nrails;
static int fds[MAX_RAILS];
static size_t part[MAX_RAILS];
static unsigned char *buf;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* Moves every part of the message (send or receive) on all rails at once. */
static void transfer(int sending) {
    size_t done[MAX_RAILS] = {0}, off[MAX_RAILS];
    int left = nrails;
    size_t at = 0;
    for (int k = 0; k < nrails; k++) {
        off[k] = at;
        at += part[k];
    }
    while (left > 0) {
        struct pollfd p[MAX_RAILS];
        for (int k = 0; k < nrails; k++) {
            p[k].fd = fds[k];
            p[k].events = done[k] < part[k] ? (sending ? POLLOUT : POLLIN) : 0;
            p[k].revents = 0;
        }
        if (poll(p, (nfds_t)nrails, 10000) <= 0)
            die("poll (timed out or failed)");
        for (int k = 0; k < nrails; k++) {
            if (done[k] >= part[k] || !(p[k].revents & (POLLIN | POLLOUT | POLLERR | POLLHUP)))
                continue;
            unsigned char *at_k = buf + off[k] + done[k];
            ssize_t r = sending ? write(fds[k], at_k, part[k] - done[k]) : read(fds[k], at_k, part[k] - done[k]);
            if (r == 0)
                die("peer closed");
            if (r < 0) {
                if (errno == EAGAIN || errno == EINTR)
                    continue;
                die(sending ? "write" : "read");
            }
            done[k] += (size_t)r;
            if (done[k] >= part[k])
                left--;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 5 || argc - 4 > MAX_RAILS || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
        fprintf(stderr, "usage: %s server|client SIZE ITERATIONS ADDRESS... (at most %d)\n", argv[0], MAX_RAILS);
        return 2;
    }
    int server = strcmp(argv[1], "server") == 0;
    size_t size = strtoull(argv[2], NULL, 10);
    int iterations = atoi(argv[3]);
    nrails = argc - 4;
    if (size == 0 || iterations <= 0) {
        fprintf(stderr, "SIZE and ITERATIONS must be positive\n");
        return 2;
    }
    buf = malloc(size);
    if (!buf)
        die("malloc");
    memset(buf, 1, size);
    for (int k = 0; k < nrails; k++) {
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((unsigned short)(BASE_PORT + k));
        if (inet_pton(AF_INET, argv[4 + k], &a.sin_addr) != 1) {
            fprintf(stderr, "not an IPv4 address: %s\n", argv[4 + k]);
            return 2;
        }
        int one = 1;
        if (server) {
            int l = socket(AF_INET, SOCK_STREAM, 0);
            setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1))
                die("listen");
            fds[k] = accept(l, NULL, NULL);
            if (fds[k] < 0)
                die("accept");
            close(l);
        } else {
            /* The server may not listen yet: retry for up to 10 s. */
            for (int tries = 0;; tries++) {
                fds[k] = socket(AF_INET, SOCK_STREAM, 0);
                if (connect(fds[k], (struct sockaddr *)&a, sizeof a) == 0)
                    break;
                close(fds[k]);
                if (tries >= 1000)
                    die("connect");
                usleep(10000);
            }
        }
        setsockopt(fds[k], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(fds[k], F_SETFL, O_NONBLOCK);
        part[k] = size / (size_t)nrails + (k == nrails - 1 ? size % (size_t)nrails : 0);
    }
    double t0 = 0;
    for (int i = 0; i < iterations + WARMUP; i++) {
        if (i == WARMUP)
            t0 = now_us();
        transfer(!server);
        transfer(server);
    }
    if (!server)
        printf("rails %d size %zu one-way %.1f us\n", nrails, size, (now_us() - t0) / iterations / 2);
    free(buf);
    return 0;
}
