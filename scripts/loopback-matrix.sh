#!/usr/bin/env bash
# Bandwidth at 1 MiB and 4 MiB and 8 B latency over loopback, 1 rail vs 2
# rails, every scheduling policy, both progress engines, side by side in one
# `--compare` run per test (medians over rounds, ratio to the first column:
# one rail, polled engine).
#
#   scripts/loopback-matrix.sh [--rounds N] [--pin LIST] [--out DIR]
#
# Writes DIR/bw.txt and DIR/latency.txt (the comparison tables).
# Loopback rails: tcp:127.0.0.1 and tcp:127.0.0.2.
set -euo pipefail
# The rails measured here are loopback TCP: the two ranks of this host must
# use them, not the shared memory they would get by themselves.
export MULTIRAIL_SHM=off
rounds=3 pin=none out=
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --pin) pin=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
out=${out:-$(mktemp -d /tmp/multirail-matrix.XXXXXX)}
mkdir -p "$out"
cargo build --release -q -p multirail-cli
M=target/release/multirail

one=tcp:127.0.0.1
two=tcp:127.0.0.1,tcp:127.0.0.2
configs=()
for progress in polled threaded; do
    configs+=("rails=$one;progress=$progress;policy=*:single")
    for policy in '*:single' '*:round-robin' '*:stripe' '*:weighted' '*:adaptive' '16K:single,*:adaptive'; do
        configs+=("rails=$two;progress=$progress;policy=$policy")
    done
done

echo "results in $out" >&2
$M bench bw --sizes 1M,4M --pin "$pin" --rounds "$rounds" \
    --compare "${configs[@]}" | tee "$out/bw.txt"
$M bench latency --sizes 8 --pin "$pin" --rounds "$rounds" \
    --compare "${configs[@]}" | tee "$out/latency.txt"
