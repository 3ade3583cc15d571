# bench/lib/fipp.sh - sourced by bench/ofi-loopback.sh and
# bench/ofi-testbed.sh: one fi_pingpong client/server run of 8 B messages.
# shellcheck shell=bash

# Runs `fi_pingpong -p PROVIDER -e rdm -S 8 -I ITERS ARGS...` as a server
# and as a client against ${FIPP_ADDR:-127.0.0.1}, and prints the client's
# usec/xfer (one-way latency). The arrays FIPP_SERVER_PREFIX and
# FIPP_CLIENT_PREFIX, if set, prefix the two commands (e.g. ip netns exec NS
# for a testbed host). Outputs go to OUT/fcli and OUT/fsrv; on failure both
# are printed and the script exits.
# Usage: fipp OUT ITERS PROVIDER [ARGS...]
fipp() {
    local out=$1 iters=$2 prov=$3
    shift 3
    local p=$((14100 + RANDOM % 800))
    "${FIPP_SERVER_PREFIX[@]}" timeout 120 fi_pingpong -p "$prov" -e rdm -S 8 -I "$iters" -B "$p" "$@" >"$out/fsrv" 2>&1 &
    local spid=$!
    sleep 0.7
    "${FIPP_CLIENT_PREFIX[@]}" timeout 120 fi_pingpong -p "$prov" -e rdm -S 8 -I "$iters" "$@" -P "$p" "${FIPP_ADDR:-127.0.0.1}" >"$out/fcli" 2>&1 ||
        { cat "$out/fcli" "$out/fsrv" >&2; kill "$spid" 2>/dev/null; exit 1; }
    wait "$spid" || true
    awk '$1 == 8 { print $7 }' "$out/fcli"
}
