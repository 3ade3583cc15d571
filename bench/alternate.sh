#!/usr/bin/env bash
# bench/alternate.sh - two or more multirail binaries side by side: the same
# `multirail` command run with each binary in turn, N rounds, so that a
# machine whose speed drifts (this project's shared 2-vCPU VMs swing by 2 x
# within an hour) treats every binary alike. Prints, per binary, the median
# and the minimum of the number the command reports last (the last column of
# its last result line: the largest size's latency, bandwidth or rate; with
# --column K the K-th column instead, e.g. 3 for `bench group`'s mean GB/s),
# every round's value, and the ratio of each median to the first binary's.
#
#   bench/alternate.sh [--rounds N] [--column K] --bin PATH --bin PATH [--bin PATH...] -- ARGS...
#
#   e.g. bench/alternate.sh --rounds 21 --bin /tmp/multirail-old --bin target/release/multirail \
#            -- bench latency --rails shm --sizes 8 --pin 0,1 -i 20000
#
# To compare configurations of one binary, use `multirail bench --compare`
# instead (it alternates them inside one run). A failed run stops the script.
set -euo pipefail

rounds=9
column=0
bins=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --bin) bins+=("$2"); shift 2 ;;
        --column) column=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench/alternate.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ ${#bins[@]} -ge 2 ]] || { echo "bench/alternate.sh: give at least two --bin (see --help)" >&2; exit 2; }
[[ $# -gt 0 ]] || { echo "bench/alternate.sh: give the multirail arguments after -- (see --help)" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench/alternate.sh: --rounds must be a positive number" >&2; exit 2; }
[[ $column =~ ^[0-9]+$ ]] || { echo "bench/alternate.sh: --column must be a column number (1 is the first)" >&2; exit 2; }
for b in "${bins[@]}"; do
    [[ -x $b ]] || { echo "bench/alternate.sh: $b is not an executable" >&2; exit 2; }
done

declare -a vals
for r in $(seq 1 "$rounds"); do
    for k in "${!bins[@]}"; do
        out=$("${bins[$k]}" "$@" 2>/dev/null) || { echo "bench/alternate.sh: ${bins[$k]} $* failed" >&2; exit 1; }
        v=$(grep -v '^#' <<<"$out" | awk -v c="$column" 'NF { last = (c > 0 ? $c : $NF) } END { print last }')
        [[ -n $v ]] || { echo "bench/alternate.sh: ${bins[$k]} printed no result" >&2; exit 1; }
        vals[k]="${vals[k]:-} $v"
    done
    echo "# round $r/$rounds done" >&2
done
echo "# multirail $*: $rounds alternating rounds"
python3 - "${bins[@]}" -- "${vals[@]}" <<'EOF'
import statistics, sys
args = sys.argv[1:]
cut = args.index("--")
bins, cols = args[:cut], [[float(x) for x in c.split()] for c in args[cut + 1:]]
first = statistics.median(cols[0])
print(f"{'binary':<44} {'median':>12} {'min':>12} {'ratio':>7}  rounds")
for b, xs in zip(bins, cols):
    m = statistics.median(xs)
    print(f"{b[-44:]:<44} {m:12.4g} {min(xs):12.4g} {m / first:7.3f}  {' '.join(f'{x:g}' for x in xs)}")
EOF
