#!/usr/bin/env bash
# bench/compare.sh - multirail beside iperf3, Open MPI (ob1 + tcp BTL) and UCX
# (tcp) on an emulated cluster: a thin wrapper of
#     multirail report --testbed --study peers --peers
# that installs what is missing, builds, runs the report and fails when a
# measurement failed. Run `bench/compare.sh --help`; bench/README.md explains
# how to read the results, docs/analysis.md the page.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)
MPI_DIR=$BENCH_DIR/mpi
# shellcheck source-path=SCRIPTDIR source=lib/build.sh
. "$BENCH_DIR/lib/build.sh"

usage() {
    cat <<'EOF'
Usage: sudo bench/compare.sh [--quick] [--out DIR] [--prefix NAME]
                             [--multirail PATH | --no-build] [--no-install]

Runs `multirail report --testbed --study peers --peers` (see `multirail
report --help`): the report brings up emulated clusters (network namespaces
joined by tbf-shaped veth rails) and measures on the same rails

  multirail  bench bw, bibw, latency on rail0 only and on 2 x 2gbit; mbw_mr
             of 2 pairs across the hosts; bw on unequal rails (1 + 3 gbit)
  iperf3     one TCP stream per rail, all rails at once (the practical
             limit), and --bidir
  Open MPI   bench/mpi/mr_bw (-b), mr_pingpong, mr_mbw_mr, ob1 + tcp BTL:
             rail0 only; all rails; btl_tcp_links=2; bandwidth hints
             (btl_tcp_bandwidth_railN); send-only (btl_tcp_flags without put)
  UCX        ucx_perftest tag_bw / tag_lat, UCX_TLS=tcp: rail0 only; all
             rails with UCX_MAX_RNDV_RAILS

and writes DIR/index.html (figures, tables with each peer's value and
multirail's ratio to it, every command), DIR/results.json and the figures.

Options:
  --quick            smoke run (sizes 8, 64K, 1M; 1 round): about a minute
                     after the builds
  --out DIR          results directory (default
                     bench/results/<date>_<time>[-quick]/)
  --prefix NAME      testbed prefix (default mrcmp); the report removes a
                     leftover testbed of that prefix first
  --multirail PATH   use this multirail binary; do not run cargo
  --no-build         do not build (needs target/release/multirail)
  --no-install       do not apt-get missing packages; fail instead
  -h, --help         this help

Needs root (network namespaces, tc). Missing Debian packages are installed
with `apt-get install -y openmpi-bin libopenmpi-dev ucx-utils iperf3 ...`
unless --no-install. All traffic stays inside the testbed's namespaces.

The options of the old script (--rate, --rails, --cpus, --repeats,
--bw-repeats, --only, --small-sizes, --ompi-hints) are retired: the peers
study measures 2 x 2gbit and 1gbit + 3gbit, every size from 1 B to 4 MiB,
with the rounds of the report (median of 3).

Exit status: 0 if every measurement succeeded, 1 if any failed (the page is
still written and shows why), 2 on usage errors.
EOF
}

log() { printf '[compare %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    printf 'compare.sh: error: %s\n' "$*" >&2
    exit 1
}
cmdlog() { log "+ $*"; }
usage_error() {
    printf 'compare.sh: %s (see --help)\n' "$*" >&2
    exit 2
}

QUICK=0
PREFIX=mrcmp
OUT=
MR_BIN=
BUILD=1
INSTALL=1
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) QUICK=1 ;;
        --out | --prefix | --multirail)
            [[ $# -ge 2 ]] || usage_error "$1 needs a value"
            case $1 in
                --out) OUT=$2 ;;
                --prefix) PREFIX=$2 ;;
                --multirail) MR_BIN=$2 BUILD=0 ;;
            esac
            shift
            ;;
        --no-build) BUILD=0 ;;
        --no-install) INSTALL=0 ;;
        -h | --help)
            usage
            exit 0
            ;;
        --rate | --rails | --cpus | --repeats | --bw-repeats | --only | --small-sizes | --ompi-hints)
            usage_error "$1 is retired: compare.sh now runs 'multirail report --testbed --study peers --peers', which measures 2 x 2gbit and 1gbit + 3gbit at every size"
            ;;
        *) usage_error "unknown option $1" ;;
    esac
    shift
done

[[ $EUID -eq 0 ]] || die "needs root (network namespaces, tc): run it with sudo"
if [[ -z $OUT ]]; then
    OUT=$BENCH_DIR/results/$(date +%Y-%m-%d_%H%M%S)$([[ $QUICK -eq 1 ]] && echo -quick)
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/build
mkdir -p "$RAW"

declare -A PKG_OF=(
    [mpicc]=libopenmpi-dev [mpirun]=openmpi-bin [ucx_perftest]=ucx-utils [iperf3]=iperf3
    [ip]=iproute2 [tc]=iproute2 [ss]=iproute2 [python3]=python3 [make]=make [gcc]=gcc
)
missing=()
for cmd in "${!PKG_OF[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${PKG_OF[$cmd]}")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    [[ $INSTALL -eq 1 ]] || die "missing packages: ${missing[*]} (install them, or run without --no-install)"
    log "installing missing packages: ${missing[*]}"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"; } >"$RAW/apt.log" 2>&1; then
        tail -n 20 "$RAW/apt.log" >&2
        die "apt-get install ${missing[*]} failed; see $RAW/apt.log"
    fi
fi

[[ $BUILD -eq 1 ]] && build_mpi_programs
build_multirail "$BUILD" "$MR_BIN"

args=(report --testbed --study peers --peers --prefix "$PREFIX" --out "$OUT")
[[ $QUICK -eq 1 ]] && args+=(--quick)
log "+ $MR ${args[*]}"
"$MR" "${args[@]}"

# The report goes on past a failure and records it: say which, and fail.
python3 - "$OUT/results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bad = [f"{x['study']} figure {x['figure'] + 1} line {x['config'] + 1} round {x['round']}: {x['failed'].splitlines()[-1] if x['failed'] else ''}"
       for x in r["runs"] if x.get("failed")]
bad += [f"{p['tool']} {p['metric']} ({p.get('rails', 'all')}) on {p['testbed']['rails']} x {p['testbed']['rate']}: {p['failed']}"
        for p in r.get("peers", []) if p.get("failed")]
if not r.get("complete"):
    bad.append("the report did not finish")
for b in bad:
    print(f"compare.sh: failed: {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
log "done: $OUT/index.html"
