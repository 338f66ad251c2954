//! What a call's JetStream request came to, for the service's metrics: the
//! [`Call`](crate::call::Call) reports it ([`CallEvent::Kv`](crate::call::CallEvent::Kv))
//! from the outcome it parsed to act on, so nothing parses a reply a second time
//! and an adapter only counts what the machine says.

use crate::io::RequestOutcome;
use crate::js::JsFailure;
use crate::outcome::OutcomeClass;

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

impl KvFact {
    /// The fact of `op`'s request that came to `outcome`, which the call read as
    /// `failure`: how the request failed on the network, or else what JetStream's
    /// error said (`unavailable` for a leaderless stream and the like, `internal`
    /// for the rest).
    pub fn failed(op: KvOp, outcome: &RequestOutcome, failure: &JsFailure) -> Self {
        let kind = OutcomeClass::of_failure(outcome, failure.kind)
            .label()
            .unwrap_or("internal");
        Self::Error { op, kind }
    }

    /// `op`'s request given up unanswered: timed out.
    pub fn timed_out(op: KvOp) -> Self {
        Self::Error {
            op,
            kind: OutcomeClass::TimedOut.label().unwrap_or("timed_out"),
        }
    }
}
