//! Frame header and ACK payload: parse never panics, and whatever parses
//! emits back to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use multirail_proto::wire::{AckRepr, FrameHeader, frame::Limits};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = FrameHeader::parse(data, &Limits::default()) {
        assert_eq!(&h.to_bytes()[..], &data[..FrameHeader::LEN]);
        let rest = &data[FrameHeader::LEN..];
        if let Ok(a) = AckRepr::parse(rest, h.aux) {
            assert_eq!(a.to_vec(), rest);
        }
    }
});
