/* Truncation: a message longer than the receive buffer gives
   MR_ERR_TRUNCATED with its full length, writes nothing into the buffer,
   and the channel goes on. Two ranks: rank 0 sends, rank 1 receives. */
#include "check.h"

int main(void)
{
    uint32_t rank, size;
    struct mr_endpoint *ep = start(&rank, &size);
    unsigned char msg[100];
    if (rank == 0) {
        fill(msg, sizeof msg, 1);
        CHECK(mr_send(ep, 1, 3, msg, sizeof msg));
        fill(msg, sizeof msg, 2);
        struct mr_request *r;
        CHECK(mr_isend(ep, 1, 3, msg, sizeof msg, &r));
        CHECK(mr_wait(r, NULL));
        CHECK(mr_send(ep, 1, 4, msg, sizeof msg));
    } else {
        unsigned char small[10];
        memset(small, 0xEE, sizeof small);
        struct mr_status st = {0};
        enum mr_err rc = mr_recv(ep, 0, 3, small, sizeof small, &st);
        EXPECT(rc == MR_ERR_TRUNCATED, "blocking: %s", mr_err_name(rc));
        EXPECT(st.len == sizeof msg && st.source == 0 && st.tag == 3, "status of the truncated message: len %llu",
               (unsigned long long)st.len);
        EXPECT(strstr(mr_last_error(), "100") != NULL, "the message says the length: %s", mr_last_error());
        for (size_t i = 0; i < sizeof small; i++)
            EXPECT(small[i] == 0xEE, "byte %zu of the buffer untouched", i);

        struct mr_request *r;
        CHECK(mr_irecv(ep, 0, 3, small, sizeof small, &r));
        memset(&st, 0, sizeof st);
        rc = mr_wait(r, &st);
        EXPECT(rc == MR_ERR_TRUNCATED && st.len == sizeof msg, "non-blocking: %s, len %llu", mr_err_name(rc),
               (unsigned long long)st.len);

        /* The channel goes on: the next message arrives whole. */
        CHECK(mr_recv(ep, 0, 4, msg, sizeof msg, &st));
        EXPECT(st.len == sizeof msg && same(msg, sizeof msg, 2), "the message after the truncated ones");
    }
    CHECK(mr_barrier(ep));
    CHECK(mr_endpoint_close(ep));
    printf("truncation: rank %u ok\n", rank);
    return 0;
}
