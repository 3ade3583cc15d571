/*
 * mr_common.h - shared helpers of the multirail MPI benchmarks
 * (mr_pingpong, mr_bw, mr_mbw_mr): option parsing, size lists, buffers, reporting.
 *
 * Written for the multirail project; not derived from the OSU sources. Only
 * the output format (a "# Size  ..." header and two columns) follows the OSU
 * micro-benchmarks, so scripts that parse OSU output also parse these.
 */
#ifndef MR_COMMON_H
#define MR_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MR_MAX_SIZES 64
#define MR_MAX_MSG ((size_t)1 << 30) /* 1 GiB per message is plenty */

struct mr_opts {
    size_t sizes[MR_MAX_SIZES];
    int nsizes;
    long iters;   /* -1: default by size */
    long warmup;  /* -1: default by size */
    int window;   /* mr_bw, mr_mbw_mr: -W */
    int bidir;    /* mr_bw only: -b */
    int validate; /* -c */
    int extended; /* -x: extra columns (ping-pong) */
};

/* Print on rank 0 only, then abort the whole job. */
static void mr_die(int rank, const char *msg)
{
    if (rank == 0)
        fprintf(stderr, "error: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

/* "64", "64K", "1M", "2G" (binary multiples, K = 1024). 0 on error. */
static size_t mr_parse_size(const char *s, int *ok)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    *ok = 0;
    if (end == s || errno != 0 || s[0] == '-')
        return 0;
    unsigned long long mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1ULL << 10, end++;
    else if (*end == 'm' || *end == 'M')
        mul = 1ULL << 20, end++;
    else if (*end == 'g' || *end == 'G')
        mul = 1ULL << 30, end++;
    if (*end == 'i' || *end == 'I') /* accept KiB-style "Ki" */
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0')
        return 0;
    if (v > (unsigned long long)MR_MAX_MSG / mul)
        return 0;
    *ok = 1;
    return (size_t)(v * mul);
}

/*
 * Size list: comma-separated items; an item is a size ("8", "64K", "4M") or
 * a doubling range "A:B" (1:4M = 1, 2, 4, ... 4M). Returns 0 on success.
 */
static int mr_parse_sizes(const char *arg, struct mr_opts *o)
{
    char *copy = strdup(arg);
    char *save = NULL;
    o->nsizes = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        int ok1 = 0, ok2 = 0;
        if (colon) {
            *colon = '\0';
            size_t a = mr_parse_size(tok, &ok1), b = mr_parse_size(colon + 1, &ok2);
            if (!ok1 || !ok2 || b < a) {
                free(copy);
                return -1;
            }
            for (size_t s = a; s <= b; s = s ? s * 2 : 1) {
                if (o->nsizes == MR_MAX_SIZES) {
                    free(copy);
                    return -1;
                }
                o->sizes[o->nsizes++] = s;
            }
        } else {
            size_t a = mr_parse_size(tok, &ok1);
            if (!ok1 || o->nsizes == MR_MAX_SIZES) {
                free(copy);
                return -1;
            }
            o->sizes[o->nsizes++] = a;
        }
    }
    free(copy);
    return o->nsizes > 0 ? 0 : -1;
}

static long mr_parse_count(const char *s, long min, int *ok)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    *ok = (end != s && *end == '\0' && errno == 0 && v >= min);
    return v;
}

/*
 * The options the programs share: -s sizes, -i timed iterations, -w
 * warm-up iterations, -W window (mr_bw, mr_mbw_mr), -c check payloads.
 * Returns 1 if c is one of them (handled: set in o, or the job aborted with
 * what was wrong), 0 for the caller's own options.
 */
static int mr_common_opt(int c, const char *arg, struct mr_opts *o, int rank)
{
    int ok = 0;
    switch (c) {
    case 's':
        if (mr_parse_sizes(arg, o) != 0)
            mr_die(rank, "bad -s: expected e.g. 8,64K,1M or 1:4M (at most 64 sizes, each <= 1G)");
        return 1;
    case 'i':
        o->iters = mr_parse_count(arg, 1, &ok);
        if (!ok)
            mr_die(rank, "bad -i: expected a count >= 1");
        return 1;
    case 'w':
        o->warmup = mr_parse_count(arg, 0, &ok);
        if (!ok)
            mr_die(rank, "bad -w: expected a count >= 0");
        return 1;
    case 'W': {
        long w = mr_parse_count(arg, 1, &ok);
        if (!ok || w > 4096)
            mr_die(rank, "bad -W: expected a window of 1..4096 messages");
        o->window = (int)w;
        return 1;
    }
    case 'c':
        o->validate = 1;
        return 1;
    default:
        return 0;
    }
}

/* Whether any rank's -c check found a wrong byte (rank 0 says so). Every
 * rank must call it. */
static int mr_any_bad(int bad, int rank)
{
    int anybad = 0;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (anybad && rank == 0)
        fprintf(stderr, "error: -c found a wrong byte in a received message\n");
    return anybad;
}

/* Where this rank runs: CPU, network namespace (inode of /proc/self/ns/net). */
static void mr_describe_ranks(int rank, int nranks)
{
    char line[MPI_MAX_PROCESSOR_NAME + 128];
    char host[MPI_MAX_PROCESSOR_NAME];
    int hlen = 0;
    struct stat st;
    unsigned long netns = 0;
    MPI_Get_processor_name(host, &hlen);
    if (stat("/proc/self/ns/net", &st) == 0)
        netns = (unsigned long)st.st_ino;
    snprintf(line, sizeof line, "# rank %d: host %s, pid %ld, cpu %d, netns %lu", rank, host,
             (long)getpid(), sched_getcpu(), netns);
    if (rank == 0) {
        puts(line);
        for (int r = 1; r < nranks; r++) {
            MPI_Recv(line, sizeof line, MPI_CHAR, r, 999, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            puts(line);
        }
    } else {
        MPI_Send(line, sizeof line, MPI_CHAR, 0, 999, MPI_COMM_WORLD);
    }
}

static void *mr_alloc(size_t n, int rank)
{
    void *p = NULL;
    if (n == 0)
        n = 1;
    if (posix_memalign(&p, 4096, n) != 0)
        mr_die(rank, "out of memory");
    return p;
}

/* Deterministic payload: byte i of message m is (i * 31 + m * 7 + 1) & 0xff. */
static void mr_fill(unsigned char *buf, size_t n, unsigned m)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)((i * 31u + m * 7u + 1u) & 0xffu);
}

static int mr_check(const unsigned char *buf, size_t n, unsigned m)
{
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (unsigned char)((i * 31u + m * 7u + 1u) & 0xffu))
            return -1;
    return 0;
}

__attribute__((unused)) static int mr_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
