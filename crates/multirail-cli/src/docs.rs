//! `multirail completions SHELL` and `multirail man`: both are generated
//! from the command-line definitions in `cli.rs`, so they cannot drift
//! from what the parser accepts.

use std::io::Write;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::Cli;

/// Writes the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    // Into memory first: the generator panics when a write fails, and a
    // closed pipe (`| head`) is not worth a panic.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "multirail", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(())
}

/// The subcommands with a page of their own, and the page's name.
const PAGES: [(&str, &str); 5] = [
    ("info", "multirail-info"),
    ("bench", "multirail-bench"),
    ("testbed", "multirail-testbed"),
    ("run", "multirail-run"),
    ("model", "multirail-model"),
];

/// Writes the man page (section 1, roff) of `multirail`, or of one of its
/// subcommands (`multirail-bench`), to stdout.
pub fn man(sub: Option<&str>) -> anyhow::Result<()> {
    let top = Cli::command();
    let page = match sub {
        None => top,
        Some(name) => {
            let choices = || PAGES.map(|(n, _)| n).join(", ");
            let (sub, title) = PAGES
                .into_iter()
                .find(|(n, _)| *n == name)
                .with_context(|| format!("man {name}: no page for it (choose {})", choices()))?;
            let cmd = top.find_subcommand(sub).cloned().context("a listed subcommand exists")?;
            // The page is named as man expects (`multirail-bench(1)`).
            cmd.name(title).display_name(title).bin_name(title).version(env!("CARGO_PKG_VERSION"))
        }
    };
    let mut out = std::io::stdout().lock();
    clap_mangen::Man::new(page).render(&mut out)?;
    out.flush()?;
    Ok(())
}
