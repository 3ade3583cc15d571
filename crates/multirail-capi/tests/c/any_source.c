/* Any source, any tag: three ranks; ranks 1 and 2 each send one message
   tagged with their rank to rank 0, which takes them with MR_ANY_SOURCE
   and MR_ANY_TAG and learns who sent what from the status; after a
   barrier (so that no later message can match those receives), one more
   message each, selected by tag only. */
#include "check.h"

int main(void)
{
    uint32_t rank, size;
    struct mr_endpoint *ep = start(&rank, &size);
    EXPECT(size == 3, "three ranks, not %u", size);
    unsigned char buf[64];
    if (rank == 0) {
        int seen[3] = {0, 0, 0};
        for (int k = 0; k < 2; k++) {
            struct mr_status st;
            CHECK(mr_recv(ep, MR_ANY_SOURCE, MR_ANY_TAG, buf, sizeof buf, &st));
            EXPECT(st.source == 1 || st.source == 2, "source %u", st.source);
            EXPECT(st.tag == st.source && st.len == 32 && same(buf, 32, st.source),
                   "message of rank %u: tag %llu, %llu bytes", st.source, (unsigned long long)st.tag,
                   (unsigned long long)st.len);
            seen[st.source]++;
        }
        EXPECT(seen[1] == 1 && seen[2] == 1, "one message from each: %d %d", seen[1], seen[2]);
        CHECK(mr_barrier(ep));
        for (int k = 0; k < 2; k++) {
            struct mr_status st;
            CHECK(mr_recv(ep, MR_ANY_SOURCE, 100, buf, sizeof buf, &st));
            EXPECT(st.tag == 100 && st.len == 16 && same(buf, 16, 100 + st.source), "tag 100 from %u", st.source);
        }
    } else {
        fill(buf, 32, rank);
        CHECK(mr_send(ep, 0, rank, buf, 32));
        CHECK(mr_barrier(ep));
        fill(buf, 16, 100 + rank);
        CHECK(mr_send(ep, 0, 100, buf, 16));
    }
    CHECK(mr_barrier(ep));
    CHECK(mr_endpoint_close(ep));
    printf("any_source: rank %u ok\n", rank);
    return 0;
}
