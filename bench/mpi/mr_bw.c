/*
 * mr_bw - MPI windowed bandwidth (and bi-directional bandwidth) between
 * rank 0 and rank 1.
 *
 * Written for the multirail project (bench/compare.sh).
 *
 * Unidirectional (default), per size: rank 0 posts a window of W
 * non-blocking sends (MPI_Isend), rank 1 a window of W non-blocking receives
 * (MPI_Irecv); both wait for all (MPI_Waitall); then rank 1 sends a 4-byte
 * acknowledgement that rank 0 receives before the next window. After the
 * warm-up windows, rank 0 times the timed windows:
 *     bandwidth = size * W * iterations / time   in MB/s, MB = 10^6 bytes.
 *
 * Bidirectional (-b): both ranks post W receives and W sends to each other at
 * once and wait for all 2W; no acknowledgement (each window ends when both
 * directions are done). Both directions count:
 *     bandwidth = 2 * size * W * iterations / time.
 *
 *   mpirun -np 2 ./mr_bw [-b] [-s SIZES] [-i N] [-w N] [-W WINDOW] [-c] [-m]
 *
 *   -s SIZES  comma list of sizes; K/M/G are binary (64K = 65536); A:B is a
 *             doubling range (1:4M). Default 1:4M.
 *   -i N      timed windows per size (default 100 up to 8 KiB, 20 above)
 *   -w N      warm-up windows per size (default 10 up to 8 KiB, 2 above)
 *   -W N      messages per window (default 64)
 *   -b        bidirectional
 *   -c        check every byte of every message (adds time to the result;
 *             only when every receive of a window has its own buffer)
 *   -m        add a third column, Messages/s (= W * iterations / time, both
 *             directions with -b): all the digits of a tiny message's rate,
 *             which the two decimals of the MB/s column round away
 *   -h        help
 *
 * Every receive of a window has its own buffer (up to 1 GiB in total; above
 * that the window's receives share buffers round-robin). Sends of a window
 * share one buffer, which MPI-3 allows.
 *
 * Output (rank 0, stdout): "# Size  Bandwidth (MB/s)" (with -m also
 * "Messages/s") then one line per size.
 * Exit status 0 on success, 1 if -c found a wrong byte, 2 on usage errors.
 */
#include "mr_common.h"

#define MR_RBUF_CAP ((size_t)1 << 30)

static void usage(void)
{
    puts("usage: mr_bw [-b] [-s SIZES] [-i ITERS] [-w WARMUP] [-W WINDOW] [-c] [-m]\n"
         "  -b        bidirectional: both ranks send windows at once, both directions counted\n"
         "  -s SIZES  comma list, K/M/G binary suffixes, A:B doubling range (default 1:4M)\n"
         "  -i N      timed windows per size (default 100 <=8K, 20 above)\n"
         "  -w N      warm-up windows per size (default 10 <=8K, 2 above)\n"
         "  -W N      messages per window (default 64)\n"
         "  -c        validate every byte of every message\n"
         "  -m        add a Messages/s column\n"
         "Prints '# Size  Bandwidth (MB/s)' with MB = 10^6 bytes.");
}

static long default_iters(size_t s)
{
    return s <= 8192 ? 100 : 20;
}

static long default_warmup(size_t s)
{
    return s <= 8192 ? 10 : 2;
}

int main(int argc, char **argv)
{
    int rank, nranks, bad = 0, rate = 0;
    struct mr_opts o = {.iters = -1, .warmup = -1, .window = 64};

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    mr_parse_sizes("1:4M", &o);
    int c;
    while ((c = getopt(argc, argv, "bs:i:w:W:cmh")) != -1) {
        if (mr_common_opt(c, optarg, &o, rank))
            continue;
        switch (c) {
        case 'b':
            o.bidir = 1;
            break;
        case 'm':
            rate = 1;
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
    if (nranks != 2)
        mr_die(rank, "mr_bw needs exactly 2 ranks");

    const int peer = 1 - rank;
    const int W = o.window;
    size_t maxsize = 1;
    for (int k = 0; k < o.nsizes; k++)
        if (o.sizes[k] > maxsize)
            maxsize = o.sizes[k];
    /* Receive buffers: one per window slot, capped at MR_RBUF_CAP in total. */
    int nrbuf = W;
    if ((size_t)W * maxsize > MR_RBUF_CAP)
        nrbuf = (int)(MR_RBUF_CAP / maxsize) > 0 ? (int)(MR_RBUF_CAP / maxsize) : 1;
    const int sends = (rank == 0 || o.bidir);
    const int recvs = (rank == 1 || o.bidir);
    unsigned char *sbuf = sends ? mr_alloc(maxsize, rank) : NULL;
    unsigned char **rbuf = calloc((size_t)nrbuf, sizeof *rbuf);
    for (int j = 0; recvs && j < nrbuf; j++) {
        rbuf[j] = mr_alloc(maxsize, rank);
        memset(rbuf[j], 0, maxsize); /* touch the pages before timing */
    }
    MPI_Request *req = calloc((size_t)(2 * W), sizeof *req);
    int ack = 0;

    mr_describe_ranks(rank, nranks);
    if (rank == 0) {
        if (o.bidir)
            printf("# mr_bw -b: bidirectional, window %d, both directions counted, MB = 10^6 B\n", W);
        else
            printf("# mr_bw: unidirectional, window %d, 4-byte ack per window, MB = 10^6 B\n", W);
        if (o.validate && nrbuf < W)
            printf("# -c: window x size > 1 GiB, receives share buffers: payloads are not checked\n");
        if (rate)
            printf("# %-8s%18s%20s\n", "Size", "Bandwidth (MB/s)", "Messages/s");
        else
            printf("# %-8s%18s\n", "Size", "Bandwidth (MB/s)");
        fflush(stdout);
    }

    for (int k = 0; k < o.nsizes; k++) {
        size_t size = o.sizes[k];
        long iters = o.iters > 0 ? o.iters : default_iters(size);
        long warmup = o.warmup >= 0 ? o.warmup : default_warmup(size);
        int count = (int)size;
        double t0 = 0.0, t1;

        if (sbuf)
            mr_fill(sbuf, size, (unsigned)rank);
        MPI_Barrier(MPI_COMM_WORLD);
        for (long it = 0; it < warmup + iters; it++) {
            if (it == warmup)
                t0 = MPI_Wtime();
            int n = 0;
            if (recvs && o.validate)
                for (int j = 0; j < nrbuf; j++)
                    memset(rbuf[j], 0, size);
            if (recvs)
                for (int j = 0; j < W; j++)
                    MPI_Irecv(rbuf[j % nrbuf], count, MPI_BYTE, peer, 10, MPI_COMM_WORLD, &req[n++]);
            if (sends)
                for (int j = 0; j < W; j++)
                    MPI_Isend(sbuf, count, MPI_BYTE, peer, 10, MPI_COMM_WORLD, &req[n++]);
            MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
            if (recvs && o.validate && nrbuf == W)
                for (int j = 0; j < W; j++)
                    if (mr_check(rbuf[j], size, (unsigned)peer) != 0)
                        bad = 1;
            if (!o.bidir) {
                if (rank == 0)
                    MPI_Recv(&ack, 1, MPI_INT, 1, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                else
                    MPI_Send(&ack, 1, MPI_INT, 0, 11, MPI_COMM_WORLD);
            }
        }
        t1 = MPI_Wtime();

        if (rank == 0) {
            double msgs = (double)W * (double)iters * (o.bidir ? 2.0 : 1.0);
            double bytes = (double)size * msgs;
            if (rate)
                printf("%-10zu%18.2f%20.2f\n", size, bytes / (t1 - t0) / 1e6, msgs / (t1 - t0));
            else
                printf("%-10zu%18.2f\n", size, bytes / (t1 - t0) / 1e6);
            fflush(stdout);
        }
    }

    int anybad = mr_any_bad(bad, rank);
    for (int j = 0; recvs && j < nrbuf; j++)
        free(rbuf[j]);
    free(rbuf);
    free(sbuf);
    free(req);
    MPI_Finalize();
    return anybad ? 1 : 0;
}
