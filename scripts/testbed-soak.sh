#!/usr/bin/env bash
# Soak on the emulated cluster with silent link losses of random length:
# validated bw runs (sizes 1 B..8 MiB) back to back for --minutes, while a
# chaos loop takes a random rail down in a random host (`ip link set down`:
# nothing tells TCP) for a random time (--min-down..--max-down) every
# 0.2-2 s. Reports the runs (all must pass validation), the outages, the
# longest run, and the ranks' peak resident memory per run (flat = no
# growth). Every run is bounded (--timeout); a run over it is a failure.
#
#   sudo scripts/testbed-soak.sh [--minutes 10] [--prefix mrsoak] [--rate 2gbit,2gbit]
#                                [--min-down 20ms] [--max-down 5s] [--timeout 180] [--seed N]
set -euo pipefail
minutes=10 prefix=mrsoak rate=2gbit,2gbit min_down=20 max_down=5000 timeout_s=180 seed=$$ made=0
ms() { case "$1" in *ms) echo "${1%ms}" ;; *s) awk -v v="${1%s}" 'BEGIN { printf "%d", v * 1000 }' ;; *) echo "$1" ;; esac; }
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes=$2; shift 2 ;;
        --prefix) prefix=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --min-down) min_down=$(ms "$2"); shift 2 ;;
        --max-down) max_down=$(ms "$2"); shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "the testbed needs root" >&2; exit 2; }
cd "$(dirname "$0")/.."
cargo build --release -q -p multirail-cli
M=target/release/multirail
if ! $M testbed status --prefix "$prefix" >/dev/null 2>&1; then
    $M testbed up --prefix "$prefix" --rate "$rate" >/dev/null
    made=1
fi
log=$(mktemp -d)
chaos_pid=
cleanup() {
    if [ -n "$chaos_pid" ]; then kill "$chaos_pid" 2>/dev/null || true; fi
    for h in 0 1; do for r in 0 1 2 3; do
        ip -n "$prefix-host$h" link set "rail$r" up 2>/dev/null || true
    done; done
    if [ "$made" = 1 ]; then $M testbed down --prefix "$prefix" >/dev/null || true; fi
    rm -rf "$log"
}
trap cleanup EXIT
rails=$($M testbed status --prefix "$prefix" --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["hosts"][0]["rails"]))')

# The chaos loop: seeded, logs each outage.
(
    RANDOM=$seed
    while :; do
        sleep "$(awk -v r="$RANDOM" 'BEGIN { printf "%.3f", 0.2 + 1.8 * r / 32767 }')"
        h=$((RANDOM % 2)) r=$((RANDOM % rails))
        d=$(awk -v r="$RANDOM" -v a="$min_down" -v b="$max_down" 'BEGIN { printf "%.3f", (a + (b - a) * r / 32767) / 1000 }')
        ip -n "$prefix-host$h" link set "rail$r" down
        echo "$(date +%s.%N) host$h rail$r down for ${d}s" >>"$log/outages"
        sleep "$d"
        ip -n "$prefix-host$h" link set "rail$r" up
    done
) &
chaos_pid=$!

end=$(( $(date +%s) + minutes * 60 ))
runs=0 failures=0 longest=0
sizes=(1 4K 64K 300K 1M 4M 8M)
echo "# soak: $minutes min on testbed $prefix ($rate), outages ${min_down}..${max_down} ms, seed $seed"
while [ "$(date +%s)" -lt "$end" ]; do
    size=${sizes[$((runs % ${#sizes[@]}))]}
    t0=$(date +%s.%N)
    # Sample the ranks' resident memory while the run lasts (written with a
    # rename, so that killing the sampler never leaves a truncated file).
    rm -f "$log/rss"
    ( peak=0; while sleep 0.2; do
        for p in $(pgrep -x multirail); do
            v=$(awk '/VmRSS/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
            [ "${v:-0}" -gt "$peak" ] && peak=$v
        done
        echo "$peak" >"$log/rss.new" && mv "$log/rss.new" "$log/rss"
    done ) &
    sampler=$!
    rc=0
    case $size in 1|4K|64K) iters=30 ;; 300K|1M) iters=10 ;; *) iters=3 ;; esac
    timeout --kill-after=5 "$timeout_s" $M bench bw --testbed --testbed-prefix "$prefix" --pin 0,1 --validate \
        --sizes "$size" --iterations "$iters" --warmup 1 --quiet >"$log/out" 2>"$log/err" || rc=$?
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    rss=$(cat "$log/rss" 2>/dev/null || echo 0)
    runs=$((runs + 1))
    awk -v d="$dt" -v l="$longest" 'BEGIN { exit !(d > l) }' && longest=$dt
    if [ "$rc" != 0 ] || ! tail -1 "$log/out" | grep -q Pass; then
        failures=$((failures + 1))
        echo "run $runs ($size): FAILED (exit $rc) after ${dt}s" >&2
        tail -5 "$log/err" >&2
    else
        echo "run $runs ($size): ok in ${dt}s, $(tail -1 "$log/out" | awk '{ print $2 }') MB/s, peak RSS/rank $((rss / 1024)) MiB"
        echo "$size $rss" >>"$log/rss-by-size"
    fi
done
outages=$(wc -l <"$log/outages" 2>/dev/null || echo 0)
echo "# soak: $runs validated runs, $failures failed, $outages silent outages, longest run ${longest}s"
echo "# peak RSS per rank by size, first and last third of the soak (flat = no growth):"
awk '{ n[$1]++; v[$1, n[$1]] = $2 } END { for (s in n) { k = n[s]; t = int(k / 3); if (t < 1) t = 1
    a = 0; b = 0; for (i = 1; i <= t; i++) { if (v[s, i] > a) a = v[s, i]; if (v[s, k - i + 1] > b) b = v[s, k - i + 1] }
    printf "#   %-5s %4d runs  %7.1f MiB -> %7.1f MiB\n", s, k, a / 1024, b / 1024 } }' "$log/rss-by-size" 2>/dev/null || true
[ "$failures" = 0 ]
