/* bench/sock-floor.c - the floor of an 8 B TCP ping-pong over loopback on
 * this kernel, for each way a spinning receiver can wait, with no library
 * around it: what a progress loop costs above the system calls it makes.
 *
 *   cc -O2 -o /tmp/sock-floor bench/sock-floor.c
 *   /tmp/sock-floor [-i ITERATIONS] [-r ROUNDS] [-s SIZE]
 *
 * Two processes (fork) on 127.0.0.1, TCP_NODELAY, non-blocking sockets.
 * Each round runs every mode once, in turn, and prints the one-way
 * latency (round trip / 2, µs, mean over ITERATIONS after 100 warm-up);
 * the last lines give each mode's median over the rounds. Modes:
 *   recv   spin on recv() until it returns data (what multirail's polled
 *          engine does with few connections: "direct" reads)
 *   poll   spin on poll(fd, 0), then recv() once
 *   epoll  the socket in an epoll set, spin on epoll_wait(0), then
 *          recv() (what ucx_perftest's tcp transport does)
 * Sends are one write() of SIZE bytes (default 8). Loopback only; every
 * loop is bounded by ITERATIONS (default 20000) and ROUNDS (default 9),
 * and a wait for one message gives up after 10 s (the run fails).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

enum { MODE_RECV, MODE_POLL, MODE_EPOLL, MODES };
static const char *names[MODES] = {"recv", "poll", "epoll"};

static void die(const char *what) {
    perror(what);
    exit(1);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* A wait for one message that lasts longer fails the run. */
#define WAIT_LIMIT_US 10e6

/* Reads exactly n bytes, waiting the way `mode` says, at most
 * WAIT_LIMIT_US (the clock is read every 4096 spins only, so the check
 * does not add to the floor). */
static void get(int fd, int ep, int mode, char *buf, size_t n) {
    size_t got = 0;
    double start = 0;
    for (unsigned long spins = 1; got < n; spins++) {
        if (spins % 4096 == 0) {
            double t = now_us();
            if (start == 0)
                start = t;
            else if (t - start > WAIT_LIMIT_US) {
                fprintf(stderr, "sock-floor: no message from the peer for 10 s\n");
                exit(1);
            }
        }
        if (mode == MODE_POLL) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 0) == 0)
                continue;
        } else if (mode == MODE_EPOLL) {
            struct epoll_event ev;
            if (epoll_wait(ep, &ev, 1, 0) == 0)
                continue;
        }
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r > 0)
            got += (size_t)r;
        else if (r == 0)
            die("peer closed");
        else if (errno != EAGAIN && errno != EINTR)
            die("recv");
    }
}

static void put(int fd, const char *buf, size_t n) {
    size_t sent = 0;
    while (sent < n) {
        ssize_t w = write(fd, buf + sent, n - sent);
        if (w > 0)
            sent += (size_t)w;
        else if (w < 0 && errno != EAGAIN && errno != EINTR)
            die("write");
    }
}

static void setup(int fd) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        die("TCP_NODELAY");
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0)
        die("O_NONBLOCK");
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    long iters = 20000, rounds = 9, size = 8;
    int opt;
    while ((opt = getopt(argc, argv, "i:r:s:h")) != -1) {
        switch (opt) {
        case 'i': iters = atol(optarg); break;
        case 'r': rounds = atol(optarg); break;
        case 's': size = atol(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-i ITERATIONS] [-r ROUNDS] [-s SIZE]\n", argv[0]);
            return opt == 'h' ? 0 : 2;
        }
    }
    if (iters < 1 || iters > 10000000 || rounds < 1 || rounds > 1000 || size < 1 || size > 65536) {
        fprintf(stderr, "sock-floor: -i 1..10000000, -r 1..1000, -s 1..65536\n");
        return 2;
    }
    int lst = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (lst < 0 || bind(lst, (struct sockaddr *)&a, sizeof a) < 0 || listen(lst, 1) < 0 ||
        getsockname(lst, (struct sockaddr *)&a, &al) < 0)
        die("listen");
    pid_t child = fork();
    if (child < 0)
        die("fork");
    int fd;
    if (child == 0) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
            die("connect");
    } else {
        fd = accept(lst, NULL, NULL);
        if (fd < 0)
            die("accept");
    }
    close(lst);
    setup(fd);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = fd};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
        die("epoll");
    char *buf = calloc(1, (size_t)size);
    if (!buf)
        die("calloc");
    double *lat = calloc((size_t)(rounds * MODES), sizeof *lat);
    if (!lat)
        die("calloc");
    const long warm = 100;
    for (long r = 0; r < rounds; r++) {
        for (int m = 0; m < MODES; m++) {
            double t0 = 0;
            for (long i = 0; i < iters + warm; i++) {
                if (i == warm)
                    t0 = now_us();
                if (child == 0) {
                    get(fd, ep, m, buf, (size_t)size);
                    put(fd, buf, (size_t)size);
                } else {
                    put(fd, buf, (size_t)size);
                    get(fd, ep, m, buf, (size_t)size);
                }
            }
            lat[r * MODES + m] = (now_us() - t0) / iters / 2;
        }
        if (child != 0) {
            printf("round %ld/%ld:", r + 1, rounds);
            for (int m = 0; m < MODES; m++)
                printf("  %s %.2f", names[m], lat[r * MODES + m]);
            printf("\n");
            fflush(stdout);
        }
    }
    if (child == 0)
        return 0;
    int st;
    waitpid(child, &st, 0);
    double *col = calloc((size_t)rounds, sizeof *col);
    if (!col)
        die("calloc");
    printf("# TCP ping-pong floor on 127.0.0.1, %ld B messages, %ld iterations x %ld rounds, one-way µs\n", size,
           iters, rounds);
    printf("%-8s %10s %10s %8s\n", "mode", "median", "min", "ratio");
    double base = 0;
    for (int m = 0; m < MODES; m++) {
        for (long r = 0; r < rounds; r++)
            col[r] = lat[r * MODES + m];
        qsort(col, (size_t)rounds, sizeof *col, cmp);
        double med = rounds % 2 ? col[rounds / 2] : (col[rounds / 2 - 1] + col[rounds / 2]) / 2;
        if (m == 0)
            base = med;
        printf("%-8s %10.2f %10.2f %8.3f\n", names[m], med, col[0], med / base);
    }
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
