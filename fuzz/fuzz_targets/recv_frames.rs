//! The receive state machine driven by arbitrary frame sequences from a
//! peer on two rails, with receives posted in between: it must never
//! panic, and must not hold more unexpected bytes than it granted.
#![no_main]
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use multirail_proto::core::{Config, Core, RailCaps};
use multirail_proto::time::Time;
use multirail_proto::wire::{FrameHeader, frame::Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_frame: 1 << 16, max_message: 1 << 20 };
    let cfg = Config { rank: 0, unexpected_limit: 1 << 16, limits, ..Config::default() };
    let mut core = Core::new(cfg);
    core.add_peer(1, 2);
    let mut now = Time::ZERO;
    for r in 0..2 {
        core.rail_up(1, r, RailCaps::default(), 1 << 16, now);
    }
    let mut rest = data;
    while rest.len() > 2 {
        let (ctl, tail) = rest.split_at(2);
        rest = tail;
        let rail = (ctl[0] & 1) as usize;
        now = Time(now.0 + ctl[1] as u64 * 1000);
        match ctl[0] >> 5 {
            // Post a receive of a size from the next byte.
            0 => {
                let n = rest.first().copied().unwrap_or(0) as usize * 64;
                core.irecv(Some(1), None, BytesMut::zeroed(n), now);
            }
            // Timers.
            1 => core.handle_timeout(now),
            // A frame: 48 header bytes and its payload from the input.
            _ => {
                let Ok(h) = FrameHeader::parse(rest, &limits) else {
                    rest = rest.get(1..).unwrap_or(&[]);
                    continue;
                };
                rest = &rest[FrameHeader::LEN..];
                let n = h.payload_len().min(rest.len());
                let payload = &rest[..n];
                rest = &rest[n..];
                if core.on_frame(1, rail, &h, payload, now).is_err() {
                    core.rail_down(1, rail, "protocol error", now);
                    core.rail_up(1, rail, RailCaps::default(), 1 << 16, now);
                }
            }
        }
        assert!(core.unexpected_bytes(1) <= 1 << 16);
        while core.poll_event().is_some() {}
        for r in 0..2 {
            while core.poll_transmit(1, r, now).is_some() {}
        }
    }
});
