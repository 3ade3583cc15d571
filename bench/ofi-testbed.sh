#!/usr/bin/env bash
# bench/ofi-testbed.sh - issue 11's target table in one command: the ofi
# rail on emulated clusters beside iperf3 and fi_pingpong, interleaved
# rounds, medians, ratios against each target.
#
#   sudo bench/ofi-testbed.sh [--rounds N] [--bin MULTIRAIL] [--prefix NAME]
#
# 1. Testbed of 2 hosts x 2 rails of 2gbit (`multirail testbed up`):
#    iperf3, one stream per rail on both rails at once (S, the sum) and
#    --bidir (B); then N rounds of
#      fi_pingpong -p "tcp;ofi_rxm" -e rdm -S 8 -d rail0 (server in host1)
#      multirail bench latency --testbed --rails ofi:tcp:rail0 --sizes 8
#      multirail bench bw|bibw --testbed --rails ofi:tcp:rail0,ofi:tcp:rail1 --sizes 1M,4M
#    Targets: bw >= 0.95 S, bibw >= 0.9 x 2S, latency <= fi_pingpong.
# 2. Testbed of 1gbit + 3gbit: iperf3 sum, then N rounds of bw 1M,4M over
#    both ofi:tcp rails, no hints. Target: >= 0.95 x the sum.
# 3. This host, no testbed: N rounds of fi_pingpong -p shm -S 8 and
#    MULTIRAIL_SHM=off multirail bench latency --rails ofi:shm --sizes 8
#    (without it the automatic native shm rail would carry the messages).
#    Target: <= it.
#
# MULTIRAIL is a binary built with --features ofi (default: builds
# target/release/multirail with `cargo build --release -p multirail-cli
# --features ofi`). Needs root (namespaces, tc), iperf3 and libfabric-bin.
# All traffic stays inside the testbed's namespaces or on this host.
# The testbeds are removed on exit, also on error or Ctrl-C.
set -euo pipefail
rounds=5
bin=
prefix=mrofi
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --prefix) prefix=$2; shift 2 ;;
        -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "--rounds takes a positive count" >&2; exit 2; }
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/ucx.sh
. bench/lib/ucx.sh # median
# shellcheck source-path=SCRIPTDIR source=lib/fipp.sh
. bench/lib/fipp.sh # fipp
for t in fi_pingpong iperf3; do
    command -v $t >/dev/null || { echo "$t not found: apt-get install libfabric-bin iperf3" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, tc)" >&2; exit 1; }
if [ -z "$bin" ]; then
    cargo build --release -q -p multirail-cli --features ofi
    bin=$PWD/target/release/multirail
fi
if ! "$bin" info 2>/dev/null | grep -i libfabric | grep -qv "not built"; then
    echo "$bin: not built with --features ofi (multirail info finds no libfabric provider)" >&2
    exit 1
fi
tmp=$(mktemp -d)
cleanup() { "$bin" testbed down --prefix "$prefix" >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
log() { printf '[ofi-testbed %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# testbed_up RATE: brings the testbed up; sets H0/H1 (namespaces) and
# A0 A1 (rail addresses of host0 and host1, one per rail).
testbed_up() {
    "$bin" testbed down --prefix "$prefix" >/dev/null 2>&1 || true
    "$bin" testbed up --prefix "$prefix" --hosts 2 --rails 2 --rate "$1" >"$tmp/up" 2>&1 || { cat "$tmp/up" >&2; exit 1; }
    local a00= a01= a10= a11=
    H0= H1=
    read -r _ H0 a00 a01 < <(awk '$1 == "host0"' "$tmp/up") || true
    read -r _ H1 a10 a11 < <(awk '$1 == "host1"' "$tmp/up") || true
    [ -n "$a01" ] && [ -n "$a11" ] || { cat "$tmp/up" >&2; echo "could not read the testbed's addresses from 'testbed up'" >&2; exit 1; }
    A0=("$a00" "$a01")
    A1=("$a10" "$a11")
}

# iperf3_sum [--bidir]: MB/s of one stream per rail, both rails at once, 5 s.
iperf3_sum() {
    local r pids=()
    for r in 0 1; do
        ip netns exec "$H1" timeout 60 iperf3 -s -1 -B "${A1[$r]}" -p $((15201 + r)) >/dev/null 2>&1 &
    done
    sleep 0.5
    for r in 0 1; do
        ip netns exec "$H0" timeout 40 iperf3 -c "${A1[$r]}" -B "${A0[$r]}" -p $((15201 + r)) -t 5 -J "$@" >"$tmp/ip$r" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { echo "iperf3 failed" >&2; cat "$tmp/ip0" "$tmp/ip1" >&2; exit 1; }; done
    wait
    python3 - "$tmp/ip0" "$tmp/ip1" "$@" <<'EOF'
import json, sys
bidir = "--bidir" in sys.argv[3:]
tot = 0.0
for f in sys.argv[1:3]:
    e = json.load(open(f))["end"]
    tot += e["sum_received"]["bits_per_second"]
    if bidir:
        tot += e["sum_received_bidir_reverse"]["bits_per_second"]
print(f"{tot / 8e6:.1f}")
EOF
}

# mr TEST ARGS...: multirail's values, one per size (the bench's table rows).
mr() {
    "$bin" bench "$@" >"$tmp/mr" 2>"$tmp/mr.err" || { cat "$tmp/mr.err" >&2; exit 1; }
    awk '$1 ~ /^[0-9]+$/ { printf "%s ", $2 }' "$tmp/mr"
}

declare -A v # name -> space-separated values
add() { # NAME VALUE: appends VALUE (a number) to NAME's values
    if ! [[ $2 =~ ^[0-9.]+[[:space:]]*$ ]]; then
        echo "no value for $1 (got '$2'); the last outputs:" >&2
        cat "$tmp/mr" "$tmp/fcli" >&2 2>/dev/null || true
        exit 1
    fi
    v[$1]="${v[$1]:-} $2"
}
med() { median <<<"${v[$1]}"; }
tb=(--testbed --testbed-prefix "$prefix")
two=ofi:tcp:rail0,ofi:tcp:rail1

log "testbed 2 x 2gbit"
testbed_up 2gbit
S=$(iperf3_sum)
B=$(iperf3_sum --bidir)
log "iperf3: sum $S MB/s, --bidir $B MB/s"
for r in $(seq "$rounds"); do
    log "round $r of $rounds (2 x 2gbit)"
    # Each value is assigned first: a failed run then stops the script.
    x=$(
        FIPP_SERVER_PREFIX=(ip netns exec "$H1") FIPP_CLIENT_PREFIX=(ip netns exec "$H0") FIPP_ADDR=${A1[0]}
        fipp "$tmp" 20000 "tcp;ofi_rxm" -d rail0
    )
    add fipp_tcp "$x"
    x=$(mr latency "${tb[@]}" --rails ofi:tcp:rail0 --sizes 8 -i 20000)
    add lat_tcp "$x"
    x=$(mr bw "${tb[@]}" --rails $two --sizes 1M,4M)
    read -r a b <<<"$x"
    add bw1 "$a"; add bw4 "$b"
    x=$(mr bibw "${tb[@]}" --rails $two --sizes 1M,4M)
    read -r a b <<<"$x"
    add bibw1 "$a"; add bibw4 "$b"
done

log "testbed 1gbit + 3gbit"
testbed_up 1gbit,3gbit
U=$(iperf3_sum)
log "iperf3: sum $U MB/s"
for r in $(seq "$rounds"); do
    log "round $r of $rounds (1gbit + 3gbit)"
    x=$(mr bw "${tb[@]}" --rails $two --sizes 1M,4M)
    read -r a b <<<"$x"
    add ubw1 "$a"; add ubw4 "$b"
done
"$bin" testbed down --prefix "$prefix" >/dev/null 2>&1 || true

log "this host: ofi:shm"
for r in $(seq "$rounds"); do
    log "round $r of $rounds (shm)"
    x=$(fipp "$tmp" 20000 shm)
    add fipp_shm "$x"
    # Two ranks on one host would talk over the automatic native shm rail
    # beside ofi:shm (it carries everything): off, to measure ofi:shm.
    x=$(MULTIRAIL_SHM=off mr latency --rails ofi:shm --sizes 8 -i 20000)
    add lat_shm "$x"
done

row() { # test, multirail's median, reference, ratio, target and verdict
    printf '| %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" "$5"
}
ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }
verdict() { python3 -c "print('met' if $1 $2 $3 else '**missed**')"; }
echo
echo "Medians of $rounds interleaved rounds ($(date -u +%Y-%m-%dT%H:%MZ)); iperf3 2 x 2gbit: sum S = $S MB/s, --bidir $B; 1gbit + 3gbit: sum $U MB/s."
echo
echo "| test | multirail | reference | ratio | target |"
echo "|---|---|---|---|---|"
for s in 1 4; do
    m=$(med bw$s); q=$(ratio "$m" "$S")
    row "bw ${s} MiB, ofi:tcp x 2, 2 x 2gbit (MB/s)" "$m" "S $S" "$q" ">= 0.95: $(verdict "$q" '>=' 0.95)"
done
S2=$(python3 -c "print(f'{2 * $S:.1f}')")
for s in 1 4; do
    m=$(med bibw$s); q=$(ratio "$m" "$S2")
    row "bibw ${s} MiB, ofi:tcp x 2 (MB/s)" "$m" "2S $S2 (iperf3 --bidir $B)" "$q" ">= 0.9: $(verdict "$q" '>=' 0.9)"
done
m=$(med lat_tcp); f=$(med fipp_tcp); q=$(ratio "$m" "$f")
row "8 B latency, ofi:tcp:rail0 (µs)" "$m" "fi_pingpong tcp;ofi_rxm $f" "$q" "<= 1: $(verdict "$q" '<=' 1)"
for s in 1 4; do
    m=$(med ubw$s); q=$(ratio "$m" "$U")
    row "bw ${s} MiB, ofi:tcp x 2, 1gbit + 3gbit (MB/s)" "$m" "sum $U" "$q" ">= 0.95: $(verdict "$q" '>=' 0.95)"
done
m=$(med lat_shm); f=$(med fipp_shm); q=$(ratio "$m" "$f")
row "8 B latency, ofi:shm, this host (µs)" "$m" "fi_pingpong shm $f" "$q" "<= 1: $(verdict "$q" '<=' 1)"
echo
echo "Every round's values:"
for k in fipp_tcp lat_tcp bw1 bw4 bibw1 bibw4 ubw1 ubw4 fipp_shm lat_shm; do
    echo "  $k:${v[$k]}"
done
