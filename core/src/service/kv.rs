//! What a call's JetStream request came to, for the service's metrics: read from
//! the outcome once, here, so that an adapter only counts what the machine says.

use crate::io::{RequestOutcome, TransmitKind};
use crate::js::{self, JsFailure, PublishResult};
use crate::wire::ErrorKind;

/// Which of a call's JetStream requests it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvOp {
    /// A leader read of a key.
    Read,
    /// A conditional write.
    Write,
    /// A read confirmation.
    Confirm,
}

impl KvOp {
    /// The op of a call's request of `kind`; `None` for a request that is not a
    /// JetStream one (an owner's inbox).
    pub fn of(kind: TransmitKind) -> Option<Self> {
        match kind {
            TransmitKind::Read => Some(Self::Read),
            TransmitKind::Write => Some(Self::Write),
            TransmitKind::Confirm => Some(Self::Confirm),
            TransmitKind::Inbox | TransmitKind::Lease(_) | TransmitKind::Api => None,
        }
    }

    /// Its metric label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Confirm => "confirm",
        }
    }
}

/// One fact about a call's JetStream request, for a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvFact {
    /// A read confirmation went out.
    ConfirmSent,
    /// A read confirmation found the key written since the read: the call reads again.
    ConfirmRetry,
    /// The request failed: `kind` is `timed_out`, `no_responders`,
    /// `request_failed`, `unavailable` or `internal`.
    Error {
        /// Which request.
        op: KvOp,
        /// How it failed (the metric label).
        kind: &'static str,
    },
}

/// What `outcome` of a call's `op` request says for the metrics, if anything.
pub fn classify(op: KvOp, outcome: &RequestOutcome) -> Option<KvFact> {
    let error = |kind| Some(KvFact::Error { op, kind });
    let failure = match outcome {
        RequestOutcome::TimedOut => return error("timed_out"),
        RequestOutcome::NoResponders => return error("no_responders"),
        RequestOutcome::Failed(_) => return error("request_failed"),
        RequestOutcome::Reply { payload, .. } => {
            if op == KvOp::Confirm {
                // Small: read it whole.
                match js::parse_pub_ack(outcome) {
                    Ok(PublishResult::WrongLastSequence) => return Some(KvFact::ConfirmRetry),
                    Ok(PublishResult::Stored(_)) => None,
                    Err(f) => Some(f),
                }
            } else if !contains(payload, b"\"error\"") {
                // Neither a read's reply (base64 inside, a subject without quotes)
                // nor an ack carries the word quoted unless it is an error: no need
                // to parse the whole reply a second time.
                None
            } else if op == KvOp::Read {
                js::parse_read(outcome).err()
            } else {
                js::parse_pub_ack(outcome).err()
            }
        }
    };
    let JsFailure { kind, .. } = failure?;
    error(if kind == ErrorKind::Unavailable {
        "unavailable"
    } else {
        "internal"
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
