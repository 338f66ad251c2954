//! Wire types of the five lease subjects: strict request decoding, input bounds,
//! replies exactly as the contract shapes them, and the error kinds.
//!
//! Files: this one only names the parts and re-exports them; `endpoint.rs` holds
//! the subjects, `bounds.rs` the input bounds and their checks, `error.rs` the
//! error kinds and the error reply, `request.rs` the requests with their strict
//! decoding, `reply.rs` the replies, `renew_many.rs` the batched renewal's request
//! and reply.

mod bounds;
mod endpoint;
mod error;
mod renew_many;
mod reply;
mod request;

pub use bounds::{
    FORWARD_HOP_ROOM, MAX_FORWARD_TIMEOUT_MS, MAX_NAME_LEN, MAX_TTL_MS, MIN_FORWARD_TIMEOUT_MS,
    MIN_TTL_MS, check_name, check_ttl, forward_client_wait,
};
pub use endpoint::Endpoint;
pub use error::{ErrorKind, ErrorReply};
pub(crate) use renew_many::decode_renew_many_items;
/// The way of record alone, for the test that holds the one pass to it.
#[cfg(test)]
pub(crate) use renew_many::decode_renew_many_of_record;
pub use renew_many::{
    MAX_RENEW_MANY, RENEW_MANY, RenewBody, RenewManyReply, RenewManyRequest, RenewManyResult,
    decode_renew_many, renew_many_subject,
};
pub use reply::{AcquireReply, ForwardReply, FreeReply, Lease, ReleaseReply, Response};
pub use request::{
    AcquireRequest, ForwardRequest, ForwardRequestWire, OwnerRequest, ReleaseRequest, RenewRequest,
    Request,
};
