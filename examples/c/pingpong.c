/* pingpong: multirail from C. Two ranks measure, per message size, the
   one-way latency (half the average round trip, like osu_latency) and the
   bandwidth (a window of non-blocking sends, one small reply per window,
   like osu_bw).

   Build (see docs/c.md) and run:
     cc pingpong.c $(pkg-config --cflags --libs multirail) -o pingpong
     multirail run -n 2 -- ./pingpong [SIZES] [ITERATIONS]

   SIZES is a comma-separated list with optional K/M suffixes (default
   8,4K,64K,1M,4M); ITERATIONS the round trips (and windows) per size
   (default: 10000 for small sizes, fewer for large ones). Rank 0 prints
   one line per size and test: "latency SIZE MICROSECONDS" and
   "bw SIZE MB/s" (10^6 bytes per second). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "multirail.h"

#define WINDOW 64

#define CHECK(call)                                                                                   \
    do {                                                                                              \
        enum mr_err rc_ = (call);                                                                     \
        if (rc_ != MR_OK) {                                                                           \
            fprintf(stderr, "pingpong: %s: %s: %s\n", #call, mr_err_name(rc_), mr_last_error());      \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static size_t parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) {
        fprintf(stderr, "pingpong: '%s' is not a size (e.g. 8, 4K, 1M)\n", s);
        exit(2);
    }
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    if (*end != '\0' && *end != ',') {
        fprintf(stderr, "pingpong: '%s' is not a size (e.g. 8, 4K, 1M)\n", s);
        exit(2);
    }
    return (size_t)v;
}

static int iterations_for(size_t size, int given)
{
    if (given > 0)
        return given;
    return size <= 8192 ? 10000 : size <= (1u << 20) ? 1000 : 100;
}

static double latency(struct mr_endpoint *ep, uint32_t rank, unsigned char *buf, size_t size, int iters)
{
    uint32_t peer = 1 - rank;
    int warmup = iters / 10 + 1;
    double start = 0;
    for (int i = 0; i < warmup + iters; i++) {
        if (i == warmup)
            start = now();
        if (rank == 0) {
            CHECK(mr_send(ep, peer, 1, buf, size));
            CHECK(mr_recv(ep, peer, 1, buf, size, NULL));
        } else {
            CHECK(mr_recv(ep, peer, 1, buf, size, NULL));
            CHECK(mr_send(ep, peer, 1, buf, size));
        }
    }
    return (now() - start) * 1e6 / (2.0 * iters);
}

static double bandwidth(struct mr_endpoint *ep, uint32_t rank, unsigned char **bufs, size_t size, int iters)
{
    uint32_t peer = 1 - rank;
    struct mr_request *reqs[WINDOW];
    unsigned char ack = 0;
    int warmup = iters / 10 + 1;
    double start = 0;
    for (int i = 0; i < warmup + iters; i++) {
        if (i == warmup)
            start = now();
        if (rank == 0) {
            for (int w = 0; w < WINDOW; w++)
                CHECK(mr_isend(ep, peer, 2, bufs[0], size, &reqs[w]));
            CHECK(mr_wait_all(reqs, WINDOW, NULL));
            CHECK(mr_recv(ep, peer, 3, &ack, 1, NULL));
        } else {
            for (int w = 0; w < WINDOW; w++)
                CHECK(mr_irecv(ep, peer, 2, bufs[w], size, &reqs[w]));
            CHECK(mr_wait_all(reqs, WINDOW, NULL));
            CHECK(mr_send(ep, peer, 3, &ack, 1));
        }
    }
    double secs = now() - start;
    return (double)size * WINDOW * iters / secs / 1e6;
}

int main(int argc, char **argv)
{
    const char *sizes = argc > 1 ? argv[1] : "8,4K,64K,1M,4M";
    int given = argc > 2 ? atoi(argv[2]) : 0;
    struct mr_endpoint *ep = NULL;
    uint32_t rank, size;
    CHECK(mr_endpoint_from_env(&ep));
    CHECK(mr_endpoint_rank(ep, &rank));
    CHECK(mr_endpoint_size(ep, &size));
    if (size != 2) {
        fprintf(stderr, "pingpong: needs exactly 2 ranks, the job has %u (multirail run -n 2)\n", size);
        return 2;
    }
    if (rank == 0)
        printf("# multirail C pingpong: latency in microseconds (one way), bandwidth in MB/s\n");
    for (const char *s = sizes; s && *s; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL) {
        size_t n = parse_size(s);
        /* Memory from mr_alloc: receives land in it in place (no copy);
           sends of 64 KiB or more are sent without a copy from any memory.
           One buffer per receive of a window, as every receive in flight
           needs its own for the message to land in place. */
        unsigned char *bufs[WINDOW];
        for (int w = 0; w < WINDOW; w++)
            CHECK(mr_alloc(n ? n : 1, &bufs[w]));
        unsigned char *buf = bufs[0];
        int iters = iterations_for(n, given);
        CHECK(mr_barrier(ep));
        double lat = latency(ep, rank, buf, n, iters);
        CHECK(mr_barrier(ep));
        double bw = bandwidth(ep, rank, bufs, n, iters / 10 + 1);
        if (rank == 0) {
            printf("latency %zu %.2f\n", n, lat);
            printf("bw %zu %.2f\n", n, bw);
            fflush(stdout);
        }
        for (int w = 0; w < WINDOW; w++)
            CHECK(mr_free(bufs[w]));
    }
    CHECK(mr_endpoint_close(ep));
    return 0;
}
