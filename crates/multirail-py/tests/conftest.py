"""Runs a test body as two ranks, each in its own process.

`pair(body, *args)` starts two processes (multiprocessing, "spawn"); each
builds `multirail.Endpoint(RAILS, rank, 2, root)` on loopback and calls
`body(ep, *args)`. It returns both results, and fails the test with the
rank's traceback if a rank raised, or if the pair did not finish in time.
"""

import multiprocessing
import os
import queue
import socket
import traceback

import pytest

RAILS = "tcp:127.0.0.1,tcp:127.0.0.2"
# Every wait of a pair is bounded: a hung rank fails the test.
TIMEOUT_S = 60


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, root, env, body, args, results):
    os.environ.update(env)
    try:
        import multirail

        ep = multirail.Endpoint(RAILS, rank, 2, root)
        out = body(ep, *args)
        ep.close()
        results.put((rank, True, out))
    except BaseException:  # reported to the test in the parent
        results.put((rank, False, traceback.format_exc()))


def run_pair(body, *args, env=None):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    root = f"127.0.0.1:{free_port()}"
    # The TCP rails by default: two ranks of one host would otherwise talk
    # over shared memory only.
    env = {"MULTIRAIL_SHM": "off", **(env or {})}
    procs = [ctx.Process(target=_rank_main, args=(r, root, env, body, args, results)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in procs:
            rank, ok, out = results.get(timeout=TIMEOUT_S)
            if not ok:
                pytest.fail(f"rank {rank} raised:\n{out}", pytrace=False)
            got[rank] = out
    except queue.Empty:
        pytest.fail(f"the ranks did not finish within {TIMEOUT_S} s (got {sorted(got)})", pytrace=False)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return got[0], got[1]


@pytest.fixture
def pair():
    return run_pair
