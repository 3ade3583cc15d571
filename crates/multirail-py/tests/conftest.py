"""Runs a test body as two ranks, each in its own process.

`pair(body, *args)` starts two processes (multiprocessing, "spawn"); each
builds `multirail.Endpoint(RAILS, rank, 2, root)` on loopback and calls
`body(ep, *args)`. It returns both results, and fails the test with the
rank's traceback if a rank raised, or if the pair did not finish in time.
"""

import multiprocessing
import os
import queue
import random
import socket
import traceback

import pytest

RAILS = "tcp:127.0.0.1,tcp:127.0.0.2"
# Every wait of a pair is bounded: a hung rank fails the test.
TIMEOUT_S = 60


def free_port():
    """A port for rank 0, drawn at random below the kernel's ephemeral
    range (as multirail.free_root_port does in Rust): an outgoing
    connection cannot take it before rank 0 binds it, as one can take a
    port that a bind to port 0 handed out."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = [random.randrange(10000, low) for _ in range(32)] if low > 11000 else []
    for port in candidates + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port on 127.0.0.1")


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
