//! The one error type of the crate, sorted by category.
//!
//! * **Environment**: something the machine lacks ([`Error::NotRoot`],
//!   [`Error::ToolMissing`], [`Error::TbfUnavailable`], [`Error::BusUnavailable`]). The message says
//!   exactly what is missing and how to get it.
//! * **Input**: the caller asked for something invalid ([`Error::InvalidRate`],
//!   [`Error::InvalidPrefix`], [`Error::InvalidSpec`], [`Error::InvalidHost`],
//!   [`Error::EmptyCommand`]).
//! * **State**: the system is not in the state the call needs
//!   ([`Error::AlreadyExists`], [`Error::NotFound`], [`Error::NoSuchHost`],
//!   [`Error::NoSuchRail`]).
//! * **Command**: an `ip`/`tc` run failed; the message carries the command
//!   line and its stderr ([`Error::CommandFailed`], [`Error::Spawn`],
//!   [`Error::BadOutput`], [`Error::SetupAndCleanup`]).

use std::io;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while building, inspecting or removing a
/// testbed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The process lacks CAP_NET_ADMIN / CAP_SYS_ADMIN.
    #[error(
        "testbed needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN to create network \
         namespaces): run with sudo"
    )]
    NotRoot,

    /// A required program is not installed (or not on `PATH`, `/sbin`,
    /// `/usr/sbin`).
    #[error("`{tool}` not found: install {package}")]
    ToolMissing {
        /// Program name, e.g. `tc`.
        tool: &'static str,
        /// Debian/Fedora package that provides it.
        package: &'static str,
    },

    /// The kernel cannot create a `tbf` qdisc.
    #[error(
        "the kernel has no tbf qdisc (CONFIG_NET_SCH_TBF): try `modprobe sch_tbf`; \
         `{command}` said: {stderr}"
    )]
    TbfUnavailable {
        /// The `tc` command line that failed.
        command: String,
        /// What `tc` printed.
        stderr: String,
    },

    /// The kernel lacks a piece of the shared bus of `--bus` (ifb device,
    /// clsact qdisc, u32 classifier or mirred action).
    #[error(
        "--bus needs the kernel's ifb device, clsact qdisc, u32 classifier and mirred action \
         (CONFIG_IFB, CONFIG_NET_SCH_INGRESS, CONFIG_NET_CLS_U32, CONFIG_NET_ACT_MIRRED): try \
         `modprobe ifb sch_ingress cls_u32 act_mirred`; `{command}` said: {stderr}"
    )]
    BusUnavailable {
        /// The `ip` or `tc` command line that failed.
        command: String,
        /// What it printed.
        stderr: String,
    },

    /// A rate string could not be parsed.
    #[error("invalid rate `{input}`: {reason}")]
    InvalidRate {
        /// The text given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },

    /// A prefix is not usable as a name component.
    #[error("invalid prefix `{input}`: {reason}")]
    InvalidPrefix {
        /// The text given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },

    /// A host name is neither `hostN` nor `N`.
    #[error("invalid host `{input}`: expected `host0`, `host1`, ... or a plain index")]
    InvalidHost {
        /// The text given.
        input: String,
    },

    /// `exec` was given no command to run.
    #[error("no command given to run in the host")]
    EmptyCommand,

    /// The [`Spec`](crate::Spec) is inconsistent (too many hosts, wrong number
    /// of rates, ...).
    #[error("invalid testbed spec: {0}")]
    InvalidSpec(String),

    /// `up` found objects of a testbed with the same prefix.
    #[error(
        "a testbed with prefix `{prefix}` already exists ({found}): run \
         `multirail testbed down --prefix {prefix}` first"
    )]
    AlreadyExists {
        /// The prefix asked for.
        prefix: String,
        /// What was found, e.g. `netns mr-host0`.
        found: String,
    },

    /// No namespace of this testbed exists.
    #[error("no testbed with prefix `{prefix}`: run `multirail testbed up` first")]
    NotFound {
        /// The prefix asked for.
        prefix: String,
    },

    /// The host's namespace does not exist.
    #[error("testbed `{prefix}` has no host{host} (network namespace `{netns}` does not exist)")]
    NoSuchHost {
        /// The prefix asked for.
        prefix: String,
        /// Host index.
        host: usize,
        /// Namespace name that was looked for.
        netns: String,
    },

    /// The host exists but has no such rail interface.
    #[error("host{host} of testbed `{prefix}` has no interface rail{rail}")]
    NoSuchRail {
        /// The prefix asked for.
        prefix: String,
        /// Host index.
        host: usize,
        /// Rail index.
        rail: usize,
    },

    /// A command ran and exited unsuccessfully.
    #[error("`{command}` failed: {stderr}")]
    CommandFailed {
        /// The command line, program name first.
        command: String,
        /// Exit code, `None` if killed by a signal.
        code: Option<i32>,
        /// Its stderr, trimmed.
        stderr: String,
    },

    /// A command could not be started.
    #[error("could not run `{command}`: {source}")]
    Spawn {
        /// The command line, program name first.
        command: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// A command's output was not what this crate expects.
    #[error("could not understand the output of `{command}`: {reason}")]
    BadOutput {
        /// The command line, program name first.
        command: String,
        /// What was wrong.
        reason: String,
    },

    /// `up` failed and removing the half-built testbed failed too.
    #[error("{cause}; removing the half-built testbed also failed: {cleanup}")]
    SetupAndCleanup {
        /// Why `up` failed.
        cause: Box<Error>,
        /// Why the cleanup failed.
        cleanup: Box<Error>,
    },
}

impl Error {
    /// True for errors meaning "this machine cannot host a testbed" (no root,
    /// no `ip`/`tc`, no tbf). Tests use it to skip rather than fail.
    pub fn is_environment(&self) -> bool {
        matches!(
            self,
            Error::NotRoot | Error::ToolMissing { .. } | Error::TbfUnavailable { .. } | Error::BusUnavailable { .. }
        )
    }
}
