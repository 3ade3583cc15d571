#!/usr/bin/env bash
# Wire-up through the launcher costs nothing once running: `multirail bench
# bw` at 1 MiB between two testbed hosts, started by Open MPI's mpirun (the
# ranks meet through PMIx, no MULTIRAIL_ROOT) and by `--testbed` (multirail's
# own launcher), interleaved rounds, medians and their ratio.
#
#   sudo bench/pmix-vs-testbed.sh [--rounds N] [--prefix P] [--rate LIST] [--iterations N]
#
# mpirun runs inside host0; host1's Open MPI daemon (its PMIx server) is
# started through bench/lib/netns-agent, as over ssh on a real cluster (see
# bench/README.md, "Open MPI 4.1 across two namespaces"). Ranks are pinned
# to CPUs 0 and 1 in both cases. Needs root and openmpi-bin. A testbed with
# the prefix is created if absent (and then removed on exit).
set -euo pipefail
rounds=3 prefix=mrpmix rate=2gbit,2gbit iters=40 made=0
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --prefix) prefix=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --iterations) iters=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
M=${MULTIRAIL:-$here/../target/release/multirail}
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "needs mpirun (apt-get install openmpi-bin)" >&2; exit 2; }
[ -x "$M" ] || { echo "build first: cargo build --release ($M missing)" >&2; exit 2; }
if ! $M testbed status --prefix "$prefix" >/dev/null 2>&1; then
    $M testbed up --prefix "$prefix" --rate "$rate" >/dev/null
    made=1
fi
cleanup() { if [ "$made" = 1 ]; then $M testbed down --prefix "$prefix" >/dev/null || true; fi; }
trap cleanup EXIT
addr() { $M testbed status --prefix "$prefix" --json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['hosts'][$1]['rails'][0]['addr'])"; }
a0=$(addr 0) a1=$(addr 1)
rails=$($M testbed status --prefix "$prefix" --json |
    python3 -c "import json,sys; print(','.join('tcp:rail%d' % i for i in range(len(json.load(sys.stdin)['hosts'][0]['rails']))))")
args=(bench bw --sizes 1M --iterations "$iters" --warmup 2)
rank() { echo -np 1 -H "$1" env MULTIRAIL_RAILS="$rails" MULTIRAIL_LOG=info taskset -c "$2" "$M" "${args[@]}"; }
value() { awk '$1 == 1048576 { print $2 }' | tail -1; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "-"; exit }
    printf "%.1f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
pm=() tb=()
for r in $(seq 1 "$rounds"); do
    # shellcheck disable=SC2046  # rank() prints words on purpose
    v=$(MR_NETNS_PREFIX=$prefix timeout 120 ip netns exec "$prefix-host0" env -u MULTIRAIL_ROOT -u MULTIRAIL_RAILS \
        mpirun --allow-run-as-root --bind-to none --mca plm_rsh_agent "$here/lib/netns-agent" \
        --mca oob_tcp_if_include rail0 $(rank "$a0" 0) : $(rank "$a1" 1) 2>/tmp/pmix-vs-testbed.err | value || true)
    grep -q "wire-up through PMIx" /tmp/pmix-vs-testbed.err 2>/dev/null ||
        echo "# round $r: mpirun's ranks did not report PMIx wire-up" >&2
    [ -n "$v" ] && pm+=("$v")
    w=$(timeout 120 "$M" "${args[@]}" --testbed --testbed-prefix "$prefix" --pin 0,1 2>/dev/null | value || true)
    [ -n "$w" ] && tb+=("$w")
    echo "# round $r: mpirun+PMIx ${v:--} MB/s, --testbed ${w:--} MB/s" >&2
done
p=$(printf '%s\n' "${pm[@]+"${pm[@]}"}" | grep . | median)
t=$(printf '%s\n' "${tb[@]+"${tb[@]}"}" | grep . | median)
ratio=$(awk -v a="$p" -v b="$t" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.3f", a / b }')
echo "# bench bw 1 MiB, testbed $prefix, $rounds rounds, medians"
echo "mpirun+PMIx $p MB/s  --testbed $t MB/s  ratio $ratio"
[ "${#pm[@]}" = "$rounds" ] && [ "${#tb[@]}" = "$rounds" ]
