/*
 * mr_pingpong - MPI ping-pong latency between rank 0 and rank 1.
 *
 * Written for the multirail project (bench/compare.sh). For every size,
 * rank 0 sends a message to rank 1, which sends one of the same size back;
 * after the warm-up round trips, the time of the timed round trips is taken
 * on rank 0 and reported as one-way latency = round trip / 2, in
 * microseconds (mean over the timed iterations, as OSU reports it).
 *
 *   mpirun -np 2 ./mr_pingpong [-s SIZES] [-i N] [-w N] [-c] [-x]
 *
 *   -s SIZES  comma list of sizes; K/M/G are binary (64K = 65536); A:B is a
 *             doubling range (1:4M). Default 1:4M.
 *   -i N      timed round trips per size (default: 10000 up to 8 KiB,
 *             1000 up to 64 KiB, 100 above)
 *   -w N      untimed warm-up round trips per size (default: 100 up to
 *             64 KiB, 10 above)
 *   -c        check every byte of every message (adds time to the result)
 *   -x        extra columns: minimum, median and maximum one-way time of a
 *             single round trip
 *   -h        help
 *
 * Output (rank 0, stdout): "# Size  Latency (us)" then one line per size.
 * Exit status 0 on success, 1 if -c found a wrong byte, 2 on usage errors.
 */
#include "mr_common.h"

static void usage(void)
{
    puts("usage: mr_pingpong [-s SIZES] [-i ITERS] [-w WARMUP] [-c] [-x]\n"
         "  -s SIZES  comma list, K/M/G binary suffixes, A:B doubling range (default 1:4M)\n"
         "  -i N      timed round trips per size (default 10000 <=8K, 1000 <=64K, 100 above)\n"
         "  -w N      warm-up round trips per size (default 100 <=64K, 10 above)\n"
         "  -c        validate every byte of every message\n"
         "  -x        add min/median/max one-way time of single round trips\n"
         "Prints '# Size  Latency (us)'; latency = mean round trip / 2.");
}

static long default_iters(size_t s)
{
    return s <= 8192 ? 10000 : s <= 65536 ? 1000 : 100;
}

static long default_warmup(size_t s)
{
    return s <= 65536 ? 100 : 10;
}

int main(int argc, char **argv)
{
    int rank, nranks, bad = 0;
    struct mr_opts o = {.iters = -1, .warmup = -1};

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    mr_parse_sizes("1:4M", &o);
    int c;
    while ((c = getopt(argc, argv, "s:i:w:cxh")) != -1) {
        if (mr_common_opt(c, optarg, &o, rank))
            continue;
        switch (c) {
        case 'x':
            o.extended = 1;
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
        mr_die(rank, "mr_pingpong needs exactly 2 ranks");

    size_t maxsize = 0;
    long maxiters = 0;
    for (int k = 0; k < o.nsizes; k++) {
        long it = o.iters > 0 ? o.iters : default_iters(o.sizes[k]);
        if (o.sizes[k] > maxsize)
            maxsize = o.sizes[k];
        if (it > maxiters)
            maxiters = it;
    }
    unsigned char *sbuf = mr_alloc(maxsize, rank);
    unsigned char *rbuf = mr_alloc(maxsize, rank);
    double *trip = o.extended ? mr_alloc(sizeof(double) * (size_t)maxiters, rank) : NULL;

    mr_describe_ranks(rank, nranks);
    if (rank == 0) {
        printf("# mr_pingpong: one-way latency = round trip / 2, mean over the timed iterations\n");
        if (o.extended)
            printf("# %-8s%18s%18s%18s%18s%12s\n", "Size", "Latency (us)", "Min (us)", "Median (us)",
                   "Max (us)", "Iterations");
        else
            printf("# %-8s%18s\n", "Size", "Latency (us)");
        fflush(stdout);
    }

    for (int k = 0; k < o.nsizes; k++) {
        size_t size = o.sizes[k];
        long iters = o.iters > 0 ? o.iters : default_iters(size);
        long warmup = o.warmup >= 0 ? o.warmup : default_warmup(size);
        int count = (int)size; /* MR_MAX_MSG keeps this in range */
        double t0 = 0.0, t1 = 0.0;

        mr_fill(sbuf, size, (unsigned)rank);
        memset(rbuf, 0, size);
        MPI_Barrier(MPI_COMM_WORLD);
        for (long it = 0; it < warmup + iters; it++) {
            if (it == warmup)
                t0 = MPI_Wtime();
            double ts = o.extended ? MPI_Wtime() : 0.0;
            if (rank == 0) {
                MPI_Send(sbuf, count, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
                MPI_Recv(rbuf, count, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (o.validate && mr_check(rbuf, size, 1) != 0)
                    bad = 1;
            } else {
                MPI_Recv(rbuf, count, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (o.validate && mr_check(rbuf, size, 0) != 0)
                    bad = 1;
                MPI_Send(sbuf, count, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
            }
            if (o.extended && it >= warmup)
                trip[it - warmup] = MPI_Wtime() - ts;
        }
        t1 = MPI_Wtime();

        if (rank == 0) {
            double lat = (t1 - t0) * 1e6 / (2.0 * (double)iters);
            if (o.extended) {
                qsort(trip, (size_t)iters, sizeof(double), mr_cmp_double);
                double med = (iters % 2) ? trip[iters / 2]
                                         : 0.5 * (trip[iters / 2 - 1] + trip[iters / 2]);
                printf("%-10zu%18.2f%18.2f%18.2f%18.2f%12ld\n", size, lat, trip[0] * 0.5e6,
                       med * 0.5e6, trip[iters - 1] * 0.5e6, iters);
            } else {
                printf("%-10zu%18.2f\n", size, lat);
            }
            fflush(stdout);
        }
    }

    int anybad = mr_any_bad(bad, rank);
    free(sbuf);
    free(rbuf);
    free(trip);
    MPI_Finalize();
    return anybad ? 1 : 0;
}
