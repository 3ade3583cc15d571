"""Sends a 64 MiB numpy array from rank 0 to rank 1, checks every element
and prints the bandwidth.

    multirail run -n 2 -- python examples/python/numpy_64m.py [--rounds 3]

Rank 1 prints one line per round (MB/s = 10^6 bytes per second, from the
moment both ranks left a barrier until the array was in place) and exits
with 1 if any element differs.
"""

import argparse
import sys
import time

import multirail
import numpy as np

N = 64 << 20  # bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    expected = np.arange(N // 4, dtype=np.uint32)
    with multirail.Endpoint.from_env() as ep:
        if ep.size != 2:
            raise SystemExit(f"needs 2 ranks, not {ep.size}: multirail run -n 2 -- python {__file__}")
        # Memory of multirail's: the message lands in it without a copy.
        got = np.asarray(multirail.Buffer(N)).view(np.uint32)
        for r in range(args.rounds):
            ep.barrier()
            t0 = time.perf_counter()
            if ep.rank == 0:
                ep.send(expected, 1, tag=r)
                continue
            got[:] = 0
            st = ep.recv(got, 0, tag=r)
            dt = time.perf_counter() - t0
            bad = np.flatnonzero(got != expected)
            if st.len != N or bad.size:
                first = f"first at element {bad[0]}" if bad.size else f"got {st.len} bytes"
                print(f"round {r}: FAILED: {bad.size} elements differ ({first})", flush=True)
                sys.exit(1)
            print(f"round {r}: 64 MiB numpy array received and checked, {N / dt / 1e6:.1f} MB/s", flush=True)


if __name__ == "__main__":
    main()
