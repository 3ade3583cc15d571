//! The collectives the kernels need besides `Endpoint::barrier`, all
//! through rank 0: an agreement on a [`Verdict`] (stop early? did anyone
//! see a bad payload?) and a gather of per-rank numbers. They run between
//! timed intervals, never inside one.

use bytes::BytesMut;
use multirail::Endpoint;

use super::{control, tag};
use crate::error::{BenchError, ValidationError};

/// What all ranks must agree on after an iteration.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Verdict {
    /// Stop this size now (only rank 0's clock decides).
    pub stop: bool,
    /// The first bad payload any rank saw (rank order).
    pub error: Option<ValidationError>,
}

const VERDICT_WORDS: usize = 6;

impl Verdict {
    fn encode(&self) -> [u64; VERDICT_WORDS] {
        let e = self.error.clone().unwrap_or(ValidationError { size: 0, offset: 0, iteration: 0, message: 0, rank: 0 });
        let flags = u64::from(self.stop) | u64::from(self.error.is_some()) << 1;
        [flags, e.size, e.offset, e.iteration, u64::from(e.message), u64::from(e.rank)]
    }

    fn decode(w: &[u64], from: u32) -> Result<Verdict, BenchError> {
        let narrow =
            |x: u64| u32::try_from(x).map_err(|_| BenchError::Protocol(format!("bad verdict from rank {from}")));
        let error = match w[0] & 2 {
            0 => None,
            _ => Some(ValidationError {
                size: w[1],
                offset: w[2],
                iteration: w[3],
                message: narrow(w[4])?,
                rank: narrow(w[5])?,
            }),
        };
        Ok(Verdict { stop: w[0] & 1 == 1, error })
    }

    fn merge(&mut self, other: Verdict) {
        self.stop |= other.stop;
        if self.error.is_none() {
            self.error = other.error;
        }
    }
}

/// Every rank passes its verdict and gets the job's: rank 0 gathers,
/// merges (its own first, then by rank) and broadcasts.
pub(crate) fn agree(ep: &Endpoint, mine: Verdict) -> Result<Verdict, BenchError> {
    if ep.rank() != 0 {
        ep.isend(0, tag::AGREE_UP, control::encode(&mine.encode()))?.wait()?;
        let w = recv_words(ep, 0, tag::AGREE_DOWN, VERDICT_WORDS)?;
        return Verdict::decode(&w, 0);
    }
    let mut all = mine;
    for p in 1..ep.size() {
        let w = recv_words(ep, p, tag::AGREE_UP, VERDICT_WORDS)?;
        all.merge(Verdict::decode(&w, p)?);
    }
    let down = control::encode(&all.encode());
    for p in 1..ep.size() {
        ep.isend(p, tag::AGREE_DOWN, down.clone())?.wait()?;
    }
    Ok(all)
}

/// Sends `words` to rank `to` as one control message.
pub(crate) fn send_words(ep: &Endpoint, to: u32, tag: u64, words: &[u64]) -> Result<(), BenchError> {
    Ok(ep.isend(to, tag, control::encode(words))?.wait()?)
}

/// Receives a control message of exactly `n` words from rank `from`.
pub(crate) fn recv_words(ep: &Endpoint, from: u32, tag: u64, n: usize) -> Result<Vec<u64>, BenchError> {
    let buf = BytesMut::zeroed(control::encoded_len(n));
    let (buf, st) = ep.irecv(Some(from), Some(tag), buf)?.wait()?;
    let len = usize::try_from(st.len).unwrap_or(usize::MAX).min(buf.len());
    control::decode(&buf[..len], n, from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_round_trip_and_merge() {
        let e = ValidationError { size: 8, offset: 3, iteration: 9, message: 2, rank: 1 };
        let v = Verdict { stop: true, error: Some(e.clone()) };
        assert_eq!(Verdict::decode(&v.encode(), 1).unwrap(), v);
        let quiet = Verdict::default();
        assert_eq!(Verdict::decode(&quiet.encode(), 1).unwrap(), quiet);
        let mut m = Verdict::default();
        m.merge(Verdict { stop: false, error: Some(e.clone()) });
        m.merge(Verdict { stop: true, error: Some(ValidationError { rank: 3, ..e.clone() }) });
        assert_eq!(m, Verdict { stop: true, error: Some(e) });
    }
}
