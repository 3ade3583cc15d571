/* Two rails, explicit: the endpoint made with mr_endpoint_create from
   the rails, rank, size, root and key given on the command line (no
   launcher), then validated 4 MiB messages both ways. */
#include <stdlib.h>

#include "check.h"

#define LEN (4u << 20)

int main(int argc, char **argv)
{
    EXPECT(argc == 5, "usage: two_rails RAILS RANK ROOT KEY (got %d arguments)", argc - 1);
    struct mr_endpoint *ep = NULL;
    uint32_t rank = (uint32_t)atoi(argv[2]);
    CHECK(mr_endpoint_create(argv[1], rank, 2, argv[3], argv[4], &ep));
    uint32_t got_rank, size;
    CHECK(mr_endpoint_rank(ep, &got_rank));
    CHECK(mr_endpoint_size(ep, &size));
    EXPECT(got_rank == rank && size == 2, "rank %u of %u", got_rank, size);
    unsigned char *out = malloc(LEN), *in = malloc(LEN);
    EXPECT(out && in, "memory");
    for (unsigned k = 0; k < 4; k++) {
        fill(out, LEN, 10 * rank + k);
        struct mr_request *s;
        CHECK(mr_isend(ep, 1 - rank, k, out, LEN, &s));
        struct mr_status st;
        CHECK(mr_recv(ep, 1 - rank, k, in, LEN, &st));
        CHECK(mr_wait(s, NULL));
        EXPECT(st.len == LEN && same(in, LEN, 10 * (1 - rank) + k), "4 MiB message %u validated", k);
    }
    CHECK(mr_endpoint_close(ep));
    free(out);
    free(in);
    printf("two_rails: rank %u ok\n", rank);
    return 0;
}
