//! include/multirail.h is what cbindgen makes of src/lib.rs today.
//! `MULTIRAIL_BLESS=1 cargo test -p multirail-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen parses src/lib.rs")
        .write(&mut fresh);
    let path = dir.join("include/multirail.h");
    if std::env::var_os("MULTIRAIL_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write include/multirail.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/multirail.h is stale: regenerate it with `MULTIRAIL_BLESS=1 cargo test -p multirail-capi --test header` and commit it"
    );
}
