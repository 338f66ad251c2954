//! The exit codes of the `dagnats-leases` and `dagnats-leases-smol` binaries, in
//! one place, and the code of a failed call ([`exit_code`], which the commands and
//! `lock` both return). The tokio crate's `commands` and `lock`, and [`crate::cli`],
//! re-export the ones they return.

use dagnats_leases_core::wire::ErrorKind;

use crate::client::{LeaseError, LeaseErrorKind};

/// The codes `lock`'s machines decide (its watchdog reports them) are the core's.
pub use dagnats_leases_core::holder::supervise::{
    EXIT_BAD_GRACE, EXIT_CANNOT_RUN, EXIT_ERROR, EXIT_LEASE_LOST,
};

/// Done.
pub const EXIT_OK: u8 = 0;
/// `serve`: the service could not start (the same code as [`EXIT_ERROR`]).
pub const EXIT_START_FAILED: u8 = 1;
/// Nothing answers: no NATS server could be reached, or no lease service runs on
/// it (clap also uses 2 for bad arguments).
pub const EXIT_NO_SERVER: u8 = 2;
/// The lease is not the caller's, or nobody holds it.
pub const EXIT_NOT_HELD: u8 = 3;
/// `fence_mismatch`: acquire again to learn the current fence.
pub const EXIT_FENCE_MISMATCH: u8 = 4;

/// The exit code of a failed call.
pub fn exit_code(e: &LeaseError) -> u8 {
    match e.kind() {
        LeaseErrorKind::ErrorReply(ErrorKind::Lost | ErrorKind::NotHeld) => EXIT_NOT_HELD,
        LeaseErrorKind::ErrorReply(ErrorKind::FenceMismatch) => EXIT_FENCE_MISMATCH,
        LeaseErrorKind::Connection | LeaseErrorKind::NoService => EXIT_NO_SERVER,
        _ => EXIT_ERROR,
    }
}
