//! The write coalescer's rules, one table test each.

use super::support::owner_ids;
use crate::service::coalesce::BatchCounts;
use std::time::{Duration, Instant};

use crate::io::{NatsRequest, RequestOutcome, Transmit, TransmitId, TransmitKind};
use crate::js::{PublishResult, parse_pub_ack};
use crate::service::coalesce::{
    CoalesceWrites, Coalescer, CoalescerConfig, CoalescerEvent, DEFAULT_REPLICATED_SINGLE_WINDOW,
    DEFAULT_SINGLE_WINDOW, HDR_BATCH_COMMIT, HDR_BATCH_ID, HDR_BATCH_SEQUENCE, coalesce_on,
    single_window,
};
use crate::subjects::{
    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
};
use crate::subjects::{confirm_subject, kv_subject};

fn write(key: &str, expected: u64) -> NatsRequest {
    NatsRequest {
        subject: kv_subject(key),
        headers: vec![(HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, expected.to_string())],
        payload: b"{}".to_vec(),
        timeout: Duration::from_secs(2),
    }
}

fn header<'a>(r: &'a NatsRequest, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_str())
}

fn drain(c: &mut Coalescer) -> (Vec<Transmit>, Vec<(TransmitId, RequestOutcome)>) {
    let mut sends = Vec::new();
    let mut done = Vec::new();
    while let Some(t) = c.poll_transmit(&mut owner_ids()) {
        assert_eq!(t.kind, TransmitKind::Write);
        sends.push(t);
    }
    while let Some(CoalescerEvent::Outcome { write, outcome }) = c.poll_event() {
        done.push((write, outcome));
    }
    (sends, done)
}

fn ack(seq: u64) -> RequestOutcome {
    RequestOutcome::reply(format!(r#"{{"stream":"KV_leases","seq":{seq}}}"#))
}

fn batch_ack(seq: u64, count: u64) -> RequestOutcome {
    RequestOutcome::reply(format!(
        r#"{{"stream":"KV_leases","seq":{seq},"batch":"b","count":{count}}}"#
    ))
}

fn error(err_code: u64) -> RequestOutcome {
    RequestOutcome::reply(format!(
        r#"{{"error":{{"code":400,"err_code":{err_code},"description":"x"}}}}"#
    ))
}

fn stored(o: &RequestOutcome) -> Option<u64> {
    match parse_pub_ack(o) {
        Ok(PublishResult::Stored(s)) => Some(s),
        _ => None,
    }
}

/// One single out at once, batches of three or more, one batch out at once: small
/// numbers, so each rule shows in a few writes.
fn narrow() -> CoalescerConfig {
    CoalescerConfig {
        single_window: 1,
        min_batch: 3,
        max_in_flight: 1,
        ..CoalescerConfig::atomic("p-")
    }
}

/// `narrow()` with batches from `min_batch` writes.
fn with_min_batch(min_batch: usize) -> Coalescer {
    with_batch_bounds(narrow().max_batch, min_batch)
}

/// `narrow()` with batches of `min_batch` to `max_batch` writes.
fn with_batch_bounds(max_batch: usize, min_batch: usize) -> Coalescer {
    Coalescer::new(
        CoalescerConfig {
            max_batch,
            min_batch,
            ..narrow()
        },
        Instant::now(),
    )
}

/// Sends write 0 (key `x`) alone: the single window is full from then on.
fn fill_the_single_window(c: &mut Coalescer, now: Instant) -> Transmit {
    c.handle_write(now, TransmitId(0), write("x", 0));
    drain(c).0.remove(0)
}

fn atomic() -> Coalescer {
    Coalescer::new(narrow(), Instant::now())
}

#[test]
fn a_write_alone_goes_out_at_once_as_a_plain_publish() {
    let now = Instant::now();
    let mut c = atomic();
    c.handle_write(now, TransmitId(1), write("a", 0));
    let (sends, done) = drain(&mut c);
    assert!(done.is_empty());
    assert_eq!(sends.len(), 1);
    assert!(sends[0].publish.is_empty());
    assert_eq!(
        sends[0].request,
        write("a", 0),
        "no batch header on a single"
    );
    c.handle_outcome(now, sends[0].id, ack(7));
    let (sends2, done) = drain(&mut c);
    assert!(sends2.is_empty());
    assert_eq!(
        done,
        vec![(TransmitId(1), ack(7))],
        "the reply passes through untouched"
    );
    assert!(c.is_idle());
}

#[test]
fn past_the_single_window_writes_gather_and_go_as_one_batch_at_min_batch() {
    let now = Instant::now();
    let mut c = atomic();
    c.handle_write(now, TransmitId(1), write("a", 0));
    let (first, _) = drain(&mut c);
    for (i, key) in ["b", "c"].iter().enumerate() {
        c.handle_write(now, TransmitId(2 + i as u64), write(key, 5));
        assert_eq!(
            drain(&mut c),
            (vec![], vec![]),
            "the single window is full and the queue below min_batch: they wait"
        );
    }
    c.handle_write(now, TransmitId(4), write("d", 5));
    let (sends, done) = drain(&mut c);
    assert!(done.is_empty());
    assert_eq!(sends.len(), 1, "the third makes a batch, at once");
    c.handle_outcome(now, first[0].id, ack(1));
    assert_eq!(drain(&mut c), (vec![], vec![(TransmitId(1), ack(1))]));
    let s = &sends[0];
    assert_eq!(s.publish.len(), 2);
    let all: Vec<&NatsRequest> = s.publish.iter().chain([&s.request]).collect();
    let id = header(all[0], HDR_BATCH_ID).unwrap().to_string();
    assert!(id.starts_with("p-") && id.len() <= 64);
    for (i, (m, key)) in all.iter().zip(["b", "c", "d"]).enumerate() {
        assert_eq!(
            m.subject,
            kv_subject(key),
            "each message to its own subject, in order"
        );
        assert_eq!(header(m, HDR_BATCH_ID), Some(id.as_str()));
        assert_eq!(
            header(m, HDR_BATCH_SEQUENCE),
            Some((i + 1).to_string().as_str())
        );
        assert_eq!(
            header(m, HDR_BATCH_COMMIT),
            (i == 2).then_some("1"),
            "only the last commits"
        );
        assert_eq!(header(m, HDR_EXPECTED_LAST_SUBJECT_SEQUENCE), Some("5"));
    }
    // The commit's ack names the last sequence: each write gets its own.
    c.handle_outcome(now, s.id, batch_ack(12, 3));
    let (sends, done) = drain(&mut c);
    assert!(sends.is_empty());
    let got: Vec<(TransmitId, Option<u64>)> = done.iter().map(|(w, o)| (*w, stored(o))).collect();
    assert_eq!(
        got,
        vec![
            (TransmitId(2), Some(10)),
            (TransmitId(3), Some(11)),
            (TransmitId(4), Some(12))
        ]
    );
    assert!(c.is_idle());
    assert_eq!(c.batch_counts(), BatchCounts { sent: 1, failed: 0 });
}

#[test]
fn a_batch_holds_at_most_max_batch_writes() {
    let now = Instant::now();
    let mut c = with_batch_bounds(4, 4);
    c.handle_write(now, TransmitId(0), write("k0", 0));
    let (first, _) = drain(&mut c);
    for i in 1..=10u64 {
        c.handle_write(now, TransmitId(i), write(&format!("k{i}"), 0));
    }
    let (sends, _) = drain(&mut c);
    assert_eq!(sends.len(), 1, "one batch out at once");
    assert_eq!(sends[0].publish.len() + 1, 4);
    c.handle_outcome(now, sends[0].id, batch_ack(5, 4));
    let (sends, done) = drain(&mut c);
    assert_eq!(done.len(), 4);
    assert_eq!(sends[0].publish.len() + 1, 4);
    c.handle_outcome(now, sends[0].id, batch_ack(9, 4));
    let (sends, done) = drain(&mut c);
    assert_eq!(done.len(), 4);
    assert!(sends.is_empty(), "two left, below min_batch: they wait");
    assert_eq!(c.pending(), pending(2, 1));
    c.handle_outcome(now, first[0].id, ack(1));
    let (sends, _) = drain(&mut c);
    assert_eq!(
        sends.len(),
        1,
        "the single came back: the front goes single"
    );
    assert!(sends[0].publish.is_empty());
    assert_eq!(c.writes_of(sends[0].id), vec![TransmitId(9)]);
    assert_eq!(c.pending(), pending(1, 1));
}

#[test]
fn the_bound_is_clamped_to_the_servers_limit() {
    let now = Instant::now();
    let mut c = with_batch_bounds(5000, 5000);
    c.handle_write(now, TransmitId(0), write("k", 0));
    drain(&mut c);
    for i in 1..=1500u64 {
        c.handle_write(now, TransmitId(i), write(&format!("k{i}"), 0));
    }
    let (sends, _) = drain(&mut c);
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].publish.len() + 1, 1000);
}

#[test]
fn two_writes_of_one_subject_never_share_a_batch() {
    let now = Instant::now();
    let mut c = with_min_batch(5);
    fill_the_single_window(&mut c, now);
    c.handle_write(now, TransmitId(1), write("a", 3));
    c.handle_write(now, TransmitId(2), write("a", 3));
    // A read confirmation checks `$KV.leases.b` from another subject.
    let mut confirm = write("b", 4);
    confirm.subject = confirm_subject("b");
    confirm
        .headers
        .push((HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT, kv_subject("b")));
    c.handle_write(now, TransmitId(3), confirm);
    c.handle_write(now, TransmitId(4), write("b", 4));
    c.handle_write(now, TransmitId(5), write("c", 0));
    let (sends, _) = drain(&mut c);
    let subjects = batch_subjects(&sends[0]);
    assert_eq!(
        subjects,
        vec![kv_subject("a"), confirm_subject("b"), kv_subject("c")]
    );
    c.handle_outcome(now, sends[0].id, batch_ack(4, 3));
    let (sends, done) = drain(&mut c);
    assert_eq!(done.len(), 3);
    assert!(sends.is_empty(), "a and b left: below min_batch");
    for (i, key) in ["d", "e", "f"].iter().enumerate() {
        c.handle_write(now, TransmitId(6 + i as u64), write(key, 0));
    }
    let (sends, _) = drain(&mut c);
    let subjects = batch_subjects(&sends[0]);
    assert_eq!(
        subjects,
        ["a", "b", "d", "e", "f"].map(kv_subject).to_vec(),
        "the next batch, in order"
    );
}

/// A batch takes no write to or checking a subject a write out also touches (a
/// replicated stream refuses such a check while the earlier write is in process,
/// and one refusal fails the whole batch): that write waits for the subject to
/// come back, whether a single or a batch holds it.
#[test]
fn a_write_of_a_subject_out_waits_for_it_outside_any_batch() {
    let now = Instant::now();
    let mut c = Coalescer::new(
        CoalescerConfig {
            min_batch: 2,
            max_in_flight: 2,
            ..narrow()
        },
        now,
    );
    let first = fill_the_single_window(&mut c, now);
    // A read confirmation checking `x`, out alone, and two other keys.
    let mut confirm = write("y", 1);
    confirm.subject = confirm_subject("x");
    confirm
        .headers
        .push((HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT, kv_subject("x")));
    c.handle_write(now, TransmitId(1), confirm);
    c.handle_write(now, TransmitId(2), write("a", 0));
    c.handle_write(now, TransmitId(3), write("b", 0));
    let (sends, _) = drain(&mut c);
    assert_eq!(sends.len(), 1);
    assert_eq!(
        batch_subjects(&sends[0]),
        vec![kv_subject("a"), kv_subject("b")]
    );
    let batch = sends[0].id;
    // `a` is out in that batch: a second write of it stays out of the next one.
    c.handle_write(now, TransmitId(4), write("a", 1));
    c.handle_write(now, TransmitId(5), write("c", 0));
    c.handle_write(now, TransmitId(6), write("d", 0));
    let (sends, _) = drain(&mut c);
    assert_eq!(
        batch_subjects(&sends[0]),
        vec![kv_subject("c"), kv_subject("d")]
    );
    assert_eq!(c.pending(), pending(2, 3));
    // `x` back: the confirmation goes alone; `a` back: its write goes too.
    c.handle_outcome(now, first.id, ack(1));
    let (sends, _) = drain(&mut c);
    assert_eq!(sends.len(), 1);
    assert_eq!(c.writes_of(sends[0].id), vec![TransmitId(1)]);
    c.handle_outcome(now, batch, batch_ack(3, 2));
    c.handle_outcome(now, sends[0].id, ack(4));
    let (sends, done) = drain(&mut c);
    assert_eq!(done.len(), 3);
    assert_eq!(sends.len(), 1);
    assert_eq!(c.writes_of(sends[0].id), vec![TransmitId(4)]);
}

#[test]
fn a_batch_failing_as_a_whole_is_retried_as_singles_with_their_own_outcomes() {
    for err_code in [10071, 10164, 10176, 10210] {
        let now = Instant::now();
        let mut c = atomic();
        let first = fill_the_single_window(&mut c, now);
        c.handle_write(now, TransmitId(1), write("a", 0));
        c.handle_write(now, TransmitId(2), write("b", 9));
        c.handle_write(now, TransmitId(3), write("c", 0));
        let (sends, _) = drain(&mut c);
        c.handle_outcome(now, sends[0].id, error(err_code));
        let (retries, done) = drain(&mut c);
        assert!(done.is_empty(), "no write is told the batch's error");
        assert_eq!(retries.len(), 3, "all at once, outside the window");
        for (r, key) in retries.iter().zip(["a", "b", "c"]) {
            assert!(r.publish.is_empty());
            assert!(header(&r.request, HDR_BATCH_ID).is_none());
            assert_eq!(r.request.subject, kv_subject(key));
        }
        c.handle_outcome(now, retries[1].id, error(10071));
        c.handle_outcome(now, retries[0].id, ack(2));
        c.handle_outcome(now, retries[2].id, RequestOutcome::TimedOut);
        let (sends, done) = drain(&mut c);
        assert!(sends.is_empty());
        assert_eq!(
            done,
            vec![
                (TransmitId(2), error(10071)),
                (TransmitId(1), ack(2)),
                (TransmitId(3), RequestOutcome::TimedOut)
            ],
            "err_code {err_code}"
        );
        c.handle_outcome(now, first.id, ack(1));
        drain(&mut c);
        assert!(c.is_idle());
        assert_eq!(c.batch_counts(), BatchCounts { sent: 1, failed: 1 });
        assert!(c.atomic());
    }
}

#[test]
fn a_batch_without_a_reply_gives_every_write_that_outcome_and_no_retry() {
    for outcome in [
        RequestOutcome::TimedOut,
        RequestOutcome::NoResponders,
        RequestOutcome::Failed("gone".into()),
    ] {
        let now = Instant::now();
        let mut c = with_min_batch(2);
        fill_the_single_window(&mut c, now);
        c.handle_write(now, TransmitId(1), write("a", 0));
        c.handle_write(now, TransmitId(2), write("b", 0));
        let (sends, _) = drain(&mut c);
        c.handle_outcome(now, sends[0].id, outcome.clone());
        let (sends, done) = drain(&mut c);
        assert!(sends.is_empty());
        assert_eq!(
            done,
            vec![(TransmitId(1), outcome.clone()), (TransmitId(2), outcome)]
        );
    }
}

#[test]
fn an_unreadable_batch_ack_lends_no_write_its_sequence() {
    let now = Instant::now();
    let mut c = with_min_batch(2);
    fill_the_single_window(&mut c, now);
    c.handle_write(now, TransmitId(1), write("a", 0));
    c.handle_write(now, TransmitId(2), write("b", 0));
    let (sends, _) = drain(&mut c);
    c.handle_outcome(now, sends[0].id, batch_ack(9, 3));
    let (sends, done) = drain(&mut c);
    assert!(sends.is_empty());
    assert!(done.iter().all(|(_, o)| stored(o).is_none()), "{done:?}");
}

#[test]
fn atomic_disabled_answer_turns_batches_off() {
    let now = Instant::now();
    let mut c = with_min_batch(2);
    fill_the_single_window(&mut c, now);
    c.handle_write(now, TransmitId(1), write("a", 0));
    c.handle_write(now, TransmitId(2), write("b", 0));
    let (sends, _) = drain(&mut c);
    c.handle_outcome(now, sends[0].id, error(10174));
    let (retries, _) = drain(&mut c);
    assert_eq!(retries.len(), 2);
    assert!(!c.atomic());
    c.handle_write(now, TransmitId(3), write("c", 0));
    let (sends, _) = drain(&mut c);
    assert_eq!(sends.len(), 1, "single at once though two are in flight");
}

#[test]
fn without_atomic_support_everything_goes_single_at_once() {
    let now = Instant::now();
    let mut c = Coalescer::new(CoalescerConfig::single(), now);
    for i in 0..5u64 {
        c.handle_write(now, TransmitId(i), write(&format!("k{i}"), 0));
    }
    let (sends, done) = drain(&mut c);
    assert!(done.is_empty());
    assert_eq!(sends.len(), 5);
    assert!(
        sends
            .iter()
            .all(|s| s.publish.is_empty() && header(&s.request, HDR_BATCH_ID).is_none())
    );
    for (i, s) in sends.iter().enumerate().rev() {
        c.handle_outcome(now, s.id, ack(i as u64 + 1));
    }
    let (_, done) = drain(&mut c);
    assert_eq!(done.len(), 5);
    assert!(c.is_idle());
    // An outcome for an id it never sent is ignored.
    c.handle_outcome(now, TransmitId(999), ack(1));
    assert!(c.poll_transmit(&mut owner_ids()).is_none() && c.poll_event().is_none());
}

#[test]
fn a_wider_single_window_sends_more_writes_at_once() {
    let now = Instant::now();
    let mut c = Coalescer::new(
        CoalescerConfig {
            single_window: 2,
            min_batch: 2,
            ..narrow()
        },
        now,
    );
    c.handle_write(now, TransmitId(1), write("a", 0));
    c.handle_write(now, TransmitId(2), write("b", 0));
    c.handle_write(now, TransmitId(3), write("c", 0));
    let (sends, _) = drain(&mut c);
    assert_eq!(sends.len(), 2, "two singles, the third waits");
    c.handle_write(now, TransmitId(4), write("d", 0));
    let (sends, done) = drain(&mut c);
    assert!(done.is_empty());
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].publish.len(), 1, "c and d as one batch");
    assert_eq!(sends[0].request.timeout, Duration::from_secs(2));
}

#[test]
fn by_default_sixteen_writes_at_once_all_go_single_and_the_rest_gather() {
    let now = Instant::now();
    let mut c = Coalescer::new(CoalescerConfig::atomic("p-"), now);
    for i in 0..16u64 {
        c.handle_write(now, TransmitId(i), write(&format!("k{i}"), 0));
    }
    let (sends, _) = drain(&mut c);
    assert_eq!(sends.len(), 16);
    assert!(sends.iter().all(|s| s.publish.is_empty()), "no batch at 16");
    for i in 16..31u64 {
        c.handle_write(now, TransmitId(i), write(&format!("k{i}"), 0));
    }
    assert_eq!(drain(&mut c), (vec![], vec![]), "fifteen wait");
    c.handle_write(now, TransmitId(31), write("k31", 0));
    let (batch, _) = drain(&mut c);
    assert_eq!(batch.len(), 1);
    assert_eq!(
        batch[0].publish.len() + 1,
        16,
        "the sixteenth makes a batch"
    );
    c.handle_outcome(now, sends[0].id, ack(1));
    let (_, done) = drain(&mut c);
    assert_eq!(done, vec![(TransmitId(0), ack(1))]);
}

#[test]
fn a_queue_of_one_subject_goes_single_as_singles_come_back() {
    let now = Instant::now();
    let mut c = with_min_batch(2);
    let first = fill_the_single_window(&mut c, now);
    c.handle_write(now, TransmitId(1), write("a", 1));
    c.handle_write(now, TransmitId(2), write("a", 1));
    assert_eq!(
        drain(&mut c),
        (vec![], vec![]),
        "no batch of two writes of one subject, and no batch of one"
    );
    c.handle_outcome(now, first.id, ack(1));
    let (sends, _) = drain(&mut c);
    assert_eq!(sends.len(), 1);
    assert!(sends[0].publish.is_empty());
    assert_eq!(c.writes_of(sends[0].id), vec![TransmitId(1)]);
    assert_eq!(c.pending(), pending(1, 1));
}

#[test]
fn two_messages_to_one_subject_never_share_a_batch_whatever_they_check() {
    let now = Instant::now();
    let mut c = atomic();
    let first = fill_the_single_window(&mut c, now);
    for (i, checked) in ["a", "b"].iter().enumerate() {
        let mut confirm = write("a", 4);
        confirm.subject = confirm_subject("a");
        confirm.headers.push((
            HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
            kv_subject(checked),
        ));
        c.handle_write(now, TransmitId(1 + i as u64), confirm);
    }
    c.handle_outcome(now, first.id, ack(1));
    let (sends, _) = drain(&mut c);
    assert!(sends[0].publish.is_empty(), "one, then the other");
    assert_eq!(c.pending(), pending(1, 1));
}

// The simulated JetStream's atomic batches, as nats-server 2.12+ answers them.

fn batch_msg(id: &str, seq: u64, commit: bool, key: &str, expected: u64) -> NatsRequest {
    let mut r = write(key, expected);
    r.headers.push((HDR_BATCH_ID, id.to_string()));
    r.headers.push((HDR_BATCH_SEQUENCE, seq.to_string()));
    if commit {
        r.headers.push((HDR_BATCH_COMMIT, "1".to_string()));
    }
    r
}

fn err_code(o: &RequestOutcome) -> Option<u64> {
    let RequestOutcome::Reply { payload, .. } = o else {
        return None;
    };
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    v["error"]["err_code"].as_u64()
}

#[test]
fn sim_a_batch_is_stored_whole_and_acked_on_its_commit() {
    let mut js = crate::sim::SimJetStream::new();
    js.handle(&write("a", 0));
    assert_eq!(
        js.handle(&batch_msg("b1", 1, false, "b", 0)),
        RequestOutcome::reply(Vec::new())
    );
    js.handle_publish(&batch_msg("b1", 2, false, "c", 0));
    assert_eq!(js.log.len(), 1, "nothing stored before the commit");
    let ack = js.handle(&batch_msg("b1", 3, true, "a", 1));
    let v: serde_json::Value = match &ack {
        RequestOutcome::Reply { payload, .. } => serde_json::from_slice(payload).unwrap(),
        _ => panic!(),
    };
    assert_eq!((v["seq"].as_u64(), v["count"].as_u64()), (Some(4), Some(3)));
    assert_eq!(v["batch"], "b1");
    let keys: Vec<(u64, &str)> = js.log.iter().map(|m| (m.seq, m.key.as_str())).collect();
    assert_eq!(keys, vec![(1, "a"), (2, "b"), (3, "c"), (4, "a")]);
    assert_eq!(js.open_batches(), 0);
}

#[test]
fn sim_one_wrong_expected_sequence_fails_the_whole_batch() {
    let mut js = crate::sim::SimJetStream::new();
    js.handle(&write("a", 0));
    js.handle_publish(&batch_msg("b1", 1, false, "b", 0));
    js.handle_publish(&batch_msg("b1", 2, false, "a", 0));
    let answer = js.handle(&batch_msg("b1", 3, true, "c", 0));
    assert_eq!(err_code(&answer), Some(10071));
    assert_eq!(js.log.len(), 1, "nothing of the batch is stored");
    assert_eq!(js.open_batches(), 0);
    // A subject written earlier in the batch cannot be checked again: 10164.
    js.handle_publish(&batch_msg("b2", 1, false, "b", 0));
    let answer = js.handle(&batch_msg("b2", 2, true, "b", 0));
    assert_eq!(err_code(&answer), Some(10164));
    assert_eq!(js.log.len(), 1);
}

#[test]
fn sim_batch_limits_and_errors() {
    let mut js = crate::sim::SimJetStream::new();
    for i in 0..50 {
        js.handle_publish(&batch_msg(&format!("open{i}"), 1, false, "k", 0));
    }
    assert_eq!(js.open_batches(), 50);
    assert_eq!(
        err_code(&js.handle(&batch_msg("one-more", 1, false, "k", 0))),
        Some(10210)
    );
    assert_eq!(
        err_code(&js.handle(&batch_msg("one-more", 2, true, "k", 0))),
        Some(10176),
        "its commit finds no batch"
    );
    // A gap abandons the batch.
    assert_eq!(
        err_code(&js.handle(&batch_msg("open0", 3, true, "j", 0))),
        Some(10176)
    );
    assert_eq!(js.open_batches(), 49);
    // At most 1,000 messages.
    let mut js = crate::sim::SimJetStream::new();
    for i in 1..=1000u64 {
        js.handle_publish(&batch_msg("big", i, false, &format!("k{i}"), 0));
    }
    assert_eq!(
        err_code(&js.handle(&batch_msg("big", 1001, true, "k1001", 0))),
        Some(10199)
    );
    assert!(js.log.is_empty());
    assert_eq!(js.open_batches(), 0);
    // Without allow_atomic.
    let mut js = crate::sim::SimJetStream::new().with_atomic(false);
    assert_eq!(
        err_code(&js.handle(&batch_msg("x", 1, true, "k", 0))),
        Some(10174)
    );
    let mut bad_commit = batch_msg("y", 1, false, "k", 0);
    bad_commit
        .headers
        .push((HDR_BATCH_COMMIT, "yes".to_string()));
    let mut js = crate::sim::SimJetStream::new();
    assert_eq!(err_code(&js.handle(&bad_commit)), Some(10200));
}

#[test]
fn sim_a_1000_message_batch_commits() {
    let mut js = crate::sim::SimJetStream::new();
    for i in 1..1000u64 {
        js.handle_publish(&batch_msg("big", i, false, &format!("k{i}"), 0));
    }
    let ack = js.handle(&batch_msg("big", 1000, true, "k1000", 0));
    assert_eq!(stored(&ack), Some(1000));
    assert_eq!(js.log.len(), 1000);
}

#[test]
fn a_write_given_up_before_it_goes_out_is_dropped() {
    let now = Instant::now();
    let mut c = atomic();
    let first = fill_the_single_window(&mut c, now);
    c.handle_write(now, TransmitId(1), write("a", 0));
    c.handle_write(now, TransmitId(2), write("b", 0));
    let queued = c.pending().queued;
    c.handle_cancel(now, TransmitId(2));
    assert_eq!(c.pending().queued, queued - 1, "dropped from the queue");
    c.handle_cancel(now, TransmitId(0));
    assert_eq!(
        c.pending().queued,
        queued - 1,
        "already out: it runs its course"
    );
    c.handle_write(now, TransmitId(3), write("c", 0));
    c.handle_write(now, TransmitId(4), write("d", 0));
    let (sends, _) = drain(&mut c);
    assert_eq!(
        c.writes_of(sends[0].id),
        vec![TransmitId(1), TransmitId(3), TransmitId(4)]
    );
    c.handle_outcome(now, first.id, ack(1));
    c.handle_outcome(now, sends[0].id, batch_ack(4, 3));
    let (_, done) = drain(&mut c);
    assert_eq!(done.len(), 4);
    assert!(c.is_idle());
}

/// `auto` is on, as `true`, wherever the stream takes atomic batches, and
/// nothing is on without them; the window of singles follows the replicas unless
/// given.
#[test]
fn the_coalescer_is_on_where_the_stream_takes_batches() {
    use CoalesceWrites::{Auto, Off, On};
    let table = [
        // (setting, atomic) -> on
        ((Auto, true), true),
        ((Auto, false), false),
        ((On, true), true),
        ((On, false), false),
        ((Off, true), false),
        ((Off, false), false),
    ];
    for ((setting, atomic), want) in table {
        assert_eq!(
            coalesce_on(setting, atomic),
            want,
            "{setting:?}, atomic {atomic}"
        );
    }
    // (batch_after, replicas) -> window
    for ((batch_after, replicas), want) in [
        ((None, 1), DEFAULT_SINGLE_WINDOW),
        ((None, 3), DEFAULT_REPLICATED_SINGLE_WINDOW),
        ((None, 5), DEFAULT_REPLICATED_SINGLE_WINDOW),
        ((Some(2), 1), 2),
        ((Some(2), 3), 2),
    ] {
        assert_eq!(
            single_window(batch_after, replicas),
            want,
            "{batch_after:?}, {replicas}"
        );
    }
}

/// The command line's words for the setting; anything else is refused by name.
#[test]
fn coalesce_writes_parses_its_words() {
    for (word, want) in [
        ("auto", CoalesceWrites::Auto),
        ("true", CoalesceWrites::On),
        ("on", CoalesceWrites::On),
        ("false", CoalesceWrites::Off),
        ("off", CoalesceWrites::Off),
    ] {
        assert_eq!(word.parse::<CoalesceWrites>(), Ok(want), "{word}");
    }
    let err = "yes".parse::<CoalesceWrites>().expect_err("not a setting");
    assert!(
        err.contains("--coalesce-writes") && err.contains("yes"),
        "{err}"
    );
}

/// An ADR-50 batch is one stream's: on a sharded bucket, writes of two shards
/// never share a batch; each shard's writes go together, in arrival order.
#[test]
fn writes_of_two_shards_never_share_a_batch() {
    let shards = crate::shard::ShardMap::new(2).unwrap();
    let (zero, one) = (keys_of_shard(shards, 0), keys_of_shard(shards, 1));
    let now = Instant::now();
    let mut c = with_min_batch(3);
    fill_the_single_window(&mut c, now);
    let mut id = 1;
    for (a, b) in zero.iter().zip(&one) {
        for key in [a, b] {
            c.handle_write(now, TransmitId(id), shard_write(shards, key));
            id += 1;
        }
    }
    let (sends, _) = drain(&mut c);
    let subjects = batch_subjects(&sends[0]);
    let first = zero
        .iter()
        .map(|k| shards.kv_subject(k))
        .collect::<Vec<_>>();
    assert!(subjects.len() >= 2, "a batch went: {subjects:?}");
    assert_eq!(
        subjects[..],
        first[..subjects.len()],
        "shard 0's writes alone, in order"
    );
}

/// Three keys that `shards` puts in shard `i`.
fn keys_of_shard(shards: crate::shard::ShardMap, i: u32) -> Vec<String> {
    (0..)
        .map(|n| format!("k{n}"))
        .filter(|k| shards.shard_of(k) == i)
        .take(3)
        .collect()
}

/// A write of `key` to its own shard's stream.
fn shard_write(shards: crate::shard::ShardMap, key: &str) -> NatsRequest {
    let mut w = write(key, 0);
    w.subject = shards.kv_subject(key);
    w
}

/// The subjects a batch writes, in order: its published messages, then the commit.
fn batch_subjects(batch: &Transmit) -> Vec<String> {
    batch
        .publish
        .iter()
        .chain([&batch.request])
        .map(|r| r.subject.clone())
        .collect()
}

/// [`Coalescer::pending`] as the table rows above write it.
fn pending(queued: usize, sent: usize) -> crate::service::coalesce::WritesPending {
    crate::service::coalesce::WritesPending { queued, sent }
}

/// `min_batch` counts one stream's writes: on a sharded bucket a queue long
/// enough only with another shard's writes sends no batch; one more write of the
/// first write's shard makes a batch of `min_batch` of that shard alone.
#[test]
fn a_batch_holds_min_batch_writes_of_its_own_shard() {
    let shards = crate::shard::ShardMap::new(2).unwrap();
    let (zero, one) = (keys_of_shard(shards, 0), keys_of_shard(shards, 1));
    let now = Instant::now();
    let mut c = with_min_batch(3);
    fill_the_single_window(&mut c, now);
    let mut id = 1;
    let mut send = |c: &mut Coalescer, key: &String| {
        c.handle_write(now, TransmitId(id), shard_write(shards, key));
        id += 1;
    };
    for (a, b) in zero.iter().zip(&one).take(2) {
        send(&mut c, a);
        send(&mut c, b);
    }
    let (sends, _) = drain(&mut c);
    assert!(
        sends.is_empty(),
        "four queued, two of each shard, min_batch 3: no batch of two"
    );
    send(&mut c, &zero[2]);
    let (sends, _) = drain(&mut c);
    assert_eq!(sends.len(), 1, "one batch");
    let subjects = batch_subjects(&sends[0]);
    let wanted: Vec<String> = zero.iter().map(|k| shards.kv_subject(k)).collect();
    assert_eq!(subjects, wanted, "shard 0's three writes, in order");
}

/// A write cancelled while out in a batch (its call gave up and was answered) is
/// not sent again alone when the batch fails; the others are. Broken, the write
/// of a call answered `unavailable` could still land.
#[test]
fn a_write_cancelled_while_its_batch_is_out_is_not_sent_again_when_the_batch_fails() {
    let now = Instant::now();
    let mut c = atomic();
    fill_the_single_window(&mut c, now);
    for (id, key) in [(1, "k1"), (2, "k2"), (3, "k3")] {
        c.handle_write(now, TransmitId(id), write(key, 0));
    }
    let (sends, _) = drain(&mut c);
    assert_eq!(sends.len(), 1, "one batch of three");
    assert_eq!(c.writes_of(sends[0].id).len(), 3);
    c.handle_cancel(now, TransmitId(2));
    c.handle_outcome(now, sends[0].id, error(10071));
    let (again, done) = drain(&mut c);
    let subjects: Vec<&str> = again.iter().map(|t| t.request.subject.as_str()).collect();
    assert_eq!(
        subjects,
        vec![kv_subject("k1").as_str(), kv_subject("k3").as_str()],
        "only the writes still wanted go again"
    );
    assert_eq!(done.len(), 1, "the cancelled write ends unsent");
    assert_eq!(done[0].0, TransmitId(2));
}
