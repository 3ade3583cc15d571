//! Running this same binary as a child (`multirail bench ... --json`,
//! `multirail testbed up ...`) and reading what it printed: how `bench cbr`
//! and `report` run their suites.

use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use multirail_perf::report::json::JsonRecord;

/// What a child printed, and how it ended.
pub struct Finished {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// The command line as a user would type it: `multirail bench bw --json`
/// (arguments with spaces or shell characters quoted).
pub fn shown(argv: &[String]) -> String {
    let quote = |a: &String| {
        let plain = !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_.,:/=@+%".contains(c));
        if plain { a.clone() } else { format!("'{}'", a.replace('\'', r"'\''")) }
    };
    std::iter::once("multirail".to_string()).chain(argv.iter().map(quote)).collect::<Vec<_>>().join(" ")
}

/// Runs `multirail ARGV` to the end, output captured, with variables
/// `env` set for it. Variables that would make the child a rank of our
/// own job are removed.
pub fn run_env(argv: &[String], env: &[(String, String)]) -> anyhow::Result<Finished> {
    let exe = std::env::current_exe().context("cannot find the multirail executable")?;
    let out = Command::new(exe)
        .args(argv)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove(crate::launch::LAUNCHED)
        .env_remove("MULTIRAIL_RANK")
        .env_remove("MULTIRAIL_SIZE")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{}`", shown(argv)))?;
    Ok(Finished {
        code: crate::launch::exit_code(out.status),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs `multirail ARGV` with variables `env` set; it must succeed.
/// Returns its stdout.
pub fn checked_env(argv: &[String], env: &[(String, String)]) -> anyhow::Result<String> {
    let f = run_env(argv, env)?;
    if f.code != 0 {
        let tail: Vec<&str> = f.stderr.lines().rev().take(6).collect::<Vec<_>>().into_iter().rev().collect();
        let vars: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        bail!("`{vars}{}` failed (exit {}): {}", shown(argv), f.code, tail.join(" / "));
    }
    Ok(f.stdout)
}

/// The JSON records among `stdout`'s lines (others are ignored).
pub fn records(stdout: &str) -> anyhow::Result<Vec<JsonRecord>> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<JsonRecord>(l).with_context(|| format!("reading a JSON record: {l}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_are_quoted_for_a_shell() {
        let argv: Vec<String> =
            ["bench", "bw", "--policy", "8K:single,*:stripe", "--rails", "tcp:127.0.0.1"].map(String::from).to_vec();
        assert_eq!(shown(&argv), "multirail bench bw --policy '8K:single,*:stripe' --rails tcp:127.0.0.1");
        assert_eq!(shown(&["it's".to_string()]), r"multirail 'it'\''s'");
    }
}
