#!/usr/bin/env bash
# The replicated-log peer of the ordered multicast group (issue 17): a
# 3-member etcd cluster, one member per testbed host, data directories on
# tmpfs (the comparison is about the network, not the disk), loaded by
# etcd's own benchmark tool with concurrent puts of 10 KB and 1 MB values
# (etcd refuses 100 MB requests).
#
#   sudo bench/etcd.sh [--prefix P] [--rate R] [--clients N] [--quick] [--json FILE]
#
#   --prefix P    testbed to use; created (3 hosts, 2 rails, --rate) and
#                 removed afterwards if it does not exist (default mre)
#   --rate R      rail rate when the testbed is created (default 2gbit)
#   --clients N   concurrent clients and connections (default 64)
#   --quick       fewer puts (a smoke run of a few seconds per size)
#   --json FILE   also write JSON lines: {"test":"etcd_put","size":...,
#                 "value":...,"unit":"MB/s","puts_per_s":...}
#
# Prints puts/s and MB/s (10^6 bytes of values per second) per value size.
# etcd talks over one address per member: the members use rail 0 only.
#
# Needs root, etcd-server (apt-get install etcd-server) and Go (the tool is
# built once into target/etcd-benchmark: `go install` refuses etcd's
# tools/benchmark because of the module's replace directives, so it is
# built from `go mod download` output with them dropped and `go mod tidy`).
set -euo pipefail
prefix=mre
rate=2gbit
clients=64
quick=0
json=
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --quick) quick=1; shift ;;
        --json) json=$2; shift 2 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "bench/etcd.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench/etcd.sh: needs root (network namespaces)" >&2; exit 2; }
command -v etcd >/dev/null || { echo "bench/etcd.sh: etcd not found: apt-get install etcd-server" >&2; exit 2; }
etcd_version=3.5.17 # the load generator's module version (v3 API, talks to etcd 3.4 and 3.5)
tool=$PWD/target/etcd-benchmark
if [ ! -x "$tool" ]; then
    command -v go >/dev/null || { echo "bench/etcd.sh: go not found (needed once, to build etcd's benchmark tool)" >&2; exit 2; }
    echo "# building etcd's benchmark tool v$etcd_version into $tool (once)" >&2
    gowork=$(mktemp -d)
    (
        export GOPATH=$gowork/gopath GOFLAGS=-modcacherw GOTOOLCHAIN=local
        dir=$(go mod download -json "go.etcd.io/etcd/v3@v$etcd_version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
        cp -r "$dir" "$gowork/src"
        chmod -R u+w "$gowork/src"
        cd "$gowork/src"
        for m in $(sed -n '/^replace (/,/^)/p' go.mod | awk '/=>/ { print $1 }'); do
            go mod edit -dropreplace="$m"
        done
        go mod tidy
        mkdir -p "$(dirname "$tool")"
        go build -o "$tool" ./tools/benchmark
    )
    rm -rf "$gowork"
fi
cargo build --release -q -p multirail-cli
M=$PWD/target/release/multirail
work=$(mktemp -d)
made_testbed=0
pids=()
# The members themselves (children of `testbed exec`), found by data dir;
# waits (bounded) until they are gone.
stop_members() {
    pkill -f "data-dir /dev/shm/mr-etcd-$prefix-" 2>/dev/null || return 0
    for _ in $(seq 50); do
        pgrep -f "data-dir /dev/shm/mr-etcd-$prefix-" >/dev/null || return 0
        sleep 0.1
    done
    pkill -9 -f "data-dir /dev/shm/mr-etcd-$prefix-" 2>/dev/null || true
}
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    stop_members
    wait 2>/dev/null || true
    rm -rf "$work" /dev/shm/mr-etcd-"$prefix"-*
    if [ "$made_testbed" = 1 ]; then "$M" testbed down --prefix "$prefix" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
if ! "$M" testbed status --prefix "$prefix" >/dev/null 2>&1; then
    "$M" testbed up --hosts 3 --rails 2 --rate "$rate" --prefix "$prefix" >/dev/null
    made_testbed=1
fi
# Member i on host i, rail 0 (10.77.0.(i+1)).
ip_of() { echo "10.77.0.$(($1 + 1))"; }
cluster=
endpoints=
for i in 0 1 2; do
    cluster+="${cluster:+,}m$i=http://$(ip_of "$i"):2380"
    endpoints+="${endpoints:+,}http://$(ip_of "$i"):2379"
done
stop_members # left over from an interrupted run
for i in 0 1 2; do
    ip=$(ip_of "$i")
    data=/dev/shm/mr-etcd-$prefix-$i
    rm -rf "$data"
    "$M" testbed exec "host$i" --prefix "$prefix" -- etcd --name "m$i" --data-dir "$data" \
        --listen-peer-urls "http://$ip:2380" --initial-advertise-peer-urls "http://$ip:2380" \
        --listen-client-urls "http://$ip:2379" --advertise-client-urls "http://$ip:2379" \
        --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "mr-$prefix" \
        --quota-backend-bytes $((4 << 30)) --log-level error >"$work/etcd$i.log" 2>&1 &
    pids+=($!)
done
# Wait (bounded) until every member answers /health with a leader.
deadline=$((SECONDS + 30))
for i in 0 1 2; do
    until "$M" testbed exec host0 --prefix "$prefix" -- curl -sf "http://$(ip_of "$i"):2379/health" 2>/dev/null | grep -q '"health":"true"'; do
        if [ $SECONDS -ge $deadline ]; then
            echo "bench/etcd.sh: member $i not healthy after 30 s; its log:" >&2
            cat "$work/etcd$i.log" >&2
            exit 1
        fi
        sleep 0.5
    done
done
echo "# etcd $(etcd --version | awk '/etcd Version/ { print $3 }'): 3 members on testbed $prefix (rail 0), data on tmpfs; load: etcd benchmark v$etcd_version from host0, $clients clients"
printf '# %-10s %10s %12s %10s\n' "value" "puts" "puts/s" "MB/s"
[ -n "$json" ] && : >"$json"
for size in 10240 1048576; do
    if [ "$quick" = 1 ]; then total=$((size > 100000 ? 60 : 2000)); else total=$((size > 100000 ? 600 : 30000)); fi
    "$M" testbed exec host0 --prefix "$prefix" -- "$tool" --endpoints="$endpoints" \
        --conns="$clients" --clients="$clients" put --key-size=8 --sequential-keys \
        --total="$total" --val-size="$size" >"$work/put.$size" 2>&1 ||
        { cat "$work/put.$size" >&2; exit 1; }
    rps=$(awk '/Requests\/sec:/ { print $2 }' "$work/put.$size")
    [ -n "$rps" ] || { echo "bench/etcd.sh: no Requests/sec in the tool's output:" >&2; cat "$work/put.$size" >&2; exit 1; }
    mbs=$(python3 -c "print(f'{$rps * $size / 1e6:.1f}')")
    printf '  %-10s %10s %12s %10s\n' "$size" "$total" "$rps" "$mbs"
    if [ -n "$json" ]; then
        printf '{"test":"etcd_put","size":%s,"value":%s,"unit":"MB/s","puts_per_s":%s,"puts":%s,"clients":%s}\n' \
            "$size" "$mbs" "$rps" "$total" "$clients" >>"$json"
    fi
done
