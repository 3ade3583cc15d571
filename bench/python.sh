#!/usr/bin/env bash
# Python beside the multirail command on loopback, 2 rails, interleaved
# rounds, medians (issue 13):
#
#   bench/python.sh [--rounds N]
#
#   8 B one-way latency (us, average and median of the half round trips):
#       multirail bench latency --sizes 8   vs  examples/python/pingpong.py
#   4 MiB bandwidth (MB/s = 10^6 B/s, window 64, 20 windows after 2):
#       multirail bench bw --sizes 4M       vs  examples/python/pingpong.py
#       with numpy arrays over multirail.Buffer (received in place), and
#       with --plain numpy arrays (received through one copy)
# Rails tcp:127.0.0.1,tcp:127.0.0.2 with MULTIRAIL_SHM=off. PYTHON (default
# python3) must import multirail and numpy: pip install numpy
# ./crates/multirail-py. Targets: Python bandwidth >= 0.9 x bench; Python
# latency within 2 us of the C API's pingpong (measured separately; here
# compared with bench latency). Results: docs/benchmarks.md.
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
PY=${PYTHON:-python3}
if ! "$PY" -c 'import multirail, numpy' 2>/dev/null; then
    echo "$PY cannot import multirail and numpy: pip install numpy ./crates/multirail-py (or set PYTHON)" >&2
    exit 1
fi
cargo build --release -q -p multirail-cli
M=$PWD/target/release/multirail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
field() { # FILE KEY -> the KEY of the last JSON line of FILE
    "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])' "$1" "$2"
}
pyping() { # TEST SIZE [ARGS...] -> JSON line in $tmp/py
    local t=$1 s=$2
    shift 2
    timeout 300 "$M" run -n 2 -- "$PY" examples/python/pingpong.py --test "$t" --sizes "$s" --json "$@" >"$tmp/py"
}
for r in $(seq "$rounds"); do
    timeout 300 "$M" bench latency --sizes 8 --rails "$MULTIRAIL_RAILS" --json --quiet >"$tmp/mr"
    echo "bench_lat $(field "$tmp/mr" value) $(field "$tmp/mr" p50)" >>"$tmp/all"
    pyping latency 8
    echo "py_lat $(field "$tmp/py" latency_us) $(field "$tmp/py" latency_p50_us)" >>"$tmp/all"
    timeout 300 "$M" bench bw --sizes 4M --rails "$MULTIRAIL_RAILS" --json --quiet >"$tmp/mr"
    echo "bench_bw $(field "$tmp/mr" value)" >>"$tmp/all"
    pyping bw 4M
    echo "py_bw $(field "$tmp/py" bandwidth_MBps)" >>"$tmp/all"
    pyping bw 4M --plain
    echo "py_plain_bw $(field "$tmp/py" bandwidth_MBps)" >>"$tmp/all"
    echo "round $r of $rounds done" >&2
done
"$PY" - "$tmp/all" "$rounds" <<'PYEOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    k, *v = line.split()
    rows.setdefault(k, []).append([float(x) for x in v])
med = lambda k, i=0: statistics.median(r[i] for r in rows[k])
print(f"# loopback, rails tcp:127.0.0.1,tcp:127.0.0.2, MULTIRAIL_SHM=off; medians of {sys.argv[2]} interleaved rounds")
print(f"{'':28} {'bench':>10} {'Python':>10} {'Python - bench / ratio':>24}")
for name, i in (("8 B latency avg (us)", 0), ("8 B latency p50 (us)", 1)):
    b, p = med("bench_lat", i), med("py_lat", i)
    print(f"{name:28} {b:>10.2f} {p:>10.2f} {p - b:>+21.2f} us")
b = med("bench_bw")
for name, k in (("4 MiB bw, Buffer (MB/s)", "py_bw"), ("4 MiB bw, plain numpy (MB/s)", "py_plain_bw")):
    p = med(k)
    print(f"{name:28} {b:>10.1f} {p:>10.1f} {p / b:>22.3f} x")
PYEOF
