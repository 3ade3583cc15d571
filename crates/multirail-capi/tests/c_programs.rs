//! The C test programs (tests/c/*.c) and the C example
//! (examples/c/pingpong.c), compiled with `cc` against
//! include/multirail.h and the static library cargo built beside this
//! test, then run as the ranks of a job on loopback (rank, size, meeting
//! point and key in the environment, as `multirail run` gives them).
//! Skipped with the reason where `cc` is missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// target/<profile>/deps, where this test runs from and where cargo
/// builds the library for it (`cargo test` does not copy it up to
/// target/<profile>, so the copy there may be stale).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

fn have_cc() -> bool {
    let ok = Command::new("cc").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping: no C compiler `cc` (apt-get install build-essential)");
    }
    ok
}

/// Compiles `src` into an executable, failing the test with the
/// compiler's message.
fn compile(src: &Path) -> PathBuf {
    let lib = lib_dir().join("libmultirail_c.a");
    assert!(lib.exists(), "{} was not built (crate-type staticlib)", lib.display());
    // Beside the test binary, not in /tmp: each program is ~40 MB (the
    // static library) and is rebuilt by the next run, not left behind.
    let out = lib_dir().join(format!("mr-c-{}", src.file_stem().unwrap().to_string_lossy()));
    let o = Command::new("cc")
        .args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(src)
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .output()
        .expect("run cc");
    assert!(o.status.success(), "cc {}: {}", src.display(), String::from_utf8_lossy(&o.stderr));
    out
}

fn free_port() -> u16 {
    multirail::free_root_port([127, 0, 0, 1].into()).unwrap()
}

/// Waits for every rank, killing all of them if one fails or the run
/// lasts longer than `limit`; returns their outputs.
fn wait_ranks(mut children: Vec<Child>, limit: Duration, what: &str) -> Vec<Output> {
    let end = Instant::now() + limit;
    loop {
        let mut all_done = true;
        for c in &mut children {
            match c.try_wait().expect("try_wait") {
                Some(st) if !st.success() => {
                    for k in &mut children {
                        let _ = k.kill();
                    }
                    all_done = true;
                    break;
                }
                Some(_) => {}
                None => all_done = false,
            }
        }
        if all_done {
            break;
        }
        if Instant::now() > end {
            for k in &mut children {
                let _ = k.kill();
            }
            panic!("{what}: the ranks did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children.into_iter().map(|c| c.wait_with_output().expect("output")).collect()
}

/// Runs `exe` as `n` ranks of one job, with `env` added; every rank must
/// exit 0. Returns rank 0's standard output.
fn run_job(exe: &Path, n: u32, args: &[&str], env: &[(&str, &str)]) -> String {
    let what = exe.display().to_string();
    // The root's port is found free and released before rank 0 binds it,
    // so another process may take it in between: in a CI run a parallel
    // test's outgoing connection did (rank 0: "cannot listen on
    // 127.0.0.1:45781 (MULTIRAIL_ROOT=...): Address already in use").
    // Ports now come from below the ephemeral range (free_root_port),
    // where outgoing connections do not take them; an explicit bind still
    // could, so that failure alone is retried, on a new port, at most twice.
    let mut outs = start_job(exe, n, args, env);
    for _ in 0..2 {
        let err = String::from_utf8_lossy(&outs[0].stderr);
        if outs[0].status.success() || !(err.contains("MULTIRAIL_ROOT") && err.contains("Address already in use")) {
            break;
        }
        eprintln!("{what}: the root's port was taken before rank 0 bound it; again on another");
        outs = start_job(exe, n, args, env);
    }
    let all: String = outs
        .iter()
        .enumerate()
        .map(|(r, o)| {
            format!(
                "\n--- rank {r} ({}):\n{}{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .collect();
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "{what}: rank {rank} failed:{all}");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!out.contains("expected"), "{what}: rank {rank}: {out}");
    }
    String::from_utf8_lossy(&outs[0].stdout).into_owned()
}

/// One attempt of [`run_job`]: `n` ranks on a fresh root port, waited for.
fn start_job(exe: &Path, n: u32, args: &[&str], env: &[(&str, &str)]) -> Vec<Output> {
    let root = format!("127.0.0.1:{}", free_port());
    let key = multirail::generate_key();
    let children: Vec<Child> = (0..n)
        .map(|rank| {
            let mut c = Command::new(exe);
            c.args(args)
                .env("MULTIRAIL_RANK", rank.to_string())
                .env("MULTIRAIL_SIZE", n.to_string())
                .env("MULTIRAIL_ROOT", &root)
                .env("MULTIRAIL_KEY", &key)
                .env("MULTIRAIL_RAILS", "tcp:127.0.0.1")
                .env_remove("MULTIRAIL_LAUNCHED")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn().expect("start a rank")
        })
        .collect();
    wait_ranks(children, Duration::from_secs(120), &exe.display().to_string())
}

fn program(name: &str) -> Option<PathBuf> {
    have_cc().then(|| compile(&crate_dir().join("tests/c").join(format!("{name}.c"))))
}

#[test]
fn c_errors_have_codes_and_messages() {
    let Some(exe) = program("errors") else { return };
    assert!(run_job(&exe, 2, &[], &[]).contains("errors: rank 0 ok"));
}

#[test]
fn c_truncation_is_reported_and_writes_nothing() {
    let Some(exe) = program("truncation") else { return };
    assert!(run_job(&exe, 2, &[], &[]).contains("truncation: rank 0 ok"));
}

#[test]
fn c_any_source_and_any_tag() {
    let Some(exe) = program("any_source") else { return };
    assert!(run_job(&exe, 3, &[], &[]).contains("any_source: rank 0 ok"));
}

#[test]
fn c_non_blocking_calls() {
    let Some(exe) = program("nonblocking") else { return };
    for (shm, rails) in [("off", "tcp:127.0.0.1"), ("auto", "tcp:127.0.0.1")] {
        let out = run_job(&exe, 2, &[], &[("MULTIRAIL_SHM", shm), ("MULTIRAIL_RAILS", rails)]);
        assert!(out.contains("nonblocking: rank 0 ok"), "MULTIRAIL_SHM={shm}: {out}");
    }
}

#[test]
fn c_memory_from_mr_alloc_and_lent_sends() {
    let Some(exe) = program("memory") else { return };
    assert!(run_job(&exe, 2, &[], &[]).contains("memory: rank 0 ok"));
}

/// Two rails given explicitly to mr_endpoint_create, no launcher.
#[test]
fn c_two_rails_with_an_explicit_endpoint() {
    let Some(exe) = program("two_rails") else { return };
    let root = format!("127.0.0.1:{}", free_port());
    let key = multirail::generate_key();
    let rails = "tcp:127.0.0.1,tcp:127.0.0.2";
    let children: Vec<Child> = (0..2)
        .map(|rank: u32| {
            Command::new(&exe)
                .args([rails, &rank.to_string(), &root, &key])
                .env("MULTIRAIL_SHM", "off")
                .env_remove("MULTIRAIL_RANK")
                .env_remove("MULTIRAIL_SIZE")
                .env_remove("MULTIRAIL_ROOT")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    for (rank, o) in wait_ranks(children, Duration::from_secs(120), "two_rails").iter().enumerate() {
        assert!(o.status.success(), "rank {rank}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).contains("ok"));
    }
}

/// The example: builds, runs, prints a latency and a bandwidth per size.
#[test]
fn c_pingpong_example_measures_each_size() {
    if !have_cc() {
        return;
    }
    let exe = compile(&crate_dir().join("../../examples/c/pingpong.c"));
    let out = run_job(&exe, 2, &["8,64K", "20"], &[]);
    for (test, size) in [("latency", "8"), ("bw", "8"), ("latency", "65536"), ("bw", "65536")] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{test} {size} ")))
            .unwrap_or_else(|| panic!("no {test} line for {size}: {out}"));
        let v: f64 = line.split(' ').nth(2).unwrap().parse().unwrap();
        assert!(v > 0.0 && v.is_finite(), "{line}");
    }
}

/// docs/c.md promises that one endpoint may be used from several threads.
#[test]
fn an_endpoint_may_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<multirail::Endpoint>();
}
