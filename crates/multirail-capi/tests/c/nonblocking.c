/* Non-blocking calls: receives posted before the sends, many messages in
   flight both ways, mr_test polled until done (bounded), mr_wait_all
   with statuses, a request freed without waiting, zero-length messages. */
#include <time.h>

#include "check.h"

#define N 32
#define LEN 70000

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void)
{
    uint32_t rank, size;
    struct mr_endpoint *ep = start(&rank, &size);
    uint32_t peer = 1 - rank;
    static unsigned char in[N][LEN], out[N][LEN];
    struct mr_request *reqs[2 * N];
    struct mr_status sts[2 * N];
    for (int i = 0; i < N; i++)
        CHECK(mr_irecv(ep, peer, (uint64_t)i, in[i], LEN, &reqs[i]));
    CHECK(mr_barrier(ep)); /* every receive is posted before any send */
    for (int i = 0; i < N; i++) {
        size_t len = (size_t)(LEN - i * 1000);
        fill(out[i], len, peer * 1000 + (unsigned)i); /* the seed the peer expects from us */
        CHECK(mr_isend(ep, peer, (uint64_t)i, out[i], len, &reqs[N + i]));
    }
    /* Poll the first receive with mr_test until it is done (bounded). */
    int32_t done = 0;
    double end = now() + 30.0;
    while (!done) {
        CHECK(mr_test(reqs[0], &done));
        EXPECT(now() < end, "the first receive finished within 30 s");
    }
    CHECK(mr_wait_all(reqs, 2 * N, sts));
    for (int i = 0; i < 2 * N; i++)
        EXPECT(reqs[i] == NULL, "mr_wait_all frees request %d", i);
    for (int i = 0; i < N; i++) {
        size_t len = (size_t)(LEN - i * 1000);
        EXPECT(sts[i].source == peer && sts[i].tag == (uint64_t)i && sts[i].len == len, "status %d", i);
        EXPECT(same(in[i], len, rank * 1000 + (unsigned)i), "message %d validated", i);
    }
    /* Zero-length messages, and a receive freed without waiting. */
    struct mr_request *r0, *s0, *dropped;
    CHECK(mr_irecv(ep, peer, 500, NULL, 0, &r0));
    CHECK(mr_isend(ep, peer, 500, NULL, 0, &s0));
    CHECK(mr_wait(s0, NULL));
    struct mr_status st;
    CHECK(mr_wait(r0, &st));
    EXPECT(st.len == 0 && st.tag == 500, "an empty message");
    CHECK(mr_irecv(ep, peer, 999, in[0], LEN, &dropped));
    CHECK(mr_request_free(dropped));
    CHECK(mr_request_free(NULL));
    CHECK(mr_barrier(ep));
    CHECK(mr_endpoint_close(ep));
    printf("nonblocking: rank %u ok\n", rank);
    return 0;
}
