//! What a member's driver relays of its campaign, and when it ends: each holder
//! event read once ([`Heard::of`]) and passed on as its listener hears it
//! ([`Heard::for_listener`]): the application hears ownership changes only; a
//! supervisor that keeps a process under the lease (`lock`) hears renewals and
//! refusals too; a refusal for good is the operator's (logged, heard by
//! nobody). The driver forwards what this says and ends when
//! [`Campaign::driver_may_end`] says.

use std::time::Instant;

use crate::holder::campaign::Campaign;
use crate::holder::supervise::NotGranted;
use crate::holder::{HolderEvent, StepDownReason};
use crate::wire::ErrorKind;

/// A change of ownership of one key, as the application hears it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// This process owns the key: fence every downstream write with `fence`.
    Elected {
        /// The revision that began the tenure: the renew's that confirmed the grant,
        /// above every fence an earlier tenure of this holder ID handed out.
        fence: u64,
    },
    /// Stop acting as owner of the key now. For [`StepDownReason::Revoked`] and
    /// [`StepDownReason::Unhealthy`], writes already under way may finish before its
    /// `deadline`; then say the application is done with the key, so it moves
    /// without waiting for it.
    SteppedDown {
        /// Why.
        reason: StepDownReason,
    },
}

/// One holder event as a campaign's listeners read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// Elected under `fence`, owner until `deadline`.
    Elected {
        /// The tenure's fence.
        fence: u64,
        /// Its local deadline.
        deadline: Instant,
    },
    /// Stepped down.
    SteppedDown {
        /// Why.
        reason: StepDownReason,
    },
    /// A renewal: the tenure's new deadline.
    Renewed {
        /// The new local deadline.
        deadline: Instant,
    },
    /// An acquire did not win the key.
    NotGranted {
        /// Why, as `lock` tells it.
        why: NotGranted,
        /// The holder the service named, if it did.
        holder: Option<String>,
    },
    /// The service refused this holder for good.
    Failed {
        /// The error kind it replied with.
        kind: ErrorKind,
        /// Its sentence.
        message: String,
    },
}

/// Who listens to a campaign group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// An application: ownership changes only.
    Application,
    /// A supervisor of a process under the lease (`lock`): ownership changes,
    /// renewals and refusals.
    Supervisor,
}

impl Heard {
    /// Reads `event`.
    pub fn of(event: HolderEvent) -> Self {
        match event {
            HolderEvent::Elected { fence, deadline } => Self::Elected { fence, deadline },
            HolderEvent::SteppedDown { reason } => Self::SteppedDown { reason },
            HolderEvent::Renewed { deadline, .. } => Self::Renewed { deadline },
            HolderEvent::NotGranted { holder, answer } => Self::NotGranted {
                why: NotGranted::of(holder.is_some(), answer),
                holder,
            },
            HolderEvent::Failed { kind, message } => Self::Failed { kind, message },
        }
    }

    /// What `listener` hears of it, if anything.
    pub fn for_listener(self, listener: Listener) -> Option<Self> {
        match (&self, listener) {
            (Self::Elected { .. } | Self::SteppedDown { .. }, _) => Some(self),
            (Self::Renewed { .. } | Self::NotGranted { .. }, Listener::Supervisor) => Some(self),
            (Self::Renewed { .. } | Self::NotGranted { .. }, Listener::Application) => None,
            (Self::Failed { .. }, _) => None,
        }
    }

    /// The ownership change it is, if it is one.
    pub fn into_ownership(self) -> Option<Ownership> {
        match self {
            Self::Elected { fence, .. } => Some(Ownership::Elected { fence }),
            Self::SteppedDown { reason } => Some(Ownership::SteppedDown { reason }),
            _ => None,
        }
    }
}

impl Campaign {
    /// Whether a member's driver ends now: every handle of the member is gone
    /// (`member_alive` false) and the campaign is done, and nothing is left to
    /// carry: no request out (each is seen through to its outcome) and no inbox
    /// a handle still reads.
    pub fn driver_may_end(&self, member_alive: bool, requests_out: bool, inbox_open: bool) -> bool {
        !member_alive && self.is_done() && !requests_out && !inbox_open
    }
}
