//! `--validate` catches payloads that the rails corrupt: rail 0 flips a
//! byte in half of its data frames, the policy stripes every message over
//! both rails, and the run must fail on every rank naming size and offset.

mod common;

use multirail::{FaultConfig, Progress as Engine};
use multirail_perf::{BenchError, BenchSpec, Test, run};

fn corrupting(rank: u32) -> multirail::Builder {
    let fault = FaultConfig { seed: 1 + u64::from(rank), corrupt: 0.5, ..Default::default() };
    common::builder(2, Engine::Polled).policy("*:stripe").fault(0, fault)
}

fn validated(test: Test) -> BenchSpec {
    let mut spec = BenchSpec::new(test);
    spec.iterations = Some(3);
    spec.warmup = Some(1);
    spec.window = 4;
    spec.validate = true;
    spec
}

#[test]
fn bw_validate_catches_corrupted_payload() {
    let spec = validated(Test::Bw);
    let outs = common::job(2, corrupting, |ep| run(&ep, &spec, &mut |_| {}));
    let mut seen = None;
    for (rank, out) in outs.into_iter().enumerate() {
        match out {
            Err(BenchError::Validation(e)) => {
                let msg = e.to_string();
                assert!(msg.contains(&format!("message size {}", e.size)), "{msg}");
                assert!(msg.contains(&format!("offset {}", e.offset)), "{msg}");
                assert!(e.offset < e.size, "{e:?}");
                assert_eq!(e.rank, 1, "bw payloads are checked by the receiver");
                assert!(seen.get_or_insert(e.clone()) == &e, "every rank reports the same error");
            }
            other => panic!("rank {rank}: expected a validation error, got {other:?}"),
        }
    }
}

#[test]
fn latency_validate_catches_corrupted_payload() {
    let spec = validated(Test::Latency);
    let outs = common::job(2, corrupting, |ep| run(&ep, &spec, &mut |_| {}));
    for out in outs {
        let e = match out {
            Err(BenchError::Validation(e)) => e,
            other => panic!("expected a validation error, got {other:?}"),
        };
        assert!(e.size > 0 && e.offset < e.size, "{e:?}");
    }
}
