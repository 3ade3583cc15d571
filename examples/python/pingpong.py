"""Latency and bandwidth per message size between two ranks, from Python.

    multirail run -n 2 -- python examples/python/pingpong.py [--sizes 8,4M]

Latency is OSU's: half the round trip of a ping-pong, in microseconds
(average, and the median p50).
Bandwidth is OSU's bw: rank 0 sends a window of messages with isend,
rank 1 receives them with irecv and answers with 4 bytes, in MB/s (10^6
bytes per second). Buffers are numpy arrays over multirail.Buffer memory,
which receives fill in place (--plain: ordinary numpy arrays, which
receives are copied into; bytearrays without numpy).
Rank 0 prints one line per size: size, latency_us, p50_us,
bandwidth_MBps (or JSON with --json).
"""

import argparse
import json
import statistics
import time

import multirail

try:
    import numpy as np
except ImportError:  # bytearrays work as well
    np = None

PING, PONG, DATA, ACK = 1, 2, 3, 4
LARGE = 8192  # OSU: fewer iterations above this size


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B") or "0"
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def buffer(n, plain):
    """numpy arrays over multirail.Buffer memory (receives land in place),
    plain numpy arrays with --plain (receives are copied into them), or
    bytearrays without numpy."""
    if np is None:
        return bytearray(n)
    return np.zeros(n, dtype=np.uint8) if plain else np.asarray(multirail.Buffer(n))


def latency(ep, n, iters, warmup, plain):
    """Average and median of the half round trips, in microseconds."""
    peer = 1 - ep.rank
    sbuf, rbuf = buffer(n, plain), buffer(n, plain)
    halves = []
    clock = time.perf_counter
    ep.barrier()
    for i in range(warmup + iters):
        t0 = clock()
        if ep.rank == 0:
            ep.send(sbuf, peer, PING)
            ep.recv(rbuf, peer, PONG)
        else:
            ep.recv(rbuf, peer, PING)
            ep.send(sbuf, peer, PONG)
        if i >= warmup:
            halves.append((clock() - t0) / 2 * 1e6)
    return statistics.fmean(halves), statistics.median(halves)


def bandwidth(ep, n, iters, warmup, window, plain):
    peer = 1 - ep.rank
    bufs = [buffer(n, plain) for _ in range(window if ep.rank == 1 else 1)]
    ack = bytearray(4)
    ep.barrier()
    for i in range(warmup + iters):
        if i == warmup:
            t0 = time.perf_counter()
        if ep.rank == 0:
            reqs = [ep.isend(bufs[0], peer, DATA) for _ in range(window)]
            ep.wait_all(reqs)
            ep.recv(ack, peer, ACK)
        else:
            reqs = [ep.irecv(b, peer, DATA) for b in bufs]
            ep.wait_all(reqs)
            ep.send(ack, peer, ACK)
    return n * window * iters / (time.perf_counter() - t0) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,64,1K,8K,64K,1M,4M", help="comma-separated sizes (8, 64K, 4M)")
    ap.add_argument("--test", choices=["both", "latency", "bw"], default="both")
    ap.add_argument("-i", "--iterations", type=int, help="per size (default: OSU's, 10000/1000 latency, 100/20 bw)")
    ap.add_argument("-W", "--window", type=int, default=64, help="messages per bw window (default 64)")
    ap.add_argument("--plain", action="store_true", help="plain numpy arrays (receives copied into them)")
    ap.add_argument("--json", action="store_true", help="one JSON object per size instead of the table")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    with multirail.Endpoint.from_env() as ep:
        if ep.size != 2:
            raise SystemExit(f"pingpong needs 2 ranks, not {ep.size}: multirail run -n 2 -- python {__file__}")
        if ep.rank == 0 and not args.json:
            print(f"# multirail {multirail.__version__} Python pingpong, rails {','.join(ep.rail_names)}")
            print(f"{'size':>10} {'latency_us':>12} {'p50_us':>10} {'bandwidth_MBps':>16}", flush=True)
        for n in sizes:
            lat = p50 = bw = float("nan")
            if args.test in ("both", "latency"):
                it = args.iterations or (10000 if n <= LARGE else 1000)
                lat, p50 = latency(ep, n, it, max(it // 10, 1), args.plain)
            if args.test in ("both", "bw"):
                it = args.iterations or (100 if n <= LARGE else 20)
                bw = bandwidth(ep, n, it, max(it // 10, 1), args.window, args.plain)
            if ep.rank != 0:
                continue
            if args.json:
                row = {"size": n, "latency_us": lat, "latency_p50_us": p50, "bandwidth_MBps": bw}
                print(json.dumps({k: v for k, v in row.items() if v == v}), flush=True)  # NaN: not measured
            else:
                print(f"{n:>10} {lat:>12.2f} {p50:>10.2f} {bw:>16.2f}", flush=True)


if __name__ == "__main__":
    main()
