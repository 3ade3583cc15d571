#!/usr/bin/env bash
# The C API beside the multirail command on loopback, 2 rails, interleaved
# rounds, medians (issue 13):
#
#   bench/bindings.sh [--rounds N]
#
#   8 B one-way latency (us):  multirail bench latency --sizes 8
#                              vs examples/c/pingpong.c (half the average round trip)
#   4 MiB bandwidth (MB/s):    multirail bench bw --sizes 4M
#                              vs examples/c/pingpong.c (window 64, one reply per window)
#   Python (when PYTHON, default python3, imports multirail and numpy):
#   8 B latency of examples/python/pingpong.py beside the C figure
# Rails tcp:127.0.0.1,tcp:127.0.0.2 with MULTIRAIL_SHM=off. Targets: C
# latency at most 1.05 x bench, C bandwidth at least 0.97 x bench, Python
# latency within 2 us of C. Python's bandwidth: bench/python.sh. Results:
# docs/benchmarks.md.
set -euo pipefail
export MULTIRAIL_SHM=off MULTIRAIL_RAILS=tcp:127.0.0.1,tcp:127.0.0.2
rounds=5
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/ucx.sh
. bench/lib/ucx.sh # median
command -v cc >/dev/null || { echo "bench/bindings.sh: needs a C compiler (apt-get install build-essential)" >&2; exit 1; }
cargo build --release -q -p multirail-cli -p multirail-capi
M=$PWD/target/release/multirail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -Icrates/multirail-capi/include examples/c/pingpong.c target/release/libmultirail_c.a \
    -lpthread -ldl -lm -o "$tmp/pingpong"
bench() { # TEST SIZE -> value of multirail bench
    "$M" bench "$1" --sizes "$2" --quiet | awk '!/^#/ { print $2 }'
}
PY=${PYTHON:-python3}
py=0
if "$PY" -c 'import multirail, numpy' 2>/dev/null; then py=1; else
    echo "# $PY cannot import multirail and numpy: Python not measured (pip install numpy ./crates/multirail-py)" >&2
fi
declare -A v
for r in $(seq "$rounds"); do
    echo "round $r/$rounds" >&2
    v[bench_lat]+=" $(bench latency 8)"
    "$M" run -n 2 -- "$tmp/pingpong" 8 10000 >"$tmp/c8"
    v[c_lat]+=" $(awk '$1 == "latency" { print $3 }' "$tmp/c8")"
    if [ "$py" = 1 ]; then
        "$M" run -n 2 -- "$PY" examples/python/pingpong.py --test latency --sizes 8 --json >"$tmp/py8"
        v[py_lat]+=" $("$PY" -c 'import json,sys; d = json.loads(open(sys.argv[1]).read().splitlines()[-1]); print(round(d["latency_us"], 2))' "$tmp/py8")"
    fi
    v[bench_bw]+=" $(bench bw 4M)"
    "$M" run -n 2 -- "$tmp/pingpong" 4M 200 >"$tmp/c4m"
    v[c_bw]+=" $(awk '$1 == "bw" { print $3 }' "$tmp/c4m")"
done
med() { echo "${v[$1]}" | median; }
ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }
bl=$(med bench_lat) cl=$(med c_lat) bb=$(med bench_bw) cb=$(med c_bw)
echo "# C API vs multirail bench, loopback, $MULTIRAIL_RAILS, MULTIRAIL_SHM=off, $rounds rounds, medians"
printf '%-22s %12s %12s %8s  %s\n' "test" "bench" "C" "C/bench" "target"
printf '%-22s %12s %12s %8s  %s\n' "8 B latency (us)" "$bl" "$cl" "$(ratio "$cl" "$bl")" "<= 1.05"
printf '%-22s %12s %12s %8s  %s\n' "4 MiB bw (MB/s)" "$bb" "$cb" "$(ratio "$cb" "$bb")" ">= 0.97"
if [ "$py" = 1 ]; then
    pl=$(med py_lat)
    printf '%-22s %12s %12s %8s  %s\n' "8 B latency (us)" "C $cl" "Py $pl" \
        "$(python3 -c "print(f'{$pl - $cl:+.2f}')")" "Python - C <= 2 us"
fi
for k in bench_lat c_lat py_lat bench_bw c_bw; do [ -n "${v[$k]:-}" ] && echo "# $k:${v[$k]}"; done
true
