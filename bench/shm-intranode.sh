#!/usr/bin/env bash
# Intra-node: multirail's shm rail beside UCX shared memory and Open MPI's
# vader, on this machine, interleaved rounds, medians and ratios (issue 10).
#
#   bench/shm-intranode.sh [--rounds N] [--no-mpi] [--no-ucx]
#
# Rows: 8 B one-way latency (us), bandwidth at 1 MiB and 4 MiB (MB/s =
# 10^6 B/s, window 64), and mbw_mr with 2 pairs at 8 B (messages/s).
#   multirail:  bench latency|bw|mbw_mr --rails shm (and tcp:127.0.0.1 for
#               reference)
#   UCX:        ucx_perftest -t tag_lat with UCX_TLS=posix,cma; -t tag_bw
#               with UCX_TLS=sysv,cma (its fastest here); no mbw_mr test
#   Open MPI:   bench/mpi/mr_pingpong, mr_bw, mr_mbw_mr (-np 4) with
#               --mca btl self,vader
# Iterations: latency 10000 after 100; bandwidth 20 windows after 2 (UCX
# streams as many messages); mbw_mr 100 windows after 10.
# Needs ucx-utils, openmpi-bin, libopenmpi-dev (make -C bench/mpi).
set -euo pipefail
# The tcp:127.0.0.1 reference rows run over loopback TCP, not over the
# shared memory two ranks of one host get by themselves.
export MULTIRAIL_SHM=off
rounds=5 mpi=1 ucx=1
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --no-mpi) mpi=0; shift ;;
        --no-ucx) ucx=0; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/ucx.sh
. bench/lib/ucx.sh
if [ "$ucx" = 1 ] && ! command -v ucx_perftest >/dev/null; then
    echo "ucx_perftest not found: apt-get install ucx-utils (or --no-ucx)" >&2; exit 1
fi
if [ "$mpi" = 1 ] && ! command -v mpirun >/dev/null; then
    echo "mpirun not found: apt-get install openmpi-bin libopenmpi-dev (or --no-mpi)" >&2; exit 1
fi
cargo build --release -q -p multirail-cli
[ "$mpi" = 1 ] && make -s -C bench/mpi >/dev/null
M=$PWD/target/release/multirail
H=$PWD/bench/lib/mrcmp.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=13700
UCX_CLIENT_PREFIX=() UCX_SERVER_PREFIX=()
ucx_run() { # TLS TEST SIZE N WARMUP KIND -> value
    ucx_perftest_pair $((port++)) "$tmp" "UCX_TLS=$1" -t "$2" -s "$3" -n "$4" -w "$5"
    python3 "$H" ucx "$tmp/client" "$6"
}
mr() { # TEST SIZE RAILS [FIELD] [ARGS...] -> value
    local t=$1 s=$2 r=$3 f=${4:-value}
    shift 4 || shift $#
    timeout 300 "$M" bench "$t" --sizes "$s" --rails "$r" --json --quiet "$@" >"$tmp/mr"
    python3 "$H" mr "$tmp/mr" "$f" | awk '{ print $2 }'
}
ompi() { # NP PROGRAM ARGS... -> the OSU table
    timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$1" --mca btl self,vader --mca pml ob1 \
        "bench/mpi/$2" "${@:3}" >"$tmp/ompi" 2>"$tmp/ompi.err" || { cat "$tmp/ompi.err" >&2; exit 1; }
}
declare -A v
for r in $(seq "$rounds"); do
    echo "round $r/$rounds" >&2
    v[mr_lat]+=" $(mr latency 8 shm)"
    v[tcp_lat]+=" $(mr latency 8 tcp:127.0.0.1)"
    v[mr_bw1]+=" $(mr bw 1M shm)"
    v[tcp_bw1]+=" $(mr bw 1M tcp:127.0.0.1)"
    v[mr_bw4]+=" $(mr bw 4M shm)"
    v[mr_mbw]+=" $(mr mbw_mr 8 shm msg_rate --pairs 2 --iterations 100 --warmup 10)"
    if [ "$ucx" = 1 ]; then
        v[ucx_lat]+=" $(ucx_run posix,cma tag_lat 8 10000 100 lat)"
        v[ucx_bw1]+=" $(ucx_run sysv,cma tag_bw 1048576 1280 128 bw)"
        v[ucx_bw4]+=" $(ucx_run sysv,cma tag_bw 4194304 1280 128 bw)"
    fi
    if [ "$mpi" = 1 ]; then
        ompi 2 mr_pingpong -s 8 -i 10000 -w 100
        v[ompi_lat]+=" $(python3 "$H" osu "$tmp/ompi" | awk '{ print $2 }')"
        ompi 2 mr_bw -s 1048576,4194304 -i 20 -w 2 -W 64
        v[ompi_bw1]+=" $(python3 "$H" osu "$tmp/ompi" | awk '$1 == 1048576 { print $2 }')"
        v[ompi_bw4]+=" $(python3 "$H" osu "$tmp/ompi" | awk '$1 == 4194304 { print $2 }')"
        ompi 4 mr_mbw_mr -s 8 -i 100 -w 10 -W 64
        v[ompi_mbw]+=" $(python3 "$H" osu "$tmp/ompi" 2 | awk '{ print $2 }')"
    fi
done
declare -A m
for k in mr_lat tcp_lat mr_bw1 tcp_bw1 mr_bw4 mr_mbw ucx_lat ucx_bw1 ucx_bw4 ompi_lat ompi_bw1 ompi_bw4 ompi_mbw; do
    m[$k]=$(echo "${v[$k]:-}" | median)
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.3f", a / b }'; }
printf '# multirail shm vs UCX (%s) vs Open MPI vader (%s), one host, %s rounds, medians\n' \
    "$( [ "$ucx" = 1 ] && ucx_info -v | sed -n 's/# Version //p' || echo skipped)" \
    "$( [ "$mpi" = 1 ] && mpirun --version 2>/dev/null | head -1 | awk '{ print $NF }' || echo skipped)" "$rounds"
printf '%-28s %12s %12s %12s %14s %12s %12s\n' test "multirail" "UCX" "Open MPI" "multirail/UCX" "mr/OMPI" "(tcp lo)"
num() { awk -v x="$1" 'BEGIN { if (x == "-") print "-"; else if (x >= 10000) printf "%.0f", x; else printf "%.2f", x }'; }
row() {
    printf '%-28s %12s %12s %12s %14s %12s %12s\n' "$1" "$(num "$2")" "$(num "$3")" "$(num "$4")" \
        "$(ratio "$2" "$3")" "$(ratio "$2" "$4")" "$(num "$5")"
}
row "8 B latency (us)" "${m[mr_lat]}" "${m[ucx_lat]}" "${m[ompi_lat]}" "${m[tcp_lat]}"
row "bw 1 MiB (MB/s)" "${m[mr_bw1]}" "${m[ucx_bw1]}" "${m[ompi_bw1]}" "${m[tcp_bw1]}"
row "bw 4 MiB (MB/s)" "${m[mr_bw4]}" "${m[ucx_bw4]}" "${m[ompi_bw4]}" "-"
row "mbw_mr 2 pairs 8 B (msg/s)" "${m[mr_mbw]}" "-" "${m[ompi_mbw]}" "-"
echo "# latency: lower is better; bw and mbw_mr: higher is better. UCX: latency posix,cma; bw sysv,cma."
for k in mr_lat ucx_lat ompi_lat mr_bw1 ucx_bw1 ompi_bw1 mr_bw4 ucx_bw4 ompi_bw4 mr_mbw ompi_mbw tcp_lat tcp_bw1; do
    echo "# all values $k:${v[$k]:-}"
done
