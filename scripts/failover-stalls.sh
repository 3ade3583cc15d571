#!/usr/bin/env bash
# Measures what a rail failure costs: N validated bw runs (1 MiB messages),
# each taking rail 1 down once 300 ms in (--fail-rail), and reports per run
# the longest delivery stall, the throughput while the rail was down and
# how long after it came back it carried data again; then median and worst.
#
#   scripts/failover-stalls.sh [--runs N] [--down-for 500ms|3s|30s|forever] [--side host0|host1]
#                              [--testbed [--prefix P]] [--policy POLICY] [--timeout SECONDS]
#   scripts/failover-stalls.sh --matrix [--runs N] [--prefix P] [--out FILE]
#
# Without --testbed: two loopback rails; the fault-injecting rail kills
# rail 1's connection (the peer sees it close at once).
# With --testbed (root): rail 1's interface goes down inside host0 or host1
# (`ip link set rail1 down`): nothing tells TCP, so multirail has to notice
# by itself.
# --matrix (root): the table of issue 8 in one sitting on a 2 x 2 Gbit
# testbed: outages of 500 ms, 3 s and forever, taken down in host0 and in
# host1, N runs each (default 10), plus iperf3 over one rail for the
# throughput the surviving rail can give. The validated runs' wall clock
# includes the time the ranks spend checking payloads (about a tenth at
# 1 MiB), so the matrix ends with unvalidated runs, rail 1 down for good,
# for the throughput alone.
# A run that does not finish within --timeout seconds (default 90) is
# killed and reported as a failure: the script never hangs.
set -euo pipefail
# Local runs fail a loopback TCP rail: the two ranks must use those rails,
# not the shared memory two ranks of one host get by themselves.
export MULTIRAIL_SHM=off
runs="" testbed=0 prefix=mrfail down_for=500ms side=host0 policy="" made=0
timeout_s=90 matrix=0 out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs=$2; shift 2 ;;
        --testbed) testbed=1; shift ;;
        --prefix) prefix=$2; shift 2 ;;
        --down-for) down_for=$2; shift 2 ;;
        --side) side=$2; shift 2 ;;
        --policy) policy=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --matrix) matrix=1; testbed=1; shift ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$side" in host0|host1) ;; *) echo "--side must be host0 or host1" >&2; exit 2 ;; esac
if [ "$side" != host0 ] && [ "$testbed" = 0 ]; then
    echo "--side needs --testbed (there are no sides on loopback)" >&2
    exit 2
fi
if [ -z "$runs" ]; then
    if [ "$matrix" = 1 ]; then runs=10; else runs=20; fi
fi
cd "$(dirname "$0")/.."
cargo build --release -q -p multirail-cli
M=target/release/multirail
where=()
if [ "$testbed" = 1 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "--testbed and --matrix need root (network namespaces)" >&2
        exit 2
    fi
    if ! $M testbed status --prefix "$prefix" >/dev/null 2>&1; then
        $M testbed up --prefix "$prefix" --rate 2gbit,2gbit >/dev/null
        made=1
    fi
    # shellcheck disable=SC2054  # "0,1" is one argument
    where=(--testbed --testbed-prefix "$prefix" --pin 0,1)
fi
cleanup() { if [ "$made" = 1 ]; then $M testbed down --prefix "$prefix" >/dev/null || true; fi; }
trap cleanup EXIT

# median of numbers on stdin ("-" if none)
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "-"; exit }
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.1f\n", m }'; }
worst() { sort -n | awk 'END { if (NR == 0) print "-"; else printf "%.1f\n", $1 }'; }

# One configuration: prints per-run lines to stderr and a summary line
# "median_stall worst_stall median_MBps median_rejoin worst_rejoin failures" to stdout.
measure() {
    local dfor=$1 sd=$2 spec iters=40 check=(--validate)
    if [ "${3:-}" = unvalidated ]; then check=(); fi
    spec="1@300ms:for=$dfor"
    if [ "$testbed" = 1 ]; then spec="$spec:side=$sd"; fi
    # A long outage needs a run that outlasts it.
    case "$dfor" in 3s) iters=80 ;; 30s) iters=200 ;; esac
    local stalls=() rates=() rejoins=() failures=0
    for i in $(seq 1 "$runs"); do
        local o rc=0
        o=$(timeout --kill-after=5 "$timeout_s" $M bench bw "${where[@]}" ${policy:+--policy "$policy"} "${check[@]+"${check[@]}"}" \
            --sizes 1M --iterations "$iters" --warmup 2 --fail-rail "$spec" 2>&1 >/dev/null) || rc=$?
        local s r j
        s=$(printf '%s\n' "$o" | sed -n 's/.*longest delivery stall after the failure: \([0-9.]*\) ms.*/\1/p')
        r=$(printf '%s\n' "$o" | sed -n 's/.*throughput during the outage: \([0-9.]*\) MB\/s.*/\1/p')
        j=$(printf '%s\n' "$o" | sed -n 's/.*carried data again \([0-9.]*\) ms after.*/\1/p')
        if [ "$rc" != 0 ] || [ -z "$s" ]; then
            failures=$((failures + 1))
            if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
                echo "  run $i: FAILED: still running after ${timeout_s}s, killed" >&2
            else
                printf '%s\n' "$o" | tail -5 >&2
                echo "  run $i: FAILED (exit $rc)" >&2
            fi
            continue
        fi
        stalls+=("$s")
        [ -n "$r" ] && rates+=("$r")
        [ -n "$j" ] && rejoins+=("$j")
        echo "  run $i: stall $s ms, during the outage ${r:--} MB/s, rejoined after ${j:--} ms" >&2
    done
    printf '%s %s %s %s %s %s\n' \
        "$(printf '%s\n' "${stalls[@]+"${stalls[@]}"}" | grep . | median)" \
        "$(printf '%s\n' "${stalls[@]+"${stalls[@]}"}" | grep . | worst)" \
        "$(printf '%s\n' "${rates[@]+"${rates[@]}"}" | grep . | median)" \
        "$(printf '%s\n' "${rejoins[@]+"${rejoins[@]}"}" | grep . | median)" \
        "$(printf '%s\n' "${rejoins[@]+"${rejoins[@]}"}" | grep . | worst)" \
        "$failures"
}

if [ "$matrix" = 0 ]; then
    echo "# rail 1 down at 300 ms for $down_for$( [ "$testbed" = 1 ] && echo " in $side" ), $runs runs"
    read -r ms ws mr mj wj f < <(measure "$down_for" "$side")
    echo "runs $runs  failed $f  median stall $ms ms  worst $ws ms  throughput during the outage (median) $mr MB/s  rejoined after (median/worst) $mj/$wj ms"
    [ "$f" = 0 ]
    exit
fi

command -v iperf3 >/dev/null || { echo "--matrix needs iperf3 (apt-get install iperf3)" >&2; exit 2; }
# What one rail gives: iperf3 over rail 0 between the two hosts, 3 runs.
ip0=$($M testbed status --prefix "$prefix" --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["hosts"][0]["rails"][0]["addr"])')
iperf=()
for _ in 1 2 3; do
    ip netns exec "$prefix-host0" iperf3 -s -B "$ip0" -1 >/dev/null 2>&1 &
    sleep 0.5
    v=$(ip netns exec "$prefix-host1" iperf3 -c "$ip0" -t 3 -J 2>/dev/null |
        python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e6))' || true)
    wait || true
    [ -n "$v" ] && iperf+=("$v")
done
one=$(printf '%s\n' "${iperf[@]+"${iperf[@]}"}" | grep . | median)
echo "# iperf3 over one rail (median of ${#iperf[@]}): $one MB/s"
rows=()
for dfor in 500ms 3s forever; do
    for sd in host0 host1; do
        echo "# outage $dfor in $sd, $runs runs" >&2
        read -r ms ws mr mj wj f < <(measure "$dfor" "$sd")
        ratio=$(awk -v a="$mr" -v b="$one" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / b }')
        rows+=("$(printf '%-8s %-6s %8s %8s %10s %7s %9s %9s %6s' "$dfor" "$sd" "$ms" "$ws" "$mr" "$ratio" "$mj" "$wj" "$f")")
    done
done
tput=()
for sd in host0 host1; do
    echo "# outage forever in $sd, $runs runs without payload checks" >&2
    read -r ms ws mr mj wj f < <(measure forever "$sd" unvalidated)
    ratio=$(awk -v a="$mr" -v b="$one" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / b }')
    tput+=("$(printf '# unvalidated, rail 1 down for good in %s: %s MB/s during the outage = %s x iperf3 one rail (median of %s, %s failed)' "$sd" "$mr" "$ratio" "$runs" "$f")")
done
{
    echo "# testbed 2 x 2 Gbit, 1 MiB validated bw, rail 1 taken down at 300 ms; $runs runs per row"
    echo "# iperf3 over one rail: $one MB/s"
    printf '%-8s %-6s %8s %8s %10s %7s %9s %9s %6s\n' outage side "stall-md" "worst" "MB/s-out" "x1rail" "rejoin-md" "rejoin-wc" failed
    printf '%s\n' "${rows[@]}"
    echo "# MB/s-out of validated runs counts the time spent checking payloads:"
    printf '%s\n' "${tput[@]}"
} | tee ${out:+"$out"}
