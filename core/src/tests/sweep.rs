//! The tombstone sweep: each release's tombstone purged below its own revision + 1,
//! one purge out at a time, a bounded queue.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::io::{RequestOutcome, TransmitKind};
use crate::sweep::{MAX_PENDING, SweepEvent, TombstoneSweep};

fn sweep() -> (TombstoneSweep, Instant) {
    let now = Instant::now();
    (TombstoneSweep::new(Duration::from_secs(5), now), now)
}

#[test]
fn a_released_tombstone_is_purged_below_its_own_revision_plus_one_and_nothing_later() {
    let (mut s, now) = sweep();
    assert!(s.is_done());
    s.handle_released(now, "job".into(), 41);
    let t = s.poll_transmit().expect("a purge");
    assert_eq!(t.kind, TransmitKind::Api);
    assert_eq!(t.request.subject, "$JS.API.STREAM.PURGE.KV_leases");
    let body: Value = serde_json::from_slice(&t.request.payload).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"filter": "$KV.leases.job", "seq": 42})
    );
    s.handle_outcome(
        now,
        t.id,
        RequestOutcome::reply(r#"{"type":"io.nats.jetstream.api.v1.stream_purge_response","success":true,"purged":1}"#),
    );
    assert_eq!(
        s.poll_event(),
        Some(SweepEvent::Purged {
            key: "job".into(),
            revision: 41,
            purged: 1
        })
    );
    assert!(s.is_done());
}

#[test]
fn one_purge_is_out_at_a_time() {
    let (mut s, now) = sweep();
    s.handle_released(now, "a".into(), 1);
    s.handle_released(now, "b".into(), 2);
    let first = s.poll_transmit().unwrap();
    assert!(
        s.poll_transmit().is_none(),
        "a second purge while one is out"
    );
    s.handle_outcome(now, first.id, RequestOutcome::TimedOut);
    assert!(matches!(s.poll_event(), Some(SweepEvent::Failed { key, .. }) if key == "a"));
    let second = s.poll_transmit().unwrap();
    assert!(String::from_utf8_lossy(&second.request.payload).contains("$KV.leases.b"));
}

#[test]
fn a_refused_purge_is_reported_and_an_unknown_outcome_ignored() {
    let (mut s, now) = sweep();
    s.handle_released(now, "a".into(), 1);
    let t = s.poll_transmit().unwrap();
    s.handle_outcome(
        now,
        crate::io::EffectId(t.id.0 + 100),
        RequestOutcome::TimedOut,
    );
    assert_eq!(
        s.poll_event(),
        None,
        "an outcome of another id changes nothing"
    );
    s.handle_outcome(
        now,
        t.id,
        RequestOutcome::reply(
            r#"{"error":{"code":500,"err_code":10056,"description":"purge not permitted"}}"#,
        ),
    );
    assert!(matches!(s.poll_event(), Some(SweepEvent::Failed { .. })));
}

#[test]
fn past_the_bound_the_oldest_tombstone_is_dropped_unpurged() {
    let (mut s, now) = sweep();
    for i in 0..=MAX_PENDING {
        s.handle_released(now, format!("k{i}"), i as u64 + 1);
    }
    assert_eq!(
        s.poll_event(),
        Some(SweepEvent::Dropped { key: "k0".into() })
    );
    let t = s.poll_transmit().unwrap();
    assert!(String::from_utf8_lossy(&t.request.payload).contains("$KV.leases.k1\""));
}

/// On a sharded bucket a tombstone is purged in its key's own stream.
#[test]
fn a_purge_goes_to_the_stream_of_the_keys_shard() {
    let shards = crate::shard::ShardMap::new(4).unwrap();
    let t0 = Instant::now();
    let mut s = TombstoneSweep::new(Duration::from_secs(1), t0).with_shards(shards);
    for key in ["a", "b", "c", "d", "e"] {
        s.handle_released(t0, key.to_string(), 7);
        let t = s.poll_transmit().unwrap();
        assert_eq!(
            t.request.subject,
            format!("$JS.API.STREAM.PURGE.{}", shards.stream_of(key))
        );
        let body: serde_json::Value = serde_json::from_slice(&t.request.payload).unwrap();
        assert_eq!(body["filter"], shards.kv_subject(key));
        s.handle_outcome(
            t0,
            t.id,
            RequestOutcome::reply(r#"{"success":true,"purged":1}"#),
        );
    }
}
