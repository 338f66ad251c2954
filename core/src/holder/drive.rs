//! What a [`Holder`] sends, and when: the step-down at the local deadline, then
//! the acquire, renew, release or probe that is due, built as a lease call.

use std::time::Instant;

use super::{Holder, InFlight, MAX_STOP_REQUESTS, Phase, Purpose, StepDownReason};
use crate::io::{TransmitId, lease_call};
use crate::wire::{AcquireRequest, OwnerRequest, ReleaseRequest, RenewRequest, Request};

impl Holder {
    /// Steps down at the deadline, and sends what is due.
    pub(super) fn drive(&mut self, now: Instant) {
        if let Phase::Owner { ownership, .. } = self.phase
            && now >= ownership.deadline
        {
            // An unanswered request may still write; its outcome is unknown.
            if let Some(flight) = self.in_flight.take() {
                self.mark_unknown(flight);
            }
            self.step_down(now, StepDownReason::DeadlineMissed);
        }
        if self.in_flight.is_some() {
            return;
        }
        match self.phase {
            Phase::Campaigning { next_at } if now >= next_at => match self.held_back_until {
                // A tick inside the hold-back after a change: the preferred candidate
                // asks first.
                Some(until) if now < until => self.phase = Phase::Campaigning { next_at: until },
                // The hold-back has passed: ask.
                Some(_) => {
                    self.held_back_until = None;
                    self.send(now, Purpose::Acquire, 0);
                }
                // A plain tick of a candidate that holds back: read first.
                None if !self.config.hold_back.is_zero() => self.send(now, Purpose::Probe, 0),
                None => self.send(now, Purpose::Acquire, 0),
            },
            Phase::Confirming { revision } => self.send(now, Purpose::Renew, revision),
            Phase::Owner {
                ownership,
                next_at,
                recovering,
            } if now >= next_at => {
                let purpose = if recovering {
                    Purpose::Acquire
                } else {
                    Purpose::Renew
                };
                self.send(now, purpose, ownership.fence);
            }
            // A revocation keeps the lease until its deadline.
            Phase::Stopping {
                hold_until: Some(at),
                ..
            } if now < at => {}
            Phase::Stopping {
                fence, attempts, ..
            } => match fence {
                Some(fence) if attempts < MAX_STOP_REQUESTS => {
                    self.send(now, Purpose::Release, fence)
                }
                _ => self.phase = Phase::Done,
            },
            _ => {}
        }
    }

    pub(super) fn send(&mut self, now: Instant, purpose: Purpose, fence: u64) {
        let (key, holder) = (self.config.key.clone(), self.config.holder.clone());
        let request = match purpose {
            Purpose::Acquire => Request::Acquire(AcquireRequest {
                key,
                holder,
                ttl_ms: self.config.ttl_ms(),
            }),
            Purpose::Renew => Request::Renew(RenewRequest {
                key,
                holder,
                revision: fence,
                ttl_ms: Some(self.config.ttl_ms()),
            }),
            Purpose::Release => Request::Release(ReleaseRequest {
                key,
                holder,
                revision: fence,
            }),
            Purpose::Probe => Request::Owner(OwnerRequest { key }),
        };
        if let Phase::Stopping { attempts, .. } = &mut self.phase {
            *attempts += 1;
        }
        let id = TransmitId(self.next_id);
        self.next_id += 1;
        self.in_flight = Some(InFlight {
            id,
            purpose,
            sent_at: now,
            fence,
        });
        self.requests.push_back(lease_call(
            id,
            request.endpoint(),
            request.to_json(),
            self.config.request_timeout,
        ));
    }
}
