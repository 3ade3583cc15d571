//! What can end a benchmark run: a payload that arrived wrong, a failure
//! of the channel underneath, a spec that cannot run on this job, or
//! ranks that stopped agreeing.

/// A received message differed from what its sender wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "payload validation failed for message size {size}: first bad byte at offset {offset} \
     (iteration {iteration}, message {message} of the window, checked by rank {rank})"
)]
pub struct ValidationError {
    /// The benchmark's message size in bytes.
    pub size: u64,
    /// First offset whose byte differs (or the received length, when the
    /// message arrived shorter than sent).
    pub offset: u64,
    /// Iteration, counting warm-up iterations from 0.
    pub iteration: u64,
    /// Index of the message within its window (0 for ping-pongs).
    pub message: u32,
    /// The rank that received the message.
    pub rank: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// `--validate` found a wrong byte (every rank returns it).
    #[error(transparent)]
    Validation(#[from] ValidationError),
    /// The multirail channel failed (a peer died, a setting is invalid...).
    #[error("communication failed")]
    Net(#[from] multirail::Error),
    /// The spec cannot run on this job (names what is wrong).
    #[error("invalid benchmark: {0}")]
    Spec(String),
    /// A control message between ranks made no sense.
    #[error("ranks disagree: {0}")]
    Protocol(String),
}
