//! The owner's inbox check: a forwarded request is delivered only for a key owned
//! now, with a fence of this tenure, and only to a reader.

use super::*;

/// What to do with a request forwarded to this holder's inbox
/// ([`Campaign::check_inbox`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxVerdict {
    /// Pass it to the application: it is for a key owned now, with a fence of this
    /// tenure.
    Deliver(Accepted),
    /// Answer it `Dagnats-Lease-Reject: stale` for this reason, and drop it.
    Reject(RejectReason),
    /// Drop it unanswered: it is for a key owned now, but nobody reads the inbox.
    /// The forwarding service times it out; a reject would call a good fence stale.
    Ignore,
}

impl Campaign {
    /// What to do with a request forwarded to this holder's inbox on `subject`, with
    /// `Dagnats-Lease-Fence` header value `fence`, while the application reads the
    /// inbox (`read`) or not: delivered only for a key owned at `now`, with a fence
    /// of the current tenure, and only to a reader; rejected otherwise.
    pub fn check_inbox(
        &self,
        now: Instant,
        subject: &str,
        fence: Option<&str>,
        read: bool,
    ) -> InboxVerdict {
        let accepted = match self.guard.check(now, subject, fence) {
            Ok(accepted) => accepted,
            Err(reason) => return InboxVerdict::Reject(reason),
        };
        // The guard follows the events; the holder's own deadline is the last word.
        if self.tenure(&accepted.key, now).is_none() {
            return InboxVerdict::Reject(RejectReason::NotOwner);
        }
        if !read {
            return InboxVerdict::Ignore;
        }
        InboxVerdict::Deliver(accepted)
    }
}
