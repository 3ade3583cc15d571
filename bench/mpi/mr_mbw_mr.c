/*
 * mr_mbw_mr - MPI multiple bandwidth / message rate (osu_mbw_mr-style):
 * P pairs of ranks stream windows at the same time.
 *
 * Written for the multirail project (bench/compare.sh, bench/scaling.sh).
 *
 * N ranks, P pairs (default N/2): rank i < P sends to rank i + P. Per size,
 * for every window (warm-up and timed), as OMB 7.x osu_mbw_mr's calc_bw:
 *   - every rank (also ranks >= 2P, which only keep step) passes
 *     MPI_Barrier, outside the timed part;
 *   - a sender takes the time, posts W non-blocking sends (MPI_Isend) to its
 *     receiver, waits for all (MPI_Waitall), receives a 4-byte reply, takes
 *     the time again and adds the difference to its sum t (timed windows);
 *   - a receiver posts W non-blocking receives (MPI_Irecv), waits for all and
 *     sends the 4-byte reply.
 * Then the senders' sums are added on rank 0 (MPI_Reduce) and averaged over
 * the pairs: t = sum / P, and rank 0 reports
 *     MB/s       = size / 1e6 * P * iterations * W / t   (MB = 10^6 bytes)
 *     Messages/s = P * iterations * W / t                (= 1e6 * MB/s / size)
 * This is what `multirail bench mbw_mr --pairs P` measures.
 *
 *   mpirun -np N ./mr_mbw_mr [-p PAIRS] [-s SIZES] [-i N] [-w N] [-W WINDOW] [-c] [-q]
 *
 *   -p P      pairs (default N/2; at most N/2): rank i sends to rank i + P
 *   -s SIZES  comma list of sizes; K/M/G are binary (64K = 65536); A:B is a
 *             doubling range (1:4M). Default 1:4M.
 *   -i N      timed windows per size (default 100, every size, as
 *             osu_mbw_mr and multirail's mbw_mr)
 *   -w N      warm-up windows per size (default 10)
 *   -W N      messages per window (default 64)
 *   -c        check every byte of every message (adds time to the result;
 *             only when every receive of a window has its own buffer)
 *   -q        no "# rank ..." lines (they make every rank talk to rank 0
 *             once, which opens N-1 connections a scaling test may not want)
 *   -h        help
 *
 * Every receive of a window has its own buffer (up to 64 MiB per receiving
 * rank; above that the window's receives share buffers round-robin). Sends
 * of a window share one buffer, which MPI-3 allows.
 *
 * Output (rank 0, stdout): "# Size  MB/s  Messages/s" then one line per size.
 * Exit status 0 on success, 1 if -c found a wrong byte, 2 on usage errors.
 */
#include "mr_common.h"

#define MR_RBUF_CAP ((size_t)64 << 20)

static void usage(void)
{
    puts("usage: mr_mbw_mr [-p PAIRS] [-s SIZES] [-i ITERS] [-w WARMUP] [-W WINDOW] [-c] [-q]\n"
         "  -p N      pairs, rank i sends to rank i + N (default: ranks / 2)\n"
         "  -s SIZES  comma list, K/M/G binary suffixes, A:B doubling range (default 1:4M)\n"
         "  -i N      timed windows per size (default 100)\n"
         "  -w N      warm-up windows per size (default 10)\n"
         "  -W N      messages per window (default 64)\n"
         "  -c        validate every byte of every message\n"
         "  -q        do not print the '# rank ...' lines\n"
         "Barrier before every window; each sender times its windows (sends + 4-byte reply);\n"
         "rank 0 averages the senders' times t and prints '# Size  MB/s  Messages/s' with\n"
         "MB/s = size/1e6 * pairs * iterations * window / t (MB = 10^6 bytes).");
}

int main(int argc, char **argv)
{
    int rank, nranks, ok, bad = 0, quiet = 0;
    long pairs_opt = -1;
    struct mr_opts o = {.iters = -1, .warmup = -1, .window = 64};

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    mr_parse_sizes("1:4M", &o);
    int c;
    while ((c = getopt(argc, argv, "p:s:i:w:W:cqh")) != -1) {
        if (mr_common_opt(c, optarg, &o, rank))
            continue;
        switch (c) {
        case 'p':
            pairs_opt = mr_parse_count(optarg, 1, &ok);
            if (!ok)
                mr_die(rank, "bad -p: expected a count >= 1");
            break;
        case 'q':
            quiet = 1;
            break;
        case 'h':
            if (rank == 0)
                usage();
            MPI_Finalize();
            return 0;
        default:
            if (rank == 0)
                usage();
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (nranks < 2)
        mr_die(rank, "mr_mbw_mr needs at least 2 ranks");
    if (pairs_opt > nranks / 2) {
        char msg[128];
        snprintf(msg, sizeof msg, "bad -p %ld: %d ranks make at most %d pairs", pairs_opt, nranks,
                 nranks / 2);
        mr_die(rank, msg);
    }
    const int P = pairs_opt > 0 ? (int)pairs_opt : nranks / 2;
    const int W = o.window;
    const long iters_default = 100, warmup_default = 10;
    const int sender = rank < P;
    const int receiver = rank >= P && rank < 2 * P;
    const int peer = sender ? rank + P : receiver ? rank - P : -1;

    size_t maxsize = 1;
    for (int k = 0; k < o.nsizes; k++)
        if (o.sizes[k] > maxsize)
            maxsize = o.sizes[k];
    /* Receive buffers: one per window slot, capped at MR_RBUF_CAP per rank. */
    int nrbuf = W;
    if ((size_t)W * maxsize > MR_RBUF_CAP)
        nrbuf = (int)(MR_RBUF_CAP / maxsize) > 0 ? (int)(MR_RBUF_CAP / maxsize) : 1;
    unsigned char *sbuf = sender ? mr_alloc(maxsize, rank) : NULL;
    unsigned char **rbuf = calloc((size_t)nrbuf, sizeof *rbuf);
    for (int j = 0; receiver && j < nrbuf; j++) {
        rbuf[j] = mr_alloc(maxsize, rank);
        memset(rbuf[j], 0, maxsize); /* touch the pages before timing */
    }
    MPI_Request *req = calloc((size_t)W, sizeof *req);
    int reply = 0;

    if (!quiet)
        mr_describe_ranks(rank, nranks);
    if (rank == 0) {
        printf("# mr_mbw_mr: %d ranks, %d pairs (rank i -> rank i+%d), window %d, barrier before "
               "each window, 4-byte reply per window, MB = 10^6 B\n",
               nranks, P, P, W);
        printf("# [ pairs: %d ] [ window size: %d ]\n", P, W);
        if (o.validate && nrbuf < W)
            printf("# -c: window x size > 64 MiB, receives share buffers: payloads are not checked\n");
        printf("%-10s%20s%20s\n", "# Size", "MB/s", "Messages/s");
        fflush(stdout);
    }

    for (int k = 0; k < o.nsizes; k++) {
        size_t size = o.sizes[k];
        long iters = o.iters > 0 ? o.iters : iters_default;
        long warmup = o.warmup >= 0 ? o.warmup : warmup_default;
        int count = (int)size;
        double t = 0.0, sum = 0.0;

        if (sbuf)
            mr_fill(sbuf, size, (unsigned)rank);
        MPI_Barrier(MPI_COMM_WORLD);
        for (long it = 0; it < warmup + iters; it++) {
            if (receiver && o.validate)
                for (int j = 0; j < nrbuf; j++)
                    memset(rbuf[j], 0, size);
            MPI_Barrier(MPI_COMM_WORLD);
            if (sender) {
                double t0 = MPI_Wtime();
                for (int j = 0; j < W; j++)
                    MPI_Isend(sbuf, count, MPI_BYTE, peer, 100, MPI_COMM_WORLD, &req[j]);
                MPI_Waitall(W, req, MPI_STATUSES_IGNORE);
                MPI_Recv(&reply, 1, MPI_INT, peer, 101, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (it >= warmup)
                    t += MPI_Wtime() - t0;
            } else if (receiver) {
                for (int j = 0; j < W; j++)
                    MPI_Irecv(rbuf[j % nrbuf], count, MPI_BYTE, peer, 100, MPI_COMM_WORLD, &req[j]);
                MPI_Waitall(W, req, MPI_STATUSES_IGNORE);
                if (o.validate && nrbuf == W)
                    for (int j = 0; j < W; j++)
                        if (mr_check(rbuf[j], size, (unsigned)peer) != 0)
                            bad = 1;
                MPI_Send(&reply, 1, MPI_INT, peer, 101, MPI_COMM_WORLD);
            }
        }
        MPI_Reduce(&t, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);

        if (rank == 0) {
            double mean = sum / (double)P;
            double msgs = (double)P * (double)iters * (double)W;
            printf("%-10zu%20.2f%20.2f\n", size, (double)size / 1e6 * msgs / mean, msgs / mean);
            fflush(stdout);
        }
    }

    int anybad = mr_any_bad(bad, rank);
    for (int j = 0; receiver && j < nrbuf; j++)
        free(rbuf[j]);
    free(rbuf);
    free(sbuf);
    free(req);
    MPI_Finalize();
    return anybad ? 1 : 0;
}
