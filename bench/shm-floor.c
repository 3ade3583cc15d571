/*
 * bench/shm-floor.c - the floor of an 8 B ping-pong through shared memory
 * between two processes on this machine: each side spins on one cache line
 * the other writes (a sequence number and the 8 bytes), nothing else. What
 * is left above this in a library's shm latency (multirail's shm rail, UCX
 * posix, Open MPI vader) is its own work per message, not the hardware's.
 *
 *   cc -O2 -o /tmp/shm-floor bench/shm-floor.c
 *   /tmp/shm-floor [-i ITERATIONS] [-r ROUNDS] [-c CPU0,CPU1]
 *
 * Prints one-way latency (half the round trip, microseconds) per round,
 * then the median. The two processes are pinned to CPU0 and CPU1 (default
 * 0,1). Naming one CPU twice runs, but measures only this program's spin
 * (a wait yields the CPU every 65536 spins): it is not a floor. Every wait
 * gives up after 10 s (the run fails): no loop is unbounded in time.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct line {
    volatile uint64_t seq;
    volatile char data[56];
} __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s) != 0) {
        perror("sched_setaffinity");
        exit(2);
    }
}

/* Spins until l->seq == want; 0 on success, -1 after 10 s. The clock is
 * read only every 65536 spins, so it does not slow the common short wait. */
static int await_seq(struct line *l, uint64_t want) {
    double t0 = 0;
    for (uint64_t spins = 1;; spins++) {
        if (__atomic_load_n(&l->seq, __ATOMIC_ACQUIRE) == want)
            return 0;
        __builtin_ia32_pause();
        if ((spins & 0xffff) == 0) {
            if (t0 == 0)
                t0 = now();
            else if (now() - t0 > 10)
                return -1;
            sched_yield(); /* a peer on this CPU needs it */
        }
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    long iters = 200000, rounds = 5;
    int c0 = 0, c1 = 1, opt;
    while ((opt = getopt(argc, argv, "i:r:c:h")) != -1) {
        switch (opt) {
        case 'i': iters = atol(optarg); break;
        case 'r': rounds = atol(optarg); break;
        case 'c':
            if (sscanf(optarg, "%d,%d", &c0, &c1) != 2) {
                fprintf(stderr, "-c takes CPU0,CPU1\n");
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: %s [-i ITERATIONS] [-r ROUNDS] [-c CPU0,CPU1]\n", argv[0]);
            return opt == 'h' ? 0 : 2;
        }
    }
    if (iters < 1 || rounds < 1 || rounds > 1000) {
        fprintf(stderr, "iterations >= 1, 1 <= rounds <= 1000\n");
        return 2;
    }
    double *lat = calloc(rounds, sizeof *lat);
    printf("# 8 B shared-memory ping-pong floor, CPUs %d,%d, %ld iterations per round\n", c0, c1, iters);
    for (long r = 0; r < rounds; r++) {
        /* Two lines: the pinger writes l[0], the ponger l[1]. */
        struct line *l = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (l == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        memset(l, 0, 4096);
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 1;
        }
        if (p == 0) {
            pin(c1);
            for (uint64_t i = 1; i <= (uint64_t)iters; i++) {
                if (await_seq(&l[0], i) != 0)
                    _exit(1);
                memcpy((char *)l[1].data, (const char *)l[0].data, 8);
                __atomic_store_n(&l[1].seq, i, __ATOMIC_RELEASE);
            }
            _exit(0);
        }
        pin(c0);
        double t0 = now();
        int failed = 0;
        for (uint64_t i = 1; i <= (uint64_t)iters && !failed; i++) {
            memcpy((char *)l[0].data, &i, 8);
            __atomic_store_n(&l[0].seq, i, __ATOMIC_RELEASE);
            failed = await_seq(&l[1], i) != 0;
        }
        double t = now() - t0;
        int st = 0;
        waitpid(p, &st, 0);
        munmap(l, 4096);
        if (failed || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "round %ld: a wait gave up after 10 s\n", r + 1);
            return 1;
        }
        lat[r] = t / iters / 2 * 1e6;
        printf("round %ld: %.3f us\n", r + 1, lat[r]);
    }
    qsort(lat, rounds, sizeof *lat, cmp);
    double med = rounds % 2 ? lat[rounds / 2] : (lat[rounds / 2 - 1] + lat[rounds / 2]) / 2;
    printf("median one-way: %.3f us\n", med);
    free(lat);
    return 0;
}
