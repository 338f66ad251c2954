//! The two checks a holder's side of the contract needs besides renewing:
//! [`InboxGuard`], the owner-side reject rules for forwarded requests, and
//! [`FenceGuard`], the fence check a downstream store applies to every write.

use std::collections::HashMap;
use std::fmt;
use std::time::Instant;

use crate::holder::HolderEvent;
use crate::subjects::{HDR_REJECT, INBOX_PREFIX, REJECT_STALE};

/// Why a forwarded request was rejected (the reply is an empty body with
/// `Dagnats-Lease-Reject: stale` in every case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// This holder is not acting as owner of the key: never acquired it, released it,
    /// lost it, or is past its local deadline.
    NotOwner,
    /// `Dagnats-Lease-Fence` is missing.
    MissingFence,
    /// `Dagnats-Lease-Fence` is not an unsigned integer.
    MalformedFence,
    /// The fence is below the revision that began this holder's tenure (for a
    /// [`crate::holder::Holder`], the revision of the renew that confirmed its grant).
    StaleFence,
    /// The subject is not `dagnats.lease.inbox.<this holder>.<key>`.
    WrongSubject,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotOwner => "not acting as owner of the key",
            Self::MissingFence => "the Dagnats-Lease-Fence header is missing",
            Self::MalformedFence => "the Dagnats-Lease-Fence header is not an unsigned integer",
            Self::StaleFence => "the fence is below the fence this tenure began with",
            Self::WrongSubject => "the subject is not this holder's inbox",
        })
    }
}

impl RejectReason {
    /// The reply header a rejection carries: `Dagnats-Lease-Reject: stale`.
    pub fn reply_header() -> (&'static str, &'static str) {
        (HDR_REJECT, REJECT_STALE)
    }
}

/// A forwarded request this holder may process as owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The key it was forwarded for.
    pub key: String,
    /// The fence the service sent (at least the fence the tenure began with).
    pub fence: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tenure {
    revision: u64,
    deadline: Instant,
}

/// The owner-side reject rules of the contract, for one holder ID over any number of
/// keys. Feed it the holder's events ([`InboxGuard::observe`]) and ask it about every
/// request arriving on `dagnats.lease.inbox.<holder>.>` ([`InboxGuard::check`]).
///
/// ```
/// use std::time::{Duration, Instant};
/// use dagnats_leases_core::holder::guard::{InboxGuard, RejectReason};
///
/// let now = Instant::now();
/// let mut guard = InboxGuard::new("notify-7f3a");
/// guard.begin("notify-leader", 42, now + Duration::from_secs(10));
/// let subject = "dagnats.lease.inbox.notify-7f3a.notify-leader";
/// assert!(guard.check(now, subject, Some("42")).is_ok());
/// assert_eq!(guard.check(now, subject, Some("41")), Err(RejectReason::StaleFence));
/// assert_eq!(guard.check(now, subject, None), Err(RejectReason::MissingFence));
/// ```
#[derive(Debug, Clone)]
pub struct InboxGuard {
    prefix: String,
    tenures: HashMap<String, Tenure>,
}

impl InboxGuard {
    /// A guard for `holder`'s inbox, acting as owner of nothing yet.
    pub fn new(holder: &str) -> Self {
        Self {
            prefix: format!("{INBOX_PREFIX}.{holder}."),
            tenures: HashMap::new(),
        }
    }

    /// A tenure of `key` began at `revision`; act as owner until `deadline`.
    pub fn begin(&mut self, key: &str, revision: u64, deadline: Instant) {
        self.tenures
            .insert(key.to_string(), Tenure { revision, deadline });
    }

    /// The tenure of `key` was renewed: the same start fence, a later deadline.
    pub fn extend(&mut self, key: &str, deadline: Instant) {
        if let Some(t) = self.tenures.get_mut(key) {
            t.deadline = deadline;
        }
    }

    /// This holder no longer acts as owner of `key`.
    pub fn end(&mut self, key: &str) {
        self.tenures.remove(key);
    }

    /// Applies a [`HolderEvent`] of the holder of `key`.
    pub fn observe(&mut self, key: &str, event: &HolderEvent) {
        match event {
            HolderEvent::Elected { fence, deadline } => self.begin(key, *fence, *deadline),
            HolderEvent::Renewed {
                tenure, deadline, ..
            } => {
                if self.tenures.get(key).map(|t| t.revision) == Some(*tenure) {
                    self.extend(key, *deadline);
                }
            }
            HolderEvent::SteppedDown { .. } | HolderEvent::Failed { .. } => self.end(key),
            HolderEvent::NotGranted { .. } => {}
        }
    }

    /// Whether to process a request that arrived on `subject` with the
    /// `Dagnats-Lease-Fence` header value `fence` (as of `now`).
    pub fn check(
        &self,
        now: Instant,
        subject: &str,
        fence: Option<&str>,
    ) -> Result<Accepted, RejectReason> {
        let key = subject
            .strip_prefix(&self.prefix)
            .filter(|k| !k.is_empty() && !k.contains('.'))
            .ok_or(RejectReason::WrongSubject)?;
        let tenure = self
            .tenures
            .get(key)
            .filter(|t| now < t.deadline)
            .ok_or(RejectReason::NotOwner)?;
        let fence = fence.ok_or(RejectReason::MissingFence)?;
        let fence = parse_unsigned(fence).ok_or(RejectReason::MalformedFence)?;
        if fence < tenure.revision {
            return Err(RejectReason::StaleFence);
        }
        Ok(Accepted {
            key: key.to_string(),
            fence,
        })
    }
}

/// An unsigned decimal integer, digits only (no sign, no spaces).
fn parse_unsigned(value: &str) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// A write refused by a [`FenceGuard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleWrite {
    /// The fence the write carried.
    pub fence: u64,
    /// The highest fence the store has seen.
    pub highest: u64,
}

impl fmt::Display for StaleWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fence {} is below the highest seen, {}: the writer is no longer owner",
            self.fence, self.highest
        )
    }
}

impl std::error::Error for StaleWrite {}

/// The check a downstream store applies to writes made under a lease: it refuses any
/// fence lower than the highest it has seen. Keep one per lease key.
///
/// ```
/// use dagnats_leases_core::holder::guard::FenceGuard;
///
/// let mut store = FenceGuard::new();
/// assert!(store.admit(40).is_ok());
/// assert!(store.admit(42).is_ok()); // a new tenure
/// assert!(store.admit(40).is_err()); // the old owner, woken from a pause
/// assert!(store.admit(42).is_ok()); // the same tenure writes again
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceGuard {
    highest: Option<u64>,
}

impl FenceGuard {
    /// A guard that has seen no fence.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits a write carrying `fence` (and remembers it) unless it is below the
    /// highest fence seen.
    pub fn admit(&mut self, fence: u64) -> Result<(), StaleWrite> {
        match self.highest {
            Some(highest) if fence < highest => Err(StaleWrite { fence, highest }),
            _ => {
                self.highest = Some(fence);
                Ok(())
            }
        }
    }

    /// The highest fence admitted so far.
    pub fn highest(&self) -> Option<u64> {
        self.highest
    }
}
