//! Typed calls to the lease service: acquire, renew, release, owner and forward.
//!
//! Each call is one NATS request to `api.leases.*`; protocol refusals (`lost`,
//! `fence_mismatch`, `not_held`, ...) come back as a [`LeaseError`] whose kind is
//! [`LeaseErrorKind::ErrorReply`], so `?` works and a `match` on the kind tells them
//! apart. `granted: false` on acquire is a normal answer, not an error.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::{Duration, Instant};
//! use dagnats_leases_nats::client::LeaseClient;
//!
//! let nats = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let leases = LeaseClient::new(nats);
//! let reply = leases.acquire("notify-leader", "notify-7f3a", Duration::from_secs(15)).await?;
//! if reply.granted {
//!     let renewed = leases.renew("notify-leader", "notify-7f3a", reply.lease.revision, None).await?;
//!     leases.release("notify-leader", "notify-7f3a", renewed.revision).await?;
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, Subscriber};
use base64::Engine as _;
use dagnats_leases_core::change::ChangeEvent;
use dagnats_leases_core::holder::acquire_wait::{WaitingAcquire, WaitingAcquireEvent};
use dagnats_leases_core::outcome::Answer;
use dagnats_leases_core::subjects::changed_subject;
use dagnats_leases_core::wire::{
    AcquireReply, AcquireRequest, Endpoint, ErrorKind, ErrorReply, ForwardRequest, Lease,
    OwnerRequest, ReleaseReply, ReleaseRequest, RenewRequest, Request, Response,
    forward_client_wait,
};
use dagnats_leases_core::{NatsRequest, RequestOutcome};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use crate::nats_request;
use crate::runtime::Runtime;
#[cfg(feature = "runtime-tokio")]
use crate::runtime::TokioRuntime;

/// How long a call waits for the service by default.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What kind of failure a [`LeaseError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseErrorKind {
    /// The service answered with an error reply of this kind (`lost`, `not_held`, ...).
    ErrorReply(ErrorKind),
    /// No lease service subscribes to the subject: none is running.
    NoService,
    /// No reply within the call's timeout (the call may have taken effect).
    TimedOut,
    /// The connection to NATS failed.
    Connection,
    /// The reply is not what the contract says a reply looks like.
    BadReply,
}

impl LeaseErrorKind {
    /// Its snake_case name, as `--json` prints it beside the service's kinds: a
    /// refusal's own (`lost`, `not_held`, ...), else `no_service`, `timed_out`,
    /// `connection` or `bad_reply`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ErrorReply(kind) => kind.as_str(),
            Self::NoService => "no_service",
            Self::TimedOut => "timed_out",
            Self::Connection => "connection",
            Self::BadReply => "bad_reply",
        }
    }
}

/// A failed lease call, in async-nats' `Error<Kind>` style.
#[derive(Debug, Clone)]
pub struct LeaseError {
    kind: LeaseErrorKind,
    message: String,
    reply: Option<ErrorReply>,
}

impl LeaseError {
    pub(crate) fn new(kind: LeaseErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            reply: None,
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> LeaseErrorKind {
        self.kind
    }

    /// The service's error reply, when it refused (forward errors name the owner tried).
    pub fn reply(&self) -> Option<&ErrorReply> {
        self.reply.as_ref()
    }

    /// Whether the caller must stop acting as owner: `lost`.
    pub fn is_lost(&self) -> bool {
        self.kind == LeaseErrorKind::ErrorReply(ErrorKind::Lost)
    }
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            LeaseErrorKind::ErrorReply(kind) => write!(f, "{kind}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for LeaseError {}

impl From<ErrorReply> for LeaseError {
    fn from(reply: ErrorReply) -> Self {
        Self {
            kind: LeaseErrorKind::ErrorReply(reply.kind),
            message: reply.error.clone(),
            reply: Some(reply),
        }
    }
}

/// Turns what came of a request into the reply, or the error it is, as the
/// core reads it ([`Answer`]).
pub fn reply_of(endpoint: Endpoint, outcome: RequestOutcome) -> Result<Response, LeaseError> {
    match Answer::of(endpoint, outcome) {
        Answer::Reply(reply) => Ok(reply),
        Answer::Error(e) => Err(e.into()),
        Answer::Unreadable(why) => Err(LeaseError::new(LeaseErrorKind::BadReply, why)),
        Answer::NoResponders => Err(LeaseError::new(
            LeaseErrorKind::NoService,
            format!("no lease service answers on {}", endpoint.subject()),
        )),
        Answer::TimedOut => Err(LeaseError::new(
            LeaseErrorKind::TimedOut,
            format!("{} timed out (it may have taken effect)", endpoint.name()),
        )),
        Answer::Failed(why) => Err(LeaseError::new(LeaseErrorKind::Connection, why)),
    }
}

/// What came of a waiting acquire's subscribe or flush, for its machine.
enum Setup {
    /// The subscription, or `None`: it failed.
    Subscribed(Option<Subscriber>),
    Flushed,
}

/// A forward's answer: the owner's reply body and who gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    /// The owner's reply body.
    pub payload: Vec<u8>,
    /// The owner that answered.
    pub holder: String,
    /// The revision of the lease it answered under.
    pub revision: u64,
}

/// Calls the lease service over one NATS connection. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LeaseClient {
    nats: Client,
    timeout: Duration,
    runtime: Arc<dyn Runtime>,
}

impl LeaseClient {
    /// A client with the default call timeout (10 s), timing its calls on tokio.
    #[cfg(feature = "runtime-tokio")]
    pub fn new(nats: Client) -> Self {
        Self::with_runtime(nats, TokioRuntime::shared())
    }

    /// A client whose call timeouts run on `runtime`'s timer.
    pub fn with_runtime(nats: Client, runtime: Arc<dyn Runtime>) -> Self {
        Self {
            nats,
            timeout: DEFAULT_CALL_TIMEOUT,
            runtime,
        }
    }

    /// The same client with another call timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The NATS connection underneath.
    pub fn nats(&self) -> &Client {
        &self.nats
    }

    /// One request to the service, answered or timed out after `timeout`: no
    /// machine keeps a deadline for a one-shot call, so the request keeps its own
    /// timer ([`nats_request::send`]; the waiting acquire and the holder's campaign send
    /// untimed, their machines' deadlines timing them).
    async fn call(&self, request: Request, timeout: Duration) -> Result<Response, LeaseError> {
        // The service's own validation, run here first: bad input fails before any
        // request, with the same sentence the service would reply.
        let endpoint = request.endpoint();
        let payload = request.to_json();
        Request::decode(endpoint, &payload)?;
        let outcome = nats_request::send(
            &*self.runtime,
            &self.nats,
            NatsRequest {
                subject: endpoint.subject(),
                headers: Vec::new(),
                payload,
                timeout,
            },
        )
        .await;
        reply_of(endpoint, outcome)
    }

    fn unexpected(endpoint: Endpoint, reply: Response) -> LeaseError {
        LeaseError::new(
            LeaseErrorKind::BadReply,
            format!("unexpected {} reply: {reply:?}", endpoint.name()),
        )
    }

    /// Asks for `key` for `ttl` (whole seconds). `granted: false` names the holder.
    pub async fn acquire(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<AcquireReply, LeaseError> {
        let request = Request::Acquire(AcquireRequest {
            key: key.into(),
            holder: holder.into(),
            ttl_ms: millis(ttl),
        });
        match self.call(request, self.timeout).await? {
            Response::Acquired(r) => Ok(r),
            other => Err(Self::unexpected(Endpoint::Acquire, other)),
        }
    }

    /// Acquires `key`, waiting up to `wait` for it while another holder has it:
    /// asks again on each change event that may free the key (release, expiry,
    /// delete), not by polling. Change events are at-most-once, so it also asks
    /// again one TTL after the last write it saw. `wait` zero tries once. Returns
    /// the last `granted: false` when the wait ends without the lease.
    pub async fn acquire_waiting(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<AcquireReply, LeaseError> {
        self.acquire_waiting_noting(key, holder, ttl, wait, &mut |_| {})
            .await
    }

    /// [`Self::acquire_waiting`], calling `not_granted` with each `granted: false` it
    /// waits on (its reply names the current holder): what `acquire --wait`
    /// prints while it waits.
    pub async fn acquire_waiting_noting(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        wait: Duration,
        not_granted: &mut (dyn FnMut(&AcquireReply) + Send),
    ) -> Result<AcquireReply, LeaseError> {
        let request = AcquireRequest {
            key: key.into(),
            holder: holder.into(),
            ttl_ms: millis(ttl),
        };
        Request::decode(
            Endpoint::Acquire,
            &Request::Acquire(request.clone()).to_json(),
        )?;
        // The machine subscribes before the first try and flushes, each within its
        // bound; the client runs them untimed and drops one the machine gives up.
        let mut events: Option<Subscriber> = None;
        let mut setup: Option<BoxFuture<'_, Setup>> = None;
        let mut waiting = WaitingAcquire::new(request, self.timeout, wait, self.runtime.now());
        let mut asking = None;
        loop {
            while let Some(t) = waiting.poll_transmit() {
                let send = nats_request::send_untimed(&self.nats, t.request);
                asking = Some((t.id, Box::pin(send)));
            }
            while let Some(event) = waiting.poll_event() {
                match event {
                    WaitingAcquireEvent::Subscribe => {
                        let subscribe = self.nats.subscribe(changed_subject(key));
                        setup = Some(subscribe.map(|s| Setup::Subscribed(s.ok())).boxed());
                    }
                    WaitingAcquireEvent::Flush => {
                        setup = Some(self.nats.flush().map(|_| Setup::Flushed).boxed());
                    }
                    WaitingAcquireEvent::CancelSubscribe | WaitingAcquireEvent::CancelFlush => {
                        setup = None;
                    }
                    WaitingAcquireEvent::NotGranted(reply) => not_granted(&reply),
                    WaitingAcquireEvent::Done(reply) => return Ok(reply),
                    WaitingAcquireEvent::Failed(outcome) => {
                        return Err(match reply_of(Endpoint::Acquire, outcome) {
                            Err(e) => e,
                            Ok(other) => Self::unexpected(Endpoint::Acquire, other),
                        });
                    }
                }
            }
            let timer = async {
                match waiting.poll_timeout() {
                    Some(at) => self.runtime.sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let event = async {
                match events.as_mut() {
                    Some(sub) => sub.next().await,
                    None => std::future::pending().await,
                }
            };
            let answer = async {
                match asking.as_mut() {
                    Some((id, send)) => (*id, send.await),
                    None => std::future::pending().await,
                }
            };
            let set_up = async {
                match setup.as_mut() {
                    Some(step) => step.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                done = set_up => {
                    setup = None;
                    let now = self.runtime.now();
                    match done {
                        Setup::Subscribed(sub) => {
                            let made = sub.is_some();
                            events = sub;
                            waiting.handle_subscribed(now, made);
                        }
                        Setup::Flushed => waiting.handle_flushed(now),
                    }
                }
                (id, outcome) = answer => {
                    asking = None;
                    waiting.handle_outcome(self.runtime.now(), id, outcome);
                }
                message = event => match message {
                    Some(m) => waiting.handle_change(self.runtime.now(), &change_event(&m)),
                    None => events = None,
                },
                () = timer => waiting.handle_timeout(self.runtime.now()),
            }
        }
    }

    /// Extends the lease under the fence `revision`, to `ttl` or the lease's own TTL.
    pub async fn renew(
        &self,
        key: &str,
        holder: &str,
        revision: u64,
        ttl: Option<Duration>,
    ) -> Result<Lease, LeaseError> {
        let request = Request::Renew(RenewRequest {
            key: key.into(),
            holder: holder.into(),
            revision,
            ttl_ms: ttl.map(millis),
        });
        match self.call(request, self.timeout).await? {
            Response::Lease(l) => Ok(l),
            other => Err(Self::unexpected(Endpoint::Renew, other)),
        }
    }

    /// Frees the key under the fence `revision`.
    pub async fn release(
        &self,
        key: &str,
        holder: &str,
        revision: u64,
    ) -> Result<ReleaseReply, LeaseError> {
        let request = Request::Release(ReleaseRequest {
            key: key.into(),
            holder: holder.into(),
            revision,
        });
        match self.call(request, self.timeout).await? {
            Response::Released(r) => Ok(r),
            other => Err(Self::unexpected(Endpoint::Release, other)),
        }
    }

    /// Who holds `key`, read through the stream leader; `None` when nobody does.
    pub async fn owner(&self, key: &str) -> Result<Option<Lease>, LeaseError> {
        let request = Request::Owner(OwnerRequest { key: key.into() });
        match self.call(request, self.timeout).await? {
            Response::Lease(l) => Ok(Some(l)),
            Response::Free(_) => Ok(None),
            other => Err(Self::unexpected(Endpoint::Owner, other)),
        }
    }

    /// Sends `payload` to whoever holds `key` and returns its reply; `timeout` (100 ms
    /// to 30 s) bounds the whole call on the service's side.
    pub async fn forward(
        &self,
        key: &str,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Forwarded, LeaseError> {
        let request = Request::Forward(ForwardRequest {
            key: key.into(),
            payload: payload.to_vec(),
            timeout_ms: millis(timeout),
        });
        let wait = forward_client_wait(timeout);
        match self.call(request, wait).await? {
            Response::Forwarded(r) => {
                let payload = base64::engine::general_purpose::STANDARD
                    .decode(&r.payload)
                    .map_err(|e| {
                        LeaseError::new(
                            LeaseErrorKind::BadReply,
                            format!("forward reply payload is not base64: {e}"),
                        )
                    })?;
                Ok(Forwarded {
                    payload,
                    holder: r.holder,
                    revision: r.revision,
                })
            }
            other => Err(Self::unexpected(Endpoint::Forward, other)),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Decodes a change event (`dagnats.lease.changed.<key>`) from its NATS message.
pub fn change_event(message: &async_nats::Message) -> ChangeEvent {
    let headers = message.headers.as_ref();
    ChangeEvent::from_parts(
        |name| headers.and_then(|h| h.get(name)).map(|v| v.as_str()),
        &message.payload,
    )
}
