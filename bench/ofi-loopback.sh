#!/usr/bin/env bash
# The libfabric rail beside the native rails and fi_pingpong on this
# machine: 8 B one-way latency and 1 MiB / 4 MiB bandwidth, interleaved
# rounds, medians.
#
#   bench/ofi-loopback.sh [--rounds N]
#
# multirail (built with --features ofi): `bench latency --sizes 8` and
# `bench bw --sizes 1M,4M` over ofi:tcp:127.0.0.1 vs tcp:127.0.0.1, over
# two rails ofi:tcp:127.0.0.1,ofi:tcp:127.0.0.2 vs tcp:127.0.0.1,tcp:127.0.0.2,
# and over ofi:shm vs shm (OSU's iteration counts). libfabric's own:
# `fi_pingpong -e rdm -S 8 -I 10000` with -p "tcp;ofi_rxm" and -p shm
# (its usec/xfer, one way). Needs libfabric-dev and libfabric-bin.
set -euo pipefail
rounds=3
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/ucx.sh
. bench/lib/ucx.sh # median
# shellcheck source-path=SCRIPTDIR source=lib/fipp.sh
. bench/lib/fipp.sh # fipp
command -v fi_pingpong >/dev/null || { echo "fi_pingpong not found: apt-get install libfabric-bin" >&2; exit 1; }
cargo build --release -q -p multirail-cli --features ofi
M=$PWD/target/release/multirail
H=$PWD/bench/lib/mrcmp.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mr() { # TEST SIZE RAILS -> value
    # Two ranks on one host talk over the automatic shm rail unless told
    # otherwise: measure the rails named (the native shm rail only where
    # they name it; ofi:shm is the libfabric one, not it).
    local shm=off
    case ,$3, in *,shm,*) shm=auto ;; esac
    MULTIRAIL_SHM=$shm "$M" bench "$1" --sizes "$2" --rails "$3" --json --quiet >"$tmp/mr"
    python3 "$H" mr "$tmp/mr" | awk '{ print $2 }'
}
declare -A rails=([ofi1]=ofi:tcp:127.0.0.1 [tcp1]=tcp:127.0.0.1 [ofi2]=ofi:tcp:127.0.0.1,ofi:tcp:127.0.0.2
    [tcp2]=tcp:127.0.0.1,tcp:127.0.0.2 [ofishm]=ofi:shm [shm]=shm)
order=(ofi1 tcp1 ofi2 tcp2 ofishm shm)
declare -A v
for r in $(seq "$rounds"); do
    echo "round $r/$rounds" >&2
    v[fi_tcp]+=" $(fipp "$tmp" 10000 'tcp;ofi_rxm')"
    v[fi_shm]+=" $(fipp "$tmp" 10000 shm)"
    for k in "${order[@]}"; do
        v[$k.lat]+=" $(mr latency 8 "${rails[$k]}")"
        v[$k.1M]+=" $(mr bw 1M "${rails[$k]}")"
        v[$k.4M]+=" $(mr bw 4M "${rails[$k]}")"
    done
done
med() { echo "${v[$1]}" | median; }
echo "# medians of $rounds rounds; latency in us (one way), bandwidth in MB/s"
printf '%-40s %12s %12s %12s\n' "rails" "8 B lat" "1 MiB bw" "4 MiB bw"
for k in "${order[@]}"; do
    printf '%-40s %12s %12s %12s\n' "${rails[$k]}" "$(med "$k.lat")" "$(med "$k.1M")" "$(med "$k.4M")"
done
printf '%-40s %12s\n' 'fi_pingpong -p "tcp;ofi_rxm"' "$(med fi_tcp)"
printf '%-40s %12s\n' 'fi_pingpong -p shm' "$(med fi_shm)"
