//! The tombstone sweep, rule by rule: each release's tombstone purged below its own
//! revision + 1 with several purges out, nothing lost past the queue's bound or a
//! failed purge, and a scan of the stream that finds what was missed.

use super::support::owner_ids;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::io::{RequestOutcome, Transmit, TransmitId, TransmitKind};
use crate::service::sweep::{
    MAX_IN_FLIGHT, MAX_PENDING, RETRY_AFTER, ScanReason, TombstoneSweep, TombstoneSweepEvent,
};
use crate::shard::ShardMap;

fn sweep() -> (TombstoneSweep, Instant) {
    let now = Instant::now();
    (TombstoneSweep::new(Duration::from_secs(5), now), now)
}

fn body(t: &Transmit) -> Value {
    serde_json::from_slice(&t.request.payload).unwrap()
}

fn purged() -> RequestOutcome {
    RequestOutcome::reply(r#"{"success":true,"purged":1}"#)
}

fn events(s: &mut TombstoneSweep) -> Vec<TombstoneSweepEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn transmits(s: &mut TombstoneSweep) -> Vec<Transmit> {
    std::iter::from_fn(|| s.poll_transmit(&mut owner_ids())).collect()
}

/// A MSG.GET reply for the message at `seq` on `subject` with these headers.
fn stored(seq: u64, subject: &str, headers: &[(&str, &str)]) -> RequestOutcome {
    let mut block = String::from("NATS/1.0\r\n");
    for (n, v) in headers {
        block.push_str(&format!("{n}: {v}\r\n"));
    }
    block.push_str("\r\n");
    let b64 = base64::engine::general_purpose::STANDARD;
    let hdrs = if headers.is_empty() {
        Value::Null
    } else {
        json!(b64.encode(block))
    };
    RequestOutcome::reply(
        json!({"message": {"subject": subject, "seq": seq, "hdrs": hdrs, "data": "",
                           "time": "2026-01-01T00:00:00Z"}})
        .to_string(),
    )
}

fn end_of_stream() -> RequestOutcome {
    RequestOutcome::reply(
        r#"{"error":{"code":404,"err_code":10037,"description":"no message found"}}"#,
    )
}

const DEL: (&str, &str) = ("KV-Operation", "DEL");

/// Rule purge: the tombstone at its revision and nothing later.
#[test]
fn purge_a_released_tombstone_below_its_own_revision_plus_one_and_nothing_later() {
    let (mut s, now) = sweep();
    assert!(s.is_idle());
    s.handle_released(now, "job".into(), 41);
    let t = s.poll_transmit(&mut owner_ids()).expect("a purge");
    assert_eq!(t.kind, TransmitKind::Api);
    assert_eq!(t.request.subject, "$JS.API.STREAM.PURGE.KV_leases");
    assert_eq!(body(&t), json!({"filter": "$KV.leases.job", "seq": 42}));
    s.handle_outcome(
        now,
        t.id,
        RequestOutcome::reply(r#"{"type":"io.nats.jetstream.api.v1.stream_purge_response","success":true,"purged":1}"#),
    );
    // Purged: nothing to say (a failed purge says `Failed`), nothing left to do.
    assert_eq!(s.poll_event(), None);
    assert!(s.is_idle());
}

/// Rule purge: up to MAX_IN_FLIGHT out at once, oldest first; each outcome makes
/// room for one more.
#[test]
fn purge_up_to_max_in_flight_at_once_oldest_first() {
    let (mut s, now) = sweep();
    for i in 0..MAX_IN_FLIGHT + 5 {
        s.handle_released(now, format!("k{i}"), i as u64 + 1);
    }
    let out = transmits(&mut s);
    assert_eq!(out.len(), MAX_IN_FLIGHT);
    for (i, t) in out.iter().enumerate() {
        assert_eq!(body(t)["filter"], format!("$KV.leases.k{i}"));
    }
    s.handle_outcome(now, out[3].id, purged());
    let next = transmits(&mut s);
    assert_eq!(next.len(), 1);
    assert_eq!(
        body(&next[0])["filter"],
        format!("$KV.leases.k{MAX_IN_FLIGHT}")
    );
}

/// Rule overflow defers to a scan: past the bound a tombstone is reported, not
/// queued, and its stream is scanned once the queue has room.
#[test]
fn overflow_defers_to_a_scan() {
    let (mut s, now) = sweep();
    for i in 0..=MAX_PENDING {
        s.handle_released(now, format!("k{i}"), i as u64 + 1);
    }
    assert_eq!(
        events(&mut s),
        vec![TombstoneSweepEvent::Deferred {
            key: format!("k{MAX_PENDING}")
        }]
    );
    let out = transmits(&mut s);
    assert_eq!(
        out.len(),
        MAX_IN_FLIGHT + 1,
        "the purges, then the scan's read"
    );
    let read = out.last().unwrap();
    assert_eq!(read.request.subject, "$JS.API.STREAM.MSG.GET.KV_leases");
    assert_eq!(
        body(read),
        json!({"seq": 1, "next_by_subj": "$KV.leases.>"})
    );
    assert_eq!(
        events(&mut s),
        vec![TombstoneSweepEvent::ScanStarted {
            stream: "KV_leases".into(),
            reason: ScanReason::Overflow
        }]
    );
    assert!(!s.is_idle());
}

/// Rule a failed purge defers to a scan: every kind of failure is reported, and
/// the stream is scanned after RETRY_AFTER (not at once: the server may be down).
#[test]
fn a_failed_purge_defers_to_a_scan_after_retry_after() {
    let refused = RequestOutcome::reply(
        r#"{"error":{"code":500,"err_code":10056,"description":"purge not permitted"}}"#,
    );
    for (name, outcome) in [
        ("timed out", RequestOutcome::TimedOut),
        ("no responders", RequestOutcome::NoResponders),
        ("connection failed", RequestOutcome::Failed("closed".into())),
        ("refused", refused),
        ("unreadable", RequestOutcome::reply("not json")),
    ] {
        let (mut s, now) = sweep();
        s.handle_released(now, "a".into(), 9);
        let t = s.poll_transmit(&mut owner_ids()).unwrap();
        s.handle_outcome(now, t.id, outcome);
        assert!(
            matches!(events(&mut s).as_slice(), [TombstoneSweepEvent::Failed { key, .. }] if key == "a"),
            "{name}"
        );
        assert!(
            s.poll_transmit(&mut owner_ids()).is_none(),
            "{name}: no scan before the pause ends"
        );
        assert_eq!(s.poll_timeout(), Some(now + RETRY_AFTER), "{name}");
        s.handle_timeout(now + RETRY_AFTER);
        let read = s.poll_transmit(&mut owner_ids()).expect("the scan's read");
        assert_eq!(body(&read)["seq"], 1, "{name}");
        assert_eq!(
            events(&mut s),
            vec![TombstoneSweepEvent::ScanStarted {
                stream: "KV_leases".into(),
                reason: ScanReason::FailedPurge
            }],
            "{name}"
        );
    }
}

/// Rule scan at start: every stream of the bucket, one read out each, from 1.
#[test]
fn scan_at_start_reads_every_stream_from_sequence_one() {
    for count in [1, 3] {
        let shards = ShardMap::new(count).unwrap();
        let now = Instant::now();
        let mut s = TombstoneSweep::new(Duration::from_secs(1), now).with_shards(shards);
        assert!(s.is_idle());
        s.handle_serving(now);
        assert!(!s.is_idle());
        let out = transmits(&mut s);
        assert_eq!(out.len(), count as usize, "{count} streams");
        for (i, t) in out.iter().enumerate() {
            let i = i as u32;
            assert_eq!(
                t.request.subject,
                format!("$JS.API.STREAM.MSG.GET.{}", shards.stream(i))
            );
            assert_eq!(
                body(t),
                json!({"seq": 1, "next_by_subj": shards.stream_subjects(i)})
            );
        }
        // One read out per stream: nothing more until it answers.
        assert!(s.poll_transmit(&mut owner_ids()).is_none());
    }
}

/// A stored message: what it is, its subject, its headers, whether the scan
/// queues it.
type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], bool);

/// Rule the scan reads in order and never loses: which stored messages are
/// tombstones left behind (queued for their purge at their own sequence) and
/// which are not; the next read starts past each message; the end reports.
#[test]
fn the_scan_reads_in_order_and_queues_only_tombstones() {
    let marker = [("Nats-Marker-Reason", "MaxAge"), ("Nats-TTL", "1s")];
    let cases: &[Case] = &[
        ("a tombstone", "$KV.leases.a", &[DEL], true),
        (
            "a purge",
            "$KV.leases.b",
            &[("KV-Operation", "PURGE")],
            true,
        ),
        (
            "a tenant's tombstone",
            "$KV.leases.acct.k",
            &[DEL, ("Dagnats-Lease-Event", "released")],
            true,
        ),
        (
            "a live lease",
            "$KV.leases.c",
            &[("Nats-TTL", "15s")],
            false,
        ),
        ("a value without headers", "$KV.leases.d", &[], false),
        ("an expiry marker", "$KV.leases.e", &marker, false),
        (
            "a marker that says DEL",
            "$KV.leases.f",
            &[DEL, ("Nats-Marker-Reason", "Remove")],
            false,
        ),
        ("another bucket's subject", "$KV.other.g", &[DEL], false),
        ("the bucket's prefix alone", "$KV.leases.", &[DEL], false),
    ];
    for (name, subject, headers, queued) in cases {
        let (mut s, now) = sweep();
        s.handle_serving(now);
        let read = s.poll_transmit(&mut owner_ids()).unwrap();
        s.handle_outcome(now, read.id, stored(7, subject, headers));
        let out = transmits(&mut s);
        if *queued {
            assert_eq!(out.len(), 2, "{name}: a purge and the next read");
            assert_eq!(
                out[0].request.subject, "$JS.API.STREAM.PURGE.KV_leases",
                "{name}"
            );
            assert_eq!(
                body(&out[0]),
                json!({"filter": subject, "seq": 8}),
                "{name}"
            );
        } else {
            assert_eq!(out.len(), 1, "{name}: only the next read");
        }
        let next = out.last().unwrap();
        assert_eq!(body(next)["seq"], 8, "{name}: the next read starts past it");
        s.handle_outcome(now, next.id, end_of_stream());
        assert_eq!(
            events(&mut s).last(),
            Some(&TombstoneSweepEvent::Scanned {
                stream: "KV_leases".into(),
                read: 1,
                found: u64::from(*queued)
            }),
            "{name}"
        );
        assert!(
            s.poll_transmit(&mut owner_ids()).is_none(),
            "{name}: the scan is over"
        );
    }
}

/// Rule the scan never loses: a tombstone read while the queue is full is read
/// again once it has room, not skipped.
#[test]
fn a_tombstone_read_into_a_full_queue_is_read_again() {
    let (mut s, now) = sweep();
    s.handle_serving(now);
    let read = s.poll_transmit(&mut owner_ids()).unwrap();
    for i in 0..MAX_PENDING {
        s.handle_released(now, format!("k{i}"), 100 + i as u64);
    }
    s.handle_outcome(now, read.id, stored(7, "$KV.leases.x", &[DEL]));
    let out = transmits(&mut s);
    assert_eq!(
        out.len(),
        MAX_IN_FLIGHT + 1,
        "the purges, then a read again"
    );
    let again = out.last().unwrap();
    assert_eq!(
        body(again)["seq"],
        1,
        "where it was, not past the tombstone"
    );
    assert!(
        events(&mut s)
            .iter()
            .all(|e| !matches!(e, TombstoneSweepEvent::Deferred { .. }))
    );
    // With room now, the same tombstone is queued behind the releases' ones.
    s.handle_outcome(now, again.id, stored(7, "$KV.leases.x", &[DEL]));
    s.handle_outcome(now, out[0].id, purged());
    let next = s.poll_transmit(&mut owner_ids()).unwrap();
    assert_eq!(
        body(&next)["filter"],
        format!("$KV.leases.k{MAX_IN_FLIGHT}")
    );
    let read = s.poll_transmit(&mut owner_ids()).unwrap();
    assert_eq!(body(&read)["seq"], 8, "past it once queued");
}

/// Rule a loss ahead of a scan is its own: a tombstone missed at or past the
/// scan's next read needs no second scan; one behind it does.
#[test]
fn a_loss_ahead_of_a_scan_is_its_own() {
    for (name, revision, second_scan) in [
        ("behind the scan", 5, true),
        ("at its next read", 10, false),
        ("ahead of it", 50, false),
    ] {
        let (mut s, now) = sweep();
        s.handle_serving(now);
        let read = s.poll_transmit(&mut owner_ids()).unwrap();
        s.handle_outcome(now, read.id, stored(9, "$KV.leases.live", &[]));
        let read = s.poll_transmit(&mut owner_ids()).unwrap();
        assert_eq!(body(&read)["seq"], 10);
        // A purge fails for a tombstone at `revision` while the scan is at 10.
        s.handle_released(now, "lost".into(), revision);
        let purge = s.poll_transmit(&mut owner_ids()).unwrap();
        s.handle_outcome(now, purge.id, RequestOutcome::TimedOut);
        s.handle_outcome(now, read.id, end_of_stream());
        s.handle_timeout(now + RETRY_AFTER);
        events(&mut s);
        let next = s.poll_transmit(&mut owner_ids());
        assert_eq!(next.is_some(), second_scan, "{name}");
        if let Some(t) = next {
            assert_eq!(body(&t)["seq"], 1, "{name}: a second scan from the start");
        } else {
            assert!(s.is_idle(), "{name}");
        }
    }
}

/// Rule a failed read pauses the scans: every kind of failure; the scan resumes at
/// the same sequence after RETRY_AFTER.
#[test]
fn a_failed_read_pauses_the_scans_and_resumes_where_they_were() {
    for (name, outcome) in [
        ("timed out", RequestOutcome::TimedOut),
        ("no responders", RequestOutcome::NoResponders),
        (
            "no stream",
            RequestOutcome::reply(
                r#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#,
            ),
        ),
        ("unreadable", RequestOutcome::reply("{")),
        (
            "a message without a sequence",
            RequestOutcome::reply(r#"{"message":{"subject":"$KV.leases.a"}}"#),
        ),
        (
            "headers not base64",
            RequestOutcome::reply(r#"{"message":{"subject":"$KV.leases.a","seq":3,"hdrs":"!!"}}"#),
        ),
    ] {
        let (mut s, now) = sweep();
        s.handle_serving(now);
        let read = s.poll_transmit(&mut owner_ids()).unwrap();
        s.handle_outcome(now, read.id, stored(4, "$KV.leases.v", &[]));
        let read = s.poll_transmit(&mut owner_ids()).unwrap();
        s.handle_outcome(now, read.id, outcome);
        assert!(
            matches!(
                events(&mut s).last(),
                Some(TombstoneSweepEvent::ScanFailed { .. })
            ),
            "{name}"
        );
        assert!(
            s.poll_transmit(&mut owner_ids()).is_none(),
            "{name}: paused"
        );
        s.handle_timeout(now + RETRY_AFTER - Duration::from_millis(1));
        assert!(
            s.poll_transmit(&mut owner_ids()).is_none(),
            "{name}: still paused"
        );
        s.handle_timeout(now + RETRY_AFTER);
        let again = s.poll_transmit(&mut owner_ids()).expect("the read again");
        assert_eq!(body(&again)["seq"], 5, "{name}: where it was");
    }
}

/// An outcome of an id the sweep never sent changes nothing.
#[test]
fn an_unknown_outcome_is_ignored() {
    let (mut s, now) = sweep();
    s.handle_released(now, "a".into(), 1);
    let t = s.poll_transmit(&mut owner_ids()).unwrap();
    s.handle_outcome(now, TransmitId(t.id.0 + 100), RequestOutcome::TimedOut);
    assert_eq!(s.poll_event(), None);
    assert!(s.poll_timeout().is_none());
}

/// On a sharded bucket a tombstone is purged in its key's own stream, and a
/// failed purge scans that stream only.
#[test]
fn a_purge_goes_to_the_stream_of_the_keys_shard_and_a_loss_scans_only_it() {
    let shards = ShardMap::new(4).unwrap();
    let t0 = Instant::now();
    let mut s = TombstoneSweep::new(Duration::from_secs(1), t0).with_shards(shards);
    for key in ["a", "b", "c", "d", "e"] {
        s.handle_released(t0, key.to_string(), 7);
        let t = s.poll_transmit(&mut owner_ids()).unwrap();
        assert_eq!(
            t.request.subject,
            format!("$JS.API.STREAM.PURGE.{}", shards.stream_of(key))
        );
        assert_eq!(body(&t)["filter"], shards.kv_subject(key));
        s.handle_outcome(t0, t.id, purged());
    }
    s.handle_released(t0, "e".into(), 9);
    let t = s.poll_transmit(&mut owner_ids()).unwrap();
    s.handle_outcome(t0, t.id, RequestOutcome::TimedOut);
    s.handle_timeout(t0 + RETRY_AFTER);
    let out = transmits(&mut s);
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].request.subject,
        format!("$JS.API.STREAM.MSG.GET.{}", shards.stream_of("e"))
    );
}
