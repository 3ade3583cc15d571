#!/usr/bin/env bash
# multirail beside ucx_perftest on this machine's loopback: 8 B one-way
# latency and 1 MiB bandwidth, interleaved rounds, medians and ratios.
#
#   bench/ucx-loopback.sh [--rounds N] [--pin CPU0,CPU1] [--latency-only] [--bin PATH]...
#                         [--testbed PREFIX] [--ompi]
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
# Latency is given twice: the mean of a run (what the targets compare;
# UCX's "overall") and the run's median iteration (UCX's "typical"), which
# a few slow iterations on a noisy machine do not move. --bin (repeatable)
# measures these multirail binaries side by side instead of a fresh build
# (e.g. an older commit's); --latency-only skips the bandwidth.
# --testbed PREFIX (as root, a testbed brought up with `multirail testbed
# up --hosts 2 --rails 2 --prefix PREFIX`): the same between its hosts
# instead, UCX from host0 to host1 over rail0 (UCX_NET_DEVICES=rail0),
# multirail with `--testbed` over tcp:rail0 and over both rails.
set -euo pipefail
# --ompi (loopback only) adds Open MPI in every round: bench/mpi/mr_pingpong
# -s 8 -i 10000 -w 100 under mpirun with ob1 and the tcp BTL on lo (pinned
# to --pin's CPUs with it), needs openmpi-bin and libopenmpi-dev; its row's
# ratios are to UCX like the others, and a line gives multirail's ratios
# to it (issue 9, target 1: at most UCX's and at most Open MPI's).
# The rails measured here are loopback TCP: the two ranks of this host must
# use them, not the shared memory they would get by themselves.
export MULTIRAIL_SHM=off
rounds=5 pin= bw=1 bins=() testbed= ompi=
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --pin) pin=$2; shift 2 ;;
        --latency-only) bw=; shift ;;
        --bin) bins+=("$2"); shift 2 ;;
        --testbed) testbed=$2; shift 2 ;;
        --ompi) ompi=1; shift ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/ucx.sh
. bench/lib/ucx.sh
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found: apt-get install ucx-utils" >&2; exit 1; }
if [ ${#bins[@]} -eq 0 ]; then
    cargo build --release -q -p multirail-cli
    bins=("$PWD/target/release/multirail")
fi
for b in "${bins[@]}"; do [ -x "$b" ] || { echo "$b: not an executable" >&2; exit 2; }; done
if [ -n "$ompi" ]; then
    [ -z "$testbed" ] || { echo "--ompi measures loopback only (the testbed's Open MPI rows: bench/compare.sh)" >&2; exit 2; }
    command -v mpirun >/dev/null || { echo "mpirun not found: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 1; }
    make -s -C bench/mpi >/dev/null
fi
H=$PWD/bench/lib/mrcmp.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
UCX_CLIENT_PREFIX=() UCX_SERVER_PREFIX=() mrpin=(--pin none)
if [ -n "$pin" ]; then
    UCX_CLIENT_PREFIX=(taskset -c "${pin%%,*}") UCX_SERVER_PREFIX=(taskset -c "${pin##*,}") mrpin=(--pin "$pin")
fi
port=13600
ucxenv="UCX_TLS=tcp UCX_NET_DEVICES=lo" where=loopback
one=tcp:127.0.0.1 two=tcp:127.0.0.1,tcp:127.0.0.2 mrwhere=()
if [ -n "$testbed" ]; then
    ip netns list | grep -q "^$testbed-host1\b" ||
        { echo "no testbed $testbed (multirail testbed up --hosts 2 --rails 2 --prefix $testbed)" >&2; exit 2; }
    UCX_SERVER_ADDR=$(ip -n "$testbed-host1" -4 -o addr show dev rail0 | awk '{ sub("/.*", "", $4); print $4 }')
    UCX_SERVER_PREFIX=(ip netns exec "$testbed-host1" "${UCX_SERVER_PREFIX[@]}")
    UCX_CLIENT_PREFIX=(ip netns exec "$testbed-host0" "${UCX_CLIENT_PREFIX[@]}")
    ucxenv="UCX_TLS=tcp UCX_NET_DEVICES=rail0" where="testbed $testbed, host0 -> host1"
    one=tcp:rail0 two=tcp:rail0,tcp:rail1 mrwhere=(--testbed --testbed-prefix "$testbed")
fi
ucx() { # TEST SIZE N WARMUP KIND... -> one value per KIND
    ucx_perftest_pair $((port++)) "$tmp" "$ucxenv" -t "$1" -s "$2" -n "$3" -w "$4"
    local k
    for k in "${@:5}"; do python3 "$H" ucx "$tmp/client" "$k"; done
}
ompipin=()
[ -n "$pin" ] && ompipin=(--bind-to core --cpu-set "$pin")
ompi_lat() { # -> mean and median one-way latency (us) of Open MPI's ping-pong
    timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "${ompipin[@]}" --mca pml ob1 \
        --mca btl self,tcp --mca btl_tcp_if_include lo bench/mpi/mr_pingpong -s 8 -i 10000 -w 100 -x >"$tmp/ompi" 2>&1 ||
        { cat "$tmp/ompi" >&2; exit 1; }
    awk '$1 == 8 { print $2, $4 }' "$tmp/ompi"
}
mr() { # BIN TEST SIZE RAILS FIELD... -> one value per FIELD
    "$1" bench "$2" --sizes "$3" --rails "$4" "${mrpin[@]}" "${mrwhere[@]}" --json --quiet >"$tmp/mr"
    local f
    for f in "${@:5}"; do python3 "$H" mr "$tmp/mr" "$f" | awk '{ print $2 }'; done
}
declare -A v
for r in $(seq "$rounds"); do
    echo "round $r/$rounds" >&2
    read -r a b < <(ucx tag_lat 8 10000 100 lat lat50 | xargs)
    v[ucx_lat]+=" $a" v[ucx_lat50]+=" $b"
    if [ -n "$ompi" ]; then
        read -r a b < <(ompi_lat)
        v[ompi_lat]+=" $a" v[ompi_lat50]+=" $b"
    fi
    for i in "${!bins[@]}"; do
        for n in 1 2; do
            rails=$one; [ $n = 2 ] && rails=$two
            read -r a b < <(mr "${bins[$i]}" latency 8 "$rails" value p50 | xargs)
            v[mr${i}_${n}_lat]+=" $a" v[mr${i}_${n}_lat50]+=" $b"
        done
    done
    if [ -n "$bw" ]; then
        v[ucx_bw]+=" $(ucx tag_bw 1048576 1280 128 bw)"
        for i in "${!bins[@]}"; do
            v[mr${i}_1_bw]+=" $(mr "${bins[$i]}" bw 1M $one value)"
            v[mr${i}_2_bw]+=" $(mr "${bins[$i]}" bw 1M $two value)"
        done
    fi
done
declare -A m
for k in "${!v[@]}"; do m[$k]=$(echo "${v[$k]}" | median); done
printf '# ucx_perftest %s vs multirail, %s, %s rounds, medians (pin: %s)\n' \
    "$(ucx_info -v | sed -n 's/# Version //p')" "$where" "$rounds" "${pin:-none}"
printf '%-50s %15s %8s %15s %8s %16s %8s\n' "tool" "8 B mean (us)" "ratio" "8 B p50 (us)" "ratio" "1 MiB bw (MB/s)" "ratio"
row() { # LABEL KEY
    awk -v n="$1" -v l="${m[$2_lat]}" -v l5="${m[$2_lat50]}" -v b="${m[$2_bw]:--}" \
        -v l0="${m[ucx_lat]}" -v l50="${m[ucx_lat50]}" -v b0="${m[ucx_bw]:--}" 'BEGIN {
        bw = (b == "-") ? sprintf("%16s %8s", "-", "-") : sprintf("%16.1f %8.3f", b, b / b0)
        printf "%-50s %15.2f %8.3f %15.2f %8.3f %s\n", n, l, l / l0, l5, l5 / l50, bw }'
}
row "ucx_perftest (${ucxenv// /, })" ucx
[ -n "$ompi" ] && row "Open MPI $(mpirun --version 2>/dev/null | head -1 | awk '{ print $NF }') (mr_pingpong, ob1, tcp BTL on lo)" ompi
for i in "${!bins[@]}"; do
    name=multirail; [ ${#bins[@]} -gt 1 ] && name="multirail $i"
    row "$name, 1 rail" "mr${i}_1"
    row "$name, 2 rails (default)" "mr${i}_2"
done
if [ -n "$ompi" ]; then
    for i in "${!bins[@]}"; do
        for n in 1 2; do
            awk -v i="$i" -v n="$n" -v l="${m[mr${i}_${n}_lat]}" -v l5="${m[mr${i}_${n}_lat50]}" \
                -v o="${m[ompi_lat]}" -v o5="${m[ompi_lat50]}" \
                'BEGIN { printf "# multirail %s, %s rail(s) / Open MPI: mean %.3f, p50 %.3f\n", i, n, l / o, l5 / o5 }'
        done
    done
fi
[ ${#bins[@]} -gt 1 ] && for i in "${!bins[@]}"; do echo "# multirail $i: ${bins[$i]}"; done
for k in $(printf '%s\n' "${!v[@]}" | sort); do echo "# all values: $k${v[$k]}"; done
