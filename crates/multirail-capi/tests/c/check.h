/* Shared by the C test programs: CHECK fails the program (exit 1) naming
   the call, the code and multirail's message; EXPECT fails it on a false
   condition. Each program is one rank; tests/c_programs.rs starts them. */
#ifndef MR_TEST_CHECK_H
#define MR_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "multirail.h"

#define CHECK(call)                                                              \
    do {                                                                         \
        enum mr_err rc_ = (call);                                                \
        if (rc_ != MR_OK) {                                                      \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,    \
                    mr_err_name(rc_), mr_last_error());                          \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#define EXPECT(cond, ...)                                                        \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

/* Byte i of the message `seed` (both sides compute it). */
static inline unsigned char pattern(unsigned seed, size_t i)
{
    return (unsigned char)(i * 131u + seed * 7u + (i >> 13));
}

static inline void fill(unsigned char *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = pattern(seed, i);
}

static inline int same(const unsigned char *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (buf[i] != pattern(seed, i))
            return 0;
    return 1;
}

static inline struct mr_endpoint *start(uint32_t *rank, uint32_t *size)
{
    struct mr_endpoint *ep = NULL;
    CHECK(mr_endpoint_from_env(&ep));
    CHECK(mr_endpoint_rank(ep, rank));
    CHECK(mr_endpoint_size(ep, size));
    return ep;
}

#endif
