//! Table tests of the holder machine and the two guards: one input sequence, the
//! requests and events it must give.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::change::{ChangeEvent, ChangeKind};
use crate::holder::guard::{FenceGuard, InboxGuard, RejectReason};
use crate::holder::{
    Holder, HolderConfig, HolderEvent, HolderStatus, MAX_EXPIRY_MARKER_LAG, MAX_STOP_REQUESTS,
    OutcomeClass, StepDownReason, owner_retry_delay,
};
use crate::io::RequestOutcome;
use crate::test_support::HolderRequest;
use crate::wire::{Endpoint, ErrorKind, ErrorReply};

const TTL: Duration = Duration::from_secs(15);

/// A change event that may have freed the key.
pub(super) fn freed() -> ChangeEvent {
    ChangeEvent {
        kind: ChangeKind::Released,
        revision: 0,
        holder: None,
    }
}

fn config() -> HolderConfig {
    HolderConfig::new("leader", "h1", TTL)
}

fn span() -> Duration {
    config().believed_span(TTL)
}

pub(super) fn lease(revision: u64, holder: &str) -> serde_json::Value {
    json!({"held": true, "key": "leader", "holder": holder, "revision": revision,
        "acquired_at": "2026-10-18T12:00:00Z", "expires_at": "2026-10-18T12:00:15Z",
        "ttl_ms": 15000})
}

pub(super) fn granted(revision: u64) -> RequestOutcome {
    let mut v = lease(revision, "h1");
    v["granted"] = json!(true);
    RequestOutcome::reply(v.to_string())
}

pub(super) fn not_granted(revision: u64) -> RequestOutcome {
    let mut v = lease(revision, "h2");
    v["granted"] = json!(false);
    RequestOutcome::reply(v.to_string())
}

pub(super) fn renewed(revision: u64) -> RequestOutcome {
    RequestOutcome::reply(lease(revision, "h1").to_string())
}

pub(super) fn error(kind: &str) -> RequestOutcome {
    RequestOutcome::reply(json!({"error": "says the service", "kind": kind}).to_string())
}

pub(super) fn body(r: &HolderRequest) -> serde_json::Value {
    serde_json::from_slice(&r.body).unwrap()
}

struct Run {
    holder: Holder,
    t0: Instant,
}

impl Run {
    fn new(config: HolderConfig) -> Self {
        let t0 = Instant::now();
        Self {
            holder: Holder::new(config, t0).unwrap(),
            t0,
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn request(&mut self) -> HolderRequest {
        self.holder
            .poll_transmit()
            .expect("the holder wants to send")
            .into()
    }

    fn no_request(&mut self) {
        assert_eq!(self.holder.poll_transmit(), None);
    }

    fn answer(&mut self, ms: u64, r: &HolderRequest, outcome: RequestOutcome) {
        self.holder.handle_outcome(self.at(ms), r.id, outcome);
    }

    /// The events but refusals (see [`Run::all_events`]).
    fn events(&mut self) -> Vec<HolderEvent> {
        self.all_events()
            .into_iter()
            .filter(|e| !matches!(e, HolderEvent::NotGranted { .. }))
            .collect()
    }

    fn all_events(&mut self) -> Vec<HolderEvent> {
        std::iter::from_fn(|| self.holder.poll_event()).collect()
    }

    /// The renew due at 5000 times out at 8750 (it wrote, the reply was lost); its
    /// retry at 9750, still carrying fence 7, meets `fence_mismatch` at 9760. Returns
    /// the recovery acquire the holder sends then.
    fn renew_written_but_reply_lost(&mut self) -> HolderRequest {
        self.holder.handle_timeout(self.at(5000));
        let first = self.request();
        self.answer(8750, &first, RequestOutcome::TimedOut);
        self.holder.handle_timeout(self.at(9750));
        let retry = self.request();
        assert_eq!(body(&retry)["revision"], 7);
        self.answer(9760, &retry, error("fence_mismatch"));
        let recover = self.request();
        assert_eq!(recover.endpoint, Endpoint::Acquire);
        recover
    }

    /// Acquire sent and granted `revision` at 0; the renew that confirms the grant
    /// sent at 0 too and answered at `reply_ms`. The renew is answered with the same
    /// revision (a real one raises it), so a test's tenure and fence read as one.
    fn elected(config: HolderConfig, revision: u64, reply_ms: u64) -> Self {
        let mut run = Self::new(config);
        let r = run.request();
        run.answer(0, &r, granted(revision));
        assert_eq!(run.events(), [], "a grant alone elects nobody");
        let confirm = run.request();
        assert_eq!(confirm.endpoint, Endpoint::Renew);
        assert_eq!(body(&confirm)["revision"], revision);
        run.answer(reply_ms, &confirm, renewed(revision));
        assert!(matches!(
            run.events()[..],
            [HolderEvent::Elected { fence, .. }] if fence == revision
        ));
        run
    }
}

#[test]
fn first_request_is_an_acquire_of_the_configured_lease() {
    let mut run = Run::new(config());
    let r = run.request();
    assert_eq!(r.endpoint, Endpoint::Acquire);
    assert_eq!(
        body(&r),
        json!({"key": "leader", "holder": "h1", "ttl_ms": 15000})
    );
    assert_eq!(r.timeout, Duration::from_millis(3750));
    run.no_request();
}

#[test]
fn the_deadline_counts_from_the_confirming_renews_send_not_its_reply() {
    let mut run = Run::new(config());
    let r = run.request();
    run.answer(4000, &r, granted(7));
    // The renew that confirms the grant is sent at 4000 and answered 4 s later: the
    // holder may believe only what is left of the TTL from its send.
    let confirm = run.request();
    run.answer(8000, &confirm, renewed(8));
    let deadline = run.at(4000) + span();
    assert_eq!(run.events(), [HolderEvent::Elected { fence: 8, deadline }]);
    assert!(
        run.holder
            .tenure(deadline - Duration::from_millis(1))
            .is_some()
    );
    assert_eq!(run.holder.tenure(deadline), None);
}

#[test]
fn the_drift_margin_shortens_the_deadline() {
    let span = config().believed_span(TTL);
    assert_eq!(span, Duration::from_millis(14_850));
    let mut strict = config();
    strict.max_clock_drift_ppm = 0;
    assert_eq!(strict.believed_span(TTL), TTL);
}

#[test]
fn renews_a_third_of_the_ttl_after_the_last_send_with_the_current_fence() {
    let mut run = Run::elected(config(), 7, 100);
    run.no_request();
    assert_eq!(run.holder.poll_timeout(), Some(run.at(5000)));
    run.holder.handle_timeout(run.at(4999));
    run.no_request();
    run.holder.handle_timeout(run.at(5000));
    let r = run.request();
    assert_eq!(r.endpoint, Endpoint::Renew);
    assert_eq!(
        body(&r),
        json!({"key": "leader", "holder": "h1", "revision": 7, "ttl_ms": 15000})
    );
    run.answer(5300, &r, renewed(9));
    assert_eq!(
        run.events(),
        [HolderEvent::Renewed {
            tenure: 7,
            fence: 9,
            deadline: run.at(5000) + span()
        }]
    );
    assert_eq!(run.holder.poll_timeout(), Some(run.at(10_000)));
}

#[test]
fn lost_steps_down_at_once_and_campaigns_again() {
    let mut run = Run::elected(config(), 7, 1);
    run.holder.handle_timeout(run.at(5000));
    let r = run.request();
    run.answer(5001, &r, error("lost"));
    assert_eq!(
        run.events(),
        [HolderEvent::SteppedDown {
            reason: StepDownReason::Lost
        }]
    );
    assert_eq!(run.holder.tenure(run.at(5001)), None);
    // It campaigns again once the old lease's expiry marker must have come (a
    // renewal written as the lease ran out is `lost` too, and that marker would wipe
    // whatever the key holds before it): not before, not even on a change event.
    run.no_request();
    let quiet_end = run.at(5001) + MAX_EXPIRY_MARKER_LAG;
    assert_eq!(run.holder.poll_timeout(), Some(quiet_end));
    run.holder.handle_change(run.at(5500), &freed());
    run.no_request();
    run.holder.handle_timeout(quiet_end);
    assert_eq!(run.request().endpoint, Endpoint::Acquire);
}

/// A renew whose outcome is unknown when the tenure ends may still land after the
/// lease's end, and the expiry marker still to come would wipe it and any write
/// that confirms it: the holder waits out the marker before it campaigns.
#[test]
fn a_tenure_ended_with_a_renew_unaccounted_for_waits_out_the_expiry_marker() {
    let mut run = Run::elected(config(), 7, 1);
    run.holder.handle_timeout(run.at(5000));
    let renew = run.request();
    let deadline = run.at(0) + span();
    run.holder.handle_timeout(deadline);
    assert!(matches!(
        run.events()[..],
        [HolderEvent::SteppedDown {
            reason: StepDownReason::DeadlineMissed
        }]
    ));
    // The fence 7 was learned at 1 ms (the confirming renew's reply): its lease
    // ends by then + TTL + the drift margin, its marker a lag after that.
    let margin = TTL - span();
    let quiet_end = run.at(1) + TTL + margin + MAX_EXPIRY_MARKER_LAG;
    run.holder
        .handle_timeout(quiet_end - Duration::from_millis(1));
    run.no_request();
    // The renew's late reply changes nothing about the wait.
    run.holder.handle_outcome(deadline, renew.id, renewed(8));
    run.no_request();
    run.holder.handle_timeout(quiet_end);
    assert_eq!(run.request().endpoint, Endpoint::Acquire);
}

#[test]
fn no_renewal_before_the_deadline_steps_down_even_with_a_renew_in_flight() {
    let mut run = Run::elected(config(), 7, 1);
    let deadline = run.at(0) + span();
    // Nothing ever answers. The holder times each renew out itself (3750 ms) and
    // retries a second later: renews at 5000, 9750 and 14500.
    run.holder.handle_timeout(run.at(5000));
    let mut renew = run.request();
    for (timed_out, retry) in [(8750, 9750), (13_500, 14_500)] {
        assert_eq!(run.holder.poll_timeout(), Some(run.at(timed_out)));
        run.holder.handle_timeout(run.at(timed_out));
        run.no_request();
        assert_eq!(run.holder.poll_timeout(), Some(run.at(retry)));
        run.holder.handle_timeout(run.at(retry));
        renew = run.request();
        assert_eq!(body(&renew)["revision"], 7);
    }
    // The last one is still in flight when the deadline comes, and the deadline is
    // the next thing to act on.
    assert_eq!(run.holder.poll_timeout(), Some(deadline));
    assert!(
        run.holder.tenure(deadline).is_none(),
        "believes past its deadline"
    );
    run.holder.handle_timeout(deadline);
    assert_eq!(
        run.events(),
        [HolderEvent::SteppedDown {
            reason: StepDownReason::DeadlineMissed
        }]
    );
    // A late success of that renew no longer counts.
    run.answer(15_000, &renew, renewed(9));
    assert_eq!(run.events(), []);
    assert_eq!(run.holder.tenure(run.at(15_000)), None);
}

/// A renew whose success arrives after the deadline, before the holder's timer
/// fired: it may have landed after the server's expiry, whose marker then wipes it.
/// It must not extend the tenure.
#[test]
fn a_renewal_answered_after_the_deadline_does_not_revive_the_tenure() {
    let mut run = Run::elected(config(), 7, 1);
    run.holder.handle_timeout(run.at(5000));
    let renew = run.request();
    let deadline = run.at(0) + span();
    run.holder
        .handle_outcome(deadline + Duration::from_millis(1), renew.id, renewed(9));
    assert_eq!(
        run.events(),
        [HolderEvent::SteppedDown {
            reason: StepDownReason::DeadlineMissed
        }]
    );
    assert_eq!(run.holder.tenure(deadline + Duration::from_millis(1)), None);
}

/// The renew confirming a grant is held to the deadline it would give (its send
/// plus the believed span), as an owner's renew is: a reply handled at or after it
/// (a holder paused with the reply waiting) may come from a write that landed
/// after the lease's end, which the expiry marker wipes. It elects nobody; the
/// holder waits out that marker and campaigns again.
#[test]
fn a_confirming_renew_answered_at_or_after_its_deadline_elects_nobody() {
    let span_ms = span().as_millis() as u64;
    for (reply_ms, elected) in [
        (span_ms - 1, true),
        (span_ms, false),
        (span_ms + 500, false),
    ] {
        let mut run = Run::new(config());
        let r = run.request();
        run.answer(0, &r, granted(7));
        let confirm = run.request();
        assert_eq!(confirm.endpoint, Endpoint::Renew);
        run.answer(reply_ms, &confirm, renewed(8));
        let events = run.events();
        if elected {
            assert!(
                matches!(events[..], [HolderEvent::Elected { .. }, ..]),
                "{reply_ms}: {events:?}"
            );
            continue;
        }
        assert_eq!(events, [], "elected by a reply at {reply_ms} ms");
        assert_eq!(run.holder.status(), HolderStatus::Campaigning);
        assert_eq!(run.holder.tenure(run.at(reply_ms)), None);
        // Fence 7 was learned at 0: its lease ends by the TTL and the drift margin,
        // its marker a lag after that.
        let quiet_end = run.at(0) + TTL + (TTL - span()) + MAX_EXPIRY_MARKER_LAG;
        run.holder
            .handle_timeout(quiet_end - Duration::from_millis(1));
        run.no_request();
        run.holder.handle_timeout(quiet_end);
        assert_eq!(run.request().endpoint, Endpoint::Acquire);
    }
}

/// A corrupt record answers `internal` until someone repairs it: a campaign backs
/// off, doubling from `retry_every` (1 s here) up to one TTL, and a reply resets it.
#[test]
fn a_campaign_backs_off_while_the_service_keeps_failing() {
    let mut run = Run::new(config());
    let mut at = 0;
    let mut waits = Vec::new();
    for _ in 0..6 {
        let r = run.request();
        run.answer(at, &r, error("internal"));
        let next = run.holder.poll_timeout().expect("a retry");
        waits.push((next - run.at(at)).as_millis());
        at = (next - run.t0).as_millis() as u64;
        run.holder.handle_timeout(next);
    }
    assert_eq!(waits, [1000, 2000, 4000, 8000, 15_000, 15_000]);
    // A real answer resets it: the next failure waits retry_every again.
    let r = run.request();
    run.answer(at, &r, not_granted(4));
    let next = run.holder.poll_timeout().expect("a campaign tick");
    run.holder.handle_timeout(next);
    let r = run.request();
    let at = (next - run.t0).as_millis() as u64;
    run.answer(at, &r, error("unavailable"));
    let retry = run.holder.poll_timeout().expect("a retry");
    assert_eq!(retry - run.at(at), Duration::from_secs(1));
}

#[test]
fn retries_a_failed_renew_until_the_deadline() {
    let mut run = Run::elected(config(), 7, 1);
    run.holder.handle_timeout(run.at(5000));
    let r = run.request();
    run.answer(5010, &r, error("unavailable"));
    run.no_request();
    assert_eq!(run.holder.poll_timeout(), Some(run.at(6010)));
    run.holder.handle_timeout(run.at(6010));
    let r = run.request();
    assert_eq!(body(&r)["revision"], 7);
    run.answer(6020, &r, RequestOutcome::NoResponders);
    assert!(run.holder.tenure(run.at(6020)).is_some());
    assert_eq!(run.events(), []);
}

/// The owner's retry rule: the first failure waits `retry_every`; from the second
/// on the wait doubles and the jitter adds up to half of it; never past the room
/// left before the deadline, and with less room than `retry_every`, `retry_every`.
#[test]
fn an_owners_retries_back_off_with_jitter_within_the_room_before_its_deadline() {
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    let room = s(3600);
    for (failures, jitter, room, wait) in [
        (1, 0, room, s(1)),
        (1, u64::MAX, room, s(1)),
        (2, 0, room, s(2)),
        (2, 1 << 63, room, ms(2500)),
        (2, u64::MAX, room, ms(3000) - Duration::from_nanos(1)),
        (3, 0, room, s(4)),
        (3, 1 << 62, room, ms(4500)),
        (5, 0, room, s(16)),
        // Capped by the room: still a send before the deadline.
        (5, 0, s(7), s(7)),
        (3, u64::MAX, ms(4200), ms(4200)),
        // Less room than retry_every: back to the old pace.
        (6, 0, ms(400), s(1)),
        (6, u64::MAX, Duration::ZERO, s(1)),
        // Many failures: the doubling stops, the room still bounds it.
        (u32::MAX, 0, room, s(1 << 16).min(room)),
    ] {
        assert_eq!(
            owner_retry_delay(s(1), failures, jitter, room),
            wait,
            "failures {failures}, jitter {jitter}, room {room:?}"
        );
    }
}

/// An owner the service keeps answering `unavailable`: its renews go out spread
/// apart more and more (not every `retry_every`), the last one still sent with
/// room for its reply before the deadline, and it steps down at the deadline.
/// Two holders that failed at the same instants retry at different ones.
#[test]
fn an_owner_answered_unavailable_backs_off_and_still_steps_down_at_its_deadline() {
    let ttl = Duration::from_secs(60);
    let sends = |holder: &str| {
        let config = HolderConfig::new("leader", holder, ttl);
        let (span, timeout) = (config.believed_span(ttl), config.request_timeout);
        // A 60 s lease: granted at 7 and confirmed by a renew, both at 0.
        let sixty = |mut v: serde_json::Value| {
            v["ttl_ms"] = json!(60_000);
            RequestOutcome::reply(v.to_string())
        };
        let mut run = Run::new(config);
        let r = run.request();
        let mut grant = lease(7, holder);
        grant["granted"] = json!(true);
        run.answer(0, &r, sixty(grant));
        let confirm = run.request();
        run.answer(0, &confirm, sixty(lease(7, holder)));
        assert!(matches!(run.events()[..], [HolderEvent::Elected { .. }]));
        let deadline = run.at(0) + span;
        let mut sends = Vec::new();
        let mut at = run.at(20_000);
        loop {
            run.holder.handle_timeout(at);
            if run.holder.tenure(at).is_none() {
                break;
            }
            let r = run.request();
            assert_eq!(r.endpoint, Endpoint::Renew);
            sends.push(at - run.t0);
            run.holder
                .handle_outcome(at + Duration::from_millis(5), r.id, error("unavailable"));
            at = run.holder.poll_timeout().expect("a retry or the deadline");
        }
        assert_eq!(at, deadline, "it acts next at its deadline");
        assert_eq!(
            run.events(),
            [HolderEvent::SteppedDown {
                reason: StepDownReason::DeadlineMissed
            }]
        );
        (sends, deadline - run.t0, timeout)
    };
    let (a, deadline, timeout) = sends("h1");
    let gaps: Vec<Duration> = a.windows(2).map(|w| w[1] - w[0]).collect();
    // TTL/10 (6 s) is clamped to 1 s: the first retry 1 s after the failure.
    assert_eq!(gaps[0], Duration::from_millis(1005));
    assert!(gaps[1] >= Duration::from_secs(2), "{gaps:?}");
    assert!(gaps[2] >= Duration::from_secs(4), "{gaps:?}");
    // Fewer sends than one every second over the same span.
    let span = a[a.len() - 1] - a[0];
    assert!((a.len() as u128) < span.as_millis() / 1005 / 2, "{a:?}");
    // A renew goes out within the last request timeout before the deadline.
    assert!(
        a.iter().any(|t| *t + timeout >= deadline),
        "{a:?} {deadline:?}"
    );
    let (b, ..) = sends("h2");
    assert_ne!(a, b, "jitter differs between holders");
}

#[test]
fn fence_mismatch_is_recovered_with_an_acquire_that_returns_the_current_fence() {
    let mut run = Run::elected(config(), 7, 1);
    // The first renew's reply is lost: it did write (fence 9).
    let recover = run.renew_written_but_reply_lost();
    run.answer(9770, &recover, granted(9));
    // Fence 9 was written by the renew sent at 5000: that bounds the deadline.
    assert_eq!(
        run.events(),
        [HolderEvent::Renewed {
            tenure: 7,
            fence: 9,
            deadline: run.at(5000) + span()
        }]
    );
}

#[test]
fn fence_mismatch_whose_recovery_finds_another_holder_steps_down() {
    let mut run = Run::elected(config(), 7, 1);
    run.holder.handle_timeout(run.at(5000));
    let r = run.request();
    run.answer(5001, &r, error("fence_mismatch"));
    let recover = run.request();
    run.answer(5002, &recover, not_granted(12));
    assert_eq!(
        run.events(),
        [HolderEvent::SteppedDown {
            reason: StepDownReason::Lost
        }]
    );
}

/// The bug this rule fixes: a holder made afresh (Shards rebuilding it, `stop` then
/// `elect`, a restart under the same ID) gets `granted: true` for an older write of
/// its holder ID, which the server expires up to a TTL sooner than a fresh one. A
/// grant cannot show whether it was written just now, so none elects by itself.
#[test]
fn a_grant_elects_nobody_until_a_renew_proves_the_lease() {
    let mut run = Run::new(config());
    let r = run.request();
    run.answer(10, &r, granted(3));
    assert_eq!(run.events(), [], "elected on a grant of unknown age");
    assert_eq!(run.holder.tenure(run.at(10)), None);
    let confirm = run.request();
    assert_eq!(
        (confirm.endpoint, body(&confirm)["revision"].as_u64()),
        (Endpoint::Renew, Some(3))
    );
    // The older write was at its end: the service says lost, nobody was elected.
    run.answer(20, &confirm, error("lost"));
    assert_eq!(run.events(), []);
    assert_eq!(run.holder.tenure(run.at(20)), None);
    // That renew may have been written as the lease ran out, and the old lease's
    // expiry marker would wipe it and anything won before the marker (an acquire
    // right away is granted that very write): it asks again once the marker must
    // have come.
    run.no_request();
    let quiet = crate::holder::MAX_EXPIRY_MARKER_LAG.as_millis() as u64;
    run.holder.handle_timeout(run.at(20 + quiet - 1));
    run.no_request();
    run.holder.handle_timeout(run.at(20 + quiet));
    assert_eq!(run.request().endpoint, Endpoint::Acquire);
}

/// A holder made afresh under the same ID (a restart, `stop` then `elect`) is
/// granted the last write of the ID's earlier tenure, at the fence that tenure
/// handed out last. The new tenure starts at the confirming renew's revision,
/// above it: a store that refuses only lower fences then refuses the earlier
/// tenure's late writes, and the inbox refuses forwards read before the renew.
#[test]
fn a_tenure_starts_at_the_confirming_renews_revision_above_the_grants() {
    let mut store = FenceGuard::new();
    store.admit(7).unwrap(); // the earlier tenure's write with its last fence
    let mut run = Run::new(config());
    let r = run.request();
    run.answer(0, &r, granted(7));
    let confirm = run.request();
    assert_eq!(body(&confirm)["revision"], 7);
    run.answer(10, &confirm, renewed(8));
    let deadline = run.at(0) + span();
    let events = run.events();
    assert_eq!(events, [HolderEvent::Elected { fence: 8, deadline }]);
    let own = run.holder.tenure(run.at(10)).expect("owner");
    assert_eq!((own.tenure, own.fence), (8, 8));
    // The new tenure writes with its fence; the earlier tenure's late write with 7
    // must be refused.
    store.admit(own.tenure).unwrap();
    assert!(
        store.admit(7).is_err(),
        "the earlier tenure's late write passed"
    );
    let mut inbox = InboxGuard::new("h1");
    inbox.observe("leader", &events[0]);
    assert_eq!(
        inbox.check(run.at(10), INBOX, Some("7")),
        Err(RejectReason::StaleFence)
    );
    assert!(inbox.check(run.at(10), INBOX, Some("8")).is_ok());
}

#[test]
fn no_responders_proves_nothing_was_written() {
    // A recovery grant in a tenure: a renew that met no responders wrote nothing, so
    // it does not bound the lease the recovery finds.
    let mut run = Run::elected(config(), 7, 1);
    let recover = run.renew_written_but_reply_lost();
    run.answer(9770, &recover, granted(8));
    assert!(matches!(
        run.events()[..],
        [HolderEvent::Renewed {
            tenure: 7,
            fence: 8,
            ..
        }]
    ));
    let mut run = Run::new(config());
    let first = run.request();
    run.answer(1, &first, RequestOutcome::NoResponders);
    run.holder.handle_timeout(run.at(2000));
    let retry = run.request();
    run.answer(2001, &retry, granted(3));
    let confirm = run.request();
    run.answer(2002, &confirm, renewed(4));
    assert!(matches!(
        run.events()[..],
        [HolderEvent::Elected { fence: 4, deadline }] if deadline == run.at(2001) + span()
    ));
}

#[test]
fn an_idempotent_acquire_does_not_extend_the_deadline() {
    let mut run = Run::elected(config(), 7, 1);
    // The renew's reply is lost; it did write 8.
    let recover = run.renew_written_but_reply_lost();
    run.answer(9770, &recover, granted(8));
    let bound = run.at(5000) + span();
    assert_eq!(
        run.events(),
        [HolderEvent::Renewed {
            tenure: 7,
            fence: 8,
            deadline: bound
        }]
    );
    // The next renew meets a mismatch (say a twin's write went missing), and the
    // recovery returns 8 again: the lease written at 5000, not extended.
    run.holder.handle_timeout(run.at(14_760));
    let r = run.request();
    run.answer(14_770, &r, error("fence_mismatch"));
    let recover = run.request();
    run.answer(14_780, &recover, granted(8));
    assert_eq!(
        run.events(),
        [HolderEvent::Renewed {
            tenure: 7,
            fence: 8,
            deadline: bound
        }]
    );
}

#[test]
fn a_grant_older_than_a_revision_already_seen_is_a_stale_read() {
    let mut run = Run::new(config());
    let r = run.request();
    run.answer(1, &r, not_granted(40));
    // A deposed stream leader answers from old state: "yours, at 17".
    run.holder.handle_timeout(run.at(5001));
    let r = run.request();
    run.answer(5002, &r, granted(17));
    assert_eq!(run.events(), [], "elected on a stale read");
    assert_eq!(run.holder.tenure(run.at(5002)), None);
    run.holder.handle_timeout(run.at(6002));
    let r = run.request();
    assert_eq!(r.endpoint, Endpoint::Acquire);
    run.answer(6003, &r, granted(41));
    let confirm = run.request();
    run.answer(6004, &confirm, renewed(42));
    assert!(matches!(
        run.events()[..],
        [HolderEvent::Elected { fence: 42, .. }]
    ));
}

#[test]
fn unavailable_may_have_written_so_it_bounds_a_later_grant() {
    // In a tenure: a renew answered `unavailable` may have written, so a recovery
    // grant of a newer revision is bounded by that renew's send.
    let mut run = Run::elected(config(), 7, 1);
    run.holder.handle_timeout(run.at(5000));
    let renew = run.request();
    run.answer(5010, &renew, error("unavailable"));
    run.holder.handle_timeout(run.at(6010));
    let retry = run.request();
    run.answer(6020, &retry, error("fence_mismatch"));
    let recover = run.request();
    assert_eq!(recover.endpoint, Endpoint::Acquire);
    run.answer(6030, &recover, granted(9));
    assert!(matches!(
        run.events()[..],
        [HolderEvent::Renewed { tenure: 7, fence: 9, deadline }]
            if deadline == run.at(5000) + span()
    ));
}

#[test]
fn a_grant_too_old_to_believe_is_confirmed_by_a_renew_that_starts_the_tenure() {
    let mut run = Run::new(config());
    let first = run.request();
    run.answer(3750, &first, RequestOutcome::TimedOut);
    // Much later, a grant of a lease that old acquire may have written long ago.
    run.holder.handle_timeout(run.at(20_000));
    let acquire = run.request();
    run.answer(20_010, &acquire, granted(9));
    assert_eq!(run.events(), [], "elected on a lease of unknown age");
    let confirm = run.request();
    assert_eq!(confirm.endpoint, Endpoint::Renew);
    assert_eq!(body(&confirm)["revision"], 9);
    // The confirming renew fails for now: the next grant of 9 is still not fresh.
    run.answer(20_020, &confirm, RequestOutcome::NoResponders);
    run.holder.handle_timeout(run.at(21_020));
    let again = run.request();
    assert_eq!(again.endpoint, Endpoint::Acquire);
    run.answer(21_030, &again, granted(9));
    assert_eq!(
        run.events(),
        [],
        "a second grant of the same lease is no fresher"
    );
    let confirm = run.request();
    assert_eq!(confirm.endpoint, Endpoint::Renew);
    run.answer(21_040, &confirm, renewed(12));
    let deadline = run.at(21_030) + span();
    assert_eq!(
        run.events(),
        [HolderEvent::Elected {
            fence: 12,
            deadline
        }]
    );
    assert_eq!(run.holder.tenure(run.at(21_040)).unwrap().tenure, 12);
}

#[test]
fn an_idempotent_grant_past_the_old_deadline_is_not_an_election() {
    let mut run = Run::elected(config(), 7, 1);
    let deadline = run.at(0) + span();
    run.holder.handle_timeout(deadline);
    assert_eq!(run.events().len(), 1);
    run.holder.handle_timeout(deadline + Duration::from_secs(1));
    let r = run.request();
    run.answer(16_000, &r, granted(7));
    assert_eq!(run.events(), [], "elected on a lease it may not believe in");
    assert_eq!(run.holder.tenure(run.at(16_000)), None);
}

#[test]
fn another_holder_means_campaigning_again_later_or_on_a_change_event() {
    let mut run = Run::new(config());
    let r = run.request();
    run.answer(10, &r, not_granted(4));
    assert_eq!(run.events(), []);
    assert_eq!(run.holder.poll_timeout(), Some(run.at(5010)));
    run.no_request();
    run.holder.handle_change(run.at(100), &freed());
    assert_eq!(run.request().endpoint, Endpoint::Acquire);
}

/// A campaign's acquire that leaves the holder campaigning is reported, naming the
/// holder the service named; a grant, or a renew's answer, is not.
#[test]
fn an_acquire_that_does_not_win_the_key_is_reported_refused() {
    let mut run = Run::new(config());
    let r = run.request();
    run.answer(10, &r, not_granted(4));
    let by = |h: &str| HolderEvent::NotGranted {
        holder: Some(h.to_string()),
        answer: OutcomeClass::Clear,
    };
    assert_eq!(run.all_events(), [by("h2")]);
    run.holder.handle_timeout(run.at(5010));
    let r = run.request();
    run.answer(5020, &r, RequestOutcome::TimedOut);
    assert_eq!(
        run.all_events(),
        [HolderEvent::NotGranted {
            holder: None,
            answer: OutcomeClass::TimedOut
        }]
    );
    let next = run.holder.poll_timeout().expect("it campaigns on");
    run.holder.handle_timeout(next);
    let r = run.request();
    let later = u64::try_from((next - run.at(0)).as_millis()).unwrap() + 10;
    run.answer(later, &r, RequestOutcome::NoResponders);
    assert_eq!(
        run.all_events(),
        [HolderEvent::NotGranted {
            holder: None,
            answer: OutcomeClass::NoResponders
        }],
        "no service is told apart from a holder"
    );
    let mut run = Run::new(config());
    let r = run.request();
    run.answer(10, &r, granted(4));
    assert_eq!(run.all_events(), [], "confirming, not refused");
    let mut run = Run::elected(config(), 7, 1);
    run.all_events();
    run.holder.handle_timeout(run.at(5000));
    let renew = run.request();
    run.answer(5010, &renew, renewed(8));
    assert!(
        !run.all_events()
            .iter()
            .any(|e| matches!(e, HolderEvent::NotGranted { .. }))
    );
}

/// Only an event that may have freed the key wakes a candidate: an acquire or a
/// renewal by the owner leaves it to its next campaign tick.
#[test]
fn a_change_event_that_cannot_free_the_key_does_not_wake_the_holder() {
    for (kind, wakes) in [
        (ChangeKind::Acquired, false),
        (ChangeKind::Renewed, false),
        (ChangeKind::Released, true),
        (ChangeKind::Expired, true),
    ] {
        let mut run = Run::new(config());
        let r = run.request();
        run.answer(10, &r, not_granted(4));
        let event = ChangeEvent {
            kind,
            revision: 5,
            holder: Some("h2".to_string()),
        };
        run.holder.handle_change(run.at(100), &event);
        assert_eq!(run.holder.poll_transmit().is_some(), wakes, "{kind:?}");
    }
}

#[test]
fn stop_steps_down_first_then_releases_with_the_current_fence() {
    let mut run = Run::elected(config(), 7, 1);
    run.holder.handle_stop(run.at(10));
    assert_eq!(
        run.events(),
        [HolderEvent::SteppedDown {
            reason: StepDownReason::Stopped
        }]
    );
    assert_eq!(run.holder.tenure(run.at(10)), None);
    let r = run.request();
    assert_eq!(r.endpoint, Endpoint::Release);
    assert_eq!(
        body(&r),
        json!({"key": "leader", "holder": "h1", "revision": 7})
    );
    assert!(!run.holder.is_done());
    let released =
        json!({"released": true, "held": false, "key": "leader", "holder": "h1", "revision": 8});
    run.answer(11, &r, RequestOutcome::reply(released.to_string()));
    assert!(run.holder.is_done());
}

#[test]
fn revoke_steps_down_at_once_and_keeps_the_lease_until_the_deadline_handed_out() {
    let mut run = Run::elected(config(), 7, 1);
    let deadline = run.at(0) + span();
    run.holder.handle_revoke(run.at(10));
    assert_eq!(
        run.events(),
        [HolderEvent::SteppedDown {
            reason: StepDownReason::Revoked { deadline }
        }]
    );
    assert_eq!(run.holder.tenure(run.at(10)), None);
    assert_eq!(run.holder.revoked_until(), Some(deadline));
    // No renew at its tick, no release before the deadline; the timer is the deadline.
    run.no_request();
    assert_eq!(run.holder.poll_timeout(), Some(deadline));
    run.holder.handle_timeout(run.at(5_000));
    run.no_request();
    run.holder.handle_timeout(deadline);
    let r = run.request();
    assert_eq!(r.endpoint, Endpoint::Release);
    assert_eq!(body(&r)["revision"], 7);
    assert_eq!(run.events(), []);
}

#[test]
fn stop_of_a_revoked_holder_releases_at_once() {
    let mut run = Run::elected(config(), 7, 1);
    run.holder.handle_revoke(run.at(10));
    run.events();
    run.holder.handle_stop(run.at(20));
    assert_eq!(run.events(), [], "it stepped down already");
    let r = run.request();
    assert_eq!(r.endpoint, Endpoint::Release);
    assert_eq!(run.holder.revoked_until(), None);
}

#[test]
fn revoke_before_any_deadline_was_handed_out_is_a_stop() {
    let mut run = Run::new(config());
    let acquire = run.request();
    run.answer(1, &acquire, granted(5));
    let _confirm = run.request();
    run.holder.handle_revoke(run.at(2));
    assert_eq!(run.events(), []);
    assert_eq!(run.holder.revoked_until(), None);
}

#[test]
fn stop_with_an_acquire_in_flight_releases_what_it_grants() {
    let mut run = Run::new(config());
    let acquire = run.request();
    run.holder.handle_stop(run.at(1));
    run.no_request();
    run.answer(2, &acquire, granted(5));
    assert_eq!(run.events(), [], "never elected while stopping");
    let r = run.request();
    assert_eq!(r.endpoint, Endpoint::Release);
    assert_eq!(body(&r)["revision"], 5);
}

/// How a stop goes when nothing is ever answered: each request given up at its
/// timeout, the holder done within [`HolderConfig::stop_bound`] of the stop, from
/// every state a stop can find it in.
#[test]
fn a_stop_that_hears_nothing_is_done_within_the_stop_bound() {
    type Setup = fn(&mut Run) -> u64;
    let table: [(&str, Setup); 6] = [
        ("owner, idle", |run| {
            run.holder.handle_timeout(run.at(10));
            10
        }),
        ("owner, a renew in flight", |run| {
            run.holder.handle_timeout(run.at(5000));
            let _renew = run.request();
            5001
        }),
        ("revoked, holding until the deadline", |run| {
            run.holder.handle_revoke(run.at(10));
            20
        }),
        ("owner, the renew's reply lost", |run| {
            let _recover = run.renew_written_but_reply_lost();
            9761
        }),
        ("campaigning, an acquire in flight", |run| {
            *run = Run::new(config());
            let _acquire = run.request();
            1
        }),
        ("campaigning, waiting for the next tick", |run| {
            *run = Run::new(config());
            let acquire = run.request();
            run.answer(1, &acquire, not_granted(3));
            2
        }),
    ];
    for (name, setup) in table {
        let mut run = Run::elected(config(), 7, 1);
        let stop_ms = setup(&mut run);
        let stopped = run.at(stop_ms);
        run.holder.handle_stop(stopped);
        let mut now = stopped;
        let mut sent = 0;
        // Only time passes: whatever is sent is never answered.
        while !run.holder.is_done() {
            while run.holder.poll_transmit().is_some() {
                sent += 1;
            }
            let at = run
                .holder
                .poll_timeout()
                .unwrap_or_else(|| panic!("{name}: a stopping holder waits on nothing"));
            assert!(at >= now, "{name}: a timer in the past");
            now = at;
            run.holder.handle_timeout(now);
        }
        let took = now - stopped;
        assert!(
            took <= config().stop_bound(),
            "{name}: done {took:?} after the stop, bound {:?}",
            config().stop_bound()
        );
        assert!(sent <= MAX_STOP_REQUESTS, "{name}: {sent} requests sent");
    }
}

#[test]
fn invalid_or_unsupported_ends_the_holder_with_the_reason() {
    for kind in ["invalid", "unsupported"] {
        let mut run = Run::new(config());
        let r = run.request();
        run.answer(1, &r, error(kind));
        let events = run.events();
        assert!(
            matches!(&events[..], [HolderEvent::Failed { kind: k, .. }] if k.as_str() == kind),
            "{events:?}"
        );
        assert!(run.holder.is_done());
        assert_eq!(run.holder.poll_timeout(), None);
    }
}

#[test]
fn a_malformed_reply_counts_as_an_unknown_outcome() {
    let mut run = Run::new(config());
    let first = run.request();
    run.answer(1, &first, RequestOutcome::reply("not json"));
    assert_eq!(run.events(), []);
    run.holder.handle_timeout(run.at(1001));
    let retry = run.request();
    run.answer(1002, &retry, granted(2));
    assert_eq!(run.events(), []);
    let confirm = run.request();
    assert_eq!(confirm.endpoint, Endpoint::Renew);
    run.answer(1003, &confirm, renewed(3));
    assert!(matches!(
        run.events()[..],
        [HolderEvent::Elected { deadline, .. }] if deadline == run.at(1002) + span()
    ));
}

#[test]
fn the_config_is_checked_against_the_contract_bounds() {
    let bad = [
        HolderConfig::new("a.b", "h1", TTL),
        HolderConfig::new("leader", "", TTL),
        HolderConfig::new("leader", "h1", Duration::from_millis(1500)),
        HolderConfig::new("leader", "h1", Duration::from_secs(601)),
        HolderConfig {
            campaign_every: Duration::ZERO,
            ..config()
        },
        HolderConfig {
            renew_every: TTL - Duration::from_millis(100),
            ..config()
        },
        HolderConfig {
            request_timeout: TTL,
            ..config()
        },
        HolderConfig {
            retry_every: Duration::MAX,
            ..config()
        },
        HolderConfig {
            campaign_every: Duration::MAX,
            ..config()
        },
        HolderConfig {
            first_renewal_sooner: config().renew_every,
            ..config()
        },
    ];
    for config in bad {
        let err = Holder::new(config.clone(), Instant::now()).unwrap_err();
        assert!(!err.message().is_empty(), "{config:?}");
        // Where a campaign hands it on, it is an `invalid` reply.
        assert_eq!(ErrorReply::from(err).kind, ErrorKind::Invalid, "{config:?}");
    }
}

// The guards.

const INBOX: &str = "dagnats.lease.inbox.h1.leader";

#[test]
fn inbox_guard_rejects_until_a_tenure_begins_and_after_it_ends() {
    let now = Instant::now();
    let mut guard = InboxGuard::new("h1");
    assert_eq!(
        guard.check(now, INBOX, Some("5")),
        Err(RejectReason::NotOwner)
    );
    guard.begin("leader", 5, now + TTL);
    assert_eq!(guard.check(now, INBOX, Some("5")).unwrap().fence, 5);
    assert_eq!(guard.check(now, INBOX, Some("9")).unwrap().fence, 9);
    guard.end("leader");
    assert_eq!(
        guard.check(now, INBOX, Some("5")),
        Err(RejectReason::NotOwner)
    );
}

#[test]
fn inbox_guard_rejects_past_the_local_deadline() {
    let now = Instant::now();
    let mut guard = InboxGuard::new("h1");
    guard.begin("leader", 5, now + TTL);
    assert!(
        guard
            .check(now + TTL - Duration::from_millis(1), INBOX, Some("5"))
            .is_ok()
    );
    assert_eq!(
        guard.check(now + TTL, INBOX, Some("5")),
        Err(RejectReason::NotOwner)
    );
    guard.extend("leader", now + 2 * TTL);
    assert!(guard.check(now + TTL, INBOX, Some("5")).is_ok());
}

#[test]
fn inbox_guard_rejects_a_missing_malformed_or_stale_fence() {
    let now = Instant::now();
    let mut guard = InboxGuard::new("h1");
    guard.begin("leader", 42, now + TTL);
    assert_eq!(
        guard.check(now, INBOX, None),
        Err(RejectReason::MissingFence)
    );
    for bad in [
        "",
        "-1",
        "+42",
        " 42",
        "42 ",
        "4.2e1",
        "x",
        "18446744073709551616",
    ] {
        assert_eq!(
            guard.check(now, INBOX, Some(bad)),
            Err(RejectReason::MalformedFence),
            "{bad:?}"
        );
    }
    assert_eq!(
        guard.check(now, INBOX, Some("41")),
        Err(RejectReason::StaleFence)
    );
}

#[test]
fn inbox_guard_knows_only_its_own_inbox() {
    let now = Instant::now();
    let mut guard = InboxGuard::new("h1");
    guard.begin("leader", 1, now + TTL);
    for subject in [
        "dagnats.lease.inbox.h2.leader",
        "dagnats.lease.inbox.h1.",
        "dagnats.lease.inbox.h1.leader.x",
        "api.leases.acquire",
    ] {
        assert_eq!(
            guard.check(now, subject, Some("1")),
            Err(RejectReason::WrongSubject),
            "{subject}"
        );
    }
}

#[test]
fn inbox_guard_follows_holder_events() {
    let now = Instant::now();
    let mut guard = InboxGuard::new("h1");
    let deadline = now + TTL;
    guard.observe("leader", &HolderEvent::Elected { fence: 3, deadline });
    assert!(guard.check(now, INBOX, Some("3")).is_ok());
    let later = deadline + TTL;
    guard.observe(
        "leader",
        &HolderEvent::Renewed {
            tenure: 3,
            fence: 6,
            deadline: later,
        },
    );
    assert!(guard.check(deadline, INBOX, Some("3")).is_ok());
    guard.observe(
        "leader",
        &HolderEvent::SteppedDown {
            reason: StepDownReason::Lost,
        },
    );
    assert_eq!(
        guard.check(now, INBOX, Some("6")),
        Err(RejectReason::NotOwner)
    );
}

#[test]
fn fence_guard_admits_equal_and_higher_fences_and_refuses_lower() {
    let mut guard = FenceGuard::new();
    assert_eq!(guard.highest(), None);
    assert!(guard.admit(10).is_ok());
    assert!(guard.admit(10).is_ok());
    assert!(guard.admit(12).is_ok());
    let stale = guard.admit(11).unwrap_err();
    assert_eq!((stale.fence, stale.highest), (11, 12));
    assert_eq!(
        guard.highest(),
        Some(12),
        "a refused write must not lower the mark"
    );
}

#[test]
fn a_grant_of_a_renewal_this_holder_did_not_write_waits_out_the_expiry_marker_once() {
    // A renewal stored 20 s into its tenure (TTL 15 s): an earlier incarnation's,
    // which may have landed as its lease ran out, the marker still to come.
    let mut late = lease(9, "h1");
    late["granted"] = json!(true);
    late["expires_at"] = json!("2026-10-18T12:00:35Z");
    let late = RequestOutcome::reply(late.to_string());
    let mut run = Run::new(config());
    let first = run.request();
    run.answer(10, &first, late.clone());
    assert_eq!(run.events(), []);
    run.no_request();
    let quiet = crate::holder::MAX_EXPIRY_MARKER_LAG.as_millis() as u64;
    run.holder.handle_timeout(run.at(10 + quiet - 1));
    run.no_request();
    // Once the marker must have come, the same grant is confirmed as usual.
    run.holder.handle_timeout(run.at(10 + quiet));
    let again = run.request();
    assert_eq!(again.endpoint, Endpoint::Acquire);
    run.answer(10 + quiet, &again, late);
    let confirm = run.request();
    assert_eq!(
        (confirm.endpoint, body(&confirm)["revision"].as_u64()),
        (Endpoint::Renew, Some(9))
    );
    // A fresh create (stored as its tenure began) is confirmed at once.
    let mut run = Run::new(config());
    let first = run.request();
    run.answer(10, &first, granted(3));
    assert_eq!(run.request().endpoint, Endpoint::Renew);
}

#[test]
fn priority_sets_the_hold_back_and_the_config_bounds_it() {
    use crate::holder::{MAX_HOLD_BACK, MAX_PRIORITY};
    assert_eq!(
        config().hold_back,
        Duration::ZERO,
        "no priority, no hold-back"
    );
    assert_eq!(
        config().with_priority(MAX_PRIORITY).hold_back,
        Duration::ZERO
    );
    assert_eq!(
        config().with_priority(7).hold_back,
        Duration::from_millis(300)
    );
    assert_eq!(config().with_priority(0).hold_back, MAX_HOLD_BACK);
    assert_eq!(config().with_priority(200).hold_back, Duration::ZERO);
    let too_long = HolderConfig {
        hold_back: MAX_HOLD_BACK + Duration::from_millis(1),
        ..config()
    };
    assert!(too_long.validate().is_err());
    // Any priority goes with the shortest TTL.
    let short = HolderConfig::new("leader", "h1", Duration::from_secs(1)).with_priority(0);
    assert_eq!(short.validate(), Ok(()));
}

/// A lower candidate reads the owner at a campaign tick instead of asking blind;
/// hearing the key may be free, it asks only once its hold-back has passed, and a
/// tick inside the hold-back waits too. A candidate with no hold-back asks at once.
#[test]
fn a_lower_candidate_holds_back_after_a_change_and_a_preferred_one_does_not() {
    let held_by_h2 = RequestOutcome::reply(lease(3, "h2").to_string());
    let mut lower = Run::new(config().with_priority(7));
    let probe = lower.request();
    assert_eq!(probe.endpoint, Endpoint::Owner, "a tick reads first");
    lower.answer(10, &probe, held_by_h2.clone());
    lower.no_request();
    lower.holder.handle_change(lower.at(4_950), &freed());
    lower.no_request();
    // The campaign tick (campaign_every after the probe, at 5010) falls inside it.
    lower.holder.handle_timeout(lower.at(5_010));
    lower.no_request();
    assert_eq!(lower.holder.poll_timeout(), Some(lower.at(5_250)));
    lower.holder.handle_timeout(lower.at(5_250));
    assert_eq!(lower.request().endpoint, Endpoint::Acquire);

    // A probe that finds the key free holds back too; one that finds it held under
    // this holder ID (a restart) asks at once.
    let free = RequestOutcome::reply(json!({"held": false, "key": "leader"}).to_string());
    let mut lower = Run::new(config().with_priority(7));
    let probe = lower.request();
    lower.answer(10, &probe, free);
    lower.no_request();
    assert_eq!(lower.holder.poll_timeout(), Some(lower.at(310)));
    lower.holder.handle_timeout(lower.at(310));
    assert_eq!(lower.request().endpoint, Endpoint::Acquire);
    let mut restarted = Run::new(config().with_priority(7));
    let probe = restarted.request();
    restarted.answer(
        10,
        &probe,
        RequestOutcome::reply(lease(3, "h1").to_string()),
    );
    assert_eq!(restarted.request().endpoint, Endpoint::Acquire);

    let mut preferred = Run::new(config().with_priority(MAX_PRIORITY_FOR_TEST));
    let r = preferred.request();
    assert_eq!(r.endpoint, Endpoint::Acquire, "no hold-back, no probe");
    preferred.answer(10, &r, not_granted(3));
    preferred
        .holder
        .handle_change(preferred.at(4_950), &freed());
    assert_eq!(preferred.request().endpoint, Endpoint::Acquire);
}

const MAX_PRIORITY_FOR_TEST: u8 = crate::holder::MAX_PRIORITY;
