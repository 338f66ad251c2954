//! How a [`Holder`] reads what came of its requests: replies, errors and unknown
//! outcomes, the grant that a renew must confirm, the step-down, and the quiet
//! waits for an expiry marker still to come.

use std::time::{Duration, Instant};

use super::{
    Holder, HolderEvent, InFlight, MAX_EXPIRY_MARKER_LAG, Phase, Purpose, StepDownReason, Tenure,
    UnknownRenews, owner_retry_delay,
};
use crate::io::RequestOutcome;
use crate::wire::{Endpoint, ErrorKind, ErrorReply, Response};

impl Holder {
    pub(super) fn on_outcome(&mut self, now: Instant, flight: InFlight, outcome: RequestOutcome) {
        self.in_flight = None;
        if matches!(self.phase, Phase::Owner { ownership, .. } if now >= ownership.deadline) {
            // The tenure ended at the deadline, whatever this says: a renewal that
            // lands after the server's expiry check is wiped by its marker. Whether
            // it wrote is unknown to the campaign that follows.
            self.mark_unknown(flight);
            self.drive(now);
            return;
        }
        if flight.purpose == Purpose::Probe {
            self.on_probe(now, &outcome);
            self.drive(now);
            return;
        }
        if let Phase::Confirming { .. } = self.phase
            && flight.purpose == Purpose::Renew
            && now >= flight.sent_at + self.config.believed_span(self.config.ttl)
        {
            // The confirming renew, answered at or after the deadline it would give:
            // the same as a renew answered after the deadline, it elects nobody.
            self.mark_unknown(flight);
            self.campaign_after(now, Duration::ZERO);
            self.drive(now);
            return;
        }
        let reply = match &outcome {
            RequestOutcome::Reply { payload, .. } => {
                Response::decode(flight.purpose.endpoint(), payload).ok()
            }
            _ => None,
        };
        match (&outcome, reply) {
            (RequestOutcome::Reply { .. }, Some(reply)) => self.on_reply(now, flight, reply),
            // Nobody received it: nothing was written.
            (RequestOutcome::NoResponders, _) => self.on_transient(now, flight),
            // It may have been processed, or may still be.
            _ => {
                self.mark_unknown(flight);
                self.on_transient(now, flight);
            }
        }
        self.drive(now);
    }

    pub(super) fn mark_unknown(&mut self, flight: InFlight) {
        match flight.purpose {
            Purpose::Acquire => {
                let since = self
                    .unknown_acquire
                    .map_or(flight.sent_at, |t| t.min(flight.sent_at));
                self.unknown_acquire = Some(since);
            }
            Purpose::Renew => {
                self.stay_quiet();
                let merged = match self.unknown_renews {
                    Some(u) => UnknownRenews {
                        since: u.since.min(flight.sent_at),
                        fence: u.fence.max(flight.fence),
                    },
                    None => UnknownRenews {
                        since: flight.sent_at,
                        fence: flight.fence,
                    },
                };
                self.unknown_renews = Some(merged);
            }
            // Only a stop releases, and a stopped holder believes nothing; a probe
            // reads.
            Purpose::Release | Purpose::Probe => {}
        }
    }

    /// A reply showed the key at `revision`: renews carrying a lower fence can no
    /// longer write.
    fn saw_revision(&mut self, revision: u64) {
        self.highest_seen = self.highest_seen.max(revision);
        if self.unknown_renews.is_some_and(|u| revision > u.fence) {
            self.unknown_renews = None;
        }
    }

    fn on_reply(&mut self, now: Instant, flight: InFlight, reply: Response) {
        let failed = matches!(&reply, Response::Error(e)
            if matches!(e.kind, ErrorKind::Unavailable | ErrorKind::Internal));
        if !failed {
            self.failures = 0;
        }
        match (flight.purpose, reply) {
            (Purpose::Acquire, Response::Acquired(r))
                if r.granted && r.lease.revision < self.highest_seen =>
            {
                // Older than what this holder already saw: a stale read, not a grant.
                self.on_transient(now, flight);
            }
            (Purpose::Acquire, Response::Acquired(r))
                if r.granted
                    && matches!(self.phase, Phase::Campaigning { .. })
                    && self.marker_waited != Some(r.lease.revision)
                    && may_be_a_late_renewal(&r.lease) =>
            {
                // A renewal of a tenure of this holder ID that this machine did not
                // write (an earlier incarnation's, a restart): it may have landed as
                // its lease ran out, and that lease's expiry marker, still to come
                // within MAX_EXPIRY_MARKER_LAG, would wipe it and any renew confirming
                // it. Ask again once the marker must have come (found by a holder
                // world: a restart granted the late renew of its predecessor).
                self.saw_revision(r.lease.revision);
                self.marker_waited = Some(r.lease.revision);
                self.quiet_for_a_marker(now);
                self.campaign_after(now, Duration::ZERO);
            }
            (Purpose::Acquire, Response::Acquired(r)) if r.granted => {
                // Unknown renews may have written this very revision: bound it first.
                self.fence_learned_at = now;
                self.on_granted(now, flight, r.lease.revision, r.lease.ttl_ms);
                self.saw_revision(r.lease.revision);
            }
            (Purpose::Acquire, Response::Acquired(r)) => {
                // Another holder has it.
                self.saw_revision(r.lease.revision);
                match self.phase {
                    Phase::Owner { .. } => self.step_down(now, StepDownReason::Lost),
                    Phase::Stopping { .. } => self.phase = Phase::Done,
                    _ => self.campaign_after(now, self.config.campaign_every),
                }
            }
            (Purpose::Renew, Response::Lease(lease)) => {
                self.saw_revision(lease.revision);
                self.fence_learned_at = now;
                self.on_renewed(flight, lease.revision, lease.ttl_ms);
            }
            (Purpose::Release, Response::Released(_)) => {
                self.confirmed = None;
                self.phase = Phase::Done;
            }
            (_, Response::Error(e)) => self.on_error(now, flight, e),
            // A reply of the wrong shape: treat like an unknown outcome.
            _ => {
                self.mark_unknown(flight);
                self.on_transient(now, flight);
            }
        }
    }

    /// A probe's answer: the key held by another, ask again at the next tick; free,
    /// or no answer, ask after the hold-back, as after a change event; held under
    /// this holder ID (a restart), ask now.
    fn on_probe(&mut self, now: Instant, outcome: &RequestOutcome) {
        if !matches!(self.phase, Phase::Campaigning { .. }) {
            return;
        }
        let reply = match outcome {
            RequestOutcome::Reply { payload, .. } => {
                Response::decode(Endpoint::Owner, payload).ok()
            }
            _ => None,
        };
        let ask_at = match reply {
            Some(Response::Lease(lease)) if lease.holder != self.config.holder => {
                self.highest_seen = self.highest_seen.max(lease.revision);
                return self.campaign_after(now, self.config.campaign_every);
            }
            Some(Response::Lease(_)) => now,
            _ => now + self.config.hold_back,
        };
        self.held_back_until = Some(ask_at);
        self.campaign_after(now, ask_at - now);
    }

    fn lease_ttl(&self, reply_ttl_ms: u64) -> Duration {
        self.config.ttl.min(Duration::from_millis(reply_ttl_ms))
    }

    /// A renew wrote `revision` after `flight` was sent: the soundest proof there is.
    fn on_renewed(&mut self, flight: InFlight, revision: u64, ttl_ms: u64) {
        let deadline = flight.sent_at + self.config.believed_span(self.lease_ttl(ttl_ms));
        self.confirmed = Some((revision, deadline));
        let next_at = flight.sent_at + self.config.renew_every;
        match self.phase {
            Phase::Owner { ownership, .. } => {
                let ownership = Tenure {
                    fence: revision,
                    deadline,
                    ..ownership
                };
                self.phase = Phase::Owner {
                    ownership,
                    next_at,
                    recovering: false,
                };
                self.events.push_back(HolderEvent::Renewed {
                    tenure: ownership.tenure,
                    fence: revision,
                    deadline,
                });
            }
            Phase::Confirming { .. } => {
                // The tenure starts at this renew's revision, not the grant's: a
                // grant may return an earlier tenure's last write under this holder
                // ID, whose fence that tenure already handed out.
                // The tenure's first renewal: sooner by the key's offset in its
                // group, so keys won together do not renew together for ever.
                self.phase = Phase::Owner {
                    ownership: Tenure {
                        tenure: revision,
                        fence: revision,
                        deadline,
                    },
                    next_at: next_at - self.config.first_renewal_sooner,
                    recovering: false,
                };
                self.events.push_back(HolderEvent::Elected {
                    fence: revision,
                    deadline,
                });
            }
            Phase::Stopping { ref mut fence, .. } => *fence = Some(revision),
            Phase::Campaigning { .. } | Phase::Done => {}
        }
    }

    fn on_granted(&mut self, now: Instant, flight: InFlight, revision: u64, ttl_ms: u64) {
        // When the lease at `revision` was written at the earliest: by this request, or
        // by an earlier one whose outcome is unknown.
        let written_after = [
            Some(flight.sent_at),
            self.unknown_acquire,
            self.unknown_renews.map(|u| u.since),
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("the send time is always there");
        let deadline = match self.confirmed {
            // Acquire does not extend: the lease is the one already confirmed.
            Some((fence, deadline)) if fence == revision => deadline,
            _ => written_after + self.config.believed_span(self.lease_ttl(ttl_ms)),
        };
        match self.phase {
            Phase::Stopping { ref mut fence, .. } => *fence = Some(revision),
            Phase::Owner { ownership, .. } => {
                // A recovery after fence_mismatch. The lease at `revision` was written
                // after the one the current deadline stands on, so it lasts at least as
                // long: keep the later of the two.
                let deadline = deadline.max(ownership.deadline);
                let ownership = Tenure {
                    fence: revision.max(ownership.fence),
                    deadline,
                    ..ownership
                };
                self.confirmed = Some((ownership.fence, deadline));
                self.phase = Phase::Owner {
                    ownership,
                    next_at: flight.sent_at + self.config.renew_every,
                    recovering: false,
                };
                self.events.push_back(HolderEvent::Renewed {
                    tenure: ownership.tenure,
                    fence: ownership.fence,
                    deadline,
                });
            }
            // Ours on the server, but a grant cannot show who wrote it, nor when: an
            // idempotent grant of an older write under this holder ID (a holder made
            // afresh for a key this process held before, or a restart) looks just like
            // a fresh create, while the server expires that older write up to a TTL
            // sooner. A renew proves it: its write came after its send. Remember the
            // bound, so a later grant of the same revision is not taken as fresh.
            Phase::Campaigning { .. } => {
                self.confirmed = Some((revision, deadline.min(now)));
                self.phase = Phase::Confirming { revision };
            }
            Phase::Confirming { .. } | Phase::Done => {}
        }
    }

    fn on_error(&mut self, now: Instant, flight: InFlight, e: ErrorReply) {
        match e.kind {
            ErrorKind::Invalid | ErrorKind::Unsupported => {
                if let Phase::Owner { .. } = self.phase {
                    self.events.push_back(HolderEvent::SteppedDown {
                        reason: StepDownReason::Failed,
                    });
                }
                self.events.push_back(HolderEvent::Failed {
                    kind: e.kind,
                    message: e.error,
                });
                self.phase = Phase::Done;
            }
            ErrorKind::Lost => match self.phase {
                Phase::Owner { .. } => {
                    // A renew the service wrote as the lease ran out is `lost` too:
                    // the old lease's expiry marker may still wipe the key.
                    if flight.purpose == Purpose::Renew {
                        self.quiet_for_a_marker(now);
                    }
                    self.step_down(now, StepDownReason::Lost)
                }
                Phase::Stopping { .. } => self.phase = Phase::Done,
                // The renew confirming a grant, written as that lease ran out: an
                // acquire now could be granted that very write, which the marker
                // still to come wipes (found by a holder world).
                Phase::Confirming { .. } if flight.purpose == Purpose::Renew => {
                    self.quiet_for_a_marker(now);
                    self.campaign_after(now, Duration::ZERO)
                }
                _ => self.campaign_after(now, Duration::ZERO),
            },
            ErrorKind::FenceMismatch => match &mut self.phase {
                Phase::Owner {
                    next_at,
                    recovering,
                    ..
                } => {
                    *recovering = true;
                    *next_at = now;
                }
                // Ask again: the acquire returns the current fence.
                Phase::Confirming { .. } => self.campaign_after(now, Duration::ZERO),
                Phase::Stopping { .. } => self.send(now, Purpose::Acquire, 0),
                _ => {}
            },
            // `unavailable` or `internal`: the service may have written before it
            // failed (a JetStream ack that timed out), so the outcome is unknown.
            _ => {
                self.mark_unknown(flight);
                self.on_transient(now, flight);
            }
        }
    }

    fn on_transient(&mut self, now: Instant, flight: InFlight) {
        // An owner backs off with jitter (owner_retry_delay), never past the last
        // send that can still renew before its deadline; a campaign backs off
        // (doubling, at most one TTL) while the service keeps failing (a corrupt
        // record answers `internal` until someone repairs it); a change event still
        // wakes it at once.
        self.failures = self.failures.saturating_add(1);
        let backoff = self
            .config
            .retry_every
            .saturating_mul(1 << (self.failures - 1).min(16))
            .min(self.config.ttl);
        let (failures, jitter) = (self.failures, self.next_jitter());
        let (retry_every, request_timeout) = (self.config.retry_every, self.config.request_timeout);
        match &mut self.phase {
            Phase::Owner {
                next_at, ownership, ..
            } => {
                let room = ownership
                    .deadline
                    .saturating_duration_since(now + request_timeout);
                *next_at = now + owner_retry_delay(retry_every, failures, jitter, room);
            }
            Phase::Campaigning { next_at } => *next_at = now + backoff,
            Phase::Confirming { .. } => self.campaign_after(now, backoff),
            // One release attempt is enough: the TTL frees the key anyway. A renew or
            // acquire that was in flight when the stop came still leads to a release.
            Phase::Stopping { .. } if flight.purpose == Purpose::Release => {
                self.phase = Phase::Done
            }
            Phase::Stopping { .. } | Phase::Done => {}
        }
    }

    pub(super) fn step_down(&mut self, now: Instant, reason: StepDownReason) {
        self.events.push_back(HolderEvent::SteppedDown { reason });
        let wait = match reason {
            StepDownReason::Lost => Duration::ZERO,
            _ => self.config.retry_every,
        };
        self.campaign_after(now, wait);
    }

    pub(super) fn campaign_after(&mut self, now: Instant, wait: Duration) {
        let next_at = (now + wait).max(self.quiet_until.unwrap_or(now));
        self.phase = Phase::Campaigning { next_at };
    }

    /// A renew answered `lost` may have been written as its lease ran out: the old
    /// lease's expiry marker, within [`MAX_EXPIRY_MARKER_LAG`], may wipe the key, and
    /// whatever a campaign wins before it.
    fn quiet_for_a_marker(&mut self, now: Instant) {
        let until = now + MAX_EXPIRY_MARKER_LAG;
        self.quiet_until = Some(self.quiet_until.map_or(until, |q| q.max(until)));
    }

    /// A renew whose outcome is unknown may land after the end of the lease it
    /// renews, and the expiry marker still to come would then wipe the key. That
    /// lease was stored before this holder learned its fence, so it ends at most a
    /// TTL (and the drift margin) after that; its marker comes within
    /// [`MAX_EXPIRY_MARKER_LAG`].
    fn stay_quiet(&mut self) {
        let margin = self.config.ttl - self.config.believed_span(self.config.ttl);
        let until = self.fence_learned_at + self.config.ttl + margin + MAX_EXPIRY_MARKER_LAG;
        self.quiet_until = Some(self.quiet_until.map_or(until, |q| q.max(until)));
    }
}

/// Whether a granted lease is a renewal stored at least half a TTL after its tenure
/// began: only such a write can have landed after the end of the lease it renewed
/// (that lease ran at least a TTL from the tenure's first write). Its times are the
/// service's (`acquired_at`) and the server's store time (`expires_at` less the
/// TTL); half a TTL of slack covers their skew.
fn may_be_a_late_renewal(lease: &crate::wire::Lease) -> bool {
    let (Some(acquired), Some(expires)) = (
        crate::record::parse_time(&lease.acquired_at),
        crate::record::parse_time(&lease.expires_at),
    ) else {
        // Unreadable times: assume the worst.
        return true;
    };
    let ttl = time::Duration::milliseconds(lease.ttl_ms as i64);
    expires - ttl - acquired >= ttl / 2
}
