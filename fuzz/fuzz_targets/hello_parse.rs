//! Handshake messages: parse never panics; an acceptor fed arbitrary bytes
//! refuses them with a reason or answers, never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use multirail_proto::handshake::{AcceptorWaiting, HandshakeError, LocalHello};
use multirail_proto::wire::{HelloKind, HelloRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = HelloRepr::parse(data) {
        // Every field round-trips. The reserved word must be zero except in a
        // REJECT (the last 4 bytes), where a reader ignores it (a REJECT of any version is read),
        // so there it is re-emitted as zero.
        let keep = if h.kind == HelloKind::Reject { HelloRepr::LEN - 4 } else { HelloRepr::LEN };
        assert_eq!(&h.to_bytes()[..keep], &data[..keep]);
    }
    let local = LocalHello {
        job_id: 7,
        rank: 0,
        size: 2,
        rail_index: 0,
        rail_count: 2,
        bandwidth: 0,
        latency_ns: 0,
        max_frame: 1 << 20,
        credits: 1 << 20,
        nonce: [1; 32],
        generation: 1,
    };
    match AcceptorWaiting::new(&local, b"key").on_hello(data) {
        Ok((state, _, _)) => {
            let _ = state.on_auth(data.get(HelloRepr::LEN..).unwrap_or(&[]));
        }
        // Every refusal carries a reason to send back, except a REJECT
        // received from the peer (nothing to answer).
        Err(HandshakeError::Rejected(_)) => {}
        Err(e) => assert!(e.reject_reason().is_some(), "{e}"),
    }
});
