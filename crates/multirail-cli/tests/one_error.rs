//! One error, printed once, by the process the user started: the local
//! launcher (`bench`, `run`) checks rails and `--fail-rail` before any
//! rank starts, and when ranks fail it prints the first rank's error
//! alone, naming the rank, instead of one per rank interleaved.

use std::process::Command;

fn multirail(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multirail"));
    c.args(args)
        .env_remove("MULTIRAIL_RAILS")
        .env_remove("MULTIRAIL_LAUNCHED")
        .env_remove("MULTIRAIL_RANK")
        .env_remove("MULTIRAIL_ROOT")
        .env("MULTIRAIL_SETUP_TIMEOUT", "30");
    c
}

/// stderr of a run that must exit 2, with `needle` in it exactly once and
/// one `multirail: error:` line.
fn one_error(c: &mut Command, needle: &str) -> String {
    let o = c.output().expect("multirail runs");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.matches(needle).count(), 1, "'{needle}' once: {err}");
    assert_eq!(err.matches("multirail: error:").count(), 1, "one error: {err}");
    err
}

#[test]
fn an_address_not_of_this_host_is_one_error_naming_rails() {
    let err = one_error(&mut multirail(&["bench", "latency", "--rails", "tcp:10.9.9.9"]), "cannot listen on 10.9.9.9");
    assert!(err.contains("--rails tcp:10.9.9.9: rail 0 (tcp:10.9.9.9)"), "{err}");
    assert!(!err.contains("rank "), "said before any rank started: {err}");
    let mut c = multirail(&["bench", "latency"]);
    c.env("MULTIRAIL_RAILS", "tcp:127.0.0.1,tcp:10.9.9.9");
    let err = one_error(&mut c, "cannot listen on 10.9.9.9");
    assert!(err.contains("MULTIRAIL_RAILS=tcp:127.0.0.1,tcp:10.9.9.9: rail 1"), "{err}");
    let mut c = multirail(&["run", "-n", "2", "--", "true"]);
    c.env("MULTIRAIL_RAILS", "tcp:10.9.9.9");
    one_error(&mut c, "MULTIRAIL_RAILS=tcp:10.9.9.9: rail 0 (tcp:10.9.9.9): cannot listen on 10.9.9.9");
}

#[test]
fn an_interface_that_does_not_exist_is_one_error() {
    let err = one_error(&mut multirail(&["bench", "bw", "--rails", "tcp:nosuch0"]), "no interface named 'nosuch0'");
    assert!(err.contains("--rails tcp:nosuch0"), "{err}");
}

#[test]
fn a_bad_fail_rail_is_one_error_naming_the_flag() {
    let err = one_error(&mut multirail(&["bench", "bw", "--fail-rail", "1@1s:for=abc"]), "'abc'");
    assert!(err.contains("--fail-rail 1@1s:for=abc") && err.contains("give a unit (ms or s)"), "{err}");
    one_error(&mut multirail(&["bench", "bw", "--fail-rail", "5@1s"]), "--fail-rail 5@...: there are only 2 rails");
    one_error(&mut multirail(&["bench", "bw", "--fail-rail", "1@1s:side=host1"]), "sides exist only in a testbed");
}

/// Both ranks fail (rank 1 has another rail count): the user reads one
/// error, the first, naming its rank.
#[test]
fn ranks_that_fail_give_one_error_naming_the_rank() {
    let me = env!("CARGO_BIN_EXE_multirail");
    let script = format!(
        r#"if [ "$MULTIRAIL_RANK" = 1 ]; then export MULTIRAIL_RAILS=tcp:127.0.0.1; fi; exec "{me}" bench latency --sizes 8 --iterations 3"#
    );
    let err =
        one_error(&mut multirail(&["run", "-n", "2", "--", "sh", "-c", &script]), "every rank needs the same number");
    assert!(err.contains("multirail: error: rank "), "{err}");
}
