/* Errors: every misuse gives its code and a message naming what was
   wrong, and the endpoint stays usable afterwards. Two ranks. */
#include "check.h"

static void expect_code(enum mr_err got, enum mr_err want, const char *needle, const char *what)
{
    EXPECT(got == want, "%s: got %s, want %s (%s)", what, mr_err_name(got), mr_err_name(want), mr_last_error());
    EXPECT(strstr(mr_last_error(), needle) != NULL, "%s: message '%s' names '%s'", what, mr_last_error(), needle);
}

int main(void)
{
    EXPECT(strcmp(mr_err_name(MR_OK), "MR_OK") == 0, "name of MR_OK");
    EXPECT(strcmp(mr_err_name(MR_ERR_TRUNCATED), "MR_ERR_TRUNCATED") == 0, "name of MR_ERR_TRUNCATED");

    struct mr_endpoint *bad = NULL;
    expect_code(mr_endpoint_create("udp:1.2.3.4", 0, 1, NULL, NULL, &bad), MR_ERR_CONFIG, "udp:1.2.3.4",
                "a rail that does not exist");
    EXPECT(bad == NULL, "no endpoint on failure");

    uint32_t rank, size;
    expect_code(mr_endpoint_rank(NULL, &rank), MR_ERR_INVALID_ARGUMENT, "ep is NULL", "NULL endpoint");

    struct mr_endpoint *ep = start(&rank, &size);
    EXPECT(size == 2, "two ranks, not %u", size);
    expect_code(mr_send(ep, 7, 1, (const uint8_t *)"x", 1), MR_ERR_NO_SUCH_PEER, "7", "a rank that does not exist");
    expect_code(mr_send(ep, 1 - rank, (uint64_t)1 << 63, (const uint8_t *)"x", 1), MR_ERR_CONFIG, "reserved",
                "a reserved tag");
    expect_code(mr_send(ep, 1 - rank, 1, NULL, 5), MR_ERR_INVALID_ARGUMENT, "NULL", "a NULL buffer of 5 bytes");
    expect_code(mr_wait(NULL, NULL), MR_ERR_INVALID_ARGUMENT, "req is NULL", "waiting for NULL");
    int32_t done;
    expect_code(mr_test(NULL, &done), MR_ERR_INVALID_ARGUMENT, "req is NULL", "testing NULL");

    /* A request still open: closing is refused, the endpoint stays usable. */
    unsigned char in[8];
    struct mr_request *r = NULL;
    CHECK(mr_irecv(ep, 1 - rank, 9, in, sizeof in, &r));
    expect_code(mr_endpoint_close(ep), MR_ERR_INVALID_ARGUMENT, "request", "closing with a request open");
    unsigned char out[8] = "rank-00";
    out[6] = (unsigned char)('0' + rank);
    CHECK(mr_send(ep, 1 - rank, 9, out, sizeof out));
    struct mr_status st;
    CHECK(mr_wait(r, &st));
    EXPECT(st.source == 1 - rank && st.tag == 9 && st.len == 8, "status %u %llu %llu", st.source,
           (unsigned long long)st.tag, (unsigned long long)st.len);
    EXPECT(in[6] == '0' + (1 - rank), "the peer's message: %s", (const char *)in);
    CHECK(mr_barrier(ep));
    CHECK(mr_endpoint_close(ep));
    CHECK(mr_endpoint_close(NULL));
    printf("errors: rank %u ok\n", rank);
    return 0;
}
