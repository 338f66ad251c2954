//! The sans-IO core of dagnats-leases.
//!
//! Replicas of a service elect a leader or split shard ownership by asking the lease
//! service over NATS request/reply; the NATS server enforces each lease's TTL and
//! the key's KV revision is the fencing token. This crate holds every lease rule as
//! pure, synchronous state machines, in three layers; each imports only from the
//! layers below it.
//!
//! - **The service** ([`service`]): [`service::Service`], one machine composing all
//!   of its parts, which live beside it: bucket startup ([`service::startup`]), the
//!   replicas re-check that turns read confirmation on and off
//!   ([`service::replicas`]), the write coalescer that gathers the calls' writes into
//!   atomic batches ([`service::coalesce`]), admission of requests under load
//!   ([`service::admit`]), the tombstone sweep ([`service::sweep`]), the `$SRV`
//!   verbs ([`service::micro`]) and the stop ([`service::shutdown`]). It runs one
//!   machine per call ([`call`]).
//! - **The holder side** ([`holder`]): a campaigning, renewing [`holder::Holder`],
//!   every campaign of one process ([`holder::campaign::Campaign`]: groups, caps, the
//!   inbox, which change events to watch), the client's waiting acquire
//!   ([`holder::acquire_wait`]), the owner-side and downstream checks of
//!   [`holder::guard`], `elect`'s decisions ([`holder::elect`]) and `lock`'s supervision
//!   ([`holder::supervise`]).
//! - **The shared vocabulary** both sides speak: wire types and strict validation
//!   ([`wire`]), the subjects ([`subjects`]), the record in the bucket ([`record`]),
//!   how JetStream's answers are read ([`js`]), the sharded bucket ([`shard`]), change
//!   events ([`change`]), the I/O types every machine shares ([`io`]), how a machine
//!   keeps its ids, deadlines, requests out and hand-offs ([`outbox`]), the requests a
//!   call asks for ([`call_request`]), the strict NATS
//!   client protocol ([`proto`]), connection health and readiness ([`health`]), what
//!   the service knows of leases ([`known`]), tenancy ([`tenant`]) and the reply rule
//!   ([`reply_scope`]).
//!
//! # Determinism
//!
//! Nothing here does IO, reads a clock, spawns, sleeps or locks. Time comes in as
//! arguments (`now: Instant` for deadlines, `wall: OffsetDateTime` for the
//! timestamps replies carry) and the result of every effect comes back as an input
//! tagged with its [`io::TransmitId`]. The same inputs always give the same effects.
//!
//! # One vocabulary
//!
//! Every machine ([`service::Service`], [`call::Call`], [`service::startup::Startup`],
//! [`service::replicas::ReplicasCheck`], [`service::coalesce::Coalescer`],
//! [`holder::Holder`], [`holder::campaign::Campaign`],
//! [`holder::acquire_wait::WaitingAcquire`], [`holder::supervise::Supervisor`],
//! [`holder::supervise::Lock`], [`service::admit::Admission`]) is driven
//! the same way, in the types of [`io`] (`lock`'s supervision sends nothing: its
//! `poll_transmit` is always `None`; admission neither sends nor waits, so it has
//! neither `poll_transmit` nor `poll_timeout`):
//!
//! - inputs are `handle_*(now, …)`; the result of a request comes back as
//!   `handle_outcome(now, id, outcome)`, tagged with the [`io::TransmitId`] it was
//!   sent with;
//! - `poll_transmit()` gives the next [`io::Transmit`] to send (one NATS request,
//!   with its id, and its [`io::TransmitKind`] for routing and metrics);
//! - `poll_event()` gives the next thing that happened (a call's reply, a holder's
//!   election, startup's log lines and its end);
//! - `poll_timeout()` is the one instant to wake at; `handle_timeout(now)` acts on
//!   it. A machine keeps its own request deadlines: a request unanswered within
//!   its timeout becomes [`io::RequestOutcome::TimedOut`] there, so an adapter
//!   needs no timer per request;
//! - `is_done()` means finished for good, with nothing left to poll. The service's
//!   long-lived parts (`Coalescer`, `Admission`, `TombstoneSweep`) say `is_idle()`
//!   instead: nothing queued or in flight now; `Shutdown` says `is_stopped()`: the
//!   stop is over.
//!
//! # Driving a call
//!
//! After every input, drain the outputs until none is left (the drain invariant);
//! with nothing to send and nothing happened, sleep until `poll_timeout()`:
//!
//! ```
//! use std::time::Instant;
//! use dagnats_leases_core::call::{Call, CallConfig, CallEvent};
//! use dagnats_leases_core::io::{TransmitId, NatsRequest, RequestOutcome};
//! use dagnats_leases_core::outbox::Ids;
//! use dagnats_leases_core::wire::{Endpoint, Response};
//!
//! /// The adapter's one NATS request (here JetStream stores the create at revision 1).
//! fn send(_: &NatsRequest) -> RequestOutcome {
//!     RequestOutcome::reply(r#"{"stream":"KV_leases","seq":1}"#)
//! }
//!
//! let body = br#"{"key":"notify-leader","holder":"notify-7f3a","ttl_ms":15000}"#;
//! let mut now = Instant::now();
//! let wall = time::OffsetDateTime::now_utc();
//! let mut call = Call::new(CallConfig::ready(1024 * 1024), Endpoint::Acquire, body, wall, now);
//! // The call's owner names its requests (the service does, from one id space).
//! let mut ids = Ids::<TransmitId>::starting_from(1);
//! let reply = 'call: loop {
//!     while let Some(transmit) = call.poll_transmit(&mut ids) {
//!         let outcome = send(&transmit.request); // an adapter races this against the timer
//!         call.handle_outcome(now, transmit.id, outcome);
//!     }
//!     while let Some(event) = call.poll_event() {
//!         match event {
//!             CallEvent::Replied(reply) => break 'call reply,
//!             CallEvent::Kv(_fact) => {} // a metric: a confirmation sent, a request failed
//!         }
//!     }
//!     // Waiting: sleep until the one timer, then fire it.
//!     now = call.poll_timeout().expect("a waiting call has a deadline");
//!     call.handle_timeout(now);
//! };
//! assert!(call.is_done());
//! assert!(matches!(reply, Response::Acquired(a) if a.granted));
//! ```
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![warn(clippy::use_self)]

pub mod call;
pub mod call_request;
pub mod change;
pub mod health;
pub mod holder;
pub mod io;
pub mod js;
pub mod known;
pub mod outbox;
pub mod outcome;
pub mod proto;
pub mod record;
pub mod reply_scope;
pub mod service;
pub mod shard;
pub mod subjects;
pub mod tenant;
pub mod wire;

#[cfg(any(test, feature = "__test"))]
#[doc(hidden)]
pub mod sim;

#[cfg(any(test, feature = "__test"))]
#[doc(hidden)]
pub mod test_support;

pub use call::{Call, CallConfig, CallEvent, CallRequest};
pub use change::{ChangeEvent, ChangeKind};
pub use holder::campaign::{Campaign, CampaignEvent, GroupId};
pub use holder::guard::{FenceGuard, InboxGuard};
pub use holder::{Holder, HolderConfig, HolderEvent, Tenure};
pub use io::{Mode, NatsRequest, RequestOutcome, Transmit, TransmitId, TransmitKind};
pub use wire::{Endpoint, ErrorKind, Request, Response};

#[cfg(test)]
mod tests;
