//! Forward: read who owns the key, request the owner's inbox with the fence, and
//! on no responders or a stale reject read again and try the new owner, at most
//! [`MAX_FORWARD_ATTEMPTS`] times and within the call's `timeout_ms`.

use std::time::Instant;

use base64::Engine as _;

use super::{Call, Job, Waiting, with_owner};
use crate::call_request::{CallRequest, InboxRequest};
use crate::io::RequestOutcome;
use crate::js::KeyState;
use crate::subjects::{HDR_REJECT, REJECT_STALE};
use crate::wire::{ErrorKind, ErrorReply, ForwardReply, ForwardRequest, Response};

/// How many owners a forward tries at most.
pub const MAX_FORWARD_ATTEMPTS: u32 = 3;
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    NoResponders,
    Rejected,
}

#[derive(Debug)]
pub(super) struct ForwardJob {
    pub(super) request: ForwardRequest,
    pub(super) deadline: Instant,
    pub(super) attempts: u32,
    pub(super) last_tried: Option<(String, u64)>,
    pub(super) retry: Option<Retry>,
}

impl Call {
    pub(super) fn forward_after_read(&mut self, now: Instant, mut f: ForwardJob, state: KeyState) {
        let (holder, revision) = match state {
            KeyState::Held {
                revision, record, ..
            } => (record.holder, revision),
            _ => {
                let key = f.request.key.clone();
                return self.fail(with_owner(
                    ErrorReply::new(ErrorKind::NotHeld, format!("nobody holds `{key}`")),
                    f.last_tried,
                ));
            }
        };
        if let Some(retry) = f.retry {
            let same = f.last_tried.as_ref() == Some(&(holder.clone(), revision));
            if same || f.attempts >= MAX_FORWARD_ATTEMPTS {
                let key = f.request.key.clone();
                let (kind, why) = match retry {
                    Retry::NoResponders => {
                        (ErrorKind::OwnerUnavailable, "has no responder on its inbox")
                    }
                    Retry::Rejected => (ErrorKind::OwnerRejected, "rejected the request as stale"),
                };
                let attempts = f.attempts;
                return self.fail(with_owner(
                    ErrorReply::new(
                        kind,
                        format!(
                            "the owner of `{key}` {why} (after {attempts} attempt{})",
                            if attempts == 1 { "" } else { "s" }
                        ),
                    ),
                    f.last_tried,
                ));
            }
        }
        if now >= f.deadline {
            return self.fail(with_owner(
                ErrorReply::new(
                    ErrorKind::OwnerTimeout,
                    "the forward ran out of timeout_ms before the owner replied",
                ),
                f.last_tried,
            ));
        }
        f.attempts += 1;
        f.retry = None;
        f.last_tried = Some((holder.clone(), revision));
        let id = crate::io::TransmitId::UNSENT;
        let request = InboxRequest {
            id,
            holder,
            key: f.request.key.clone(),
            fence: revision,
            payload: f.request.payload.clone(),
            timeout: f.deadline.saturating_duration_since(now),
        };
        self.job = Job::Forward(f);
        self.issue(Waiting::Inbox, CallRequest::InboxRequest(request));
    }

    pub(super) fn on_inbox(&mut self, now: Instant, outcome: RequestOutcome) {
        let Job::Forward(mut f) = std::mem::replace(&mut self.job, Job::Done) else {
            return;
        };
        let retry = match outcome {
            RequestOutcome::Reply { headers, payload } => {
                if !is_reject(&headers) {
                    return self.forward_reply(f, payload);
                }
                Retry::Rejected
            }
            RequestOutcome::NoResponders => Retry::NoResponders,
            RequestOutcome::TimedOut => {
                return self.fail(with_owner(
                    ErrorReply::new(
                        ErrorKind::OwnerTimeout,
                        "the owner did not reply within timeout_ms; not retried, it may have acted",
                    ),
                    f.last_tried,
                ));
            }
            RequestOutcome::Failed(e) => {
                return self.fail(with_owner(
                    ErrorReply::new(
                        ErrorKind::Unavailable,
                        format!("the request to the owner failed: {e}"),
                    ),
                    f.last_tried,
                ));
            }
        };
        f.retry = Some(retry);
        let key = f.request.key.clone();
        let deadline = f.deadline;
        self.job = Job::Forward(f);
        self.read_before(key, now, deadline);
    }

    fn forward_reply(&mut self, f: ForwardJob, payload: Vec<u8>) {
        let (holder, revision) = f.last_tried.clone().unwrap_or_default();
        let reply = Response::Forwarded(ForwardReply {
            payload: base64::engine::general_purpose::STANDARD.encode(&payload),
            key: f.request.key.clone(),
            holder,
            revision,
        });
        let size = reply.to_json().len();
        if size > self.config.max_payload {
            let max = self.config.max_payload;
            return self.fail(with_owner(
                ErrorReply::new(
                    ErrorKind::ReplyTooLarge,
                    format!(
                        "the owner's reply of {} bytes is {size} bytes as base64 JSON, over the \
                         server's max_payload of {max}: reply with a reference instead",
                        payload.len()
                    ),
                ),
                f.last_tried,
            ));
        }
        self.reply(reply);
    }
}

/// Whether an inbox outcome is the owner's own answer (not a reject, not silence).
pub(super) fn is_owner_reply(outcome: &RequestOutcome) -> bool {
    match outcome {
        RequestOutcome::Reply { headers, .. } => !is_reject(headers),
        _ => false,
    }
}

fn is_reject(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(name, value)| name.eq_ignore_ascii_case(HDR_REJECT) && value.trim() == REJECT_STALE)
}
