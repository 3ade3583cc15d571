#!/usr/bin/env bash
# Issue 17's table in one sitting: the ordered multicast group on 3 testbed
# hosts beside iperf3 and etcd, every group run repeated, medians at the end.
#
#   sudo bench/group-sitting.sh [--prefix P] [--rounds N] [--bin PATH] [--no-etcd]
#
#   --prefix P   testbed to use (default mr); created with 3 hosts, 2 rails
#                of 2gbit if it does not exist, and taken down again after
#   --rounds N   how many times the whole list of group runs is repeated,
#                one round after the other (default 3)
#   --bin PATH   the multirail binary (default target/release/multirail)
#   --no-etcd    leave out bench/etcd.sh (needs etcd-server and Go)
#
# Order: iperf3 S (host0 -> host1, one stream per rail) and I (every host
# to both others on both rails, 12 streams, mean ingress per host); then
# N rounds of: bench group all|one x ordered|unordered at 10K,1M and at
# 100M (--count 20), one sender at 10K with --light, bench latency 8,10K
# host0-host1; then etcd (64 clients, 10K and 1M puts); then S and I again.
# Prints every run as it comes and, at the end, the median of each row
# with the targets of issue 17 as ratios. Needs root and iperf3.
set -euo pipefail
prefix=mr
rounds=3
bin=target/release/multirail
etcd=1
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --no-etcd) etcd=0; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "bench/group-sitting.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench/group-sitting.sh: needs root (network namespaces)" >&2; exit 2; }
command -v iperf3 >/dev/null || { echo "bench/group-sitting.sh: iperf3 not found: apt-get install iperf3" >&2; exit 2; }
[ -x "$bin" ] || { echo "bench/group-sitting.sh: $bin not found: cargo build --release" >&2; exit 2; }
bin=$(realpath "$bin")
out=$(mktemp -d)
created=0
cleanup() {
    pkill -f "iperf3 -s -p 5[23]" 2>/dev/null || true
    [ "$created" = 1 ] && "$bin" testbed down --prefix "$prefix" >/dev/null 2>&1 || true
    rm -rf "$out"
}
trap cleanup EXIT
if ! ip netns list | grep -qw "$prefix-host2"; then
    "$bin" testbed up --hosts 3 --rate 2gbit --prefix "$prefix" >/dev/null
    created=1
fi
addr() { ip netns exec "$prefix-host$1" ip -4 -o addr show dev "rail$2" | awk '{ split($4, a, "/"); print a[1] }'; }

# S: host0 -> host1, one iperf3 stream per rail, 5 s, summed (MB/s).
iperf_s() {
    for r in 0 1; do ip netns exec "$prefix-host1" iperf3 -s -p $((5201 + r)) -D -1 >/dev/null; done
    sleep 0.5
    for r in 0 1; do
        ip netns exec "$prefix-host0" iperf3 -c "$(addr 1 $r)" -B "$(addr 0 $r)" -p $((5201 + r)) -t 5 -J >"$out/s$r.json" &
    done
    wait
    python3 -c "import json,sys; print(round(sum(json.load(open(f))['end']['sum_received']['bits_per_second'] for f in sys.argv[1:]) / 8e6, 1))" "$out"/s0.json "$out"/s1.json
}
# I: every host to both others on both rails at once (12 streams, 5 s):
# mean ingress per host (MB/s).
iperf_i() {
    local port=5300 dst src r
    rm -f "$out"/i-*.json
    for dst in 0 1 2; do for src in 0 1 2; do [ $src = $dst ] && continue; for r in 0 1; do
        port=$((port + 1)); ip netns exec "$prefix-host$dst" iperf3 -s -p $port -D -1 >/dev/null
    done; done; done
    sleep 0.5
    port=5300
    for dst in 0 1 2; do for src in 0 1 2; do [ $src = $dst ] && continue; for r in 0 1; do
        port=$((port + 1))
        ip netns exec "$prefix-host$src" iperf3 -c "$(addr $dst $r)" -B "$(addr $src $r)" -p $port -t 5 -J >"$out/i-$dst-$src-$r.json" &
    done; done; done
    wait
    python3 - "$out" <<'EOF'
import glob, json, sys
tot = {}
for f in glob.glob(sys.argv[1] + "/i-*.json"):
    d = f.rsplit("/", 1)[1].split("-")[1]
    tot[d] = tot.get(d, 0) + json.load(open(f))["end"]["sum_received"]["bits_per_second"]
print(round(sum(tot.values()) / len(tot) / 8e6, 1))
EOF
}

G=("$bin" bench group --testbed --testbed-prefix "$prefix" --json)
# One line per result as it comes (the JSON lines go to the log).
cat >"$out/show.py" <<'EOF'
import json, sys
for line in sys.stdin:
    v = json.loads(line)
    if v["test"] == "group":
        light = "light " if v.get("light") else ""
        print(f"{v['senders']:3} {v['mode']:9} {light}{v['size']:>9} B  {v['value']:.3f} GB/s per node  p50 {v['p50']:.1f} us", flush=True)
    else:
        print(f"point to point {v['size']:>6} B  {v['value']:.2f} us one way", flush=True)
EOF
show() { python3 "$out/show.py"; }
log=$out/runs.jsonl
echo "# start $(date -u +%H:%M:%S) UTC, $bin, testbed $prefix"
s1=$(iperf_s); i1=$(iperf_i)
echo "# iperf3 before: S $s1 MB/s, I $i1 MB/s"
for round in $(seq 1 "$rounds"); do
    for s in all one; do for m in ordered unordered; do
        flag=(); [ $m = unordered ] && flag=(--unordered)
        "${G[@]}" --senders $s "${flag[@]}" --sizes 10K,1M 2>/dev/null | tee -a "$log" | show || echo "# that run failed"
        "${G[@]}" --senders $s "${flag[@]}" --sizes 100M --count 20 2>/dev/null | tee -a "$log" | show || echo "# that run failed"
    done; done
    "${G[@]}" --senders one --sizes 10K --light --count 1000 2>/dev/null | tee -a "$log" | show || echo "# that run failed"
    "$bin" bench latency --testbed --testbed-prefix "$prefix" --sizes 8,10K --json 2>/dev/null | tee -a "$log" | show || echo "# that run failed"
    echo "# round $round done $(date -u +%H:%M:%S)"
done
if [ "$etcd" = 1 ]; then
    bench/etcd.sh --prefix "$prefix" --json "$out/etcd.json" 2>&1 | tail -3
fi
s2=$(iperf_s); i2=$(iperf_i)
echo "# iperf3 after: S $s2 MB/s, I $i2 MB/s"
echo "# end $(date -u +%H:%M:%S) UTC"
python3 - "$log" "$s1" "$s2" "$i1" "$i2" "$out/etcd.json" <<'EOF'
import json, os, statistics, sys
log, s1, s2, i1, i2, etcd = sys.argv[1], *map(float, sys.argv[2:6]), sys.argv[6]
S, I = (s1 + s2) / 2 / 1e3, (i1 + i2) / 2 / 1e3  # GB/s
runs = {}
lat = []
for line in open(log):
    v = json.loads(line)
    if v.get("test") == "group":
        key = (v["senders"], v["mode"], v["size"], bool(v.get("light")))
        runs.setdefault(key, []).append((v["value"], v["p50"]))
    elif v.get("test") == "latency" and v.get("size") == 10240:
        lat.append(v["value"])
med = lambda xs: statistics.median(xs) if xs else float("nan")
def rate(s, m, z):
    return med([x[0] for x in runs.get((s, m, z, False), [])])
print(f"\nS = {S*1e3:.1f} MB/s, I = {I*1e3:.1f} MB/s (means of before and after); I x 3/2 = {I*1.5*1e3:.0f} MB/s")
print("median GB/s per node (runs):")
for s in ("all", "one"):
    for m in ("ordered", "unordered"):
        cells = []
        for z in (10240, 1 << 20, 100 << 20):
            xs = [x[0] for x in runs.get((s, m, z, False), [])]
            cells.append(f"{med(xs):.3f} ({', '.join(f'{x:.3f}' for x in xs)})")
        print(f"  {s:3} {m:9}  10K {cells[0]}  1M {cells[1]}  100M {cells[2]}")
light = [x[1] for x in runs.get(("one", "ordered", 10240, True), [])]
rtt = 2 * med(lat)
print(f"light load p50 {med(light):.1f} us ({', '.join(f'{x:.1f}' for x in light)}); point-to-point 10K one way {med(lat):.2f} us")
t = [
    ("all 1M >= 0.9 I x 3/2", rate("all", "ordered", 1 << 20) / (I * 1.5), 0.9),
    ("all 100M >= 0.9 I x 3/2", rate("all", "ordered", 100 << 20) / (I * 1.5), 0.9),
    ("one 1M >= 0.9 S", rate("one", "ordered", 1 << 20) / S, 0.9),
    ("one 100M >= 0.9 S", rate("one", "ordered", 100 << 20) / S, 0.9),
    ("all 10K >= 0.7 I x 3/2", rate("all", "ordered", 10240) / (I * 1.5), 0.7),
    ("ordered / unordered, all, 1M", rate("all", "ordered", 1 << 20) / rate("all", "unordered", 1 << 20), 0.9),
    ("ordered / unordered, one, 1M", rate("one", "ordered", 1 << 20) / rate("one", "unordered", 1 << 20), 0.9),
]
if os.path.exists(etcd):
    e = {}
    for line in open(etcd):
        v = json.loads(line)
        e[v["size"]] = v
    for z in (10240, 1 << 20):
        if z in e:
            mbs = e[z]["value"]  # MB/s
            t.append((f"etcd x10 at {z}", rate("all", "ordered", z) * 1e3 / mbs / 10, 1.0))
print("targets (ratio / needed):")
for name, r, need in t:
    print(f"  {name:32} {r:.3f} / {need}  {'met' if r >= need else 'missed'}")
print(f"  {'light p50 <= 2 x round trip':32} {med(light) / rtt:.3f} / 2 (round trips)  {'met' if med(light) <= 2 * rtt else 'missed'}")
EOF
