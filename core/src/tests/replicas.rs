//! The replicas re-check: when it asks, and when read confirmation turns on or off.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::json;

use crate::io::{RequestOutcome, TransmitKind};
use crate::replicas::{ReplicasCheck, ReplicasEvent};

const EVERY: Duration = Duration::from_secs(10);
const T: Duration = Duration::from_secs(5);

fn info(replicas: u64) -> RequestOutcome {
    RequestOutcome::reply(json!({"config": {"num_replicas": replicas}, "state": {}}).to_string())
}

fn ms(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

/// Fires the timer at `at` and takes the check it sends.
fn check_at(c: &mut ReplicasCheck, at: Instant) -> crate::io::EffectId {
    c.handle_timeout(at);
    let t = c.poll_transmit().expect("a check is due");
    assert_eq!(t.kind, TransmitKind::Api);
    assert_eq!(t.request.subject, "$JS.API.STREAM.INFO.KV_leases");
    assert!(c.poll_transmit().is_none(), "one check at a time");
    t.id
}

#[test]
fn a_check_goes_out_each_period_and_not_before() {
    let t0 = Instant::now();
    let mut c = ReplicasCheck::new(EVERY, T, 1, t0);
    assert_eq!(c.poll_timeout(), Some(t0 + EVERY));
    c.handle_timeout(ms(t0, 9_999));
    assert!(c.poll_transmit().is_none());
    let id = check_at(&mut c, t0 + EVERY);
    assert_eq!(
        c.poll_timeout(),
        Some(t0 + EVERY + T),
        "the check's own deadline"
    );
    c.handle_outcome(ms(t0, 10_050), id, info(1));
    assert_eq!(c.poll_event(), None, "one replica, as before");
    assert_eq!(c.poll_timeout(), Some(t0 + 2 * EVERY));
    assert!(!c.is_done());
}

#[test]
fn confirmation_turns_on_past_one_replica_and_off_at_one_once_each() {
    let t0 = Instant::now();
    let mut c = ReplicasCheck::new(EVERY, T, 1, t0);
    let id = check_at(&mut c, t0 + EVERY);
    c.handle_outcome(t0 + EVERY, id, info(3));
    let on = ReplicasEvent::ConfirmReads {
        replicas: 3,
        on: true,
    };
    assert_eq!(c.poll_event(), Some(on));
    assert!(c.confirm_reads());
    let id = check_at(&mut c, t0 + 2 * EVERY);
    c.handle_outcome(t0 + 2 * EVERY, id, info(5));
    assert_eq!(c.poll_event(), None, "still more than one");
    let id = check_at(&mut c, t0 + 3 * EVERY);
    c.handle_outcome(t0 + 3 * EVERY, id, info(1));
    let off = ReplicasEvent::ConfirmReads {
        replicas: 1,
        on: false,
    };
    assert_eq!(c.poll_event(), Some(off));
    assert!(!c.confirm_reads());
}

#[test]
fn no_answer_or_an_error_keeps_what_was_known_and_a_late_answer_is_ignored() {
    let t0 = Instant::now();
    let mut c = ReplicasCheck::new(EVERY, T, 3, t0);
    assert!(c.confirm_reads());
    let id = check_at(&mut c, t0 + EVERY);
    c.handle_timeout(t0 + EVERY + T);
    assert_eq!(c.poll_event(), None);
    c.handle_outcome(t0 + EVERY + T, id, info(1));
    assert_eq!(c.poll_event(), None, "the timed-out check's answer");
    assert!(c.confirm_reads());
    let id = check_at(&mut c, t0 + 2 * EVERY);
    c.handle_outcome(t0 + 2 * EVERY, id, RequestOutcome::NoResponders);
    let error = r#"{"error":{"code":503,"err_code":10008,"description":"x"}}"#;
    let id2 = check_at(&mut c, t0 + 3 * EVERY);
    c.handle_outcome(t0 + 3 * EVERY, id2, RequestOutcome::reply(error));
    assert_eq!(c.poll_event(), None);
    assert!(c.confirm_reads());
    assert_ne!(id, id2);
}

proptest! {
    /// Whatever the answers and their timing: at most one check is out, an event
    /// comes only when confirmation flips, and confirmation follows the last
    /// replicas answered.
    #[test]
    fn confirmation_follows_the_last_replicas_answered(
        steps in prop::collection::vec((0u64..15_000, prop::option::of(1u64..5), any::<bool>()), 1..60),
        start in 1u64..4,
    ) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut c = ReplicasCheck::new(EVERY, T, start as usize, t0);
        let mut expected = start > 1;
        let mut out = None;
        for (wait, replicas, answer) in steps {
            now += Duration::from_millis(wait);
            let at = c.poll_timeout().expect("always a next check");
            if now >= at {
                // The check in flight, if any, timed out (and maybe a new one went).
                c.handle_timeout(now);
                out = None;
            }
            if let Some(t) = c.poll_transmit() {
                prop_assert!(out.is_none(), "two checks out");
                prop_assert!(c.poll_transmit().is_none());
                out = Some(t.id);
            }
            if answer && let Some(id) = out.take() {
                let outcome = replicas.map_or(RequestOutcome::TimedOut, info);
                c.handle_outcome(now, id, outcome);
                if let Some(r) = replicas {
                    let on = r > 1;
                    let event = c.poll_event();
                    if on == expected {
                        prop_assert_eq!(event, None);
                    } else {
                        prop_assert_eq!(event, Some(ReplicasEvent::ConfirmReads { replicas: r as usize, on }));
                    }
                    expected = on;
                }
            }
            prop_assert_eq!(c.poll_event(), None);
            prop_assert_eq!(c.confirm_reads(), expected);
        }
    }
}

fn info_created(created: &str) -> RequestOutcome {
    RequestOutcome::reply(
        json!({"config": {"num_replicas": 1}, "created": created, "state": {}}).to_string(),
    )
}

#[test]
fn a_stream_made_anew_or_gone_says_forget_what_was_known_of_its_revisions() {
    let t0 = Instant::now();
    let mut c = ReplicasCheck::new(EVERY, T, 1, t0);
    let id = check_at(&mut c, t0 + EVERY);
    c.handle_outcome(t0 + EVERY, id, info_created("2026-12-05T03:00:00Z"));
    assert_eq!(c.poll_event(), None, "the first sight is no change");
    let id = check_at(&mut c, t0 + 2 * EVERY);
    c.handle_outcome(t0 + 2 * EVERY, id, info_created("2026-12-05T03:00:00Z"));
    assert_eq!(c.poll_event(), None, "the same stream");
    let id = check_at(&mut c, t0 + 3 * EVERY);
    c.handle_outcome(t0 + 3 * EVERY, id, info_created("2026-12-05T03:09:00Z"));
    assert_eq!(c.poll_event(), Some(ReplicasEvent::StreamReplaced));
    let id = check_at(&mut c, t0 + 4 * EVERY);
    c.handle_outcome(
        t0 + 4 * EVERY,
        id,
        crate::sim::api_error(404, 10059, "stream not found"),
    );
    assert_eq!(c.poll_event(), Some(ReplicasEvent::StreamReplaced));
    // Unavailable or timed out: nothing to say.
    let id = check_at(&mut c, t0 + 5 * EVERY);
    c.handle_outcome(t0 + 5 * EVERY, id, RequestOutcome::TimedOut);
    assert_eq!(c.poll_event(), None);
}

/// On a sharded bucket each period asks every shard's stream in turn; one with
/// more than one replica turns confirmation on, and one made anew says so.
#[test]
fn every_shards_stream_is_asked_each_period() {
    let t0 = Instant::now();
    let shards = crate::shard::ShardMap::new(3).unwrap();
    let mut c = ReplicasCheck::new(EVERY, T, 1, t0).with_shards(shards);
    let created = |replicas: u64, at: &str| {
        RequestOutcome::reply(
            json!({"config": {"num_replicas": replicas}, "created": at, "state": {}}).to_string(),
        )
    };
    for round in 0..2 {
        let at = t0 + EVERY * (round + 1);
        c.handle_timeout(at);
        for i in 0..3 {
            let t = c.poll_transmit().expect("the next shard is asked");
            assert_eq!(
                t.request.subject,
                format!("$JS.API.STREAM.INFO.KV_leases_{i}")
            );
            assert!(c.poll_transmit().is_none(), "one at a time");
            let (replicas, made) = match (round, i) {
                (1, 1) => (3, "later"),
                _ => (1, "first"),
            };
            c.handle_outcome(at, t.id, created(replicas, made));
        }
        assert!(c.poll_transmit().is_none(), "the round is over");
        assert_eq!(c.poll_timeout(), Some(at + EVERY));
    }
    assert_eq!(c.poll_event(), Some(ReplicasEvent::StreamReplaced));
    assert_eq!(
        c.poll_event(),
        Some(ReplicasEvent::ConfirmReads {
            replicas: 3,
            on: true
        })
    );
}
