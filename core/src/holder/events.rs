//! What a [`Holder`](super::Holder) tells its driver: its events, why it stepped
//! down, where it is in its life, and the tenure it is in.

use std::fmt;
use std::time::Instant;

use crate::outcome::OutcomeClass;
use crate::wire::ErrorKind;

/// Why a holder stopped acting as owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StepDownReason {
    /// The service said the lease is no longer this holder's (`lost`, or a
    /// `fence_mismatch` whose recovery found another holder).
    Lost,
    /// The local deadline passed without a successful renewal.
    DeadlineMissed,
    /// The application asked to stop (the lease is released).
    Stopped,
    /// The application handed the key over (the lease is released now, and this
    /// member asks for the key again only after a campaign interval, so a waiting
    /// member is elected first).
    HandedOver,
    /// The service refused the request for good (`invalid` or `unsupported`).
    Failed,
    /// The library gives the key up by itself (a shard shed for balance, a semaphore
    /// slot given up): stop writes now. The lease is kept, not renewed, until
    /// `deadline` (the last one handed out) or until the application says it is
    /// done with the key, and only then released.
    Revoked {
        /// The last deadline handed out for the key; no later one will be.
        deadline: Instant,
    },
    /// The member's health check failed for longer than its group allows (the
    /// health gate of [`campaign`](super::campaign)): stop writes now. Like
    /// [`StepDownReason::Revoked`], the lease is kept, not renewed, until
    /// `deadline` or until the application says it is done with the key, and only
    /// then released.
    Unhealthy {
        /// The last deadline handed out for the key; no later one will be.
        deadline: Instant,
    },
}

impl fmt::Display for StepDownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Lost => "lost",
            Self::DeadlineMissed => "deadline_missed",
            Self::Stopped => "stopped",
            Self::HandedOver => "handed_over",
            Self::Failed => "failed",
            Self::Revoked { .. } => "revoked",
            Self::Unhealthy { .. } => "unhealthy",
        })
    }
}

/// What changed about this holder's ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderEvent {
    /// A tenure began: act as owner until `deadline`, fencing writes with `fence`.
    Elected {
        /// The start of the tenure: the revision of the renew that confirmed the
        /// grant, above every fence an earlier tenure of this holder ID handed out.
        fence: u64,
        /// The local deadline, on the holder's clock.
        deadline: Instant,
    },
    /// A renewal succeeded: the same tenure, a higher fence, a later deadline.
    Renewed {
        /// The tenure's start fence (the `fence` of its `Elected`).
        tenure: u64,
        /// The new fence.
        fence: u64,
        /// The new local deadline.
        deadline: Instant,
    },
    /// Stop acting as owner now.
    SteppedDown {
        /// Why.
        reason: StepDownReason,
    },
    /// An acquire while campaigning did not win the key: `holder` has it, or
    /// (`None`) no usable answer came. The holder asks again later; `lock --wait`
    /// gives up on it once its wait has passed.
    NotGranted {
        /// The holder the service named, if it answered.
        holder: Option<String>,
        /// What came back: [`OutcomeClass::Clear`] when the service answered,
        /// [`OutcomeClass::NoResponders`] when no lease service is there at all.
        answer: OutcomeClass,
    },
    /// The service refused for good; the holder is done.
    Failed {
        /// The error kind the service replied with.
        kind: ErrorKind,
        /// Its sentence.
        message: String,
    },
}

/// Where a [`Holder`](super::Holder) is in its life ([`Holder::status`](super::Holder::status)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HolderStatus {
    /// Not owner; asking for the key.
    Campaigning,
    /// Granted, proving the lease fresh with a renew before acting as owner.
    Confirming,
    /// Owner until the local deadline (check [`Holder::tenure`](super::Holder::tenure)
    /// for the instant).
    Owner,
    /// Stepped down for good; releasing (once a revocation's hold is over).
    Stopping,
    /// Finished.
    Done,
}

/// The tenure a holder is in, while its deadline has not passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenure {
    /// The fence that began the tenure (the confirming renew's revision).
    pub tenure: u64,
    /// The latest fence (the revision of the last acquire or renew).
    pub fence: u64,
    /// The local deadline.
    pub deadline: Instant,
}
