//! What a request came to, classified once: the client's calls, the holder's
//! campaign and the service's JetStream metrics all read a [`RequestOutcome`]
//! through [`Answer`] and [`OutcomeClass`], so none sorts outcomes by itself.

use crate::io::RequestOutcome;
use crate::wire::{Endpoint, ErrorKind, ErrorReply, Response};

/// A request's outcome read whole as a call to one endpoint: its reply, the
/// service's refusal, or why there is no reply to read.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A reply of the endpoint's success shape.
    Reply(Response),
    /// An error reply: the service refused (or failed) with this kind.
    Error(ErrorReply),
    /// A reply no shape of the endpoint reads: why.
    Unreadable(String),
    /// Nobody received the request: no service subscribes to its subject.
    NoResponders,
    /// No reply within the request's timeout: it may still have taken effect.
    TimedOut,
    /// The request could not be sent, or its connection failed: why.
    Failed(String),
}

impl Answer {
    /// Reads `outcome`, the reply of a call to `endpoint`.
    pub fn of(endpoint: Endpoint, outcome: RequestOutcome) -> Self {
        match outcome {
            RequestOutcome::Reply { payload, .. } => match Response::decode(endpoint, &payload) {
                Ok(Response::Error(e)) => Self::Error(e),
                Ok(reply) => Self::Reply(reply),
                Err(why) => Self::Unreadable(why),
            },
            RequestOutcome::NoResponders => Self::NoResponders,
            RequestOutcome::TimedOut => Self::TimedOut,
            RequestOutcome::Failed(why) => Self::Failed(why),
        }
    }

    /// Its class: whether a holder can read it as a yes or a no.
    pub fn class(&self) -> OutcomeClass {
        match self {
            Self::Reply(_) => OutcomeClass::Clear,
            Self::Error(e) => OutcomeClass::of_error(e.kind),
            Self::Unreadable(_) => OutcomeClass::Internal,
            Self::NoResponders => OutcomeClass::NoResponders,
            Self::TimedOut => OutcomeClass::TimedOut,
            Self::Failed(_) => OutcomeClass::RequestFailed,
        }
    }
}

/// How a holder reads what came of one of its requests: a clear yes or no, or an
/// outcome it cannot read as either (the slow path, counted by the holder
/// library's metrics). The driver feeds outcomes back; it never reads them itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeClass {
    /// A reply the holder reads as a yes or a no (a grant, a refusal, `lost`, ...).
    Clear,
    /// No reply within the request's timeout: it may still be processed.
    TimedOut,
    /// Nobody received the request: nothing was written.
    NoResponders,
    /// The client could not send it, or its connection failed meanwhile.
    RequestFailed,
    /// The service answered `unavailable`: it may have written before it failed.
    Unavailable,
    /// The service answered `internal`, or a reply no endpoint's shape reads.
    Internal,
}

impl OutcomeClass {
    /// The class of `outcome`, the reply of a call to `endpoint`, read whole.
    pub fn of(endpoint: Endpoint, outcome: &RequestOutcome) -> Self {
        match outcome {
            RequestOutcome::Reply { payload, .. } => match Response::decode(endpoint, payload) {
                Ok(Response::Error(e)) => Self::of_error(e.kind),
                Ok(_) => Self::Clear,
                Err(_) => Self::Internal,
            },
            RequestOutcome::NoResponders => Self::NoResponders,
            RequestOutcome::TimedOut => Self::TimedOut,
            RequestOutcome::Failed(_) => Self::RequestFailed,
        }
    }

    /// The class of a request whose reply, if one came, failed with `kind`: how
    /// it failed on the network, else what the error says (a JetStream request's
    /// failure reads so).
    pub fn of_failure(outcome: &RequestOutcome, kind: ErrorKind) -> Self {
        match outcome {
            RequestOutcome::Reply { .. } => Self::of_error(kind),
            RequestOutcome::NoResponders => Self::NoResponders,
            RequestOutcome::TimedOut => Self::TimedOut,
            RequestOutcome::Failed(_) => Self::RequestFailed,
        }
    }

    /// The class of an error reply of `kind`: `unavailable` and `internal` say
    /// the service failed; any other kind is a clear no.
    pub fn of_error(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::Unavailable => Self::Unavailable,
            ErrorKind::Internal => Self::Internal,
            _ => Self::Clear,
        }
    }

    /// Whether the holder reads it as a yes or a no.
    pub fn is_clear(self) -> bool {
        self == Self::Clear
    }

    /// Its metrics label (`timed_out`, `no_responders`, `request_failed`,
    /// `unavailable`, `internal`); `None` for [`OutcomeClass::Clear`].
    pub fn label(self) -> Option<&'static str> {
        Some(match self {
            Self::Clear => return None,
            Self::TimedOut => "timed_out",
            Self::NoResponders => "no_responders",
            Self::RequestFailed => "request_failed",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        })
    }
}
