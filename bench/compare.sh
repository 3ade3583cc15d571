#!/usr/bin/env bash
# shellcheck disable=SC2317  # functions are called indirectly ("${kind}_bw") and from traps
# bench/compare.sh - one reproducible comparison of multirail with iperf3,
# Open MPI (ob1 + tcp BTL) and UCX (tcp) on an emulated dual-rail testbed.
# Run `bench/compare.sh --help` for what it does; bench/README.md explains
# the command lines and how to read the results.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)
LIB_DIR=$BENCH_DIR/lib
MPI_DIR=$BENCH_DIR/mpi
# shellcheck source-path=SCRIPTDIR source=lib/build.sh
. "$BENCH_DIR/lib/build.sh"
AGENT=$LIB_DIR/netns-agent
HELPER=$LIB_DIR/mrcmp.py

usage() {
    cat <<'EOF'
Usage: sudo bench/compare.sh [OPTIONS]

Builds an emulated cluster (2 network namespaces joined by tbf-shaped veth
"rails", via `multirail testbed`), then measures in one run, on the same
rails:

  iperf3     one TCP stream per rail, all rails at once; their sum is the
             practical limit. Also --bidir on every rail at once.
  multirail  `multirail bench bw|bibw|latency --testbed`, with 1 rail
             (--testbed-rails 1) and with all rails
  Open MPI   bench/mpi/mr_bw and mr_pingpong (ob1 + tcp BTL): rail0 only;
             all rails; all rails with btl_tcp_links=2; all rails with
             per-interface bandwidth hints (btl_tcp_bandwidth_railN); all
             rails send-only (btl_tcp_flags without put)
  UCX        ucx_perftest tag_bw / tag_lat (UCX_TLS=tcp): rail0 only; all
             rails with UCX_MAX_RNDV_RAILS

Measured (main part): bandwidth at 64 KiB, 1 MiB, 4 MiB (window of 64
messages, MB = 10^6 B), bi-directional bandwidth at 4 MiB, one-way latency
(round trip / 2) of 8 B and of 4 MiB messages. Ranks are pinned to two
different CPUs. Repeats are interleaved (round 1 of every configuration,
then round 2, ...) and the table shows medians. It ends with ONE table (plus
the ratios the multi-rail targets are stated in) and writes it, with the
software versions, to the output directory.

Small-message part (issue 9), multirail vs Open MPI vs UCX on the same rails,
printed as a second table (a row per test and size; columns multirail,
Open MPI, UCX, multirail/Open MPI, multirail/UCX; latency: lower is better):
  latency 8 B, rail0 only and all rails (the main part's runs when it runs)
  bw at 1, 64, 512, 2K, 4K, 8K, 16K bytes, all rails (--small-sizes):
             `multirail bench bw --sizes LIST`, mr_bw -s LIST, one
             ucx_perftest -t tag_bw per size
  mbw_mr, 2 pairs, 8 B, all rails: 4 ranks, ranks 0-1 in host0 send to
             ranks 2-3 in host1: `multirail bench mbw_mr --pairs 2` (ranks
             started by this script with MULTIRAIL_RANK/SIZE/ROOT) and
             mr_mbw_mr under mpirun (no UCX equivalent)

Options:
  --quick            short runs (smoke test, about 2-3 minutes after the
                     builds): fewer iterations, 1 bandwidth round and 3
                     latency rounds; the small-message part with 20 windows
                     per size
  --rate LIST        rail rates, as `multirail testbed up --rate`
                     (default 2gbit,2gbit; e.g. 1gbit,3gbit). The number of
                     rates is the number of rails (a single rate: --rails)
  --rails N          number of rails when --rate gives one rate (default 2)
  --prefix NAME      testbed prefix (default mrcmp); the testbed is created
                     by this script and removed on exit. A leftover testbed
                     with this prefix (from a killed run) is removed first.
  --out DIR          results directory (default
                     bench/results/<date>_<time>[-quick]/)
  --cpus A,B         CPUs for rank 0 (host0) and rank 1 (host1) (default 0,1)
  --repeats N        latency rounds (default 5, --quick 3)
  --bw-repeats N     bandwidth rounds (default 3, --quick 1)
  --only LIST        comma list of tools (iperf3, multirail, ompi, ucx)
                     and/or parts (main, small); default: every tool, both
                     parts. E.g. `--only small` runs the small-message part
                     alone (all tools), `--only small,ompi` Open MPI's part
                     of it, `--only main` the original table only
  --small-sizes LIST bandwidth sizes of the small-message part (default
                     1,64,512,2K,4K,8K,16K; K = 1024)
  --ompi-hints LIST  Mbit/s per rail for btl_tcp_bandwidth_railN (default:
                     the rail rates, e.g. 1000,3000 for --rate 1gbit,3gbit)
  --multirail PATH   use this multirail binary; do not run cargo
  --no-build         do not build (needs bench/mpi binaries and
                     target/release/multirail, or --multirail)
  --no-install       do not apt-get missing packages; fail instead
  -h, --help         this help

Needs root (network namespaces, tc). Missing Debian packages are installed
with `apt-get install -y openmpi-bin libopenmpi-dev ucx-utils iperf3 ...`
unless --no-install. All traffic stays inside the testbed's namespaces; every
command runs under `timeout`.

Output directory:
  table.txt      the table printed at the end
  results.json   the same, with per-cell sample counts, rail byte counts,
                 ratios and software versions
  results.md     the same as markdown
  commands.log   every command run, with its time
  raw/           each tool's output; measurements.tsv (every sample)

Exit status: 0 if every measurement succeeded, 1 if any failed (the table
is still written; failed cells show "-"), 2 on usage errors.
EOF
}

log() { printf '[compare %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    printf 'compare.sh: error: %s\n' "$*" >&2
    exit 1
}
usage_error() {
    printf 'compare.sh: %s (see --help)\n' "$*" >&2
    exit 2
}

# ------------------------------------------------------------------ options
QUICK=0
RATE=2gbit,2gbit
RAILS_OPT=
PREFIX=mrcmp
OUT=
CPUS=0,1
LAT_REPEATS=
BW_REPEATS=
ONLY=
SMALL_SIZES=1,64,512,2K,4K,8K,16K
OMPI_HINTS=
MR_BIN=
BUILD=1
INSTALL=1
ARGV_TEXT="$0${*:+ $*}"

need_arg() { [[ $# -ge 2 && -n $2 ]] || usage_error "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --quick) QUICK=1 ;;
        --rate) need_arg "$@"; RATE=$2; shift ;;
        --rails) need_arg "$@"; RAILS_OPT=$2; shift ;;
        --prefix) need_arg "$@"; PREFIX=$2; shift ;;
        --out) need_arg "$@"; OUT=$2; shift ;;
        --cpus) need_arg "$@"; CPUS=$2; shift ;;
        --repeats) need_arg "$@"; LAT_REPEATS=$2; shift ;;
        --bw-repeats) need_arg "$@"; BW_REPEATS=$2; shift ;;
        --only) need_arg "$@"; ONLY=$2; shift ;;
        --small-sizes) need_arg "$@"; SMALL_SIZES=$2; shift ;;
        --ompi-hints) need_arg "$@"; OMPI_HINTS=$2; shift ;;
        --multirail) need_arg "$@"; MR_BIN=$2; shift ;;
        --no-build) BUILD=0 ;;
        --no-install) INSTALL=0 ;;
        *) usage_error "unknown option: $1" ;;
    esac
    shift
done

if [[ $(id -u) -ne 0 ]]; then
    die "must run as root: the testbed creates network namespaces and tc qdiscs (CAP_NET_ADMIN, CAP_SYS_ADMIN). Try: sudo $ARGV_TEXT"
fi

is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
[[ $PREFIX =~ ^[a-z][a-z0-9_]{0,11}$ ]] || usage_error "--prefix: 1-12 characters of [a-z0-9_], starting with a letter"
[[ $CPUS =~ ^[0-9]+,[0-9]+$ ]] || usage_error "--cpus: two CPU numbers, e.g. 0,1"
CPU0=${CPUS%,*}
CPU1=${CPUS#*,}
[[ $CPU0 != "$CPU1" ]] || log "warning: --cpus puts both ranks on CPU $CPU0; latencies will suffer"
IFS=, read -r -a RATES <<<"$RATE"
if [[ ${#RATES[@]} -gt 1 ]]; then
    NRAILS=${#RATES[@]}
    [[ -z $RAILS_OPT || $RAILS_OPT == "$NRAILS" ]] || usage_error "--rails $RAILS_OPT but --rate lists $NRAILS rates"
else
    NRAILS=${RAILS_OPT:-2}
    is_count "$NRAILS" || usage_error "--rails: a count"
    RATES=()
    for ((r = 0; r < NRAILS; r++)); do RATES+=("$RATE"); done
fi
[[ $NRAILS -ge 2 ]] || usage_error "a comparison needs at least 2 rails"
ONLY_TOOLS='' ONLY_PARTS=''
for g in ${ONLY//,/ }; do
    case $g in
        iperf3 | multirail | ompi | ucx) ONLY_TOOLS+=,$g ;;
        main | small) ONLY_PARTS+=,$g ;;
        *) usage_error "--only: unknown tool or part $g (tools: iperf3,multirail,ompi,ucx; parts: main,small)" ;;
    esac
done
ONLY_TOOLS=${ONLY_TOOLS#,} ONLY_PARTS=${ONLY_PARTS#,}
: "${ONLY_TOOLS:=iperf3,multirail,ompi,ucx}" "${ONLY_PARTS:=main,small}"
want() { [[ ,$ONLY_TOOLS, == *,$1,* ]]; }
want_part() { [[ ,$ONLY_PARTS, == *,$1,* ]]; }
if want_part small && ! want multirail && ! want ompi && ! want ucx; then
    want_part main || usage_error "--only: the small-message part has no iperf3 measurement; add multirail, ompi or ucx"
    ONLY_PARTS=main
fi
[[ $SMALL_SIZES =~ ^[0-9]+[KM]?(,[0-9]+[KM]?)*$ ]] ||
    usage_error "--small-sizes: a comma list of sizes like 1,64,2K (K = 1024, M = 1048576)"

if [[ $QUICK -eq 1 ]]; then
    MODE=quick
    : "${LAT_REPEATS:=3}" "${BW_REPEATS:=1}"
    CMD_TIMEOUT=90
    IPERF_SECS=2 IPERF_OMIT=0
    # windows of 64 messages (timed, warm-up) per size; round trips for latency
    BW_IT_64K=50 BW_WU_64K=5 BW_IT_1M=4 BW_WU_1M=1 BW_IT_4M=2 BW_WU_4M=1
    BIBW_IT=2 BIBW_WU=1
    LAT_IT_8=1000 LAT_WU_8=100 LAT_IT_4M=10 LAT_WU_4M=2
    # small-message part: windows (timed, warm-up) for every bw size and mbw_mr
    SBW_IT=20 SBW_WU=2 MBW_IT=20 MBW_WU=2
else
    MODE=full
    : "${LAT_REPEATS:=5}" "${BW_REPEATS:=3}"
    CMD_TIMEOUT=300
    IPERF_SECS=10 IPERF_OMIT=1
    BW_IT_64K=100 BW_WU_64K=10 BW_IT_1M=20 BW_WU_1M=2 BW_IT_4M=10 BW_WU_4M=2
    BIBW_IT=10 BIBW_WU=2
    LAT_IT_8=10000 LAT_WU_8=100 LAT_IT_4M=50 LAT_WU_4M=5
    SBW_IT=100 SBW_WU=10 MBW_IT=100 MBW_WU=10
fi
is_count "$LAT_REPEATS" || usage_error "--repeats: a count >= 1"
is_count "$BW_REPEATS" || usage_error "--bw-repeats: a count >= 1"
WINDOW=64
MBW_PAIRS=2 MBW_SIZE=8 # small-message part: mbw_mr pairs and message size

if [[ -z $OUT ]]; then
    OUT=$BENCH_DIR/results/$(date +%Y-%m-%d_%H%M%S)
    [[ $MODE == quick ]] && OUT+=-quick
fi
if [[ -e $OUT/results.json ]]; then
    die "$OUT already holds results; choose another --out"
fi
mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/raw
TSV=$RAW/measurements.tsv
CMDLOG=$OUT/commands.log
: >"$TSV"
: >"$CMDLOG"
FAILURES=0
T_START=$(date +%s)

# ------------------------------------------------------------------ helpers

# Log a command line to commands.log (shell-quoted where needed, with the time).
cmdlog() {
    local a line
    line=$(date +%H:%M:%S)
    for a in "$@"; do
        if [[ $a =~ ^[A-Za-z0-9_./:,=@%+-]+$ ]]; then
            line+=" $a"
        else
            line+=" $(printf '%q' "$a")"
        fi
    done
    printf '%s\n' "$line" >>"$CMDLOG"
}

# Processes this script started (pids of their `timeout`), killed on exit.
# Commands run in the background and are waited for with `wait`, which a
# trapped signal interrupts at once: Ctrl-C stops the run without waiting
# for the current measurement to end.
declare -A BG=()
bg_start() { # OUTFILE CMD... ; sets BG_PID
    local outfile=$1
    shift
    cmdlog "$@"
    timeout --kill-after=5 "$CMD_TIMEOUT" "$@" >"$outfile" 2>&1 &
    BG_PID=$!
    BG[$BG_PID]=1
}
bg_wait() { # PID -> its exit status
    local rc=0
    wait "$1" || rc=$?
    unset "BG[$1]"
    return "$rc"
}
# run OUTFILE CMD...: run CMD under timeout, stdout+stderr to OUTFILE; its status.
run() {
    bg_start "$@"
    bg_wait "$BG_PID"
}

# record ROW METRIC SIZE REPEAT VALUE
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$TSV"; }
record_error() { # ROW METRIC SIZE REPEAT MESSAGE
    printf '%s\t%s\t%s\t%s\tERR %s\n' "$1" "$2" "$3" "$4" "$5" >>"$TSV"
    FAILURES=$((FAILURES + 1))
    log "FAILED: $1 $2 size $3 round $4: $5"
}

HOSTNS0=$PREFIX-host0
HOSTNS1=$PREFIX-host1
TESTBED_MADE=0
MR=

cleanup() {
    local rc=$?
    local pid
    for pid in "${!BG[@]}"; do
        kill "$pid" 2>/dev/null || true # timeout passes the TERM on to its command
    done
    for pid in "${!BG[@]}"; do
        wait "$pid" 2>/dev/null || true # at most --kill-after (5 s) later
    done
    if [[ $TESTBED_MADE -eq 1 ]]; then
        log "removing testbed $PREFIX"
        if ! "$MR" testbed down --prefix "$PREFIX" >>"$RAW/testbed-down.log" 2>&1; then
            log "warning: 'multirail testbed down --prefix $PREFIX' failed; see $RAW/testbed-down.log"
        fi
    fi
    if [[ $rc -ne 0 && $rc -ne 1 ]]; then
        log "stopped with status $rc; partial results in $OUT"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Wait until something listens on TCP PORT in namespace NS (at most ~5 s).
wait_listen() {
    local ns=$1 port=$2 i
    for ((i = 0; i < 100; i++)); do
        if [[ -n $(ip netns exec "$ns" ss -Hltn "sport = :$port" 2>/dev/null) ]]; then
            return 0
        fi
        sleep 0.05
    done
    return 1
}

# Bytes sent so far by the root (tbf) qdisc of rail R, both hosts' egress added.
qdisc_bytes() { # NETNS DEV
    tc -n "$1" -s qdisc show dev "$2" 2>/dev/null |
        awk '$1 == "qdisc" { root = ($0 ~ / root /) } root && $1 == "Sent" { print $2; exit }'
}
rail_bytes() {
    local r=$1 a b
    a=$(qdisc_bytes "$HOSTNS0" "rail$r")
    b=$(qdisc_bytes "$HOSTNS1" "rail$r")
    echo $((${a:-0} + ${b:-0}))
}
declare -A SHARE=()
share_begin() {
    local r
    SHARE_T0=()
    for ((r = 0; r < NRAILS; r++)); do SHARE_T0+=("$(rail_bytes "$r")"); done
}
share_end() { # ROW: add this interval's bytes per rail to ROW's total
    local row=$1 r now
    for ((r = 0; r < NRAILS; r++)); do
        now=$(rail_bytes "$r")
        SHARE[$row,$r]=$((${SHARE[$row,$r]:-0} + now - SHARE_T0[r]))
    done
}

size_bytes() { # 8, 2K, 64K, 1M, 4M -> bytes
    case $1 in
        *[0-9]K) echo $((${1%K} * 1024)) ;;
        *[0-9]M) echo $((${1%M} * 1048576)) ;;
        *[!0-9]* | '') die "internal: size $1" ;;
        *) echo $((10#$1)) ;;
    esac
}
SMALL_SIZES_BYTES=$(for s in ${SMALL_SIZES//,/ }; do printf '%s,' "$(size_bytes "$s")"; done)
SMALL_SIZES_BYTES=${SMALL_SIZES_BYTES%,}

# record_sizes ROW METRIC REPEAT RAWFILE SIZES PARSED: record the "SIZE VALUE"
# lines in PARSED for every size of the comma list SIZES (a missing one is a
# failure of that size).
record_sizes() {
    local row=$1 metric=$2 rep=$3 raw=$4 sizes=$5 parsed=$6 s b v
    for s in ${sizes//,/ }; do
        b=$(size_bytes "$s")
        v=$(awk -v s="$b" '$1 == s { print $2; exit }' <<<"$parsed")
        if [[ -n $v ]]; then
            record "$row" "$metric" "$b" "$rep" "$v"
        else
            record_error "$row" "$metric" "$b" "$rep" "no result for $b B in raw/${raw##*/}"
        fi
    done
}
# record_failed_sizes ROW METRIC REPEAT SIZES MESSAGE: one failure per size.
record_failed_sizes() {
    local s
    for s in ${4//,/ }; do record_error "$1" "$2" "$(size_bytes "$s")" "$3" "$5"; done
}
bw_iters() { local v="BW_IT_$1"; echo "${!v}"; }
bw_warmup() { local v="BW_WU_$1"; echo "${!v}"; }
lat_iters() { local v="LAT_IT_$1"; echo "${!v}"; }
lat_warmup() { local v="LAT_WU_$1"; echo "${!v}"; }

# ------------------------------------------------------------------ packages
declare -A PKG_OF=(
    [mpicc]=libopenmpi-dev [mpirun]=openmpi-bin [ompi_info]=openmpi-bin
    [ucx_perftest]=ucx-utils [ucx_info]=ucx-utils [iperf3]=iperf3
    [ip]=iproute2 [tc]=iproute2 [ss]=iproute2 [taskset]=util-linux [flock]=util-linux
    [python3]=python3 [make]=make [gcc]=gcc [timeout]=coreutils
)
ensure_packages() {
    local missing=() cmd
    for cmd in "${!PKG_OF[@]}"; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("${PKG_OF[$cmd]}")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    if [[ $INSTALL -eq 0 ]]; then
        die "missing packages: ${missing[*]} (install them, or run without --no-install)"
    fi
    log "installing missing packages: ${missing[*]}"
    cmdlog apt-get update
    cmdlog apt-get install -y "${missing[@]}"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"; } >"$RAW/apt.log" 2>&1; then
        tail -n 20 "$RAW/apt.log" >&2
        die "apt-get install ${missing[*]} failed; see $RAW/apt.log"
    fi
}

# ------------------------------------------------------------------ builds
build_all() {
    if [[ $BUILD -eq 1 ]] && want ompi; then
        build_mpi_programs
    fi
    if want ompi; then
        [[ -x $MPI_DIR/mr_bw && -x $MPI_DIR/mr_pingpong ]] ||
            die "bench/mpi/mr_bw or mr_pingpong missing: run 'make -C bench/mpi' (or drop --no-build)"
        if want_part small; then
            [[ -x $MPI_DIR/mr_mbw_mr ]] ||
                die "bench/mpi/mr_mbw_mr missing: run 'make -C bench/mpi' (or drop --no-build)"
        fi
    fi
    build_multirail "$BUILD" "$MR_BIN"
}

# ------------------------------------------------------------------ testbed
testbed_up() {
    local lockdir=/run/lock
    [[ -d $lockdir && -w $lockdir ]] || lockdir=/tmp
    exec 9>"$lockdir/multirail-compare-$PREFIX.lock"
    flock -n 9 || die "another compare.sh run uses testbed prefix $PREFIX (use --prefix)"
    if ip netns list | awk '{print $1}' | grep -q "^$PREFIX-"; then
        log "removing a leftover testbed $PREFIX (from an earlier, interrupted run)"
        run "$RAW/testbed-down-leftover.log" "$MR" testbed down --prefix "$PREFIX" ||
            die "cannot remove the leftover testbed $PREFIX; see $RAW/testbed-down-leftover.log"
    fi
    local rate_list
    rate_list=$(IFS=,; echo "${RATES[*]}")
    log "creating testbed $PREFIX: 2 hosts, $NRAILS rails at $rate_list"
    TESTBED_MADE=1
    run "$RAW/testbed-up.log" "$MR" testbed up --prefix "$PREFIX" --hosts 2 --rails "$NRAILS" --rate "$rate_list" ||
        { cat "$RAW/testbed-up.log" >&2; die "multirail testbed up failed"; }
    "$MR" testbed status --prefix "$PREFIX" --json >"$RAW/testbed-status.json" 2>&1 || true
    ADDR0=() ADDR1=()
    local r a
    for ((r = 0; r < NRAILS; r++)); do
        a=$(ip -n "$HOSTNS0" -4 -o addr show dev "rail$r" | awk '{print $4}' | cut -d/ -f1 | head -n1)
        ADDR0+=("$a")
        a=$(ip -n "$HOSTNS1" -4 -o addr show dev "rail$r" | awk '{print $4}' | cut -d/ -f1 | head -n1)
        ADDR1+=("$a")
        [[ -n ${ADDR0[r]} && -n ${ADDR1[r]} ]] || die "rail$r has no IPv4 address in the testbed"
    done
    RAIL_IFS=$(for ((r = 0; r < NRAILS; r++)); do printf 'rail%d,' "$r"; done)
    RAIL_IFS=${RAIL_IFS%,}
}

# ------------------------------------------------------------------ iperf3
IPERF_PORT=5201
iperf3_round() { # MODE(uni|bidir) REPEAT
    local mode=$1 rep=$2 r port flags=() spid=() cpid=() ok=1 v sum=0
    [[ $mode == bidir ]] && flags=(--bidir)
    [[ $mode == uni ]] && share_begin
    for ((r = 0; r < NRAILS; r++)); do
        port=$((IPERF_PORT + r))
        # server of rail r on the CPU the client of rail r does not use
        bg_start "$RAW/iperf3-$mode-r$r-$rep.server.txt" ip netns exec "$HOSTNS1" \
            taskset -c "$([[ $((r % 2)) -eq 0 ]] && echo "$CPU1" || echo "$CPU0")" \
            iperf3 -s -1 -B "${ADDR1[r]}" -p "$port"
        spid+=("$BG_PID")
    done
    for ((r = 0; r < NRAILS; r++)); do
        wait_listen "$HOSTNS1" $((IPERF_PORT + r)) || ok=0
    done
    if [[ $ok -eq 1 ]]; then
        for ((r = 0; r < NRAILS; r++)); do
            bg_start "$RAW/iperf3-$mode-r$r-$rep.json" ip netns exec "$HOSTNS0" \
                taskset -c "$([[ $((r % 2)) -eq 0 ]] && echo "$CPU0" || echo "$CPU1")" \
                iperf3 -c "${ADDR1[r]}" -B "${ADDR0[r]}" -p $((IPERF_PORT + r)) \
                -t "$IPERF_SECS" -O "$IPERF_OMIT" -J "${flags[@]}"
            cpid+=("$BG_PID")
        done
        for ((r = 0; r < NRAILS; r++)); do bg_wait "${cpid[r]}" || ok=0; done
    fi
    if [[ $ok -ne 1 ]]; then # a server whose client failed would wait until its timeout
        for ((r = 0; r < NRAILS; r++)); do kill "${spid[r]}" 2>/dev/null || true; done
    fi
    for ((r = 0; r < NRAILS; r++)); do bg_wait "${spid[r]}" || true; done
    [[ $mode == uni ]] && share_end iperf3_sum
    local metric=bw
    [[ $mode == bidir ]] && metric=bibw
    if [[ $ok -ne 1 ]]; then
        record_error iperf3_sum "$metric" 0 "$rep" "iperf3 did not run (see raw/iperf3-$mode-*-$rep.*)"
        return 0
    fi
    for ((r = 0; r < NRAILS; r++)); do
        if v=$(python3 "$HELPER" iperf3 "$RAW/iperf3-$mode-r$r-$rep.json" "$mode" 2>>"$RAW/parse.log"); then
            record "iperf3_r$r" "$metric" 0 "$rep" "$v"
            sum=$(python3 -c "print($sum + $v)")
        else
            record_error "iperf3_r$r" "$metric" 0 "$rep" "no result (see raw/parse.log)"
            ok=0
        fi
    done
    if [[ $ok -eq 1 ]]; then
        record iperf3_sum "$metric" 0 "$rep" "$sum"
    else
        record_error iperf3_sum "$metric" 0 "$rep" "a rail's iperf3 failed"
    fi
}

# ------------------------------------------------------------------ multirail
# row -> extra flags
mr_flags() {
    case $1 in
        mr_1) echo "--testbed-rails 1" ;;
        mr_all) echo "" ;;
    esac
}
mr_bench() { # ROW TEST SIZE ITERS WARMUP REPEAT METRIC
    local row=$1 test=$2 size=$3 it=$4 wu=$5 rep=$6 metric=$7 out v
    out=$RAW/$row-$test-$size-$rep.txt
    # shellcheck disable=SC2046  # mr_flags prints words on purpose
    if ! run "$out" "$MR" bench "$test" --testbed --testbed-prefix "$PREFIX" --pin "$CPUS" \
        --sizes "$size" --iterations "$it" --warmup "$wu" --window "$WINDOW" --json -q $(mr_flags "$row"); then
        record_error "$row" "$metric" "$(size_bytes "$size")" "$rep" "multirail bench $test exited non-zero (raw/${out##*/})"
        return 0
    fi
    if v=$(python3 "$HELPER" mr "$out" 2>>"$RAW/parse.log" | awk -v s="$(size_bytes "$size")" '$1 == s {print $2}') && [[ -n $v ]]; then
        record "$row" "$metric" "$(size_bytes "$size")" "$rep" "$v"
    else
        record_error "$row" "$metric" "$(size_bytes "$size")" "$rep" "no result in raw/${out##*/}"
    fi
}
multirail_bw() { mr_bench "$1" bw "$2" "$(bw_iters "$2")" "$(bw_warmup "$2")" "$3" bw; }
multirail_bibw() { mr_bench "$1" bibw "$2" "$BIBW_IT" "$BIBW_WU" "$3" bibw; }
multirail_lat() { mr_bench "$1" latency "$2" "$(lat_iters "$2")" "$(lat_warmup "$2")" "$3" lat; }

# Small-message part. bw: every size of --small-sizes in one run.
multirail_sbw() { # ROW REPEAT
    local row=$1 rep=$2 out parsed
    out=$RAW/$row-sbw-$rep.txt
    # shellcheck disable=SC2046  # mr_flags prints words on purpose
    if ! run "$out" "$MR" bench bw --testbed --testbed-prefix "$PREFIX" --pin "$CPUS" \
        --sizes "$SMALL_SIZES" --iterations "$SBW_IT" --warmup "$SBW_WU" --window "$WINDOW" --json -q $(mr_flags "$row"); then
        record_failed_sizes "$row" sbw "$rep" "$SMALL_SIZES" "multirail bench bw exited non-zero (raw/${out##*/})"
        return 0
    fi
    parsed=$(python3 "$HELPER" mr "$out" 2>>"$RAW/parse.log") || true
    record_sizes "$row" sbw "$rep" "$out" "$SMALL_SIZES" "$parsed"
}
# mbw_mr with MBW_PAIRS pairs: 2 x MBW_PAIRS ranks, ranks 0..P-1 in host0 send
# to ranks P..2P-1 in host1 (the placement of the Open MPI run). `bench
# --testbed` puts rank i in host i, which would need 2P hosts (and a bridged
# testbed), so the ranks are started here, as mpirun would start them:
# MULTIRAIL_RANK/SIZE, MULTIRAIL_ROOT = host0's rail0 address, a fresh
# MULTIRAIL_KEY, MULTIRAIL_RAILS = the host's addresses of the row's rails.
MR_ROOT_PORT=18700
mr_rails_of() { # ROW HOST(0|1) -> MULTIRAIL_RAILS
    local -n addrs=ADDR$2
    local r n=$NRAILS list=
    [[ $1 == mr_1 ]] && n=1
    for ((r = 0; r < n; r++)); do list+=tcp:${addrs[r]},; done
    echo "${list%,}"
}
multirail_mbw() { # ROW REPEAT
    local row=$1 rep=$2 out r h np=$((2 * MBW_PAIRS)) port=$((MR_ROOT_PORT++)) key pids=() rc=0 v m
    local b
    b=$(size_bytes "$MBW_SIZE")
    key=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
    out=$RAW/$row-mbw-$rep
    for ((r = 0; r < np; r++)); do
        h=$((r < MBW_PAIRS ? 0 : 1))
        bg_start "$out.rank$r.txt" ip netns exec "$PREFIX-host$h" env MULTIRAIL_RANK="$r" MULTIRAIL_SIZE="$np" \
            MULTIRAIL_ROOT="${ADDR0[0]}:$port" MULTIRAIL_KEY="$key" MULTIRAIL_RAILS="$(mr_rails_of "$row" "$h")" \
            taskset -c "$CPU0,$CPU1" "$MR" bench mbw_mr --pairs "$MBW_PAIRS" --sizes "$MBW_SIZE" \
            --iterations "$MBW_IT" --warmup "$MBW_WU" --window "$WINDOW" --json -q
        pids+=("$BG_PID")
    done
    bg_wait "${pids[0]}" || rc=$?
    if [[ $rc -ne 0 ]]; then # the others would wait for rank 0 until their timeout
        for ((r = 1; r < np; r++)); do kill "${pids[r]}" 2>/dev/null || true; done
    fi
    for ((r = 1; r < np; r++)); do
        bg_wait "${pids[r]}" || { [[ $rc -ne 0 ]] || rc=$?; }
    done
    if [[ $rc -ne 0 ]]; then
        record_error "$row" mbw "$b" "$rep" "multirail bench mbw_mr exited $rc (raw/${out##*/}.rank*.txt)"
        record_error "$row" mbw_rate "$b" "$rep" "multirail bench mbw_mr exited $rc"
        return 0
    fi
    v=$(python3 "$HELPER" mr "$out.rank0.txt" 2>>"$RAW/parse.log") || true
    m=$(python3 "$HELPER" mr "$out.rank0.txt" msg_rate 2>>"$RAW/parse.log") || true
    record_sizes "$row" mbw "$rep" "$out.rank0.txt" "$MBW_SIZE" "$v"
    record_sizes "$row" mbw_rate "$rep" "$out.rank0.txt" "$MBW_SIZE" "$m"
}

# ------------------------------------------------------------------ Open MPI
# Open MPI 4.1 (ORTE + PMIx 4) cannot start ranks inside other network
# namespaces with a plain MPMD line: a rank connects to the PMIx server of
# its launcher over TCP loopback, and every namespace has its own loopback.
# So mpirun runs inside host0, and host1 is a "remote node" reached through
# bench/lib/netns-agent (plm_rsh_agent), which runs orted in the namespace
# that owns the address. The out-of-band channel (orted <-> mpirun) uses
# rail0; the data (tcp BTL) uses the rails named in btl_tcp_if_include.
ompi_mca() { # ROW -> MCA arguments
    local r
    case $1 in
        ompi_1) echo "--mca btl_tcp_if_include rail0" ;;
        ompi_all) echo "--mca btl_tcp_if_include $RAIL_IFS" ;;
        ompi_links2) echo "--mca btl_tcp_if_include $RAIL_IFS --mca btl_tcp_links 2" ;;
        # the default btl_tcp_flags without "put": no RDMA-style pipeline
        ompi_noput) echo "--mca btl_tcp_if_include $RAIL_IFS --mca btl_tcp_flags send,inplace,need-ack,need-csum,hetero-rdma" ;;
        ompi_hints)
            printf -- '--mca btl_tcp_if_include %s' "$RAIL_IFS"
            for ((r = 0; r < NRAILS; r++)); do
                printf -- ' --mca btl_tcp_bandwidth_rail%d %s' "$r" "${HINTS[r]}"
            done
            echo
            ;;
    esac
}
# ompi_launch OUTFILE ROW PER_HOST PROGRAM ARGS...: PER_HOST ranks in host0
# (ranks 0..PER_HOST-1), as many in host1; its exit status. One rank per host
# is pinned (taskset) to --cpus; with more ranks than CPUs they may use both
# CPUs and Open MPI is told the machine is oversubscribed
# (mpi_yield_when_idle 1, what it does itself when it knows: busy-polling
# ranks then yield the CPU to the others).
ompi_launch() {
    local out=$1 row=$2 per=$3 prog=$4 c0=$CPU0 c1=$CPU1 h0=${ADDR0[0]} h1=${ADDR1[0]} extra=()
    shift 4
    if [[ $per -gt 1 ]]; then
        c0=$CPU0,$CPU1 c1=$CPU0,$CPU1 h0+=":$per" h1+=":$per"
        extra=(--mca mpi_yield_when_idle 1)
    fi
    # shellcheck disable=SC2046  # ompi_mca prints words on purpose
    run "$out" env MR_NETNS_PREFIX="$PREFIX" ip netns exec "$HOSTNS0" \
        mpirun --allow-run-as-root --bind-to none \
        --mca plm_rsh_agent "$AGENT" --mca oob_tcp_if_include rail0 \
        --mca pml ob1 --mca btl tcp,self $(ompi_mca "$row") "${extra[@]}" \
        -np "$per" -H "$h0" taskset -c "$c0" "$MPI_DIR/$prog" "$@" \
        : -np "$per" -H "$h1" taskset -c "$c1" "$MPI_DIR/$prog" "$@"
}
ompi_run() { # ROW METRIC SIZE REPEAT PROGRAM ARGS...
    local row=$1 metric=$2 size=$3 rep=$4 prog=$5 out v
    shift 5
    out=$RAW/$row-$metric-$size-$rep.txt
    if ! ompi_launch "$out" "$row" 1 "$prog" "$@"; then
        record_error "$row" "$metric" "$(size_bytes "$size")" "$rep" "mpirun $prog exited non-zero (raw/${out##*/})"
        return 0
    fi
    if v=$(python3 "$HELPER" osu "$out" 2>>"$RAW/parse.log" | awk -v s="$(size_bytes "$size")" '$1 == s {print $2}') && [[ -n $v ]]; then
        record "$row" "$metric" "$(size_bytes "$size")" "$rep" "$v"
    else
        record_error "$row" "$metric" "$(size_bytes "$size")" "$rep" "no result in raw/${out##*/}"
    fi
}
ompi_bw() { ompi_run "$1" bw "$2" "$3" mr_bw -s "$2" -i "$(bw_iters "$2")" -w "$(bw_warmup "$2")" -W "$WINDOW"; }
ompi_bibw() { ompi_run "$1" bibw "$2" "$3" mr_bw -b -s "$2" -i "$BIBW_IT" -w "$BIBW_WU" -W "$WINDOW"; }
ompi_lat() { ompi_run "$1" lat "$2" "$3" mr_pingpong -s "$2" -i "$(lat_iters "$2")" -w "$(lat_warmup "$2")"; }

# Small-message part: mr_bw over every size of --small-sizes in one run, and
# mr_mbw_mr with MBW_PAIRS ranks in each host.
ompi_sbw() { # ROW REPEAT
    local row=$1 rep=$2 out parsed
    out=$RAW/$row-sbw-$rep.txt
    if ! ompi_launch "$out" "$row" 1 mr_bw -m -s "$SMALL_SIZES" -i "$SBW_IT" -w "$SBW_WU" -W "$WINDOW"; then
        record_failed_sizes "$row" sbw "$rep" "$SMALL_SIZES" "mpirun mr_bw exited non-zero (raw/${out##*/})"
        return 0
    fi
    # MB/s from the Messages/s column: its digits survive for 1 B messages
    parsed=$(python3 "$HELPER" osu "$out" 2 rate 2>>"$RAW/parse.log") || true
    record_sizes "$row" sbw "$rep" "$out" "$SMALL_SIZES" "$parsed"
}
ompi_mbw() { # ROW REPEAT
    local row=$1 rep=$2 out v m b
    b=$(size_bytes "$MBW_SIZE")
    out=$RAW/$row-mbw-$rep.txt
    if ! ompi_launch "$out" "$row" "$MBW_PAIRS" mr_mbw_mr -p "$MBW_PAIRS" -s "$MBW_SIZE" \
        -i "$MBW_IT" -w "$MBW_WU" -W "$WINDOW"; then
        record_error "$row" mbw "$b" "$rep" "mpirun mr_mbw_mr exited non-zero (raw/${out##*/})"
        record_error "$row" mbw_rate "$b" "$rep" "mpirun mr_mbw_mr exited non-zero"
        return 0
    fi
    v=$(python3 "$HELPER" osu "$out" 2 rate 2>>"$RAW/parse.log") || true
    m=$(python3 "$HELPER" osu "$out" 2 2>>"$RAW/parse.log") || true
    record_sizes "$row" mbw "$rep" "$out" "$MBW_SIZE" "$v"
    record_sizes "$row" mbw_rate "$rep" "$out" "$MBW_SIZE" "$m"
}

# ------------------------------------------------------------------ UCX
# ucx_perftest: server (no address) in host1, client in host0. The tests
# exchange setup over their own TCP socket (to host1's rail0 address); data
# goes over the UCX_NET_DEVICES. ucx_perftest prints MB/s as MiB/s; the
# helper converts to 10^6 B.
UCX_PORT=13400
ucx_env() { # ROW -> environment assignments
    case $1 in
        ucx_1) echo "UCX_TLS=tcp UCX_NET_DEVICES=rail0" ;;
        ucx_all) echo "UCX_TLS=tcp UCX_NET_DEVICES=$RAIL_IFS UCX_MAX_RNDV_RAILS=$NRAILS" ;;
    esac
}
ucx_run() { # ROW METRIC SIZE REPEAT TEST N WARMUP KIND(bw|lat) [BYTES: bw = message rate x BYTES]
    local row=$1 metric=$2 size=$3 rep=$4 test=$5 n=$6 wu=$7 kind=$8 out spid crc=0 v
    local port=$((UCX_PORT++))
    out=$RAW/$row-$metric-$size-$rep.txt
    # shellcheck disable=SC2046  # ucx_env prints assignments on purpose
    bg_start "$out.server" ip netns exec "$HOSTNS1" env $(ucx_env "$row") \
        taskset -c "$CPU1" ucx_perftest -p "$port"
    spid=$BG_PID
    if ! wait_listen "$HOSTNS1" "$port"; then
        kill "$spid" 2>/dev/null || true
        bg_wait "$spid" || true
        record_error "$row" "$metric" "$(size_bytes "$size")" "$rep" "ucx_perftest server did not listen (raw/${out##*/}.server)"
        return 0
    fi
    # shellcheck disable=SC2046
    run "$out" ip netns exec "$HOSTNS0" env $(ucx_env "$row") taskset -c "$CPU0" \
        ucx_perftest "${ADDR1[0]}" -p "$port" -t "$test" -s "$(size_bytes "$size")" \
        -n "$n" -w "$wu" -f || crc=$?
    if [[ $crc -ne 0 ]]; then
        kill "$spid" 2>/dev/null || true
    fi
    bg_wait "$spid" || true
    if [[ $crc -ne 0 ]]; then
        record_error "$row" "$metric" "$(size_bytes "$size")" "$rep" "ucx_perftest exited $crc (raw/${out##*/})"
    elif v=$(python3 "$HELPER" ucx "$out" "$kind" ${9:+"$9"} 2>>"$RAW/parse.log"); then
        record "$row" "$metric" "$(size_bytes "$size")" "$rep" "$v"
    else
        record_error "$row" "$metric" "$(size_bytes "$size")" "$rep" "no result in raw/${out##*/}"
    fi
}
# bandwidth: as many messages as the MPI/multirail runs send (windows x 64)
ucx_bw() { ucx_run "$1" bw "$2" "$3" tag_bw $(($(bw_iters "$2") * WINDOW)) $(($(bw_warmup "$2") * WINDOW)) bw; }
ucx_bibw() { :; } # ucx_perftest has no bi-directional tag test
ucx_lat() { ucx_run "$1" lat "$2" "$3" tag_lat "$(lat_iters "$2")" "$(lat_warmup "$2")" lat; }
# Small-message part: one tag_bw per size (a server serves one test), as many
# messages as the window runs send; bandwidth from the message rate, whose
# digits survive for 1 B messages (the MiB/s column has two decimals).
ucx_sbw() { # ROW REPEAT
    local s
    for s in ${SMALL_SIZES//,/ }; do
        ucx_run "$1" sbw "$s" "$2" tag_bw $((SBW_IT * WINDOW)) $((SBW_WU * WINDOW)) bw "$(size_bytes "$s")"
    done
}
ucx_mbw() { :; } # ucx_perftest has no multi-pair test

# ------------------------------------------------------------------ run length
# The iteration counts above are sized for 2gbit rails. The rail0-only rows
# run at rail0's rate, so a slower rail0 gets proportionally fewer windows
# (never fewer than a floor), which keeps a full run under 20 minutes with
# e.g. --rate 1gbit,3gbit. Faster rails keep the counts.
scale_iterations() {
    local m0 v floor name
    m0=$(python3 "$HELPER" mbit "${RATES[0]}") || die "cannot read rate ${RATES[0]}"
    [[ $m0 -lt 2000 ]] || return 0
    for name in BW_IT_64K:20 BW_IT_1M:4 BW_IT_4M:2 BIBW_IT:2 LAT_IT_4M:10; do
        floor=${name#*:}
        name=${name%:*}
        v=$(((${!name} * m0 + 1999) / 2000))
        [[ $v -ge $floor ]] || v=$floor
        [[ $v -le ${!name} ]] || v=${!name}
        printf -v "$name" '%s' "$v"
    done
    log "rail0 is ${RATES[0]}: fewer windows per size than at 2gbit (64K $BW_IT_64K, 1M $BW_IT_1M, 4M $BW_IT_4M, bibw $BIBW_IT; 4 MiB round trips $LAT_IT_4M)"
}

# ------------------------------------------------------------------ rows
ROWS_TSV=$RAW/rows.tsv
CONFIGS=() # "kind row" of every benchmarked configuration, in table order
# Small-message part: the rail0-only and all-rails rows of each tool (the
# latency rows; bandwidth and mbw_mr use the all-rails row).
declare -A SMALL_ROW1=([multirail]=mr_1 [ompi]=ompi_1 [ucx]=ucx_1)
declare -A SMALL_ROWALL=([multirail]=mr_all [ompi]=ompi_all [ucx]=ucx_all)
define_rows() {
    local r all="rail0..rail$((NRAILS - 1))"
    : >"$ROWS_TSV"
    # the main table's rows (none when only the small-message part runs)
    row() { if want_part main; then printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$ROWS_TSV"; fi; }
    if want iperf3; then
        for ((r = 0; r < NRAILS; r++)); do
            row "iperf3_r$r" "iperf3 rail$r (1 stream, rails at once)" 1 "" 1
        done
        row iperf3_sum "iperf3 sum of $NRAILS rails (limit)" "$NRAILS" "" 1
    fi
    if want multirail; then
        if "$MR" bench --help 2>/dev/null | grep -q -- '--testbed-rails'; then
            row mr_1 "multirail, rail0 only" 1 "" 0
            CONFIGS+=("multirail mr_1")
        else
            log "note: this multirail has no 'bench --testbed-rails'; the 1-rail multirail row is skipped"
            SMALL_ROW1[multirail]=
        fi
        row mr_all "multirail, $all" "$NRAILS" "$([[ ${CONFIGS[*]-} == *mr_1* ]] && echo mr_1)" 0
        CONFIGS+=("multirail mr_all")
    fi
    if want ompi; then
        row ompi_1 "Open MPI tcp, rail0 only" 1 "" 0
        row ompi_all "Open MPI tcp, $all" "$NRAILS" ompi_1 0
        row ompi_links2 "Open MPI tcp, $all, btl_tcp_links=2" "$NRAILS" ompi_1 0
        row ompi_hints "Open MPI tcp, $all, bw hints $(IFS=/; echo "${HINTS[*]}") Mbit/s" "$NRAILS" ompi_1 0
        row ompi_noput "Open MPI tcp, $all, send-only (no put)" "$NRAILS" ompi_1 0
        CONFIGS+=("ompi ompi_1" "ompi ompi_all" "ompi ompi_links2" "ompi ompi_hints" "ompi ompi_noput")
    fi
    if want ucx; then
        row ucx_1 "UCX tcp, rail0 only" 1 "" 0
        row ucx_all "UCX tcp, $all, MAX_RNDV_RAILS=$NRAILS" "$NRAILS" ucx_1 0
        CONFIGS+=("ucx ucx_1" "ucx ucx_all")
    fi
}

# ------------------------------------------------------------------ rounds
# One round of the main part: iperf3, then every configuration's bandwidth
# (64K 1M 4M, bibw 4M) and latency (8 B, 4 MiB).
main_round() { # REPEAT
    local rep=$1 cfg kind row size
    if want iperf3 && [[ $rep -le $BW_REPEATS ]]; then
        log "  iperf3: one stream per rail, all rails at once (uni, then --bidir)"
        iperf3_round uni "$rep"
        iperf3_round bidir "$rep"
    fi
    for cfg in "${CONFIGS[@]}"; do
        kind=${cfg% *}
        row=${cfg#* }
        if [[ $rep -le $BW_REPEATS ]]; then
            log "  $row: bandwidth 64K 1M 4M, bi-bandwidth 4M"
            share_begin
            for size in 64K 1M 4M; do "${kind}_bw" "$row" "$size" "$rep"; done
            share_end "$row"
            "${kind}_bibw" "$row" 4M "$rep"
        fi
        if [[ $rep -le $LAT_REPEATS ]]; then
            log "  $row: latency 8B, 4MiB"
            "${kind}_lat" "$row" 8 "$rep"
            "${kind}_lat" "$row" 4M "$rep"
        fi
    done
}

# One round of the small-message part for one tool: 8 B latency on rail0 and
# on all rails (only when the main part does not run: it measures the same
# rows with the same counts), bandwidth at --small-sizes and mbw_mr on all
# rails.
small_round() { # KIND REPEAT
    local kind=$1 rep=$2 one=${SMALL_ROW1[$1]} all=${SMALL_ROWALL[$1]}
    if ! want_part main && [[ $rep -le $LAT_REPEATS ]]; then
        log "  $all: small messages: latency 8B (${one:+rail0 only, }all rails)"
        if [[ -n $one ]]; then "${kind}_lat" "$one" 8 "$rep"; fi
        "${kind}_lat" "$all" 8 "$rep"
    fi
    if [[ $rep -le $BW_REPEATS ]]; then
        log "  $all: small messages: bandwidth $SMALL_SIZES$([[ $kind == ucx ]] || echo ", mbw_mr $MBW_PAIRS pairs ${MBW_SIZE}B")"
        "${kind}_sbw" "$all" "$rep"
        "${kind}_mbw" "$all" "$rep"
    fi
}

# ------------------------------------------------------------------ versions
write_meta() {
    local m=$RAW/meta.tsv commit dirty
    commit=$(git -C "$REPO_DIR" rev-parse HEAD 2>/dev/null || echo unknown)
    dirty=$(git -C "$REPO_DIR" status --porcelain --untracked-files=no 2>/dev/null | head -n1)
    [[ -n $dirty ]] && commit+=" (+ uncommitted changes)"
    {
        printf 'date\t%s\n' "$(date -Is)"
        printf 'mode\t%s\n' "$MODE"
        printf 'command\t%s\n' "$ARGV_TEXT"
        printf 'prefix\t%s\n' "$PREFIX"
        printf 'rails\t%s\n' "$NRAILS"
        printf 'rate\t%s\n' "$(IFS=,; echo "${RATES[*]}")"
        printf 'cpus\t%s\n' "$CPUS"
        printf 'lat_repeats\t%s\n' "$LAT_REPEATS"
        printf 'bw_repeats\t%s\n' "$BW_REPEATS"
        printf 'window\t%s\n' "$WINDOW"
        printf 'iterations\tbw windows 64K %s+%s, 1M %s+%s, 4M %s+%s; bibw 4M %s+%s; latency 8B %s+%s, 4M %s+%s (timed+warm-up); iperf3 -t %s -O %s\n' \
            "$BW_IT_64K" "$BW_WU_64K" "$BW_IT_1M" "$BW_WU_1M" "$BW_IT_4M" "$BW_WU_4M" "$BIBW_IT" "$BIBW_WU" \
            "$LAT_IT_8" "$LAT_WU_8" "$LAT_IT_4M" "$LAT_WU_4M" "$IPERF_SECS" "$IPERF_OMIT"
        if want_part small; then
            printf 'small_part\t1\n'
            printf 'small_tools\t%s\n' "$ONLY_TOOLS"
            printf 'small_sizes_bytes\t%s\n' "$SMALL_SIZES_BYTES"
            printf 'small_mbw_pairs\t%s\n' "$MBW_PAIRS"
            printf 'small_mbw_size\t%s\n' "$(size_bytes "$MBW_SIZE")"
            printf 'small_iterations\tbw windows %s+%s at %s B; mbw_mr %s pairs %s B, windows %s+%s; latency 8B %s+%s round trips (timed+warm-up)\n' \
                "$SBW_IT" "$SBW_WU" "$SMALL_SIZES_BYTES" "$MBW_PAIRS" "$(size_bytes "$MBW_SIZE")" "$MBW_IT" "$MBW_WU" "$LAT_IT_8" "$LAT_WU_8"
        fi
        printf 'parts\t%s\n' "$ONLY_PARTS"
        printf 'ompi_bandwidth_hints_mbit\t%s\n' "$(IFS=,; echo "${HINTS[*]}")"
        printf 'kernel\t%s\n' "$(uname -srv)"
        printf 'congestion_control\t%s\n' "$(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || echo unknown)"
        printf 'congestion_control_hosts\t%s\n' "$(ip netns exec "$HOSTNS0" sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || echo unknown)"
        printf 'openmpi\t%s\n' "$( (ompi_info --version 2>/dev/null || true) | head -n1)"
        printf 'ucx\t%s\n' "$( (ucx_info -v 2>/dev/null || true) | head -n1 | sed 's/^# *//')"
        printf 'iperf3\t%s\n' "$( (iperf3 --version 2>/dev/null || true) | head -n1)"
        printf 'multirail\t%s\n' "$("$MR" --version 2>/dev/null || echo unknown)"
        printf 'multirail_commit\t%s\n' "$commit"
        printf 'multirail_binary\t%s (modified %s)\n' "$MR" "$(date -r "$MR" -Is 2>/dev/null || echo unknown)"
        printf 'rustc\t%s\n' "$(rustc --version 2>/dev/null || echo unknown)"
        printf 'cpu\t%s\n' "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
        printf 'cpus_online\t%s\n' "$(nproc)"
        printf 'loadavg_start\t%s\n' "$LOADAVG_START"
        # the order UCX (and others) enumerate devices in: /sys/class/net in each host
        printf 'netdev_order_host0\t%s\n' "$(ip netns exec "$HOSTNS0" ls -U /sys/class/net 2>/dev/null | tr '\n' ' ')"
        printf 'netdev_order_host1\t%s\n' "$(ip netns exec "$HOSTNS1" ls -U /sys/class/net 2>/dev/null | tr '\n' ' ')"
    } >"$m"
}

# ------------------------------------------------------------------ main
# The whole run is one function, called on the last line: bash parses it
# completely before running it, so editing this file during a run is safe.
main() {
    log "mode $MODE, results in $OUT"
    LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
    if awk -v l="${LOADAVG_START%% *}" 'BEGIN { exit !(l >= 0.5) }'; then
        log "warning: load average $LOADAVG_START: other processes use the CPUs and will disturb the results"
    fi
    ensure_packages
    build_all
    if want ompi; then
        if [[ -n $OMPI_HINTS ]]; then
            IFS=, read -r -a HINTS <<<"$OMPI_HINTS"
            [[ ${#HINTS[@]} -eq $NRAILS ]] || usage_error "--ompi-hints needs $NRAILS values"
        else
            HINTS=()
            for rate in "${RATES[@]}"; do HINTS+=("$(python3 "$HELPER" mbit "$rate")") || die "bad rate $rate"; done
        fi
    else
        HINTS=()
    fi
    scale_iterations
    testbed_up
    define_rows
    write_meta
    T_MEASURE=$(date +%s)

    ROUNDS=$((LAT_REPEATS > BW_REPEATS ? LAT_REPEATS : BW_REPEATS))
    for ((rep = 1; rep <= ROUNDS; rep++)); do
        log "round $rep of $ROUNDS (load average $(cut -d' ' -f1-3 /proc/loadavg))"
        if want_part main; then
            main_round "$rep"
        fi
        if want_part small; then
            for kind in multirail ompi ucx; do
                if want "$kind"; then small_round "$kind" "$rep"; fi
            done
        fi
    done

    while IFS=$'\t' read -r id _; do
        if [[ -n ${SHARE[$id,0]:-} ]]; then
            bytes=$(for ((r = 0; r < NRAILS; r++)); do printf '%s,' "${SHARE[$id,$r]}"; done)
            record "$id" share - 0 "${bytes%,}"
        fi
    done <"$ROWS_TSV"

    T_END=$(date +%s)
    {
        printf 'measure_seconds\t%s\n' $((T_END - T_MEASURE))
        printf 'total_seconds\t%s\n' $((T_END - T_START))
        printf 'loadavg_end\t%s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
    } >>"$RAW/meta.tsv"
    log "measurements took $((T_END - T_MEASURE)) s (whole run $((T_END - T_START)) s)"

    echo
    python3 "$HELPER" report "$TSV" "$RAW/meta.tsv" "$ROWS_TSV" "$OUT" || die "building the report failed"
    echo
    echo "Results: $OUT/{table.txt,results.md,results.json}"
    if [[ $FAILURES -gt 0 ]]; then
        log "$FAILURES measurement(s) failed (see the list above)"
        exit 1
    fi
    exit 0
}

main; exit "$?"
