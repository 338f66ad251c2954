//! What a [`Call`] does with each JetStream answer it waited for: a read (and its
//! confirmation on a replicated bucket), a write's ack, a conflict; and the facts
//! it reports of them for the metrics.

use std::time::Instant;

use super::forward::is_owner_reply;
use super::renew::Renewal;
use super::{Call, CallEvent, Job, KvFact, KvOp, MAX_READ_CONFIRMS, Waiting};
use crate::call_request::{CallRequest, ConfirmRead};
use crate::io::{RequestOutcome, TransmitId};
use crate::js::{self, JsFailure, KeyState, PublishResult};
use crate::wire::{ErrorKind, ErrorReply};

impl Call {
    /// What came of the request waited for.
    pub(super) fn waited_outcome(&mut self, now: Instant, outcome: RequestOutcome) {
        let late = self.forward_past_deadline(now)
            && match &self.waiting {
                Waiting::Read | Waiting::Confirm(_) => true,
                Waiting::Inbox => !is_owner_reply(&outcome),
                Waiting::Nothing | Waiting::Write => false,
            };
        if late {
            // Read for the metrics only: the call acts on the deadline.
            match self.waiting_op() {
                Some(KvOp::Read) => {
                    if let Err(f) = js::parse_read(&outcome) {
                        self.report(KvFact::failed(KvOp::Read, &outcome, &f));
                    }
                }
                Some(op) => {
                    let ack = js::parse_pub_ack(&outcome);
                    self.report_ack(op, &outcome, &ack);
                }
                None => {}
            }
            return self.fail_deadline();
        }
        let waiting = std::mem::replace(&mut self.waiting, Waiting::Nothing);
        self.out = None;
        match waiting {
            Waiting::Read => match js::parse_read(&outcome) {
                Ok(state) => {
                    self.seen_max = self.seen_max.max(state.revision());
                    self.learn_read(&state);
                    self.on_read(now, state)
                }
                Err(f) => {
                    self.report(KvFact::failed(KvOp::Read, &outcome, &f));
                    self.fail_js(f)
                }
            },
            Waiting::Confirm(state) => {
                let ack = js::parse_pub_ack(&outcome);
                self.report_ack(KvOp::Confirm, &outcome, &ack);
                if let Ok(PublishResult::Stored(rev)) = ack {
                    self.stored(rev);
                }
                match ack {
                    Ok(PublishResult::Stored(_)) => self.decide(now, state),
                    // The key moved on since the read (or a write to it is in flight).
                    Ok(PublishResult::WrongLastSequence) => self.reread(now),
                    Err(f) => self.fail_js(f),
                }
            }
            Waiting::Write => {
                let ack = js::parse_pub_ack(&outcome);
                self.report_ack(KvOp::Write, &outcome, &ack);
                match ack {
                    Ok(PublishResult::Stored(rev)) => {
                        self.stored(rev);
                        self.learn_write(rev);
                        self.on_written(now, rev)
                    }
                    Ok(PublishResult::WrongLastSequence) => self.on_conflict(),
                    Err(f) => self.fail_js(f),
                }
            }
            Waiting::Inbox => self.on_inbox(now, outcome),
            Waiting::Nothing => {}
        }
    }

    /// Which JetStream request the call waits on, if it waits on one.
    pub(super) fn waiting_op(&self) -> Option<KvOp> {
        match self.waiting {
            Waiting::Read => Some(KvOp::Read),
            Waiting::Confirm(_) => Some(KvOp::Confirm),
            Waiting::Write => Some(KvOp::Write),
            Waiting::Inbox | Waiting::Nothing => None,
        }
    }

    /// Reports a fact about one of its JetStream requests.
    pub(super) fn report(&mut self, fact: KvFact) {
        self.events.push_back(CallEvent::Kv(fact));
    }

    /// Reports what a write's or a confirmation's ack says: a confirmation that
    /// lost its race is retried; any failure is counted.
    pub(super) fn report_ack(
        &mut self,
        op: KvOp,
        outcome: &RequestOutcome,
        ack: &Result<PublishResult, JsFailure>,
    ) {
        match ack {
            Ok(PublishResult::WrongLastSequence) if op == KvOp::Confirm => {
                self.report(KvFact::ConfirmRetry)
            }
            Ok(_) => {}
            Err(f) => self.report(KvFact::failed(op, outcome, f)),
        }
    }

    /// A read came back. Where the call would answer from it (rather than go on to
    /// a conditional write, which confirms itself), a bucket with replicas first
    /// confirms it.
    pub(super) fn on_read(&mut self, now: Instant, state: KeyState) {
        if self.config.confirm_reads && !self.writes_after(now, &state) {
            return self.confirm(now, state);
        }
        self.decide(now, state);
    }

    /// Whether the call's next step after this read is a conditional write.
    pub(super) fn writes_after(&self, now: Instant, state: &KeyState) -> bool {
        match &self.job {
            Job::Acquire(_) => matches!(state, KeyState::Absent | KeyState::Free { .. }),
            // A renewal's read-back decides from the read: confirm it.
            Job::Renew(
                _,
                Some(Renewal {
                    written: Some(_), ..
                }),
            ) => false,
            Job::Renew(r, _) => self
                .check_fence(now, &r.key, &r.holder, r.revision, state)
                .is_ok(),
            Job::Release {
                key,
                holder,
                revision,
            } => self.check_fence(now, key, holder, *revision, state).is_ok(),
            Job::Owner { .. } | Job::Forward(_) | Job::Done => false,
        }
    }

    pub(super) fn confirm(&mut self, now: Instant, state: KeyState) {
        let key = self.key().to_string();
        if self.confirms >= MAX_READ_CONFIRMS {
            return self.fail_naming_owner(ErrorReply::new(
                ErrorKind::Unavailable,
                format!(
                    "the read of `{key}` could not be confirmed by the stream leader \
                     ({MAX_READ_CONFIRMS} attempts; the key kept changing): retry"
                ),
            ));
        }
        self.confirms += 1;
        self.report(KvFact::ConfirmSent);
        let id = TransmitId::UNSENT;
        let confirm = ConfirmRead {
            id,
            key,
            revision: state.revision(),
            timeout: self.kv_timeout(now),
        };
        self.issue(Waiting::Confirm(state), CallRequest::ConfirmRead(confirm));
    }

    /// Acts on a read that is current: confirmed, or about to be by a write.
    pub(super) fn decide(&mut self, now: Instant, state: KeyState) {
        if let KeyState::Corrupt { revision, reason } = &state {
            let key = self.key().to_string();
            return self.fail_naming_owner(ErrorReply::new(
                ErrorKind::Internal,
                format!("the lease record of `{key}` at revision {revision} is corrupt: {reason}"),
            ));
        }
        if let Job::Renew(
            _,
            Some(Renewal {
                written: Some(revision),
                ..
            }),
        ) = self.job
        {
            return self.on_read_back(revision, state);
        }
        match std::mem::replace(&mut self.job, Job::Done) {
            Job::Acquire(r) => self.decide_acquire(r, state),
            Job::Renew(r, _) => self.decide_renew(now, r, state),
            Job::Release {
                key,
                holder,
                revision,
            } => self.decide_release(now, key, holder, revision, state),
            Job::Owner { key } => self.decide_owner(key, state),
            Job::Forward(f) => self.forward_after_read(now, f, state),
            Job::Done => {}
        }
    }

    /// One of its own writes or confirmations was stored at `rev`.
    pub(super) fn stored(&mut self, rev: u64) {
        self.stored_max = self.stored_max.max(rev);
        self.seen_max = self.seen_max.max(rev);
    }

    /// A write was stored at `revision`. A renew acknowledged late in the lease it
    /// renews reads the key back first ([`Call::renew_written`]).
    pub(super) fn on_written(&mut self, now: Instant, revision: u64) {
        if !self.renew_written(now, revision) {
            self.on_written_in_time(revision);
        }
    }

    /// Replies to a write stored at `revision` (a renewal: before its lease's end).
    pub(super) fn on_written_in_time(&mut self, revision: u64) {
        match std::mem::replace(&mut self.job, Job::Done) {
            Job::Acquire(r) => self.acquired(r, revision),
            Job::Renew(r, Some(Renewal { record, .. })) => self.renewed(r, record, revision),
            Job::Release { key, holder, .. } => self.released(key, holder, revision),
            other => self.job = other,
        }
    }

    pub(super) fn on_conflict(&mut self) {
        let key = self.key().to_string();
        self.read(key);
    }
}
