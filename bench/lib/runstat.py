#!/usr/bin/env python3
"""runstat.py - sample a running job for bench/scaling.sh.

    runstat.py --root PID --names multirail[,NAME...] [--interval 0.1]
    runstat.py --root-from FILE --ready FILE --names ... [--interval 0.1]

The second form lets the caller start the sampler before the job: it
creates the --ready file once it runs, then waits (at most 60 s) for the
job's pid to appear in the --root-from file (write it to a temporary name
and rename it), so that Python's start-up is not taken from a short job.

Every INTERVAL seconds, until process ROOT has exited:

  * the processes of the job: ROOT's descendants (found through the parent
    pid of every process in /proc), and every descendant seen before that is
    still alive with the same start time (a rank whose parent died is
    re-parented to init but still belongs to the job);
  * the ranks: the job's processes whose name (comm) is one of NAMES, except
    ROOT's own children (the launcher: `multirail bench` starts its ranks as
    its children; `mpirun` is not in NAMES anyway);
  * VmRSS (from /proc/PID/status) and thread count of every rank;
  * the number of ESTABLISHED TCP connections of this network namespace:
    `ss -tanH state established | wc -l`.

When ROOT has exited, the processes of the job that are still alive are
stopped (SIGTERM, SIGKILL 1 s later; only processes seen as descendants of
ROOT, checked by pid and start time), and it prints key<TAB>value lines:

  samples              samples taken
  established_peak     largest connection count seen (not minus a baseline)
  rss_peak_kib         largest VmRSS of one rank in any sample
  rss_total_peak_kib   largest sum of the ranks' VmRSS in one sample
  launcher_rss_peak_kib  largest VmRSS of a process named in NAMES that is a
                       child of ROOT (multirail's launcher), 0 if none
  ranks_seen           distinct rank processes seen
  ranks_peak           most ranks alive in one sample
  threads_peak         largest sum of the ranks' threads in one sample
  leftover             processes of the job still alive after ROOT exited
                       (each was stopped)
  leftover_names       their names, comma-separated (or -)

Only the Python standard library is used. Never runs longer than
--max-seconds (default 7200).
"""

import argparse
import os
import signal
import subprocess
import sys
import time


def proc_table():
    """pid -> (comm, ppid, starttime, state) of every process now."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        lp, rp = raw.find("("), raw.rfind(")")
        if lp < 0 or rp < 0:
            continue
        rest = raw[rp + 2:].split()
        try:
            table[int(name)] = (raw[lp + 1:rp], int(rest[1]), int(rest[19]), rest[0])
        except (IndexError, ValueError):
            continue
    return table


def status_fields(pid):
    """(VmRSS in KiB, threads) of a process, or None when it is gone."""
    rss, threads = 0, 0
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return rss, threads


def established():
    try:
        out = subprocess.run(["ss", "-tanH", "state", "established"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=5, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sum(1 for line in out.splitlines() if line.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=int)
    ap.add_argument("--root-from")
    ap.add_argument("--ready")
    ap.add_argument("--names", required=True)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--max-seconds", type=float, default=7200)
    a = ap.parse_args()
    names = {n for n in a.names.split(",") if n}
    if (a.root is None) == (a.root_from is None):
        ap.error("give --root PID or --root-from FILE")

    stop = False

    def on_signal(_sig, _frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if a.ready:
        with open(a.ready, "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
    if a.root_from:
        give_up = time.monotonic() + 60
        while a.root is None:
            try:
                with open(a.root_from, encoding="utf-8") as f:
                    a.root = int(f.read().strip())
            except (OSError, ValueError):
                if stop or time.monotonic() > give_up:
                    print("runstat.py: no pid in " + a.root_from, file=sys.stderr)
                    sys.exit(1)
                time.sleep(0.002)

    root_start = proc_table().get(a.root, (None, None, None, None))[2]
    known = {}  # (pid, starttime) -> comm: every descendant of root seen
    launchers = set()  # (pid, starttime) of NAMES processes that are root's children
    ranks_seen = set()
    st = {"samples": 0, "established_peak": 0, "rss_peak_kib": 0, "rss_total_peak_kib": 0,
          "launcher_rss_peak_kib": 0, "ranks_peak": 0, "threads_peak": 0}
    t_end = time.monotonic() + a.max_seconds

    def root_alive(table):
        r = table.get(a.root)
        return r is not None and r[2] == root_start and r[3] != "Z"

    while True:
        t0 = time.monotonic()
        table = proc_table()
        alive_root = root_alive(table)
        children = {}
        for pid, (_c, ppid, _s, _st) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = list(children.get(a.root, [])) if alive_root else []
        while todo:
            pid = todo.pop()
            comm, ppid, start, _state = table[pid]
            known[(pid, start)] = comm
            if ppid == a.root and comm in names:
                launchers.add((pid, start))
            todo.extend(children.get(pid, []))
        rss_total = threads_total = nranks = 0
        for (pid, start), comm in list(known.items()):
            cur = table.get(pid)
            if cur is None or cur[2] != start or cur[3] == "Z" or comm not in names:
                continue
            f = status_fields(pid)
            if f is None:
                continue
            if (pid, start) in launchers:
                st["launcher_rss_peak_kib"] = max(st["launcher_rss_peak_kib"], f[0])
                continue
            ranks_seen.add((pid, start))
            nranks += 1
            rss_total += f[0]
            threads_total += f[1]
            st["rss_peak_kib"] = max(st["rss_peak_kib"], f[0])
        st["rss_total_peak_kib"] = max(st["rss_total_peak_kib"], rss_total)
        st["threads_peak"] = max(st["threads_peak"], threads_total)
        st["ranks_peak"] = max(st["ranks_peak"], nranks)
        n = established()
        if n is not None:
            st["established_peak"] = max(st["established_peak"], n)
        st["samples"] += 1
        if not alive_root or stop or time.monotonic() > t_end:
            break
        time.sleep(max(0.0, a.interval - (time.monotonic() - t0)))

    # The job is over (or we were told to stop): stop what is left of it.
    def leftovers():
        table = proc_table()
        return [(pid, start, comm) for (pid, start), comm in known.items()
                if pid in table and table[pid][2] == start and table[pid][3] != "Z"
                and not (pid == a.root)]

    left = leftovers() if not root_alive(proc_table()) else []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, _start, _comm in leftovers() if left else []:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if left and sig == signal.SIGTERM:
            time.sleep(1.0)
    st["ranks_seen"] = len(ranks_seen)
    st["leftover"] = len(left)
    st["leftover_names"] = ",".join(sorted({c for _p, _s, c in left})) or "-"
    for k in ("samples", "established_peak", "rss_peak_kib", "rss_total_peak_kib",
              "launcher_rss_peak_kib", "ranks_seen", "ranks_peak", "threads_peak", "leftover",
              "leftover_names"):
        print(f"{k}\t{st[k]}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
