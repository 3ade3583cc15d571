#!/usr/bin/env bash
# multirail beside ucx_perftest on this machine's loopback: 8 B one-way
# latency and 1 MiB bandwidth, interleaved rounds, medians and ratios.
#
#   bench/ucx-loopback.sh [--rounds N] [--pin CPU0,CPU1]
#
# UCX: UCX_TLS=tcp UCX_NET_DEVICES=lo, server and client on 127.0.0.1,
# `ucx_perftest -t tag_lat -s 8` and `-t tag_bw -s 1048576` (its MiB/s are
# converted to MB/s = 10^6 B/s). multirail: `bench latency --sizes 8` and
# `bench bw --sizes 1M` with one loopback rail and with the default two.
# The iteration counts are OSU's (and the same for both tools): latency
# 10000 after 100 warm-up; bandwidth 20 windows of 64 after 2 (UCX streams
# the same number of messages). Needs ucx-utils (`apt-get install
# ucx-utils`). --pin runs rank 0 / the UCX client on CPU0 and the other on
# CPU1 (default: unpinned, which is often faster on a 2-core VM).
set -euo pipefail
# The rails measured here are loopback TCP: the two ranks of this host must
# use them, not the shared memory they would get by themselves.
export MULTIRAIL_SHM=off
rounds=5 pin=
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --pin) pin=$2; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/ucx.sh
. bench/lib/ucx.sh
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found: apt-get install ucx-utils" >&2; exit 1; }
cargo build --release -q -p multirail-cli
M=$PWD/target/release/multirail
H=$PWD/bench/lib/mrcmp.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
UCX_CLIENT_PREFIX=() UCX_SERVER_PREFIX=() mrpin=(--pin none)
if [ -n "$pin" ]; then
    UCX_CLIENT_PREFIX=(taskset -c "${pin%%,*}") UCX_SERVER_PREFIX=(taskset -c "${pin##*,}") mrpin=(--pin "$pin")
fi
port=13600
ucx() { # TEST SIZE N WARMUP KIND -> value
    ucx_perftest_pair $((port++)) "$tmp" "UCX_TLS=tcp UCX_NET_DEVICES=lo" -t "$1" -s "$2" -n "$3" -w "$4"
    python3 "$H" ucx "$tmp/client" "$5"
}
mr() { # TEST SIZE RAILS -> value
    "$M" bench "$1" --sizes "$2" --rails "$3" "${mrpin[@]}" --json --quiet >"$tmp/mr"
    python3 "$H" mr "$tmp/mr" | awk '{ print $2 }'
}
one=tcp:127.0.0.1 two=tcp:127.0.0.1,tcp:127.0.0.2
declare -A v
for r in $(seq "$rounds"); do
    echo "round $r/$rounds" >&2
    v[ucx_lat]+=" $(ucx tag_lat 8 10000 100 lat)"
    v[mr1_lat]+=" $(mr latency 8 $one)"
    v[mr2_lat]+=" $(mr latency 8 $two)"
    v[ucx_bw]+=" $(ucx tag_bw 1048576 1280 128 bw)"
    v[mr1_bw]+=" $(mr bw 1M $one)"
    v[mr2_bw]+=" $(mr bw 1M $two)"
done
declare -A m
for k in "${!v[@]}"; do m[$k]=$(echo "${v[$k]}" | median); done
printf '# ucx_perftest %s vs multirail, loopback, %s rounds, medians (pin: %s)\n' \
    "$(ucx_info -v | sed -n 's/# Version //p')" "$rounds" "${pin:-none}"
printf '%-34s %16s %12s %18s %12s\n' "tool" "8 B latency (us)" "ratio" "1 MiB bw (MB/s)" "ratio"
row() { awk -v n="$1" -v l="$2" -v b="$3" -v l0="${m[ucx_lat]}" -v b0="${m[ucx_bw]}" \
    'BEGIN { printf "%-34s %16.2f %12.3f %18.1f %12.3f\n", n, l, l / l0, b, b / b0 }'; }
row "ucx_perftest (UCX_TLS=tcp, lo)" "${m[ucx_lat]}" "${m[ucx_bw]}"
row "multirail, 1 rail" "${m[mr1_lat]}" "${m[mr1_bw]}"
row "multirail, 2 rails (default)" "${m[mr2_lat]}" "${m[mr2_bw]}"
echo "# all values: ucx_lat${v[ucx_lat]} | mr1_lat${v[mr1_lat]} | mr2_lat${v[mr2_lat]}"
echo "# all values: ucx_bw${v[ucx_bw]} | mr1_bw${v[mr1_bw]} | mr2_bw${v[mr2_bw]}"
