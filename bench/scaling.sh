#!/usr/bin/env bash
# shellcheck disable=SC2317  # cleanup is called from traps
# bench/scaling.sh - wall time of a whole mbw_mr job with many local ranks:
# multirail (each progress engine) beside Open MPI, on this machine (issue 16).
# Run `bench/scaling.sh --help` for what it does; bench/README.md explains
# how to read the results.
set -euo pipefail
# The rails measured here are loopback TCP: the two ranks of this host must
# use them, not the shared memory they would get by themselves.
export MULTIRAIL_SHM=off

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)
MPI_DIR=$BENCH_DIR/mpi
# shellcheck source-path=SCRIPTDIR source=lib/build.sh
. "$BENCH_DIR/lib/build.sh"
SAMPLER=$BENCH_DIR/lib/runstat.py

usage() {
    cat <<'EOF'
Usage: bench/scaling.sh [OPTIONS]

Wall time of a whole osu_mbw_mr-style job (start-up, every window, exit)
with N ranks on this machine, N/2 pairs, 8-byte messages:

  multirail  multirail bench mbw_mr --pairs N/2 --sizes 8 --iterations I
               --warmup W --progress ENGINE [--validate]
             (its own local launcher; rails: the default two loopback rails)
  Open MPI   mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp
               -np N bench/mpi/mr_mbw_mr -p N/2 -s 8 -i I -w W -W 64 -q [-c]

for every N of --ranks, one job after the other (N=8: multirail polled,
multirail threaded, Open MPI; then N=16 ...). For each job it records:

  wall time       seconds from start to exit (date +%s.%N), whole job
  exit status     and whether it finished within --timeout; a job still
                  running then is stopped with all its processes (SIGTERM,
                  SIGKILL 10 s later; ranks that outlive their launcher
                  too) and reported as "timeout"
  rail failures   lines of multirail's stderr matching "rail down", and
                  matching "suspect" (counted separately; MULTIRAIL_LOG is
                  left at its default, warn, which logs both)
  connections     peak of `ss -tanH state established | wc -l` sampled
                  every 100 ms during the job, minus the count just before
                  it (a loopback connection counts twice: both ends)
  memory          peak VmRSS of one rank (/proc/PID/status every 100 ms, max
                  over the ranks: processes named multirail below the
                  launcher, or mr_mbw_mr), in MiB; also the ranks' total
  messages/s      the benchmark's own result line

and prints the table of issue 16 (wall time per ranks and tool) and one
line per job with every field.

Options:
  --ranks "LIST"     rank counts (default "8 16 32 64 128 256"); each even, >= 2
  --timeout SECS     per job (default 300)
  --iterations N     timed windows per job (default 300); --windows N is the same
  --warmup N         warm-up windows (default 1)
  --engines "LIST"   multirail progress engines (default "polled threaded";
                     "" runs no multirail job)
  --no-mpi           no Open MPI jobs
  --validate         multirail --validate, mr_mbw_mr -c (receivers check bytes)
  --out DIR          results directory (default
                     bench/results/<date>_<time>-scaling/): scaling.tsv (every
                     field of every job), table.md / table.txt (what is
                     printed), meta.tsv, commands.log, raw/ (each job's
                     stdout, stderr and samples)
  --multirail PATH   use this multirail binary; do not run cargo
  --no-build         build nothing (needs target/release/multirail or
                     --multirail, and bench/mpi/mr_mbw_mr)
  -h, --help         this help

The machine should be otherwise idle: every rank of a job shares its CPUs,
and anything else running (a cargo build, another benchmark) changes the
wall times several-fold. The load average is logged at start and end.
No root needed (the Open MPI command line has --allow-run-as-root so that
root can run it too).

Exit status: 0 if every job finished in time with status 0, 1 if any did
not (the table is still written), 2 on usage errors.
EOF
}

log() { printf '[scaling %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    printf 'scaling.sh: error: %s\n' "$*" >&2
    exit 1
}
usage_error() {
    printf 'scaling.sh: %s (see --help)\n' "$*" >&2
    exit 2
}

# ------------------------------------------------------------------ options
RANKS="8 16 32 64 128 256"
TIMEOUT=300
ITERS=300
WARMUP=1
ENGINES="polled threaded"
MPI=1
VALIDATE=0
OUT=
MR_BIN=
BUILD=1
KILL_AFTER=10
WINDOW=64
ARGV_TEXT="$0${*:+ $*}"

need_arg() { [[ $# -ge 2 ]] || usage_error "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --ranks) need_arg "$@"; RANKS=$2; shift ;;
        --timeout) need_arg "$@"; TIMEOUT=$2; shift ;;
        --iterations | --windows) need_arg "$@"; ITERS=$2; shift ;;
        --warmup) need_arg "$@"; WARMUP=$2; shift ;;
        --engines) need_arg "$@"; ENGINES=$2; shift ;;
        --no-mpi) MPI=0 ;;
        --validate) VALIDATE=1 ;;
        --out) need_arg "$@"; OUT=$2; shift ;;
        --multirail) need_arg "$@"; MR_BIN=$2; shift ;;
        --no-build) BUILD=0 ;;
        *) usage_error "unknown option: $1" ;;
    esac
    shift
done

is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
read -r -a RANK_LIST <<<"${RANKS//,/ }"
[[ ${#RANK_LIST[@]} -gt 0 ]] || usage_error "--ranks: give at least one rank count"
for n in "${RANK_LIST[@]}"; do
    if ! is_count "$n" || [[ $n -lt 2 || $((n % 2)) -ne 0 ]]; then
        usage_error "--ranks: $n is not an even count >= 2"
    fi
done
is_count "$TIMEOUT" || usage_error "--timeout: seconds, a count >= 1"
is_count "$ITERS" || usage_error "--iterations: a count >= 1"
[[ $WARMUP =~ ^[0-9]+$ ]] || usage_error "--warmup: a count >= 0"
read -r -a ENGINE_LIST <<<"${ENGINES//,/ }"
for e in "${ENGINE_LIST[@]}"; do
    case $e in polled | threaded) ;; *) usage_error "--engines: unknown engine $e (polled, threaded)" ;; esac
done
[[ ${#ENGINE_LIST[@]} -gt 0 || $MPI -eq 1 ]] || usage_error "nothing to run: no --engines and --no-mpi"

# ------------------------------------------------------------------ tools
need_cmd() { # CMD PACKAGE
    command -v "$1" >/dev/null 2>&1 || die "$1 not found: install $2 (apt-get install -y $2)"
}
need_cmd timeout coreutils
need_cmd ss iproute2
need_cmd python3 python3
need_cmd awk gawk
if [[ $MPI -eq 1 ]]; then
    need_cmd mpirun openmpi-bin
    [[ $BUILD -eq 0 ]] || need_cmd mpicc libopenmpi-dev
    [[ $BUILD -eq 0 ]] || need_cmd make make
fi
[[ -r $SAMPLER ]] || die "$SAMPLER missing"

if [[ -z $OUT ]]; then
    OUT=$BENCH_DIR/results/$(date +%Y-%m-%d_%H%M%S)-scaling
fi
if [[ -e $OUT/scaling.tsv ]]; then
    die "$OUT already holds results; choose another --out"
fi
mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/raw
TSV=$OUT/scaling.tsv
CMDLOG=$OUT/commands.log
: >"$CMDLOG"

cmdlog() {
    local a line
    line=$(date +%H:%M:%S)
    for a in "$@"; do
        if [[ $a =~ ^[A-Za-z0-9_./:,=@%+-]+$ ]]; then line+=" $a"; else line+=" $(printf '%q' "$a")"; fi
    done
    printf '%s\n' "$line" >>"$CMDLOG"
}

# ------------------------------------------------------------------ cleanup
# The job being measured runs under `timeout` (its own process group) and
# the sampler beside it; on exit or Ctrl-C both are stopped. The sampler
# stops what is left of a job once `timeout` has exited.
RUN_PID=
SAMPLER_PID=
cleanup() {
    local rc=$?
    if [[ -n $RUN_PID ]]; then
        kill -TERM "$RUN_PID" 2>/dev/null || true # timeout passes it on to the job
        wait "$RUN_PID" 2>/dev/null || true       # at most KILL_AFTER s later
    fi
    if [[ -n $SAMPLER_PID ]]; then
        wait "$SAMPLER_PID" 2>/dev/null || true # stops the job's leftovers, then exits
    fi
    if [[ $rc -ne 0 && $rc -ne 1 ]]; then
        log "stopped with status $rc; partial results in $OUT"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ builds
build_all() {
    if [[ ${#ENGINE_LIST[@]} -gt 0 ]]; then
        build_multirail "$BUILD" "$MR_BIN"
    fi
    if [[ $MPI -eq 1 ]]; then
        if [[ $BUILD -eq 1 ]]; then
            build_mpi_programs
        fi
        [[ -x $MPI_DIR/mr_mbw_mr ]] || die "bench/mpi/mr_mbw_mr missing: run 'make -C bench/mpi' (or drop --no-build)"
    fi
}

# ------------------------------------------------------------------ one job
established() { ss -tanH state established 2>/dev/null | wc -l; }
FAILURES=0
# Result of the last job, for the table: RES[tool,n] = cell text.
declare -A RES=()
TSV_HEADER="ranks	tool	engine	iterations	warmup	validate	wall_s	exit_status	status	timed_out	rail_down	suspect	conn_before	conn_peak	conn_peak_delta	rss_rank_peak_mib	rss_ranks_total_peak_mib	launcher_rss_peak_mib	ranks_seen	ranks_peak	threads_peak	leftover_processes	samples	msg_rate	first_error	command"

kib_to_mib() { awk -v k="${1:-0}" 'BEGIN { printf "%.1f", k / 1024 }'; }

run_job() { # TOOL(multirail|ompi) ENGINE(polled|threaded|-) N
    local tool=$1 engine=$2 n=$3 tag names cmd=() base t0 t1 rc=0 wall status timed_out=0
    local down=- suspect=- msg err line key val
    local -A S=()
    if [[ $tool == multirail ]]; then
        tag=n$n-multirail-$engine
        names=multirail
        cmd=("$MR" bench mbw_mr --pairs $((n / 2)) --sizes 8 --iterations "$ITERS" --warmup "$WARMUP"
            --progress "$engine")
        [[ $VALIDATE -eq 0 ]] || cmd+=(--validate)
    else
        tag=n$n-ompi
        names=mr_mbw_mr
        cmd=(mpirun --allow-run-as-root --oversubscribe --mca btl "self,tcp" -np "$n"
            "$MPI_DIR/mr_mbw_mr" -p $((n / 2)) -s 8 -i "$ITERS" -w "$WARMUP" -W "$WINDOW" -q)
        [[ $VALIDATE -eq 0 ]] || cmd+=(-c)
    fi
    # The sampler starts first (Python takes a moment) and is told the job's
    # pid through a file as soon as the job runs.
    local pidfile=$RAW/$tag.pid ready=$RAW/$tag.sampler-ready i
    rm -f "$pidfile" "$ready"
    timeout $((TIMEOUT + KILL_AFTER + 120)) python3 "$SAMPLER" --root-from "$pidfile" --ready "$ready" \
        --names "$names" --interval 0.1 >"$RAW/$tag.samples" 2>>"$RAW/sampler.log" &
    SAMPLER_PID=$!
    for ((i = 0; i < 1000; i++)); do
        [[ ! -e $ready ]] || break
        sleep 0.01
    done
    [[ -e $ready ]] || log "warning: the sampler of $tag did not start within 10 s; its samples will be late"
    base=$(established)
    cmdlog timeout --kill-after="$KILL_AFTER" "$TIMEOUT" "${cmd[@]}"
    t0=$(date +%s.%N)
    timeout --kill-after="$KILL_AFTER" "$TIMEOUT" "${cmd[@]}" >"$RAW/$tag.stdout" 2>"$RAW/$tag.stderr" &
    RUN_PID=$!
    echo "$RUN_PID" >"$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
    wait "$RUN_PID" || rc=$?
    t1=$(date +%s.%N)
    RUN_PID=
    wait "$SAMPLER_PID" || log "warning: the sampler of $tag failed (see raw/sampler.log)"
    SAMPLER_PID=
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    while IFS=$'\t' read -r key val; do S[$key]=$val; done <"$RAW/$tag.samples"

    if [[ $rc -eq 124 || ($rc -eq 137 && ${wall%.*} -ge $TIMEOUT) ]]; then
        timed_out=1
        status=timeout
    elif [[ $rc -eq 0 ]]; then
        status=ok
    else
        status="exit $rc"
    fi
    if [[ $tool == multirail ]]; then
        down=$(grep -c "rail down" "$RAW/$tag.stderr" || true)
        suspect=$(grep -c "suspect" "$RAW/$tag.stderr" || true)
    fi
    msg=$(awk '$1 == 8 && NF >= 3 { v = $3 } END { print v }' "$RAW/$tag.stdout")
    err=$(grep -m1 -iE 'error|panic|fatal|abort' "$RAW/$tag.stderr" | tr '\t' ' ' | cut -c1-200 || true)
    local conn_peak=${S[established_peak]:-} delta=-
    [[ -n $conn_peak ]] && delta=$((conn_peak - base))

    printf '%s\n' "$n	$tool	$engine	$ITERS	$WARMUP	$VALIDATE	$wall	$rc	$status	$timed_out	$down	$suspect	$base	${conn_peak:--}	$delta	$(kib_to_mib "${S[rss_peak_kib]:-0}")	$(kib_to_mib "${S[rss_total_peak_kib]:-0}")	$(kib_to_mib "${S[launcher_rss_peak_kib]:-0}")	${S[ranks_seen]:--}	${S[ranks_peak]:--}	${S[threads_peak]:--}	${S[leftover]:--}	${S[samples]:--}	${msg:--}	${err:--}	${cmd[*]}" >>"$TSV"

    local cell
    case $status in
        ok) cell="$wall s" ;;
        timeout) cell="timeout (>$TIMEOUT s)" ;;
        *) cell="$status after $wall s" ;;
    esac
    if [[ $tool == multirail && ($down != 0 || $suspect != 0) ]]; then
        cell+=" ($down rail down, $suspect suspect)"
    fi
    RES[$tool-$engine,$n]=$cell
    [[ $status == ok ]] || FAILURES=$((FAILURES + 1))

    if [[ $tool == multirail ]]; then line="N=$n multirail $engine"; else line="N=$n Open MPI"; fi
    line+=": $status, wall $wall s"
    [[ $tool != multirail ]] || line+=", rail down $down, suspect $suspect"
    line+=", connections +$delta, peak RSS/rank $(kib_to_mib "${S[rss_peak_kib]:-0}") MiB"
    line+=" (ranks seen ${S[ranks_seen]:--}), msg/s ${msg:--}"
    [[ ${S[leftover]:-0} == 0 ]] || line+=", ${S[leftover]} leftover process(es) stopped (${S[leftover_names]:-})"
    log "  $line"
    [[ -z $err || $status == ok ]] || log "    first error line: $err"
}

# ------------------------------------------------------------------ report
write_table() {
    local n e hdr sep row
    hdr="| ranks |" sep="|---:|"
    for e in "${ENGINE_LIST[@]}"; do hdr+=" multirail $e |"; sep+="---:|"; done
    [[ $MPI -eq 0 ]] || { hdr+=" Open MPI |"; sep+="---:|"; }
    {
        echo "Wall time of the whole job: mbw_mr, N ranks on this machine, N/2 pairs, 8 B,"
        echo "$ITERS windows of $WINDOW after $WARMUP warm-up$([[ $VALIDATE -eq 0 ]] || echo ", validated"); per-job timeout $TIMEOUT s."
        echo
        echo "$hdr"
        echo "$sep"
        for n in "${RANK_LIST[@]}"; do
            row="| $n |"
            for e in "${ENGINE_LIST[@]}"; do row+=" ${RES[multirail-$e,$n]:--} |"; done
            [[ $MPI -eq 0 ]] || row+=" ${RES[ompi--,$n]:--} |"
            echo "$row"
        done
        echo
        echo "Every job:"
        echo
        awk -F'\t' '
            NR == 1 { next }
            { printf "  N=%-4s %-9s %-8s %-8s wall %8s s  rail down %-3s suspect %-3s conns +%-5s RSS/rank %6s MiB  total %8s MiB  ranks %-4s threads %-5s msg/s %s\n",
                $1, $2, $3, $9, $7, $11, $12, $15, $16, $17, $19, $21, $24 }' "$TSV"
        echo
        echo "conns: peak ESTABLISHED TCP sockets during the job minus before it (a loopback"
        echo "connection counts twice). RSS/rank: peak VmRSS of one rank; total: peak sum over ranks."
    } >"$OUT/table.md"
    cp "$OUT/table.md" "$OUT/table.txt"
    cat "$OUT/table.md"
}

write_meta() {
    local commit dirty
    commit=$(git -C "$REPO_DIR" rev-parse HEAD 2>/dev/null || echo unknown)
    dirty=$(git -C "$REPO_DIR" status --porcelain --untracked-files=no 2>/dev/null | head -n1)
    [[ -n $dirty ]] && commit+=" (+ uncommitted changes)"
    {
        printf 'date\t%s\n' "$(date -Is)"
        printf 'command\t%s\n' "$ARGV_TEXT"
        printf 'ranks\t%s\n' "${RANK_LIST[*]}"
        printf 'engines\t%s\n' "${ENGINE_LIST[*]:-}"
        printf 'openmpi_jobs\t%s\n' "$MPI"
        printf 'iterations\t%s\n' "$ITERS"
        printf 'warmup\t%s\n' "$WARMUP"
        printf 'validate\t%s\n' "$VALIDATE"
        printf 'timeout_s\t%s\n' "$TIMEOUT"
        printf 'kernel\t%s\n' "$(uname -srv)"
        printf 'cpu\t%s\n' "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
        printf 'cpus_online\t%s\n' "$(nproc)"
        printf 'memory_total\t%s\n' "$(awk '/^MemTotal/ {print $2 " kB"}' /proc/meminfo)"
        printf 'ulimit_nofile\t%s\n' "$(ulimit -n)"
        printf 'openmpi\t%s\n' "$( (ompi_info --version 2>/dev/null || true) | head -n1)"
        if [[ -n ${MR:-} ]]; then
            printf 'multirail\t%s\n' "$("$MR" --version 2>/dev/null || echo unknown)"
            printf 'multirail_binary\t%s (modified %s)\n' "$MR" "$(date -r "$MR" -Is 2>/dev/null || echo unknown)"
        fi
        printf 'multirail_commit\t%s\n' "$commit"
        printf 'loadavg_start\t%s\n' "$LOADAVG_START"
    } >"$OUT/meta.tsv"
}

# ------------------------------------------------------------------ main
main() {
    log "results in $OUT"
    LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
    if awk -v l="${LOADAVG_START%% *}" 'BEGIN { exit !(l >= 0.5) }'; then
        log "warning: load average $LOADAVG_START: other processes use the CPUs and will disturb the results"
    fi
    MR=
    build_all
    write_meta
    printf '%s\n' "$TSV_HEADER" >"$TSV"
    local n e t_start
    t_start=$(date +%s)
    for n in "${RANK_LIST[@]}"; do
        log "N=$n ranks ($((n / 2)) pairs), load average $(cut -d' ' -f1-3 /proc/loadavg)"
        for e in "${ENGINE_LIST[@]}"; do
            run_job multirail "$e" "$n"
            sleep 1 # let the sockets of the last job close
        done
        if [[ $MPI -eq 1 ]]; then
            run_job ompi - "$n"
            sleep 1
        fi
    done
    {
        printf 'loadavg_end\t%s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
        printf 'total_seconds\t%s\n' $(($(date +%s) - t_start))
    } >>"$OUT/meta.tsv"
    echo
    write_table
    echo
    echo "Results: $OUT/{scaling.tsv,table.md,meta.tsv}"
    if [[ $FAILURES -gt 0 ]]; then
        log "$FAILURES job(s) did not finish in time with status 0"
        exit 1
    fi
    exit 0
}

main; exit "$?"
