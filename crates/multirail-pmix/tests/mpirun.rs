//! Runs the `multirail-pmix-exchange` helper as 4 ranks under Open MPI's
//! `mpirun` and checks that every rank saw every other rank's values.
//!
//! The helper is a `[[bin]]` of this package (not an example) so that cargo
//! builds it before this test and passes its path as
//! `CARGO_BIN_EXE_multirail-pmix-exchange`. Skips (and passes) when `mpirun`
//! is absent or is not Open MPI, when the ranks cannot load libpmix, or when
//! this test itself already runs inside a PMIx job.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);
const RANKS: u32 = 4;

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(name)).find(|p| p.is_file())
}

fn is_open_mpi(mpirun: &PathBuf) -> bool {
    Command::new(mpirun)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"))
        .unwrap_or(false)
}

fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

#[test]
fn four_ranks_exchange_through_pmix() {
    if std::env::var_os("PMIX_RANK").is_some() || std::env::var_os("PMIX_NAMESPACE").is_some() {
        println!("skipping: already inside a PMIx job");
        return;
    }
    let Some(mpirun) = find_in_path("mpirun") else {
        println!("skipping: mpirun not found");
        return;
    };
    if !is_open_mpi(&mpirun) {
        println!("skipping: {} is not Open MPI's mpirun", mpirun.display());
        return;
    }

    let exe = env!("CARGO_BIN_EXE_multirail-pmix-exchange");
    let mut child = Command::new(&mpirun)
        .args(["--allow-run-as-root", "--oversubscribe", "-np", &RANKS.to_string(), exe])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group, so a hung job can be killed whole (mpirun and
        // the ranks it started) without touching the test harness.
        .process_group(0)
        .spawn()
        .expect("spawn mpirun");
    let out = read_all(child.stdout.take().expect("piped stdout"));
    let err = read_all(child.stderr.take().expect("piped stderr"));

    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for mpirun") {
            break Some(status);
        }
        if start.elapsed() > TIMEOUT {
            let pgid = i32::try_from(child.id()).expect("pid fits in i32");
            // SAFETY: kill(2) with a negative pid signals the process group
            // we created for mpirun above; it touches no memory of ours.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out.join().expect("stdout reader");
    let stderr = err.join().expect("stderr reader");
    let report = format!("--- stdout\n{stdout}--- stderr\n{stderr}");
    let Some(status) = status else {
        panic!("mpirun did not finish within {TIMEOUT:?}; killed\n{report}");
    };
    if !status.success() && stderr.contains("libpmix not loadable") {
        // Open MPI built with its internal PMIx ships no loadable libpmix;
        // failing cleanly there is the library's documented behaviour.
        println!("skipping: mpirun works but libpmix is not loadable here\n{report}");
        return;
    }
    assert!(status.success(), "mpirun failed: {status}\n{report}");

    let mut ranks: Vec<u32> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ok rank "))
        .map(|rest| {
            let (r, n) = rest.split_once(" of ").unwrap_or_else(|| panic!("malformed line {rest:?}\n{report}"));
            assert_eq!(n.trim(), RANKS.to_string(), "job size\n{report}");
            r.parse().unwrap_or_else(|_| panic!("bad rank in {rest:?}\n{report}"))
        })
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..RANKS).collect::<Vec<_>>(), "one ok line per rank expected\n{report}");
    println!("{stdout}");
}
