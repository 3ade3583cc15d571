# bench/lib/ucx.sh - sourced by bench/ucx-loopback.sh and
# bench/shm-intranode.sh: one ucx_perftest client/server run on this host,
# and the median of a list of values.
# shellcheck shell=bash

# Runs a ucx_perftest server on PORT and a client against
# ${UCX_SERVER_ADDR:-127.0.0.1}:PORT with ARGS (e.g. -t tag_lat -s 8 -n
# 10000 -w 100); both get the environment assignments in ENV
# (space-separated NAME=VALUE, e.g. "UCX_TLS=tcp UCX_NET_DEVICES=lo"). The
# arrays UCX_SERVER_PREFIX and UCX_CLIENT_PREFIX, if set, prefix the two
# commands (e.g. taskset -c 1, or ip netns exec NS for a testbed host;
# the server's prefix also runs the check that it listens).
# The client's output goes to OUT/client; on failure both outputs are
# printed and the script exits.
# Usage: ucx_perftest_pair PORT OUT ENV ARGS...
ucx_perftest_pair() {
    local p=$1 out=$2 envs=$3
    shift 3
    local -a e
    read -r -a e <<<"$envs"
    env "${e[@]}" "${UCX_SERVER_PREFIX[@]}" ucx_perftest -p "$p" >"$out/server" 2>&1 &
    local spid=$!
    for _ in $(seq 100); do
        "${UCX_SERVER_PREFIX[@]}" ss -Hltn "sport = :$p" | grep -q . && break
        sleep 0.05
    done
    env "${e[@]}" timeout 120 "${UCX_CLIENT_PREFIX[@]}" ucx_perftest "${UCX_SERVER_ADDR:-127.0.0.1}" -p "$p" "$@" -f >"$out/client" 2>&1 ||
        { cat "$out/client" "$out/server" >&2; kill "$spid" 2>/dev/null; exit 1; }
    wait "$spid" || true
}

# Median of the whitespace-separated numbers on stdin ("-" if none).
median() {
    tr ' ' '\n' | grep . | sort -g |
        awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
