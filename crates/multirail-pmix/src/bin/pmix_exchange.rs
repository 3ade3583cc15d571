//! Exchange check run under a PMIx launcher (`mpirun -np N multirail-pmix-exchange`),
//! used by the crate's `tests/mpirun.rs`.
//!
//! Each rank puts its rank (4 bytes, little-endian) under `mr.test`, plus an
//! empty value and two larger binary blobs (with NULs, one compressible),
//! commits, fences, then gets every rank's values and checks them byte for
//! byte. On success it prints `ok rank R of N`; on failure it prints the
//! error to stderr and exits non-zero.

use std::process::ExitCode;

use multirail_pmix::Pmix;

/// A blob that differs per rank and contains every byte value, NUL included.
fn noisy_blob(rank: u32) -> Vec<u8> {
    let mut x = 0x9e37_79b9_u32 ^ rank;
    (0..5000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// A large, very compressible blob (PMIx may compress such values in transit).
fn repetitive_blob(rank: u32) -> Vec<u8> {
    (0..100_000u32).map(|i| if i % 1000 == 0 { rank as u8 } else { 0 }).collect()
}

fn run() -> Result<String, String> {
    let pmix = Pmix::init().map_err(|e| e.to_string())?;
    let me = pmix.rank();
    let fail = |what: &str, e: multirail_pmix::PmixError| format!("rank {me}: {what}: {e}");
    let n = pmix.size().map_err(|e| fail("size", e))?;
    pmix.put("mr.test", &me.to_le_bytes()).map_err(|e| fail("put mr.test", e))?;
    pmix.put("mr.empty", &[]).map_err(|e| fail("put mr.empty", e))?;
    pmix.put("mr.noisy", &noisy_blob(me)).map_err(|e| fail("put mr.noisy", e))?;
    pmix.put("mr.repetitive", &repetitive_blob(me)).map_err(|e| fail("put mr.repetitive", e))?;
    pmix.commit().map_err(|e| fail("commit", e))?;
    pmix.fence().map_err(|e| fail("fence", e))?;
    for r in 0..n {
        let checks: [(&str, Vec<u8>); 4] = [
            ("mr.test", r.to_le_bytes().to_vec()),
            ("mr.empty", Vec::new()),
            ("mr.noisy", noisy_blob(r)),
            ("mr.repetitive", repetitive_blob(r)),
        ];
        for (key, want) in checks {
            let got = pmix.get(r, key).map_err(|e| fail(&format!("get {key} of rank {r}"), e))?;
            if got != want {
                return Err(format!(
                    "rank {me}: {key} of rank {r}: got {} bytes, expected {} ({:02x?}... vs {:02x?}...)",
                    got.len(),
                    want.len(),
                    &got[..got.len().min(8)],
                    &want[..want.len().min(8)]
                ));
            }
        }
    }
    Ok(format!("ok rank {me} of {n}"))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pmix_exchange: {e}");
            ExitCode::FAILURE
        }
    }
}
