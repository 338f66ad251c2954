//! The waiting acquire: when it asks again, and when it ends.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::stand_in::{KEY, Rng, StandIn, TTL_MS};
use crate::change::{ChangeEvent, ChangeKind};
use crate::holder::acquire_wait::{WaitingAcquire, WaitingAcquireEvent};
use crate::io::RequestOutcome;
use crate::io::{FLUSH_BOUND, HANDOFF_BOUND};
use crate::test_support::HolderRequest;
use crate::wire::{AcquireReply, AcquireRequest, Endpoint, Lease, Request, Response};

const TIMEOUT: Duration = Duration::from_secs(2);

fn request() -> AcquireRequest {
    AcquireRequest {
        key: KEY.to_string(),
        holder: "me".to_string(),
        ttl_ms: TTL_MS,
    }
}

fn reply(granted: bool) -> AcquireReply {
    AcquireReply {
        granted,
        lease: Lease {
            held: true,
            key: KEY.to_string(),
            holder: if granted { "me" } else { "other" }.to_string(),
            revision: 4,
            acquired_at: "2026-01-01T00:00:00Z".to_string(),
            expires_at: "2026-01-01T00:00:03Z".to_string(),
            ttl_ms: TTL_MS,
        },
    }
}

fn answer(r: &AcquireReply) -> RequestOutcome {
    RequestOutcome::reply(Response::Acquired(r.clone()).to_json())
}

fn event(kind: ChangeKind) -> ChangeEvent {
    ChangeEvent {
        kind,
        revision: 5,
        holder: None,
    }
}

fn ms(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

/// The one acquire it wants sent now.
fn asked(w: &mut WaitingAcquire) -> HolderRequest {
    let r: HolderRequest = w.poll_transmit().expect("an acquire").into();
    assert_eq!(r.endpoint, Endpoint::Acquire);
    assert!(w.poll_transmit().is_none(), "one acquire at a time");
    r
}

/// A waiting acquire of `wait` started at `t0`, its subscribe and flush over at
/// once (the tests of other rules leave them out).
fn started(t0: Instant, wait: Duration) -> WaitingAcquire {
    let mut w = WaitingAcquire::new(request(), TIMEOUT, wait, t0);
    assert_eq!(w.poll_event(), Some(WaitingAcquireEvent::Subscribe));
    w.handle_subscribed(t0, true);
    assert_eq!(w.poll_event(), Some(WaitingAcquireEvent::Flush));
    w.handle_flushed(t0);
    w
}

/// A waiting acquire of `wait_ms` started at `t0`, its first acquire answered at
/// 10 ms with `granted`; returns the first event.
fn first_answer(t0: Instant, wait_ms: u64, granted: bool) -> (WaitingAcquire, WaitingAcquireEvent) {
    let mut w = started(t0, Duration::from_millis(wait_ms));
    let r = asked(&mut w);
    w.handle_outcome(ms(t0, 10), r.id, answer(&reply(granted)));
    let first = w.poll_event().expect("an event");
    (w, first)
}

#[test]
fn a_grant_ends_it_at_once() {
    let (w, first) = first_answer(Instant::now(), 5_000, true);
    assert_eq!(first, WaitingAcquireEvent::Done(reply(true)));
    assert!(w.is_done());
    assert_eq!(w.poll_timeout(), None);
}

#[test]
fn a_wait_of_zero_asks_once() {
    let (w, first) = first_answer(Instant::now(), 0, false);
    assert_eq!(first, WaitingAcquireEvent::Done(reply(false)));
    assert!(w.is_done());
}

#[test]
fn a_release_event_asks_again_at_once_and_a_renewal_event_pushes_the_fallback() {
    let t0 = Instant::now();
    let (mut w, first) = first_answer(t0, 60_000, false);
    assert_eq!(first, WaitingAcquireEvent::NotGranted(reply(false)));
    assert_eq!(
        w.poll_timeout(),
        Some(ms(t0, 10 + TTL_MS)),
        "a TTL after the refusal"
    );
    w.handle_change(ms(t0, 1_000), &event(ChangeKind::Renewed));
    assert!(w.poll_transmit().is_none());
    assert_eq!(w.poll_timeout(), Some(ms(t0, 1_000 + TTL_MS)));
    w.handle_change(ms(t0, 2_000), &event(ChangeKind::Released));
    let r = asked(&mut w);
    w.handle_outcome(ms(t0, 2_010), r.id, answer(&reply(true)));
    assert_eq!(w.poll_event(), Some(WaitingAcquireEvent::Done(reply(true))));
}

#[test]
fn without_events_it_asks_again_a_ttl_after_the_last_write_seen() {
    let t0 = Instant::now();
    let (mut w, _) = first_answer(t0, 60_000, false);
    w.handle_timeout(ms(t0, 9 + TTL_MS));
    assert!(w.poll_transmit().is_none(), "not before");
    w.handle_timeout(ms(t0, 10 + TTL_MS));
    asked(&mut w);
}

#[test]
fn the_wait_ends_with_the_last_refusal_even_before_the_fallback() {
    let t0 = Instant::now();
    let (mut w, first) = first_answer(t0, 1_000, false);
    assert_eq!(first, WaitingAcquireEvent::NotGranted(reply(false)));
    assert_eq!(w.poll_timeout(), Some(ms(t0, 1_000)));
    w.handle_timeout(ms(t0, 1_000));
    assert_eq!(
        w.poll_event(),
        Some(WaitingAcquireEvent::Done(reply(false)))
    );
    assert!(w.poll_transmit().is_none() && w.is_done());
    w.handle_change(ms(t0, 1_100), &event(ChangeKind::Released));
    assert!(w.poll_transmit().is_none(), "nothing after the end");
}

#[test]
fn no_usable_answer_fails_and_a_late_one_is_ignored() {
    let error = r#"{"error":"bad","kind":"invalid"}"#;
    for outcome in [
        RequestOutcome::NoResponders,
        RequestOutcome::Failed("gone".to_string()),
        RequestOutcome::reply(error),
        RequestOutcome::reply("not json"),
    ] {
        let t0 = Instant::now();
        let mut w = started(t0, Duration::from_secs(5));
        let r = asked(&mut w);
        w.handle_outcome(ms(t0, 5), r.id, outcome.clone());
        assert_eq!(w.poll_event(), Some(WaitingAcquireEvent::Failed(outcome)));
        assert!(w.is_done());
    }
    let t0 = Instant::now();
    let mut w = started(t0, Duration::from_secs(5));
    let r = asked(&mut w);
    assert_eq!(
        w.poll_timeout(),
        Some(t0 + TIMEOUT),
        "the acquire's own deadline"
    );
    w.handle_timeout(t0 + TIMEOUT);
    assert_eq!(
        w.poll_event(),
        Some(WaitingAcquireEvent::Failed(RequestOutcome::TimedOut))
    );
    w.handle_outcome(t0 + TIMEOUT, r.id, answer(&reply(true)));
    assert_eq!(w.poll_event(), None);
}

/// A service gone while it waits (a later acquire nobody receives) ends the wait
/// with that failure, never with the last refusal: no service is not "held".
#[test]
fn no_service_while_waiting_is_a_failure_not_the_last_refusal() {
    let t0 = Instant::now();
    let (mut w, first) = first_answer(t0, 60_000, false);
    assert_eq!(first, WaitingAcquireEvent::NotGranted(reply(false)));
    w.handle_change(ms(t0, 1_000), &event(ChangeKind::Released));
    let r = asked(&mut w);
    w.handle_outcome(ms(t0, 1_001), r.id, RequestOutcome::NoResponders);
    assert_eq!(
        w.poll_event(),
        Some(WaitingAcquireEvent::Failed(RequestOutcome::NoResponders))
    );
    assert!(w.is_done());
}

/// Nothing but the subscribe before it is over: no acquire, no flush.
fn subscribing(t0: Instant, wait: Duration) -> WaitingAcquire {
    let mut w = WaitingAcquire::new(request(), TIMEOUT, wait, t0);
    assert_eq!(w.poll_event(), Some(WaitingAcquireEvent::Subscribe));
    assert_eq!(w.poll_event(), None);
    assert!(
        w.poll_transmit().is_none(),
        "no acquire before the subscription"
    );
    w
}

#[test]
fn the_first_acquire_goes_out_once_subscribed_and_flushed_and_the_wait_begins_then() {
    let t0 = Instant::now();
    let mut w = subscribing(t0, Duration::from_millis(500));
    w.handle_subscribed(ms(t0, 30), true);
    assert_eq!(w.poll_event(), Some(WaitingAcquireEvent::Flush));
    assert!(w.poll_transmit().is_none(), "no acquire before the flush");
    w.handle_flushed(ms(t0, 40));
    let r = asked(&mut w);
    w.handle_outcome(ms(t0, 50), r.id, answer(&reply(false)));
    assert_eq!(
        w.poll_event(),
        Some(WaitingAcquireEvent::NotGranted(reply(false)))
    );
    assert_eq!(
        w.poll_timeout(),
        Some(ms(t0, 540)),
        "the wait from the flush"
    );
}

#[test]
fn a_failed_subscribe_asks_at_once_without_a_flush() {
    let t0 = Instant::now();
    let mut w = subscribing(t0, Duration::from_secs(5));
    w.handle_subscribed(ms(t0, 20), false);
    asked(&mut w);
    assert_eq!(w.poll_event(), None, "no flush");
    w.handle_flushed(ms(t0, 30));
    assert!(w.poll_transmit().is_none(), "nothing more");
}

#[test]
fn a_subscribe_not_over_within_the_handoff_bound_is_given_up_and_the_acquire_goes_ahead() {
    let t0 = Instant::now();
    let wait = Duration::from_secs(5);
    let mut w = subscribing(t0, wait);
    assert_eq!(w.poll_timeout(), Some(t0 + HANDOFF_BOUND));
    w.handle_timeout(t0 + HANDOFF_BOUND - Duration::from_millis(1));
    assert_eq!(w.poll_event(), None, "not before the bound");
    assert!(w.poll_transmit().is_none());
    w.handle_timeout(t0 + HANDOFF_BOUND);
    assert_eq!(w.poll_event(), Some(WaitingAcquireEvent::CancelSubscribe));
    let r = asked(&mut w);
    // A subscription made after it was given up is not waited on.
    w.handle_subscribed(t0 + HANDOFF_BOUND, true);
    assert_eq!(w.poll_event(), None, "no flush");
    // Without events, the TTL fallback still wakes it; the wait runs from the
    // give-up.
    let not_granted_at = t0 + HANDOFF_BOUND + Duration::from_millis(10);
    w.handle_outcome(not_granted_at, r.id, answer(&reply(false)));
    assert_eq!(
        w.poll_event(),
        Some(WaitingAcquireEvent::NotGranted(reply(false)))
    );
    let fallback = not_granted_at + Duration::from_millis(TTL_MS);
    assert_eq!(
        w.poll_timeout(),
        Some(fallback.min(t0 + HANDOFF_BOUND + wait))
    );
    w.handle_timeout(fallback);
    asked(&mut w);
}

#[test]
fn a_flush_not_over_within_the_flush_bound_is_given_up_and_the_acquire_goes_ahead() {
    let t0 = Instant::now();
    let mut w = subscribing(t0, Duration::from_secs(60));
    w.handle_subscribed(ms(t0, 10), true);
    assert_eq!(w.poll_event(), Some(WaitingAcquireEvent::Flush));
    let bound = ms(t0, 10) + FLUSH_BOUND;
    assert_eq!(w.poll_timeout(), Some(bound));
    w.handle_timeout(bound - Duration::from_millis(1));
    assert_eq!(w.poll_event(), None, "not before the bound");
    assert!(w.poll_transmit().is_none());
    w.handle_timeout(bound);
    assert_eq!(w.poll_event(), Some(WaitingAcquireEvent::CancelFlush));
    let r = asked(&mut w);
    w.handle_flushed(bound);
    assert!(
        w.poll_transmit().is_none(),
        "a late flush asks nothing more"
    );
    // The subscription was kept: a release event still asks again at once.
    w.handle_outcome(bound, r.id, answer(&reply(false)));
    w.poll_event();
    w.handle_change(
        bound + Duration::from_millis(5),
        &event(ChangeKind::Released),
    );
    asked(&mut w);
}

/// One world: another holder keeps the key for a while and releases it (or lets
/// it expire); change events are lost at random. Returns a violation, if any.
fn world(seed: u64, wait_ms: u64, release_at: u64, expire: bool) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut service = StandIn::new(false);
    let base = Instant::now();
    let at = |t: u64| base + Duration::from_millis(t);
    let other = Request::Acquire(AcquireRequest {
        holder: "other".to_string(),
        ..request()
    });
    let mut other_rev = match service.handle(0, Endpoint::Acquire, &other.to_json()) {
        Response::Acquired(r) => r.lease.revision,
        r => return Err(format!("the other holder was not granted: {r:?}")),
    };
    let mut w = started(at(0), Duration::from_millis(wait_ms));
    // The acquire out: (arrives at, id, reply).
    let mut out: Option<(u64, crate::io::TransmitId, Vec<u8>)> = None;
    let mut released = false;
    let mut t = 0;
    loop {
        if let Some(tx) = w.poll_transmit() {
            if out.is_some() {
                return Err(format!("t={t}: two acquires out"));
            }
            let r: HolderRequest = tx.into();
            let reply = service.handle(t, Endpoint::Acquire, &r.body).to_json();
            out = Some((t + rng.latency(), r.id, reply));
        }
        while let Some(e) = w.poll_event() {
            match e {
                WaitingAcquireEvent::NotGranted(_) if t >= wait_ms => {
                    return Err(format!("t={t}: still waiting past the wait"));
                }
                WaitingAcquireEvent::NotGranted(_) => {}
                WaitingAcquireEvent::Done(r) if r.granted => {
                    if service.held_by(t) != Some("me") {
                        return Err(format!("t={t}: granted but the service says otherwise"));
                    }
                    return Ok(());
                }
                WaitingAcquireEvent::Done(_) if t < wait_ms => {
                    return Err(format!("t={t}: gave up before the wait ended"));
                }
                WaitingAcquireEvent::Done(_) => {
                    // Freed (released, or expired a TTL later) well before the end: it
                    // must have got it, event or no event.
                    let free_by = if expire {
                        release_at + TTL_MS
                    } else {
                        release_at
                    };
                    if free_by + TTL_MS + 2 * TIMEOUT.as_millis() as u64 <= wait_ms {
                        return Err(format!("t={t}: the key was free from {free_by}, not taken"));
                    }
                    return Ok(());
                }
                WaitingAcquireEvent::Failed(o) => return Err(format!("t={t}: failed: {o:?}")),
                setup => return Err(format!("t={t}: {setup:?} once started")),
            }
        }
        t += 1 + rng.below(50);
        if !released && t >= release_at {
            released = true;
            // The other holder renews until then, then releases or lets it run out.
            if !expire {
                let release =
                    format!(r#"{{"key":"{KEY}","holder":"other","revision":{other_rev}}}"#);
                let _ = service.handle(t, Endpoint::Release, release.as_bytes());
                if !rng.chance(30) {
                    w.handle_change(at(t), &event(ChangeKind::Released));
                }
            }
        } else if !released && rng.chance(5) {
            let renew = format!(r#"{{"key":"{KEY}","holder":"other","revision":{other_rev}}}"#);
            if let Response::Lease(l) = service.handle(t, Endpoint::Renew, renew.as_bytes()) {
                other_rev = l.revision;
                if !rng.chance(30) {
                    w.handle_change(at(t), &event(ChangeKind::Renewed));
                }
            }
        }
        if let Some((_, id, reply)) = out.take_if(|o| o.0 <= t) {
            w.handle_outcome(at(t), id, RequestOutcome::reply(reply));
        }
        if w.poll_timeout().is_some_and(|due| at(t) >= due) {
            w.handle_timeout(at(t));
        }
        if t > wait_ms + 10 * TTL_MS {
            return Err("never ended".to_string());
        }
    }
}

proptest! {
    /// Whatever the timing and the events lost: one acquire at a time, no end
    /// before the wait is over unless granted, a grant the service agrees with, and
    /// a key freed well within the wait is taken.
    #[test]
    fn waiting_acquires_end_right(
        seed in any::<u64>(),
        wait_ms in 0u64..20_000,
        release_at in 0u64..15_000,
        expire in any::<bool>(),
    ) {
        if let Err(v) = world(seed, wait_ms, release_at, expire) {
            prop_assert!(false, "{}", v);
        }
    }
}
