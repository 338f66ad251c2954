//! The checks renew and release share: the holder and fence of the request
//! against the key as read, the expiry guard, and the bound on their writes.

use std::time::{Duration, Instant};

use super::Call;
use crate::call_request::KvWrite;
use crate::js::KeyState;
use crate::known::{KnownState, Stamp};
use crate::record::LeaseRecord;
use crate::wire::{ErrorKind, ErrorReply};

/// What the service's knowledge of a key says of a renew or release
/// ([`Call::known_fence`]).
pub(super) enum KnownFence {
    /// Not enough to decide: read.
    Unknown,
    /// The revision named holds another holder's record.
    OtherHolder,
    /// The revision named holds the caller's record, clear of its end.
    Mine(LeaseRecord, Stamp),
}

/// How many times renew and release re-read after a write lost a race.
pub const MAX_FENCED_WRITES: u32 = 2;
/// The most a lease may have left for renew and release to refuse it as `lost`.
///
/// An expiry is not atomic on nats-server: the expiring revision is checked on a
/// timer, then a `MaxAge` marker with `Nats-Rollup: sub` is proposed, which removes
/// whatever the key holds when it applies. A renew that lands after the old
/// revision's end, before the marker, is acknowledged and then wiped (seen in the
/// partition scenario: renewed at revision 1877, marker 1878 a moment later). So a
/// lease this close to its end is treated as gone (see [`expiry_guard`]): before
/// the write by the service's clock, after it by the renewal's own store time.
pub const MAX_EXPIRY_GUARD: Duration = Duration::from_secs(1);

/// The guard for a lease of `ttl_ms`: a quarter of it, at most [`MAX_EXPIRY_GUARD`],
/// so that a holder renewing every third of its TTL clears it even after one
/// failed renewal.
pub fn expiry_guard(ttl_ms: u64) -> Duration {
    MAX_EXPIRY_GUARD.min(Duration::from_millis(ttl_ms / 4))
}

impl Call {
    /// Tenancy: a lease bound to a user of the account answers only that user.
    /// The refusal names neither the holder nor the fence.
    pub(super) fn check_binding(&self, key: &str, record: &LeaseRecord) -> Result<(), ErrorReply> {
        if !self.bound_elsewhere(record) {
            return Ok(());
        }
        Err(ErrorReply::new(
            ErrorKind::Forbidden,
            format!("the lease of `{key}` is bound to another user of this account"),
        ))
    }

    /// Whether `record` is bound to a user other than the caller.
    fn bound_elsewhere(&self, record: &LeaseRecord) -> bool {
        let caller = self.scope.as_ref().and_then(|c| c.user.as_deref());
        record
            .bound_to
            .as_deref()
            .is_some_and(|bound| caller != Some(bound))
    }

    pub(super) fn fenced_write(&mut self, write: KvWrite) {
        if self.writes >= MAX_FENCED_WRITES {
            let key = write.key.clone();
            return self.fail(ErrorReply::new(
                ErrorKind::Unavailable,
                format!("key `{key}` kept changing during the call: retry"),
            ));
        }
        self.write(write);
    }

    /// The holder and fence checks of renew and release, and the expiry guard.
    ///
    /// The guard compares the service's clock with the server's end (the read's
    /// store time + TTL): no reply carries the server's time now, and the store
    /// time read is only a lower bound on it, a TTL or more before the end. So it is
    /// a first check, not the last word: a service clock running ahead refuses
    /// early (a `lost` that costs a re-acquire, never a wrong renewal); one lagging
    /// lets through a write that may land late, which renew then catches on the
    /// server's clock by reading the renewal back ([`super::read_back_window`]). A release
    /// needs no check after: a tombstone frees the key, wiped or not.
    pub(super) fn check_fence(
        &self,
        now: Instant,
        key: &str,
        holder: &str,
        revision: u64,
        state: &KeyState,
    ) -> Result<LeaseRecord, ErrorReply> {
        match state {
            KeyState::Absent | KeyState::Free { .. } => Err(ErrorReply::new(
                ErrorKind::Lost,
                format!(
                    "`{holder}` does not hold `{key}`: nobody does (it expired or was released)"
                ),
            )),
            KeyState::Held { record, .. } if record.holder != holder => Err(ErrorReply::new(
                ErrorKind::Lost,
                // Another holder is not named: the caller may be anyone.
                format!("`{holder}` does not hold `{key}`: another holder does"),
            )),
            KeyState::Held {
                revision: current,
                record,
                written_at,
            } => {
                self.check_binding(key, record)?;
                let wall = self.started_wall + now.saturating_duration_since(self.started_at);
                let ends = *written_at + Duration::from_millis(record.ttl_ms);
                let guard = expiry_guard(record.ttl_ms);
                if *current == revision && wall + guard >= ends {
                    let left = (ends - wall).max(time::Duration::ZERO);
                    Err(ErrorReply::new(
                        ErrorKind::Lost,
                        format!(
                            "the lease of `{key}` is at its end ({} ms left of {} ms, under \
                             the {} ms a write needs to land before the server expires it): \
                             acquire again",
                            left.whole_milliseconds(),
                            record.ttl_ms,
                            guard.as_millis()
                        ),
                    ))
                } else if *current == revision {
                    Ok(record.clone())
                } else {
                    Err(ErrorReply::new(
                        ErrorKind::FenceMismatch,
                        format!(
                            "field `revision` is {revision}, which is not the current fence of \
                             `{key}`: acquire again to learn it"
                        ),
                    ))
                }
            }
            KeyState::Corrupt { .. } => Err(ErrorReply::new(ErrorKind::Internal, "corrupt record")),
        }
    }

    /// The holder and fence checks of renew and release against what the service
    /// knows of the key, with no read.
    ///
    /// [`KnownFence::Mine`]: the request names the known revision and its holder,
    /// with more than the [`expiry_guard`] left by every stamp known; the call's
    /// write, conditional on that revision being the key's last, is the check that
    /// it still is (see docs/architecture.md, "One request per renew and release").
    /// [`KnownFence::OtherHolder`]: the revision the request names holds another
    /// holder's record. [`KnownFence::Unknown`]: not enough to decide (the request
    /// names another revision than the one known, nothing is known, the known
    /// revision is not a lease, or it is within the guard of its end): the call
    /// reads, as it always did.
    pub(super) fn known_fence(&self, now: Instant, holder: &str, revision: u64) -> KnownFence {
        let Some(known) = self.known.as_ref().filter(|k| k.revision == revision) else {
            return KnownFence::Unknown;
        };
        let KnownState::Held { record, stamp } = &known.state else {
            return KnownFence::Unknown;
        };
        if record.holder != holder {
            return KnownFence::OtherHolder;
        }
        // Bound to another user of the tenant: the read path refuses it.
        if self.bound_elsewhere(record) {
            return KnownFence::Unknown;
        }
        let wall = self.started_wall + now.saturating_duration_since(self.started_at);
        if stamp.at_end(record.ttl_ms, expiry_guard(record.ttl_ms), now, wall) {
            return KnownFence::Unknown;
        }
        KnownFence::Mine(record.clone(), *stamp)
    }

    /// A request naming a revision the service knows to hold another holder's
    /// record: the caller never held the key at that fence, so the answer is
    /// `lost` or, if the caller holds the key now at a later revision the service
    /// has not learnt yet, `fence_mismatch`. Which one, only the key's state now
    /// tells, so nothing is written and one request decides: on a replicated
    /// bucket a read confirmation of the known revision (acknowledged: it is still
    /// the last, `lost`; refused: the call reads, confirms and decides as it always
    /// did), on one replica the read.
    pub(super) fn decide_superseded(&mut self, now: Instant) {
        let state = self.known_state(now).filter(|_| self.config.confirm_reads);
        match state {
            Some(state) => self.confirm(now, state),
            None => {
                let key = self.key().to_string();
                self.read(key)
            }
        }
    }
}
