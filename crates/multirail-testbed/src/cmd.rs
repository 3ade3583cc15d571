//! Running `ip`, `tc` and `kill`: finding them, and turning a failed run
//! into an error that carries the command line and its stderr
//! ("`ip link add ...` failed: RTNETLINK answers: File exists").

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// The external programs the crate runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tool {
    Ip,
    Tc,
    Kill,
}

/// Directories searched after `PATH`: `sudo` and cron often leave the
/// `sbin` directories out of `PATH`, where `ip` and `tc` live.
const FALLBACK_DIRS: &[&str] = &["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

impl Tool {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Tool::Ip => "ip",
            Tool::Tc => "tc",
            Tool::Kill => "kill",
        }
    }

    fn package(self) -> &'static str {
        match self {
            Tool::Ip | Tool::Tc => "iproute2",
            Tool::Kill => "procps",
        }
    }

    /// Absolute path of the program, looked up once per process.
    pub(crate) fn path(self) -> Result<&'static Path> {
        static CACHE: [OnceLock<Option<PathBuf>>; 3] = [const { OnceLock::new() }; 3];
        let slot = &CACHE[self as usize];
        let found = slot.get_or_init(|| find_program(self.name(), std::env::var_os("PATH").as_deref()));
        found.as_deref().ok_or(Error::ToolMissing { tool: self.name(), package: self.package() })
    }

    /// A `Command` for this tool with stdin closed.
    pub(crate) fn command(self) -> Result<Command> {
        let mut cmd = Command::new(self.path()?);
        cmd.stdin(Stdio::null());
        Ok(cmd)
    }
}

/// Finds executable `name` in `path_var` (a `PATH` value), then in
/// [`FALLBACK_DIRS`].
pub(crate) fn find_program(name: &str, path_var: Option<&OsStr>) -> Option<PathBuf> {
    let from_path = path_var.map(|p| std::env::split_paths(p).collect::<Vec<_>>()).unwrap_or_default();
    let fallback = FALLBACK_DIRS.iter().map(PathBuf::from);
    from_path.into_iter().chain(fallback).map(|dir| dir.join(name)).find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The command line for messages: program file name, then the arguments.
pub(crate) fn render(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program()).file_name().unwrap_or(cmd.get_program());
    let mut words = vec![quote(program)];
    words.extend(cmd.get_args().map(quote));
    words.join(" ")
}

fn quote(word: &OsStr) -> String {
    let text = word.to_string_lossy();
    let plain = !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c));
    if plain { text.into_owned() } else { format!("'{}'", text.replace('\'', r"'\''")) }
}

/// Runs `cmd` to completion and returns its stdout, or an error with its
/// stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let output = output(cmd)?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `cmd` to completion; a non-zero exit becomes [`Error::CommandFailed`].
pub(crate) fn output(cmd: &mut Command) -> Result<Output> {
    let command = render(cmd);
    let output = cmd.output().map_err(|source| Error::Spawn { command: command.clone(), source })?;
    if output.status.success() {
        return Ok(output);
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    let stderr = if stderr.is_empty() { String::from_utf8_lossy(&output.stdout).trim().to_owned() } else { stderr };
    Err(Error::CommandFailed { command, code: output.status.code(), stderr })
}

/// `ip [-n NETNS] ARGS...`.
pub(crate) fn ip(netns: Option<&str>, args: &[&str]) -> Result<String> {
    run(&mut in_netns(Tool::Ip, netns, args)?)
}

/// `tc [-n NETNS] ARGS...`.
pub(crate) fn tc(netns: Option<&str>, args: &[&str]) -> Result<String> {
    run(&mut in_netns(Tool::Tc, netns, args)?)
}

/// `ip -j [-n NETNS] ARGS...`, parsed. Empty output counts as `[]` (older
/// iproute2 prints nothing for an empty `netns list`).
pub(crate) fn ip_json<T: DeserializeOwned>(netns: Option<&str>, args: &[&str]) -> Result<T> {
    json(Tool::Ip, netns, args)
}

/// `tc -j [-n NETNS] ARGS...`, parsed.
pub(crate) fn tc_json<T: DeserializeOwned>(netns: Option<&str>, args: &[&str]) -> Result<T> {
    json(Tool::Tc, netns, args)
}

fn json<T: DeserializeOwned>(tool: Tool, netns: Option<&str>, args: &[&str]) -> Result<T> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let mut cmd = in_netns(tool, netns, &full)?;
    let stdout = run(&mut cmd)?;
    let text = if stdout.trim().is_empty() { "[]" } else { stdout.as_str() };
    serde_json::from_str(text).map_err(|e| Error::BadOutput { command: render(&cmd), reason: e.to_string() })
}

fn in_netns(tool: Tool, netns: Option<&str>, args: &[&str]) -> Result<Command> {
    let mut cmd = tool.command()?;
    if let Some(netns) = netns {
        cmd.args(["-n", netns]);
    }
    cmd.args(args);
    Ok(cmd)
}

/// `ip netns exec NETNS ARGV...` as a full argument vector, program first.
pub(crate) fn netns_exec_argv<S: AsRef<OsStr>>(netns: &str, argv: &[S]) -> Result<Vec<OsString>> {
    let mut full: Vec<OsString> = vec![Tool::Ip.path()?.into(), "netns".into(), "exec".into(), netns.into()];
    full.extend(argv.iter().map(|a| a.as_ref().to_owned()));
    Ok(full)
}

/// Runs `ARGV` inside `netns`, capturing its output.
pub(crate) fn run_in_netns<S: AsRef<OsStr>>(netns: &str, argv: &[S]) -> Result<String> {
    let full = netns_exec_argv(netns, argv)?;
    // `full` starts with the path of `ip`, so index 0 exists.
    let mut cmd = Command::new(&full[0]);
    cmd.args(&full[1..]).stdin(Stdio::null());
    run(&mut cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_with_program_name_and_quotes() {
        let mut cmd = Command::new("/usr/sbin/ip");
        cmd.args(["-n", "mr-host0", "addr", "add", "10.77.0.1/24", "dev", "rail0"]);
        assert_eq!(render(&cmd), "ip -n mr-host0 addr add 10.77.0.1/24 dev rail0");
        let mut sh = Command::new("sh");
        sh.args(["-c", "echo 'x' > y"]);
        assert_eq!(render(&sh), r"sh -c 'echo '\''x'\'' > y'");
    }

    #[test]
    fn finds_programs_on_path_or_in_sbin() {
        let sh = find_program("sh", Some(OsStr::new("/nonexistent")));
        assert!(sh.is_some(), "sh is in /bin or /usr/bin");
        assert_eq!(find_program("no-such-program-mr", Some(OsStr::new("/bin"))), None);
    }

    #[test]
    fn failed_command_error_has_stderr() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo 'RTNETLINK answers: File exists' >&2; exit 2"]);
        let err = run(&mut cmd).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("`sh -c"), "{text}");
        assert!(text.ends_with("failed: RTNETLINK answers: File exists"), "{text}");
        assert!(matches!(err, Error::CommandFailed { code: Some(2), .. }));
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let err = run(&mut Command::new("/nonexistent/mr-tool")).unwrap_err();
        assert!(err.to_string().starts_with("could not run `mr-tool`"), "{err}");
    }

    #[test]
    fn tool_missing_message() {
        let err = Error::ToolMissing { tool: Tool::Tc.name(), package: Tool::Tc.package() };
        assert_eq!(err.to_string(), "`tc` not found: install iproute2");
    }
}
