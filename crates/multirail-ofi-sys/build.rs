//! Finds the system libfabric with pkg-config, links it, and compiles the C
//! shim (`shim/mr_ofi.c`) that turns libfabric's static-inline calls into
//! real `mr_ofi_*` symbols.
//!
//! Without libfabric (pkg-config finds no `libfabric >= 1.10`) the crate
//! still builds, empty: a warning says why, the `mr_ofi_found` cfg is left
//! unset, and `lib.rs` exports only [`LIBFABRIC_FOUND`] = false. So
//! `cargo build --workspace` never needs libfabric. Setting
//! `MULTIRAIL_OFI_REQUIRE=1` turns the missing library into a build error
//! (CI sets it, so a broken install cannot pass as a skip).

use std::env;

const MIN_VERSION: &str = "1.10";
const REQUIRE_ENV: &str = "MULTIRAIL_OFI_REQUIRE";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(mr_ofi_found)");
    println!("cargo::rerun-if-changed=shim/mr_ofi.c");
    println!("cargo::rerun-if-changed=shim/mr_ofi.h");
    println!("cargo::rerun-if-env-changed={REQUIRE_ENV}");

    let library = match pkg_config::Config::new().atleast_version(MIN_VERSION).probe("libfabric") {
        Ok(library) => library,
        Err(error) => return not_found(&error),
    };

    let mut shim = cc::Build::new();
    shim.file("shim/mr_ofi.c").warnings(true);
    for path in &library.include_paths {
        shim.include(path);
    }
    shim.compile("mr_ofi");
    // The shim calls libfabric, so libfabric must come after it on the link
    // line; pkg-config printed it before, print it again.
    for lib in &library.libs {
        println!("cargo::rustc-link-lib={lib}");
    }
    println!("cargo::rustc-cfg=mr_ofi_found");
    println!("cargo::metadata=version={}", library.version);
}

fn not_found(error: &pkg_config::Error) {
    let required = env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    if required {
        panic!("{REQUIRE_ENV} is set but libfabric >= {MIN_VERSION} was not found: {error}");
    }
    // One line: cargo shows it for every build of the workspace.
    println!(
        "cargo::warning=libfabric >= {MIN_VERSION} not found by pkg-config: \
         multirail-ofi-sys is built empty (no bindings, its tests skip). \
         Install libfabric-dev (or point PKG_CONFIG_PATH at libfabric.pc) to build it; \
         `pkg-config --modversion libfabric` shows why; {REQUIRE_ENV}=1 makes this an error."
    );
}
