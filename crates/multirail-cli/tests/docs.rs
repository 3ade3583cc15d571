//! What the command says about itself: `--help` (defaults, exit status,
//! a description for every option), shell completions, the man page, and
//! the README's and `--help`'s command examples, which must parse.

use std::process::Command;

use clap::{CommandFactory, Parser};

// The command-line definitions themselves, to parse examples without
// running them (cli.rs depends on clap, multirail's defaults and the
// placement types only).
#[allow(dead_code)]
#[path = "../src/cli.rs"]
mod cli;
#[allow(dead_code)]
#[path = "../src/placement.rs"]
mod placement;

fn multirail(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_multirail")).args(args).output().expect("multirail runs");
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).expect("UTF-8")
}

/// Splits a shell command line into words (single and double quotes,
/// no expansions: the examples need none).
fn words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quote, mut started) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (None, '\'' | '"') => (quote, started) = (Some(c), true),
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if started {
                    out.push(std::mem::take(&mut cur));
                }
                started = false;
            }
            (_, c) => (cur, started) = (cur + &c.to_string(), true),
        }
    }
    assert!(quote.is_none(), "unbalanced quote in {line}");
    if started {
        out.push(cur);
    }
    out
}

/// A `multirail ...` example without `sudo`, its comment, the description
/// written beside it (three or more spaces away) or what the shell does
/// with its output.
fn command_of(line: &str) -> Option<&str> {
    let l = line.trim();
    let l = l.strip_prefix("sudo ").unwrap_or(l);
    if !l.starts_with("multirail ") {
        return None;
    }
    // Up to the description, comment, redirection or next command.
    let end = ["   ", " # ", " > ", " | ", " && ", " ; "].iter().filter_map(|m| l.find(m)).min().unwrap_or(l.len());
    Some(l[..end].trim())
}

/// Parses one example as the binary would (`--compare` values attached
/// first), and the `multirail` command a `run` example starts.
fn parses(example: &str) -> Result<(), String> {
    let argv = words(example);
    let parsed = cli::Cli::try_parse_from(cli::split_compare(argv.iter().map(Into::into)))
        .map_err(|e| format!("`{example}`: {e}"))?;
    if let cli::Command::Run(r) = parsed.command
        && r.cmd[0] == "multirail"
    {
        return parses(&r.cmd.join(" "));
    }
    Ok(())
}

#[test]
fn every_readme_example_parses() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let mut in_code = false;
    let mut examples = Vec::new();
    for line in readme.lines() {
        // Shell blocks (```sh) hold commands; others hold diagrams and code.
        if line.trim_start().starts_with("```") {
            in_code = !in_code && line.trim_start() == "```sh";
        } else if in_code {
            examples.extend(command_of(line));
        }
    }
    assert!(examples.len() >= 12, "found the examples: {examples:?}");
    let bad: Vec<String> = examples.iter().filter_map(|e| parses(e).err()).collect();
    assert!(bad.is_empty(), "README examples that do not parse:\n{}", bad.join("\n"));
}

#[test]
fn every_help_example_parses() {
    let top = cli::Cli::command();
    let mut texts = vec![top.get_long_about().map(|s| s.to_string()).unwrap_or_default()];
    texts.extend(top.get_subcommands().filter_map(|c| c.get_long_about().map(|s| s.to_string())));
    let examples: Vec<&str> =
        texts.iter().flat_map(|t| t.lines()).filter(|l| l.starts_with("  ")).filter_map(command_of).collect();
    assert!(examples.len() >= 15, "found the examples: {examples:?}");
    let bad: Vec<String> = examples.iter().filter_map(|e| parses(e).err()).collect();
    assert!(bad.is_empty(), "--help examples that do not parse:\n{}", bad.join("\n"));
}

#[test]
fn every_option_has_a_description() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if a.get_help().is_none() && a.get_long_help().is_none() {
                missing.push(format!("{path} {}", a.get_id()));
            }
        }
        for s in cmd.get_subcommands() {
            if s.get_about().is_none() {
                missing.push(format!("{path} {}", s.get_name()));
            }
            walk(s, &format!("{path} {}", s.get_name()), missing);
        }
    }
    let mut missing = Vec::new();
    walk(&cli::Cli::command(), "multirail", &mut missing);
    assert!(missing.is_empty(), "without a description: {missing:?}");
}

#[test]
fn help_shows_defaults_exit_status_and_env_assignments() {
    let h = multirail(&["bench", "--help"]);
    for d in ["[default: tcp:127.0.0.1,tcp:127.0.0.2]", "[default: 16K:spread,*:adaptive]", "[default: polled]"] {
        assert!(h.contains(d), "bench --help shows {d}: {h}");
    }
    assert_eq!(h.matches("[default: 256K]").count(), 2, "eager limit and chunk: {h}");
    assert!(h.contains("env:NAME=VALUE"), "{h}");
    let h = multirail(&["--help"]);
    assert!(h.contains("Exit status:") && h.contains("killed by a signal"), "{h}");
    assert!(!h.contains("--rails tcp:127.0.0.1 --compare"), "compares policies on the default two rails: {h}");
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [("bash", "_multirail()"), ("zsh", "#compdef multirail"), ("fish", "complete -c multirail")]
    {
        let script = multirail(&["completions", shell]);
        assert!(script.contains(marker) && script.contains("--compare"), "{shell}: {script}");
    }
}

#[test]
fn man_pages_render() {
    let page = multirail(&["man"]);
    assert!(page.lines().any(|l| l.starts_with(".TH multirail 1")), "{page}");
    assert!(page.contains("Exit status"), "{page}");
    let page = multirail(&["man", "bench"]);
    assert!(page.lines().any(|l| l.starts_with(".TH multirail-bench 1")) && page.contains("\\-\\-compare"), "{page}");
}
