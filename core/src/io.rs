//! The I/O vocabulary every machine shares: what it asks an adapter to send
//! ([`Transmit`]), the id the outcome comes back with ([`TransmitId`]), what came of
//! it ([`RequestOutcome`]), and whether the service can serve ([`Mode`]).

use std::time::Duration;

use crate::wire::Endpoint;

/// Names one [`Transmit`], a request a machine asks an adapter to send (every
/// machine of this crate uses it: the service and its parts, a holder, a
/// campaign); the outcome comes back with it. One id space per owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransmitId(pub u64);

impl TransmitId {
    /// The id of a request a part has decided and not yet handed out: its owner
    /// names it as it polls it (`poll_transmit(ids)`), from its own id space.
    pub const UNSENT: Self = Self(0);
}

/// One NATS request with headers, as an adapter sends it: the message itself
/// (a [`Transmit`] carries one, with its id and kind).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsRequest {
    /// Where to send it.
    pub subject: String,
    /// Headers, in order.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub payload: Vec<u8>,
    /// How long to wait for the reply.
    pub timeout: Duration,
}

/// What came of a [`NatsRequest`], as the adapter observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOutcome {
    /// A reply arrived.
    Reply {
        /// The reply's headers.
        headers: Vec<(String, String)>,
        /// The reply's body.
        payload: Vec<u8>,
    },
    /// Nobody subscribes to the subject (for a JetStream publish: no stream, or no
    /// leader during an election).
    NoResponders,
    /// No reply within the request's timeout.
    TimedOut,
    /// The request could not be sent or the connection failed.
    Failed(String),
}

impl RequestOutcome {
    /// A reply without headers.
    pub fn reply(payload: impl Into<Vec<u8>>) -> Self {
        Self::Reply {
            headers: Vec::new(),
            payload: payload.into(),
        }
    }
}

/// Whether the service can serve leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The bucket is being ensured: calls reply `unavailable`.
    Starting,
    /// The bucket is there with per-message TTL.
    Ready,
    /// The server cannot do per-message TTL: calls reply `unsupported`.
    Unsupported,
}

/// What a [`Transmit`] is for, so an adapter can route and count it without
/// reading the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransmitKind {
    /// A leader read of a key.
    Read,
    /// A conditional write of a key: a stream write, which a service may hand to
    /// its write coalescer.
    Write,
    /// A read confirmation: a stream write too.
    Confirm,
    /// A request to an owner's inbox.
    Inbox,
    /// A request to the lease service, to this endpoint.
    Lease(Endpoint),
    /// A JetStream API request (stream info, create, update).
    Api,
}

impl TransmitKind {
    /// Whether this is a write to the leases stream (a write or a confirmation).
    pub fn is_stream_write(self) -> bool {
        matches!(self, Self::Write | Self::Confirm)
    }
}

/// One request a machine wants sent, the same at every level (a call's typed
/// [`CallRequest`](crate::call_request::CallRequest) becomes one; a campaign's
/// adds its key): publish each of `publish` in order (no reply wanted), then
/// send `request` and feed its outcome back with `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Feed the outcome of `request` back with this id.
    pub id: TransmitId,
    /// What it is for.
    pub kind: TransmitKind,
    /// Messages to publish first: an atomic batch's before its commit; usually empty.
    pub publish: Vec<NatsRequest>,
    /// The request whose reply is the outcome.
    pub request: NatsRequest,
}

impl Transmit {
    /// One request, nothing published before it.
    pub fn new(id: TransmitId, kind: TransmitKind, request: NatsRequest) -> Self {
        Self {
            id,
            kind,
            publish: Vec::new(),
            request,
        }
    }
}

/// A call to the lease service: `body` to `endpoint`'s subject, bounded by
/// `timeout` (the machine that asks times it out itself too).
pub fn lease_call(
    id: TransmitId,
    endpoint: Endpoint,
    body: Vec<u8>,
    timeout: Duration,
) -> Transmit {
    let request = NatsRequest {
        subject: endpoint.subject(),
        headers: Vec::new(),
        payload: body,
        timeout,
    };
    Transmit::new(id, TransmitKind::Lease(endpoint), request)
}

/// How long the last flush waits for the server.
pub const FLUSH_BOUND: Duration = Duration::from_secs(1);

/// How long a machine whose loop must end on its own (the service's reply, the
/// campaign's subscribe or reject reply, a waiting acquire's subscribe) waits for
/// the NATS client to take one command: async-nats queues commands and, while it
/// reconnects to a server that is gone, stops taking them once its queue is full.
/// Past the bound the machine gives the command up and its adapter drops it (a
/// missed change event or reject costs a retry, never correctness), so no stop or
/// bounded wait is held by it.
pub const HANDOFF_BOUND: Duration = Duration::from_secs(1);
