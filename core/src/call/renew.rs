//! Renew: a fenced write of the record with a new TTL; an ack late in the old lease
//! reads the renewal back to decide on the server's clock whether it landed in time.

use std::time::{Duration, Instant};

use time::OffsetDateTime;

use super::fence::KnownFence;
use super::{Call, Job, expiry_guard};
use crate::call_request::{KvWrite, Operation};
use crate::js::KeyState;
use crate::record::{LeaseEvent, LeaseRecord, format_time};
use crate::wire::{ErrorKind, ErrorReply, Lease, RenewRequest, Response};

/// How close to the end of the lease it renews (a lease of `ttl_ms`) a renew's ack
/// may come, by the service's clock, before the call reads the renewal back to
/// decide on the server's clock whether it landed in time: half the TTL, the
/// second half of the old lease.
///
/// The end is the server's (the old revision's store time + TTL), the ack time the
/// service's, so a service clock lagging the server's makes a late ack look early.
/// Half a TTL still reads back every renewal that can have landed within the
/// [`expiry_guard`] of the end while the lag is under `ttl/2 - guard` (250 ms at
/// the 1 s minimum, 1 s at 4 s, 6.5 s at 15 s), far beyond what NTP leaves. A
/// holder renewing every ttl/3 is acknowledged about a third into the old lease,
/// so it normally costs no read; a service clock running ahead costs reads, never
/// a wrong answer.
pub fn read_back_window(ttl_ms: u64) -> Duration {
    Duration::from_millis(ttl_ms / 2)
}

/// A renew's write: the record it carries, the end and TTL of the lease it renews,
/// and once stored, its revision (the call then reads the key back: see
/// [`read_back_window`]).
///
/// The end is known by the server's store time (`ends`: from a read or a change
/// event), by the service's own monotonic clock (`ends_by`: a lower bound, from the
/// instant before the service's own write of the old revision), or both.
#[derive(Debug)]
pub(super) struct Renewal {
    pub(super) record: LeaseRecord,
    pub(super) ends: Option<OffsetDateTime>,
    pub(super) ends_by: Option<Instant>,
    pub(super) old_ttl_ms: u64,
    pub(super) written: Option<u64>,
}

impl Call {
    /// The renew's first request: the fenced write at once when the service knows
    /// the revision named ([`Call::known_fence`]), built from the record known
    /// there; else the read.
    pub(super) fn start_renew(&mut self, now: Instant) {
        let Job::Renew(r, None) = &self.job else {
            return;
        };
        let key = r.key.clone();
        match self.known_fence(now, &r.holder, r.revision) {
            KnownFence::Unknown => self.read(key),
            KnownFence::OtherHolder => self.decide_superseded(now),
            KnownFence::Mine(record, stamp) => {
                let Job::Renew(r, None) = std::mem::replace(&mut self.job, Job::Done) else {
                    unreachable!("matched above");
                };
                let ttl = Duration::from_millis(record.ttl_ms);
                let ends = stamp.server.map(|t| t + ttl);
                let ends_by = stamp.sent_before.map(|t| t + ttl);
                let expected = r.revision;
                self.write_renewal(r, record, expected, ends, ends_by);
            }
        }
    }

    /// A current read of the key: the fenced write of the renewed record.
    pub(super) fn decide_renew(&mut self, now: Instant, r: RenewRequest, state: KeyState) {
        match self.check_fence(now, &r.key, &r.holder, r.revision, &state) {
            Err(e) => self.fail(e),
            Ok(record) => {
                let ends = match &state {
                    KeyState::Held { written_at, .. } => {
                        *written_at + Duration::from_millis(record.ttl_ms)
                    }
                    _ => unreachable!("check_fence passed: the key is held"),
                };
                self.write_renewal(r, record, state.revision(), Some(ends), None);
            }
        }
    }

    /// The fenced write of `record` renewed, expecting revision `expected`.
    fn write_renewal(
        &mut self,
        r: RenewRequest,
        record: LeaseRecord,
        expected: u64,
        ends: Option<OffsetDateTime>,
        ends_by: Option<Instant>,
    ) {
        let ttl_ms = r.ttl_ms.unwrap_or(record.ttl_ms);
        let old_ttl_ms = record.ttl_ms;
        // Everything but the TTL as known, a binding and a newer release's fields
        // included.
        let renewed = LeaseRecord { ttl_ms, ..record };
        let key = r.key.clone();
        let value = renewed.to_json();
        self.job = Job::Renew(
            r,
            Some(Renewal {
                record: renewed,
                ends,
                ends_by,
                old_ttl_ms,
                written: None,
            }),
        );
        self.fenced_write(KvWrite {
            id: crate::io::TransmitId::UNSENT,
            key,
            operation: Operation::Put,
            expected_revision: expected,
            ttl_ms: Some(ttl_ms),
            event: LeaseEvent::Renewed,
            value,
            timeout: self.config.kv_timeout,
        });
    }

    /// The renewal stored at `revision`: renewed when acked, by the service's
    /// monotonic clock, more than the [`expiry_guard`] before the old lease's end
    /// as that clock bounds it (`ends_by`: no other clock is involved); else, where
    /// the end by the server's store time is known, read it back if acked late in
    /// the old lease ([`read_back_window`]) and renewed if not; else `lost`: nothing
    /// then shows that the renewal landed before the end. Returns whether it
    /// handled the ack (read back or failed).
    pub(super) fn renew_written(&mut self, now: Instant, revision: u64) -> bool {
        let wall = self.started_wall;
        let Job::Renew(r, Some(renewal)) = &mut self.job else {
            return false;
        };
        let guard = expiry_guard(renewal.old_ttl_ms);
        if renewal.ends_by.is_some_and(|by| now + guard < by) {
            return false;
        }
        let acked = wall + now.saturating_duration_since(self.started_at);
        match renewal.ends {
            Some(ends) if acked + read_back_window(renewal.old_ttl_ms) < ends => false,
            Some(_) => {
                renewal.written = Some(revision);
                let key = r.key.clone();
                self.read(key);
                true
            }
            None => {
                let key = r.key.clone();
                self.fail(ErrorReply::new(
                    ErrorKind::Lost,
                    format!(
                        "the renewal of `{key}` written at revision {revision} was acknowledged \
                         within {} ms of its lease's end by the service's clock, and the \
                         server's store time of that lease is not known: it cannot be shown \
                         to have landed before the end; acquire again",
                        guard.as_millis()
                    ),
                ));
                true
            }
        }
    }

    /// The renewal stored at `revision`, before its lease's end: renewed.
    pub(super) fn renewed(&mut self, r: RenewRequest, record: LeaseRecord, revision: u64) {
        let wall = self.started_wall;
        self.reply(Response::Lease(Lease {
            held: true,
            key: r.key,
            holder: r.holder,
            revision,
            acquired_at: record.acquired_at,
            expires_at: format_time(wall + Duration::from_millis(record.ttl_ms)),
            ttl_ms: record.ttl_ms,
        }));
    }

    /// The key read back after a renewal stored at `revision`. The renewal stored,
    /// by the server's clock, within the [`expiry_guard`] of the end of the lease
    /// it renews, or no longer the key's last message (wiped by that lease's expiry
    /// marker), is `lost`, not a renewal anyone can rely on; stored before, it is a
    /// renewal. (Read by key, not by sequence: a deposed stream leader answers "no
    /// such message" for a sequence it never stored, which no confirmation can
    /// refute, while a read of the key is confirmed like any other.)
    pub(super) fn on_read_back(&mut self, revision: u64, state: KeyState) {
        let Job::Renew(r, Some(renewal)) = &self.job else {
            return;
        };
        let key = r.key.clone();
        let guard = expiry_guard(renewal.old_ttl_ms);
        let Some(ends) = renewal.ends else {
            // Only a renewal whose end is known on the server's clock reads back.
            return self.fail(ErrorReply::new(
                ErrorKind::Lost,
                format!("the renewal of `{key}` at revision {revision} cannot be shown in time"),
            ));
        };
        let why = match state {
            KeyState::Held {
                revision: at,
                written_at,
                ..
            } if at == revision => {
                if written_at + guard < ends {
                    return self.on_written_in_time(revision);
                }
                let before = (ends - written_at).whole_milliseconds();
                if before > 0 {
                    format!(
                        "landed {before} ms before its lease's end by the server's clock, \
                         under the {} ms guard",
                        guard.as_millis()
                    )
                } else {
                    format!(
                        "landed {} ms after its lease's end by the server's clock",
                        -before
                    )
                }
            }
            _ => format!(
                "is gone already (the key is at revision {}: the lease's expiry removed it)",
                state.revision()
            ),
        };
        self.fail(ErrorReply::new(
            ErrorKind::Lost,
            format!(
                "the renewal of `{key}` written at revision {revision} {why}: the server's \
                 expiry may remove it; acquire again"
            ),
        ));
    }
}
