//! Lists libfabric's providers through the bindings, like `fi_info -l`,
//! and checks that the `tcp` provider is among them (every 1.x build has
//! it; the RDM tests depend on it).

#[cfg(not(mr_ofi_found))]
#[test]
fn skipped_without_libfabric() {
    eprintln!("skipped: multirail-ofi-sys was built without libfabric (see its build warning)");
}

#[cfg(mr_ofi_found)]
mod common;

#[cfg(mr_ofi_found)]
#[test]
fn provider_list_has_tcp() {
    use std::collections::BTreeSet;
    use std::ptr;

    use common::{Info, c_string, describe};
    use multirail_ofi_sys::*;

    let mut list: *mut fi_info = ptr::null_mut();
    // SAFETY: no node, service or hints (every provider, default modes);
    // list receives a list owned by `info` below.
    let ret = unsafe { fi_getinfo(FI_API_VERSION, ptr::null(), ptr::null(), 0, ptr::null(), &mut list) };
    assert_eq!(ret, 0, "{}", describe("fi_getinfo", ret));
    let info = Info(list);

    // Layered stacks are named "core;utility" ("tcp;ofi_rxm"); fi_info -l
    // shows each part, so do the same, and keep the stacks too.
    let mut providers = BTreeSet::new();
    let mut stacks = BTreeSet::new();
    let mut entry = info.0;
    for _ in 0..100_000 {
        if entry.is_null() {
            break;
        }
        // SAFETY: entry is a node of the list owned by `info`; fabric_attr
        // is always allocated in a returned fi_info.
        let (name, version, next) = unsafe {
            let attr = &*(*entry).fabric_attr;
            (c_string(attr.prov_name), attr.prov_version, (*entry).next)
        };
        for part in name.split(';') {
            providers.insert((part.to_owned(), version));
        }
        stacks.insert(name);
        entry = next;
    }
    assert!(entry.is_null(), "fi_info list longer than 100000 entries");

    for (name, version) in &providers {
        println!("{name}:\n    version: {}.{}", version >> 16, version & 0xffff);
    }
    println!("stacks: {stacks:?}");
    assert!(providers.iter().any(|(name, _)| name == "tcp"), "no tcp provider in {providers:?}");
}
