//! The `multirail` command. `main` only parses, dispatches and turns
//! errors into exit codes; each command lives in its own module.

// One `unsafe` block: setting an environment variable before any thread
// exists (`prefer_rxm_env`).
#![deny(unsafe_code)]

mod bench;
mod child;
mod cli;
mod docs;
mod info;
mod launch;
mod model;
mod placement;
mod report;
mod run;
mod testbed;

fn main() {
    #[cfg(feature = "ofi")]
    prefer_rxm_env();
    // A crash is reported as one (see the function), not as exit status 1.
    #[cfg(feature = "ofi")]
    multirail_transport::ofi::default_crash_signals();
    let cli = cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    let result = match cli.command {
        cli::Command::Info { json } => info::run(json).map(|()| 0),
        cli::Command::Bench(args) => bench::run(*args),
        cli::Command::Testbed { command } => testbed::run(command),
        cli::Command::Run(args) => run::run(args),
        cli::Command::Model(args) => model::run(&args).map(|()| 0),
        cli::Command::Report(args) => report::run(&args),
        cli::Command::Completions { shell } => docs::completions(shell).map(|()| 0),
        cli::Command::Man { command } => docs::man(command.as_deref()).map(|()| 0),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            if launch::is_broken_pipe(&e) {
                std::process::exit(0);
            }
            // A rank of a local launch tells the launcher, which prints
            // one error for the job (unless the rank told it already).
            let message = format!("{e:#}");
            if !launch::report_to_launcher(&message) {
                eprintln!("multirail: error: {message}");
            }
            std::process::exit(2);
        }
    }
}

/// Lets rxm send 64 KiB messages eagerly and post 1024 receive buffers
/// per endpoint (not 4096) in this process and the ranks it starts,
/// unless the user set those variables
/// (`multirail_transport::ofi::stream::preferred_rxm_env`, docs/rails/ofi.md).
#[cfg(feature = "ofi")]
#[allow(unsafe_code)]
fn prefer_rxm_env() {
    for (name, value) in multirail_transport::ofi::stream::preferred_rxm_env() {
        // SAFETY: the first statement of `main`: no other thread exists
        // yet that could read the environment while it changes.
        unsafe { std::env::set_var(name, value) };
    }
}
