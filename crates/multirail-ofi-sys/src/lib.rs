//! Raw FFI bindings to the system libfabric, the foundation of multirail's
//! `ofi` rail (issue 11).
//!
//! # Layer and promise
//!
//! This crate is the bottom of the libfabric rail and nothing more: C types,
//! constants and `extern "C"` functions, no safe wrappers. It promises that
//!
//! * every libfabric call multirail needs is reachable from Rust: the few
//!   functions libfabric exports as real symbols ([`fi_getinfo`],
//!   [`fi_freeinfo`], [`fi_dupinfo`], [`fi_fabric`], [`fi_strerror`],
//!   [`fi_tostr`], [`fi_version`]) directly, and the many that its headers
//!   define as `static inline` calls through an object's ops table
//!   (`fi_domain`, `fi_endpoint`, `fi_send`, `fi_cq_read`, `fi_mr_reg`...)
//!   through a small C shim, `shim/mr_ofi.c`, as `mr_ofi_<name>` with the
//!   same arguments ([`mr_ofi_domain`], [`mr_ofi_send`], [`mr_ofi_cq_read`]...);
//! * the bindings (`src/bindings.rs`) were generated once with bindgen from
//!   `shim/mr_ofi.h` and are committed, so building needs a C compiler and
//!   `libfabric-dev` but neither bindgen nor libclang
//!   (`scripts/gen-bindings.sh` is the exact command);
//! * the default workspace build never needs libfabric (next section).
//!
//! # Without libfabric
//!
//! `build.rs` asks pkg-config for `libfabric >= 1.10`. When it is not there
//! the crate still compiles, empty: cargo prints one warning saying why,
//! [`LIBFABRIC_FOUND`] is `false`, no bindings are exported, and the tests
//! print that they skip. `cargo build --workspace` therefore works on any
//! machine. Set `MULTIRAIL_OFI_REQUIRE=1` to turn a missing libfabric into a
//! build error instead (CI does, so a broken install cannot pass as a skip).
//! Code that uses the bindings is compiled only where they exist: the rail
//! in `multirail-transport` depends on this crate behind its `ofi`
//! feature (which therefore needs libfabric).
//!
//! # Using the bindings
//!
//! * Object handles (`fid_ep`, `fid_cq`, `fid_mr`...) are opaque: call them
//!   through the `mr_ofi_*` functions only. Each begins with its `struct
//!   fid`, so `ep.cast::<fid>()` is the C `&ep->fid` that [`mr_ofi_close`],
//!   [`mr_ofi_ep_bind`] and [`mr_ofi_getname`] take.
//! * Allocate `fi_info` (hints) with [`mr_ofi_allocinfo`] or [`fi_dupinfo`],
//!   never as a Rust value, and free it with [`fi_freeinfo`]: newer
//!   libfabric releases append fields to the attribute structs (see below),
//!   so only the library knows their real size. Reading the fields bound
//!   here is safe on any release >= 1.10, because fields are only appended.
//! * Calls return `0` or a positive count on success and a negative
//!   `-FI_E*` on failure; `-FI_EAGAIN` from a data-transfer call means
//!   "progress the completion queues and retry", and `-FI_EAVAIL` from
//!   [`mr_ofi_cq_read`] means "an error entry waits for
//!   [`mr_ofi_cq_readerr`]".
//! * Constants from `#define`s have bindgen's types: `u32` when the value
//!   fits, else `u64` (`FI_MSG: u32` but `FI_SOURCE: u64`), so widen with
//!   `u64::from(FI_MSG)` for `caps`/`flags` and narrow the `FI_MR_*` bits to
//!   the `c_int` of `fi_domain_attr::mr_mode`. Constants from C enums have
//!   the enum's type (`FI_EP_RDM: fi_ep_type`). The casts bindgen cannot
//!   evaluate are defined here: [`FI_ADDR_UNSPEC`], [`FI_ADDR_NOTAVAIL`],
//!   [`FI_KEY_NOTAVAIL`].
//!
//! # libfabric 1.x and 2.x
//!
//! The bindings are the 1.x API (headers of 1.17, ABI 1.6), and multirail
//! asks `fi_getinfo` for that API version ([`FI_API_VERSION`]). What a port
//! to, or a build against, the 2.x series has to mind:
//!
//! * ABI: libfabric only appends to its structs. 1.20 (ABI 1.7) added
//!   `fi_domain_attr::max_ep_auth_key`; 2.0 (ABI 1.8) added
//!   `fi_domain_attr::max_group_id` and `fi_fabric2`. Hence the rule above
//!   to let the library allocate `fi_info`.
//! * Memory registration: 2.0 dropped the old enum modes `FI_MR_BASIC` and
//!   `FI_MR_SCALABLE` and the `FI_LOCAL_MR` mode bit;
//!   only the `mr_mode` bits (`FI_MR_LOCAL`, `FI_MR_VIRT_ADDR`,
//!   `FI_MR_ALLOCATED`, `FI_MR_PROV_KEY`, `FI_MR_ENDPOINT`...) remain. This
//!   crate therefore does not bind the old enum values: code written
//!   against it already uses the bits.
//! * Address vectors: 2.0 removed `FI_AV_MAP` and asynchronous AV inserts;
//!   use `FI_AV_TABLE` (indices) and synchronous [`mr_ofi_av_insert`].
//! * Wait sets and poll sets (`fi_wait_open`, `fi_poll_open`) are
//!   deprecated in 2.x: they are not bound; poll CQs, or wait on a CQ's own
//!   wait object.
//! * Providers: 2.0 removed several (rstream, gni, bgq...). For TCP, 1.x
//!   offers `FI_EP_RDM` as the `tcp;ofi_rxm` layering; newer releases'
//!   `tcp` provider (the former `net`) offers `FI_EP_RDM` by itself, so the
//!   rail must look for both.
//! * Some constants left the public headers in 2.0 (`FI_NAME_MAX` was
//!   discussed); `FI_NAME_MAX`/`FI_PATH_MAX` are bound here but nothing
//!   should rely on them.
//!
//! Verified here: only 1.17 (Debian 12). The ABI items come from
//! libfabric's `fabric(7)`, the `FI_AV_MAP` removal from the 2.0 change
//! set, the wait/poll set deprecation from 2.x `fi_poll(3)`; the
//! `FI_MR_BASIC`/`FI_MR_SCALABLE`/`FI_LOCAL_MR` removal is from memory.
//! None of it was checked by a build against 2.x.
//!
//! # Tests
//!
//! `cargo test -p multirail-ofi-sys`: a provider listing (like
//! `fi_info -l`) and an RDM ping-pong over `tcp;ofi_rxm` on 127.0.0.1 and
//! over `shm` (skipped with a reason if the provider is absent).

#![no_std]

/// Whether build.rs found libfabric and the bindings below exist.
pub const LIBFABRIC_FOUND: bool = cfg!(mr_ofi_found);

#[cfg(mr_ofi_found)]
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    missing_docs,
    clippy::all,
    reason = "generated by bindgen from C headers; names and shapes are C's"
)]
mod bindings;

#[cfg(mr_ofi_found)]
pub use bindings::*;

#[cfg(mr_ofi_found)]
mod extra {
    use super::bindings::{FI_MAJOR_VERSION, FI_MINOR_VERSION, fi_addr_t};

    /// The C macro `FI_VERSION(major, minor)`: a version number as
    /// `fi_getinfo` and `fi_version` use it.
    pub const fn fi_version_number(major: u32, minor: u32) -> u32 {
        (major << 16) | minor
    }

    /// The API version of the bound headers (1.17), the version multirail
    /// passes to `fi_getinfo`.
    pub const FI_API_VERSION: u32 = fi_version_number(FI_MAJOR_VERSION, FI_MINOR_VERSION);

    /// `FI_ADDR_UNSPEC`: "any source" for receives.
    pub const FI_ADDR_UNSPEC: fi_addr_t = u64::MAX;
    /// `FI_ADDR_NOTAVAIL`: an address the AV could not insert.
    pub const FI_ADDR_NOTAVAIL: fi_addr_t = u64::MAX;
    /// `FI_KEY_NOTAVAIL`: no memory registration key.
    pub const FI_KEY_NOTAVAIL: u64 = u64::MAX;
    /// `FI_ORDER_SAS` (`msg_order`): sends are delivered in the order they
    /// were posted, the ordering the `ofi` rail needs. Not in the
    /// bindings' allowlist when they were generated.
    pub const FI_ORDER_SAS: u64 = 1 << 8;

    // Added to the shim after `bindings.rs` was generated, declared here by
    // hand with the C prototypes' exact types (`shim/mr_ofi.h`); the next
    // run of `scripts/gen-bindings.sh` (with `mr_ofi_.*` allowlisted) binds
    // them too, and then these declarations go.
    unsafe extern "C" {
        /// `fi_control(fid, command, arg)`, e.g. `FI_GETWAIT` on a CQ
        /// opened with `FI_WAIT_FD` writes the fd to wait on into `*arg`.
        pub fn mr_ofi_control(
            fid: *mut super::bindings::fid,
            command: ::core::ffi::c_int,
            arg: *mut ::core::ffi::c_void,
        ) -> ::core::ffi::c_int;
        /// `fi_trywait(fabric, fids, count)`: 0 when it is safe to block on
        /// the wait objects of `fids`, `-FI_EAGAIN` when completions are
        /// there (read them first).
        pub fn mr_ofi_trywait(
            fabric: *mut super::bindings::fid_fabric,
            fids: *mut *mut super::bindings::fid,
            count: ::core::ffi::c_int,
        ) -> ::core::ffi::c_int;
    }
}

#[cfg(mr_ofi_found)]
pub use extra::*;

#[cfg(all(test, mr_ofi_found))]
mod tests {
    use super::*;

    #[test]
    fn hand_written_constants_match_the_c_headers() {
        // SAFETY: both shim functions take no arguments and only return a
        // value computed from header macros.
        let (version, unspec) = unsafe { (mr_ofi_header_version(), mr_ofi_addr_unspec()) };
        assert_eq!(version, FI_API_VERSION);
        assert_eq!(unspec, FI_ADDR_UNSPEC);
    }

    #[test]
    fn the_library_is_at_least_the_minimum_version() {
        // SAFETY: fi_version takes no arguments and has no preconditions.
        let runtime = unsafe { fi_version() };
        assert!(runtime >= fi_version_number(1, 10), "libfabric {runtime:#x} < 1.10");
    }
}
