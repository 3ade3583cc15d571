#!/usr/bin/env bash
# bench/msg-instructions.sh - CPU instructions per small message, counted by
# callgrind (valgrind), for one or more multirail binaries side by side.
#
# Wall-clock latency on a shared 2-vCPU machine swings with its load;
# instruction counts do not. This runs `multirail bench latency --sizes 8`
# under callgrind for each binary and prints, per rank, the instructions
# spent per message in the send path (Endpoint::isend_raw, everything the
# application's isend does, up to and including the write) and in the
# receive path (the engine's frame sink: everything an arrived frame causes,
# completion included, not the read system call), the protocol core's share
# of the receive (Core::on_frame), and the total. Spinning (the
# waiting loop) is not counted in any path: under callgrind it runs 50x
# slower, and its share means nothing.
#
# The two ranks run on one host, so they would talk over the automatic
# `shm` rail; unless SPEC names `shm`, MULTIRAIL_SHM=off makes them use the
# rails SPEC names (before 2026-11-27 the script left it on, and its
# "tcp:127.0.0.1" figures were shm's).
#
# Usage: bench/msg-instructions.sh [--iterations N] [--rails SPEC] [--progress P] BINARY...
#   e.g. bench/msg-instructions.sh /tmp/multirail-old target/release/multirail
set -euo pipefail

iters=5000
rails=tcp:127.0.0.1
progress=polled
bins=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --iterations) iters=$2; shift 2 ;;
        --rails) rails=$2; shift 2 ;;
        --progress) progress=$2; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
        *) bins+=("$1"); shift ;;
    esac
done
[[ ${#bins[@]} -gt 0 ]] || { echo "give at least one multirail binary (see --help)" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
command -v callgrind_annotate >/dev/null || { echo "callgrind_annotate is missing (valgrind package)" >&2; exit 2; }

# Two ranks on one host talk over shared memory unless told otherwise,
# whatever --rails names: measure the rails asked for.
case ,$rails, in
    *,shm,*) export MULTIRAIL_SHM=${MULTIRAIL_SHM:-auto} ;;
    *) export MULTIRAIL_SHM=off ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '%-40s %5s %12s %12s %12s %14s\n' binary rank "send/msg" "recv/msg" "core rx/msg" "total Ir"
for b in "${bins[@]}"; do
    [[ -x $b ]] || { echo "$b: not an executable" >&2; exit 2; }
    out=$work/$(basename "$b")-$RANDOM
    mkdir -p "$out"
    timeout 600 valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$out/cg.%p" \
        "$b" bench latency --sizes 8 --iterations "$iters" --rails "$rails" --progress "$progress" \
        >"$out/bench.log" 2>&1 || { tail -n 20 "$out/bench.log" >&2; echo "$b: the run failed" >&2; exit 1; }
    rank=0
    for f in "$out"/cg.*; do
        ann=$(callgrind_annotate --inclusive=yes "$f" 2>/dev/null)
        # Ranks are the processes that ran the kernel (the launcher did not).
        grep -q 'Endpoint::isend_raw \[' <<<"$ann" || continue
        python3 - "$b" "$rank" "$iters" <<PY
import re, sys
b, rank, iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
ann = """$ann"""
def incl(pat):
    best = 0
    for line in ann.splitlines():
        m = re.match(r'\s*([\d,]+) ', line)
        if m and re.search(pat, line):
            best = max(best, int(m.group(1).replace(',', '')))
    return best
total = incl(r'PROGRAM TOTALS')
# The measured iterations plus the warm-up (the latency kernel's default skip).
calls = None
for line in ann.splitlines():
    if 'Endpoint::isend_raw [' in line:
        m = re.search(r'\(([\d,]+)x\)', line)
        if m: calls = int(m.group(1).replace(',', ''))
msgs = calls or iters
send = incl(r'Endpoint::isend_raw \[')
recv = incl(r'CoreSink as multirail_transport::FrameSink>::on_frame \[')
core = incl(r'Core>::on_frame \[')
print(f'{b[-40:]:<40} {rank:>5} {send/msgs:12.0f} {recv/msgs:12.0f} {core/msgs:12.0f} {total:14,}')
PY
        rank=$((rank + 1))
    done
done
echo "(instructions per message; $iters iterations of 8 B ping-pong, rails $rails, progress $progress)"
