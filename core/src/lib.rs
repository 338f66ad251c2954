//! The sans-IO core of dagnats-leases.
//!
//! Replicas of a service elect a leader or split shard ownership by asking the lease
//! service over NATS request/reply; the NATS server enforces each lease's TTL and
//! the key's KV revision is the fencing token. This crate holds every lease rule as
//! pure, synchronous state machines: wire types and strict validation ([`wire`]),
//! the record in the bucket ([`record`]), how JetStream's answers are read ([`js`]),
//! one machine per call ([`call`]), the write coalescer that gathers the
//! calls' writes into atomic batches ([`coalesce`]) and bucket startup ([`startup`]); and the holder
//! side: a campaigning, renewing [`holder::Holder`], every campaign of one process
//! ([`campaign::Campaign`]: groups, caps, the inbox), change events ([`change`]),
//! and the owner-side and downstream checks of [`guard`].
//!
//! # Determinism
//!
//! Nothing here does IO, reads a clock, spawns, sleeps or locks. Time comes in as
//! arguments (`now: Instant` for deadlines, `wall: OffsetDateTime` for the
//! timestamps replies carry) and the result of every effect comes back as an input
//! tagged with its [`call::EffectId`]. The same inputs always give the same effects.
//!
//! # One vocabulary
//!
//! Every machine ([`call::Call`], [`startup::Startup`], [`holder::Holder`],
//! [`campaign::Campaign`]) is driven the same way:
//!
//! - inputs are `handle_*(now, …)`; the result of a request comes back as
//!   `handle_outcome(now, id, outcome)`, tagged with the request's [`js::EffectId`];
//! - outputs are drained with `poll_*` after every input, each request ready to
//!   send as one [`js::NatsRequest`] (`nats_request()`);
//! - `poll_timeout()` is the one instant to wake at; `handle_timeout(now)` acts on
//!   it. A machine keeps its own request deadlines: a request unanswered within
//!   its timeout becomes [`js::RequestOutcome::TimedOut`] there, so an adapter
//!   needs no timer per request;
//! - `is_done()` means finished, with nothing left to poll.
//!
//! # Driving a call
//!
//! After every input, drain the effects until none is left (the drain invariant):
//!
//! ```no_run
//! use std::time::Instant;
//! use dagnats_leases_core::call::{Call, CallConfig, Effect};
//! use dagnats_leases_core::js::RequestOutcome;
//! use dagnats_leases_core::wire::Endpoint;
//!
//! # fn send(_: &dagnats_leases_core::js::NatsRequest) -> RequestOutcome { unimplemented!() }
//! # fn respond(_: Vec<u8>) {}
//! let body = br#"{"key":"notify-leader","holder":"notify-7f3a","ttl_ms":15000}"#;
//! let mut call = Call::new(
//!     CallConfig::ready(1024 * 1024),
//!     Instant::now(),
//!     time::OffsetDateTime::now_utc(),
//!     Endpoint::Acquire,
//!     body,
//! );
//! while let Some(effect) = call.poll_effect() {
//!     match effect {
//!         Effect::Reply(response) => respond(response.to_json()),
//!         other => {
//!             let (id, request) = other.nats_request().expect("not a reply");
//!             let outcome = send(&request); // one NATS request, in the adapter
//!             call.handle_outcome(Instant::now(), id, outcome);
//!         }
//!     }
//! }
//! ```
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![warn(clippy::use_self)]

pub mod admit;
pub mod call;
pub mod campaign;
pub mod change;
pub mod coalesce;
pub mod effect;
pub mod guard;
pub mod holder;
pub mod js;
pub mod record;
pub mod startup;
pub mod subjects;
pub mod supervise;
pub mod wire;

#[cfg(any(test, feature = "__test"))]
#[doc(hidden)]
pub mod sim;

#[cfg(any(test, feature = "__test"))]
#[doc(hidden)]
pub mod test_support;

pub use call::{Call, CallConfig, Effect, EffectId, Mode};
pub use campaign::{Campaign, CampaignEvent, GroupId};
pub use change::{ChangeEvent, ChangeKind};
pub use guard::{FenceGuard, InboxGuard};
pub use holder::{Holder, HolderConfig, HolderEvent};
pub use js::{NatsRequest, RequestOutcome};
pub use wire::{Endpoint, ErrorKind, Request, Response};

#[cfg(test)]
mod tests;
