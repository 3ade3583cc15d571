# bench/lib/build.sh - sourced by bench/compare.sh and bench/scaling.sh:
# find or build the multirail binary and the MPI programs they run. The
# caller defines log, cmdlog and die, and the variables REPO_DIR, MPI_DIR
# and RAW (where build logs go).
# shellcheck shell=bash

# Sets MR to the multirail binary: PATH_OR_NAME if given (a --multirail
# option), else target/release/multirail, built first when BUILD is 1.
# Usage: build_multirail BUILD [PATH_OR_NAME]
build_multirail() {
    local build=$1 bin=${2:-}
    if [[ -n $bin ]]; then
        MR=$(command -v "$bin" || true)
        [[ -n $MR && -x $MR ]] || die "--multirail $bin: not an executable"
        return 0
    fi
    MR=${CARGO_TARGET_DIR:-$REPO_DIR/target}/release/multirail
    if [[ $build -eq 1 ]]; then
        local cargo
        cargo=$(command -v cargo || true)
        [[ -z $cargo && -x ${HOME:-/root}/.cargo/bin/cargo ]] && cargo=${HOME:-/root}/.cargo/bin/cargo
        [[ -n $cargo ]] || die "cargo not found: install Rust (https://rustup.rs), or pass --multirail PATH (or --no-build with target/release/multirail built)"
        log "building multirail (cargo build --release -p multirail-cli)"
        cmdlog "$cargo" build --release -p multirail-cli
        (cd "$REPO_DIR" && "$cargo" build --release -p multirail-cli) >"$RAW/build-cargo.log" 2>&1 ||
            { tail -n 20 "$RAW/build-cargo.log" >&2; die "cargo build failed; see $RAW/build-cargo.log"; }
    fi
    [[ -x $MR ]] || die "$MR not found: build it (cargo build --release -p multirail-cli) or pass --multirail PATH"
}

# Builds bench/mpi with make (mpicc).
build_mpi_programs() {
    log "building bench/mpi (mpicc)"
    cmdlog make -C "$MPI_DIR"
    make -C "$MPI_DIR" >"$RAW/build-mpi.log" 2>&1 ||
        { tail -n 20 "$RAW/build-mpi.log" >&2; die "building the MPI programs failed; see $RAW/build-mpi.log"; }
}
