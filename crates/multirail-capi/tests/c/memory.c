/* Zero-copy paths: receives into mr_alloc memory (whole and in part),
   large sends lent from the caller's memory (the buffer is overwritten
   right after mr_wait: the peer must still get what was there), mr_free
   refused while a receive holds the memory and for memory not from
   mr_alloc. Two ranks: rank 0 sends, rank 1 receives. */
#include "check.h"

#define BIG (1u << 20)

int main(void)
{
    uint32_t rank, size;
    struct mr_endpoint *ep = start(&rank, &size);
    if (rank == 0) {
        unsigned char *out = malloc(BIG);
        EXPECT(out != NULL, "memory");
        for (unsigned k = 0; k < 3; k++) {
            fill(out, BIG, 50 + k);
            struct mr_request *r;
            CHECK(mr_isend(ep, 1, k, out, BIG, &r));
            CHECK(mr_wait(r, NULL));
            memset(out, 0xAB, BIG); /* ours again: the peer must not see this */
        }
        fill(out, 1000, 60);
        CHECK(mr_send(ep, 1, 3, out, 1000));
        /* A lent send freed without waiting: mr_request_free waits until
           multirail let go of the buffer, so it may be changed after. */
        fill(out, BIG, 61);
        struct mr_request *r;
        CHECK(mr_isend(ep, 1, 4, out, BIG, &r));
        CHECK(mr_request_free(r));
        memset(out, 0xCD, BIG);
        free(out);
    } else {
        unsigned char *mem = NULL;
        CHECK(mr_alloc(BIG, &mem));
        struct mr_request *r;
        CHECK(mr_irecv(ep, 0, 0, mem, BIG, &r));
        enum mr_err rc = mr_free(mem);
        EXPECT(rc == MR_ERR_INVALID_ARGUMENT && strstr(mr_last_error(), "pending"),
               "free refused while a receive holds it: %s %s", mr_err_name(rc), mr_last_error());
        struct mr_status st;
        CHECK(mr_wait(r, &st));
        EXPECT(st.len == BIG && same(mem, BIG, 50), "message 0 in place");
        CHECK(mr_recv(ep, 0, 1, mem, BIG, &st));
        EXPECT(st.len == BIG && same(mem, BIG, 51), "message 1 in place");
        CHECK(mr_recv(ep, 0, 2, mem, BIG, &st));
        EXPECT(same(mem, BIG, 52), "message 2 in place");
        /* The front of the block only, then all of it again. */
        CHECK(mr_recv(ep, 0, 3, mem, 4096, &st));
        EXPECT(st.len == 1000 && same(mem, 1000, 60), "a short message into the front");
        for (size_t i = 4096; i < BIG; i++)
            EXPECT(mem[i] == pattern(52, i), "byte %zu: the rest of the block untouched", i);
        CHECK(mr_recv(ep, 0, 4, mem, BIG, &st));
        EXPECT(st.len == BIG && same(mem, BIG, 61), "the lent send freed unwaited arrived intact");
        CHECK(mr_free(mem));
        unsigned char local[8];
        rc = mr_free(local);
        EXPECT(rc == MR_ERR_INVALID_ARGUMENT && strstr(mr_last_error(), "not memory from mr_alloc"),
               "free of other memory: %s", mr_last_error());
        CHECK(mr_free(NULL));
        rc = mr_alloc(0, &mem);
        EXPECT(rc == MR_ERR_INVALID_ARGUMENT, "mr_alloc(0)");
    }
    CHECK(mr_barrier(ep));
    CHECK(mr_endpoint_close(ep));
    printf("memory: rank %u ok\n", rank);
    return 0;
}
