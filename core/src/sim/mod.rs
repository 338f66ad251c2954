//! A deterministic simulated JetStream KV and a world of concurrent calls, for the
//! core's property tests and the fuzzer. Not public API (`__test` feature).
//!
//! The simulator answers the same NATS requests a real server would, with the same
//! JSON: revisions are one sequence across the bucket, writes check the expected
//! last subject sequence, messages carry a per-message TTL, and an expiry leaves a
//! `MaxAge` marker that expires in turn. Time is a virtual millisecond clock.
//!
//! A stream can also be a *deposed leader* ([`SimJetStream::deposed`]): a frozen
//! copy of an older state that still answers reads from it, refuses from that
//! state a write it expects to fail, and cannot commit any other (the caller times
//! out), as a cut-off nats-server stream leader does until it steps down.
//!
//! The simulated stream is in `jetstream`; the steps a world takes are in `ops` (the
//! operation grammar), the world that carries them out in `world`, and the
//! invariants it checks after each in `judge`: a world of calls through the
//! [`Service`](crate::service::Service), each of its transmits carried out one at
//! a time, which judges every write and reply of each call. The holder world
//! (`holder_world`) runs holders and members against the service over the same
//! stream, as does the service world (`service_world`) with requests of its own;
//! all three answer the service through `server` (the stream API and the change
//! events it republishes).

pub mod holder_world;
mod jetstream;
mod judge;
mod ops;
pub mod server;
pub mod service_world;
mod world;

pub use jetstream::*;
pub use ops::{Op, OwnerBehaviour, ops_from_bytes};
pub use world::{CallKind, Mutant, Reads, Violation, World};
