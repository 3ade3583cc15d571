#!/usr/bin/env bash
# Measures how long delivery stalls when a rail dies: N validated bw runs,
# each taking rail 1 down once (--fail-rail), and prints every stall plus
# the median and the worst.
#
#   scripts/failover-stalls.sh [--runs N] [--testbed [--prefix P]] [--down-for D] [--policy POLICY]
#
# Without --testbed: two loopback rails; the fault-injecting rail kills
# rail 1's connection (the peer sees it close at once).
# With --testbed (root): rail 1's interface goes down inside host0
# (`ip link set rail1 down`): nothing tells TCP, so multirail has to notice
# by itself (retransmission timer, then heartbeats).
set -euo pipefail
runs=20 testbed=0 prefix=mrfail down_for=500ms policy="16K:single,*:adaptive" made=0
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs=$2; shift 2 ;;
        --testbed) testbed=1; shift ;;
        --prefix) prefix=$2; shift 2 ;;
        --down-for) down_for=$2; shift 2 ;;
        --policy) policy=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
cargo build --release -q -p multirail-cli
M=target/release/multirail
where=()
if [ "$testbed" = 1 ]; then
    if ! $M testbed status --prefix "$prefix" >/dev/null 2>&1; then
        $M testbed up --prefix "$prefix" --rate 2gbit,2gbit >/dev/null
        made=1
    fi
    where=(--testbed --testbed-prefix "$prefix" --pin 0,1)
fi
cleanup() { [ "$made" = 1 ] && $M testbed down --prefix "$prefix" >/dev/null || true; }
trap cleanup EXIT
stalls=()
for i in $(seq 1 "$runs"); do
    out=$($M bench bw "${where[@]}" --policy "$policy" --validate --sizes 1M --iterations 40 --warmup 2 \
        --fail-rail "1@300ms:for=$down_for" 2>&1 >/dev/null)
    s=$(printf '%s\n' "$out" | sed -n 's/.*longest delivery stall after the failure: \([0-9.]*\) ms.*/\1/p')
    if [ -z "$s" ]; then
        printf '%s\n' "$out" >&2
        echo "run $i: no stall reported (the run failed or ended before the failure)" >&2
        exit 1
    fi
    stalls+=("$s")
    echo "run $i: stall $s ms"
done
printf '%s\n' "${stalls[@]}" | sort -n | awk '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
    printf "runs %d  median stall %.1f ms  worst %.1f ms  best %.1f ms\n", NR, m, v[NR], v[1] }'
