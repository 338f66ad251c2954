//! What goes into the service and what comes out of it: the messages a
//! subscription delivers, and the events it reports.

use std::time::Duration;

use super::shutdown::StopPhase;
use crate::call::KvFact;
use crate::health::{Health, LogLevel};
use crate::io::{Mode, TransmitId};
use crate::reply_scope::DropReason;
use crate::wire::{Endpoint, Response};

/// A message as a subscription delivered it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Received {
    /// The subject it came in on.
    pub subject: String,
    /// Its reply subject, if any.
    pub reply: Option<String>,
    /// Its headers, every value of every name, in order.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub payload: Vec<u8>,
    /// What is wrong with its header block, when the connection read it as
    /// malformed ([`crate::proto::HeaderError`]); `headers` is then empty. A
    /// request with one is answered `invalid` and runs no call.
    pub header_error: Option<String>,
}

impl Received {
    /// The value of the first header named `name`, as the connection read it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What a subscription the service wants is for (which connection takes it is the
/// adapter's: the documented deployment serves on one user and reads change
/// events on the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionKind {
    /// One of the five lease endpoints, in the queue group.
    Api,
    /// A `$SRV` verb of the micro protocol (every instance answers).
    Srv,
    /// Change events, for the known map and the tenants' lease counts.
    Changes,
    /// The other instances' presence heartbeats
    /// ([`Service::handle_presence`](super::Service::handle_presence)).
    Presence,
}

/// Where a dropped request came in, for its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestSource {
    /// A lease endpoint.
    Api,
    /// A `$SRV` verb.
    Srv,
}

impl RequestSource {
    /// Its metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Srv => "srv",
        }
    }
}

/// The once-per-interval log line of requests dropped for their reply subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedLog {
    /// How many were dropped since the last line.
    pub dropped: u64,
    /// The last one's subject.
    pub subject: String,
    /// The last one's reply subject, escaped for the log.
    pub reply: Option<String>,
    /// The prefixes a reply may have, joined.
    pub prefixes: String,
}

/// What the service settled on when the bucket was ensured, for its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serving {
    /// The mode it serves in.
    pub mode: Mode,
    /// The stream's replicas.
    pub replicas: usize,
    /// Whether reads are confirmed.
    pub confirm_reads: bool,
    /// Whether writes gather into atomic batches.
    pub atomic_batches: bool,
}

/// What the service reports: replies to publish, waits to carry out, and facts for
/// metrics and logs. Drain after every input.
#[derive(Debug, Clone, PartialEq)]
pub enum ServiceEvent {
    /// Subscribe to `subject` (in `queue`, if any); feed every message to
    /// [`Service::handle_request`](super::Service::handle_request).
    Subscribe {
        /// What to subscribe to.
        subject: String,
        /// The queue group.
        queue: Option<&'static str>,
        /// What it is for. If it cannot be made, say so with
        /// [`Service::handle_subscribe_failed`](super::Service::handle_subscribe_failed).
        kind: SubscriptionKind,
    },
    /// Publish `body` to `to`: a reply, its subject checked by the reply rule.
    /// Say when the client took it with [`Service::handle_reply_sent`](super::Service::handle_reply_sent); the
    /// machine gives it up at [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND) ([`ServiceEvent::CancelReply`]).
    Reply {
        /// Names this reply in [`Service::handle_reply_sent`](super::Service::handle_reply_sent) and
        /// [`ServiceEvent::CancelReply`].
        id: ReplyId,
        /// The reply subject.
        to: String,
        /// The reply.
        body: Vec<u8>,
        /// The calls this reply answers, for the metrics (a counter by reply
        /// kind, a duration each): a call's, or each item's renew of a
        /// `renew_many`; none for a reply to a `$SRV` verb, a request admission
        /// answered `unavailable` at once, or a `renew_many` answered whole.
        calls: Vec<Answered>,
    },
    /// Drop the publish of reply `id`: the client took no command for
    /// [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND) (it reconnects to a server that is gone), and a reply
    /// must not hold a stop for as long. A log event says so too.
    CancelReply {
        /// The reply given up.
        id: ReplyId,
    },
    /// The service must not start: the bucket has another layout than this
    /// service was started with (another shard count; it keeps answering every
    /// call `unavailable`), or the client has had no server INFO (the machine asks
    /// for nothing and is done). The sentence says why and what to change.
    StartRefused(String),
    /// The service cannot be reached: a subscription of the lease endpoints or
    /// of the `$SRV` verbs failed ([`Service::handle_subscribe_failed`](super::Service::handle_subscribe_failed)). Stop
    /// with this error; the machine is done.
    Fatal(String),
    /// The service starts: it ensures the bucket, and answers every call
    /// `unavailable` meanwhile (the mode gauge: [`Mode::Starting`]).
    Starting,
    /// The bucket is ensured: serving from now on, in [`Serving::mode`] (the
    /// mode gauge).
    Serving(Serving),
    /// A request was answered `unavailable` at once: the service is at its bound
    /// (admission's answer when overloaded).
    Overloaded {
        /// Its endpoint.
        endpoint: Endpoint,
    },
    /// A request was dropped unanswered: its reply subject may not be answered.
    Dropped {
        /// Where it came in.
        source: RequestSource,
        /// Why.
        reason: DropReason,
        /// The log line, at most once per interval.
        log: Option<DroppedLog>,
    },
    /// A fact about a call's JetStream request.
    Kv(KvFact),
    /// Stop request `id` ([`Service::poll_transmit`](super::Service::poll_transmit)): nothing waits for its
    /// outcome any more (its call ended or timed out, or it timed out itself), so
    /// its send can be dropped; an outcome fed back for it now is ignored. The
    /// machine's deadlines are the only timers a request has: send it untimed.
    Cancel {
        /// The request.
        id: TransmitId,
    },
    /// Read confirmation turned on or off with the stream's replicas.
    ConfirmReads {
        /// The replicas now.
        replicas: usize,
        /// Whether reads are confirmed now.
        on: bool,
    },
    /// The stream is gone or was made anew: every known revision was forgotten.
    StreamReplaced,
    /// The service refuses its bucket from now on: the stream's sequence went
    /// back under it, so its fences would repeat. Every call is answered
    /// `unavailable` with this sentence until the service is restarted after the
    /// restore procedure (docs/operations.md).
    BucketRefused(String),
    /// A stream's highest last sequence seen grew (a gauge: every fence handed
    /// out on it so far is at most this, so a restore starts above it).
    StreamSequence {
        /// The stream.
        stream: String,
        /// Its highest last sequence seen.
        last_seq: u64,
    },
    /// Readiness or the connection state changed (a probe's answer, a gauge).
    Health(Health),
    /// A released key's tombstone stays in the stream until a scan finds it
    /// (`failed` or `deferred`).
    TombstoneLeft {
        /// The metric label.
        reason: &'static str,
        /// The key.
        key: String,
        /// Why, for the log.
        detail: String,
    },
    /// A log line.
    Log {
        /// How loud.
        level: LogLevel,
        /// The line.
        line: String,
    },
    /// Stopping: unsubscribe every subscription, keep feeding the messages already
    /// delivered, then call [`Service::handle_intake_closed`](super::Service::handle_intake_closed).
    Unsubscribe,
    /// Publish this instance's presence heartbeat, `body` to `subject`
    /// ([`super::peers`]).
    Announce {
        /// Where.
        subject: String,
        /// This instance's id.
        body: Vec<u8>,
    },
    /// Drop the change subscription: no other instance serves ([`super::peers`]).
    UnsubscribeChanges,
    /// Stopping: push the client's writes to the server, then call
    /// [`Service::handle_flushed`](super::Service::handle_flushed) with `phase`. Asked only once every reply the
    /// service sent was handed to the client ([`Service::handle_reply_sent`](super::Service::handle_reply_sent)), so
    /// the flush carries them.
    Flush {
        /// The stop phase this flush ends; one that finishes after its phase is
        /// over ends nothing, so a later phase waits for its own.
        phase: StopPhase,
    },
}

/// What a call's reply ([`ServiceEvent::Reply`]) answered, for the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    /// The call's endpoint.
    pub endpoint: Endpoint,
    /// Its reply.
    pub response: Response,
    /// How long it ran.
    pub took: Duration,
}

/// A reply the service sent, until the client takes it or the machine gives it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplyId(pub u64);

impl crate::outbox::Id for ReplyId {
    fn from_raw(n: u64) -> Self {
        Self(n)
    }
}
