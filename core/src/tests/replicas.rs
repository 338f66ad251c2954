//! The replicas re-check: when it asks, and when read confirmation turns on or off.

use super::support::owner_ids;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::json;

use crate::io::{RequestOutcome, TransmitKind};
use crate::service::replicas::{ReplicasCheck, ReplicasCheckEvent};

const EVERY: Duration = Duration::from_secs(10);
const T: Duration = Duration::from_secs(5);

fn info(replicas: u64) -> RequestOutcome {
    RequestOutcome::reply(json!({"config": {"num_replicas": replicas}, "state": {}}).to_string())
}

fn ms(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

/// The next event other than reachability (tested on its own below).
fn next_event(c: &mut ReplicasCheck) -> Option<ReplicasCheckEvent> {
    std::iter::from_fn(|| c.poll_event()).find(|e| {
        !matches!(
            e,
            ReplicasCheckEvent::Reachable(_) | ReplicasCheckEvent::Sequence { .. }
        )
    })
}

/// Fires the timer at `at` and takes the check it sends.
fn check_at(c: &mut ReplicasCheck, at: Instant) -> crate::io::TransmitId {
    c.handle_timeout(at);
    let t = c.poll_transmit(&mut owner_ids()).expect("a check is due");
    assert_eq!(t.kind, TransmitKind::Api);
    assert_eq!(t.request.subject, "$JS.API.STREAM.INFO.KV_leases");
    assert!(
        c.poll_transmit(&mut owner_ids()).is_none(),
        "one check at a time"
    );
    t.id
}

#[test]
fn a_check_goes_out_each_period_and_not_before() {
    let t0 = Instant::now();
    let mut c = ReplicasCheck::new(EVERY, T, 1, t0);
    assert_eq!(c.poll_timeout(), Some(t0 + EVERY));
    c.handle_timeout(ms(t0, 9_999));
    assert!(c.poll_transmit(&mut owner_ids()).is_none());
    let id = check_at(&mut c, t0 + EVERY);
    assert_eq!(
        c.poll_timeout(),
        None,
        "no deadline of its own for the check out: its owner times it out"
    );
    c.handle_outcome(ms(t0, 10_050), id, info(1));
    assert_eq!(next_event(&mut c), None, "one replica, as before");
    assert_eq!(c.poll_timeout(), Some(t0 + 2 * EVERY));
}

#[test]
fn confirmation_turns_on_past_one_replica_and_off_at_one_once_each() {
    let t0 = Instant::now();
    let mut c = ReplicasCheck::new(EVERY, T, 1, t0);
    let id = check_at(&mut c, t0 + EVERY);
    c.handle_outcome(t0 + EVERY, id, info(3));
    let on = ReplicasCheckEvent::ConfirmReads {
        replicas: 3,
        on: true,
    };
    assert_eq!(next_event(&mut c), Some(on));
    assert!(c.confirm_reads());
    let id = check_at(&mut c, t0 + 2 * EVERY);
    c.handle_outcome(t0 + 2 * EVERY, id, info(5));
    assert_eq!(next_event(&mut c), None, "still more than one");
    let id = check_at(&mut c, t0 + 3 * EVERY);
    c.handle_outcome(t0 + 3 * EVERY, id, info(1));
    let off = ReplicasCheckEvent::ConfirmReads {
        replicas: 1,
        on: false,
    };
    assert_eq!(next_event(&mut c), Some(off));
    assert!(!c.confirm_reads());
}

#[test]
fn no_answer_or_an_error_keeps_what_was_known_and_a_late_answer_is_ignored() {
    let t0 = Instant::now();
    let mut c = ReplicasCheck::new(EVERY, T, 3, t0);
    assert!(c.confirm_reads());
    let id = check_at(&mut c, t0 + EVERY);
    // Its owner times it out.
    c.handle_outcome(t0 + EVERY + T, id, RequestOutcome::TimedOut);
    assert_eq!(next_event(&mut c), None);
    c.handle_outcome(t0 + EVERY + T, id, info(1));
    assert_eq!(next_event(&mut c), None, "the timed-out check's answer");
    assert!(c.confirm_reads());
    let id = check_at(&mut c, t0 + 2 * EVERY);
    c.handle_outcome(t0 + 2 * EVERY, id, RequestOutcome::NoResponders);
    let error = r#"{"error":{"code":503,"err_code":10008,"description":"x"}}"#;
    let id2 = check_at(&mut c, t0 + 3 * EVERY);
    c.handle_outcome(t0 + 3 * EVERY, id2, RequestOutcome::reply(error));
    assert_eq!(next_event(&mut c), None);
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
            // The owner times out the check in flight, if any, at its timeout.
            if let Some((id, due)) = out
                && now >= due
            {
                c.handle_outcome(now, id, RequestOutcome::TimedOut);
                out = None;
            }
            match c.poll_timeout() {
                Some(_) => prop_assert!(out.is_none(), "a next check while one is out"),
                None => prop_assert!(out.is_some(), "no next check and none out"),
            }
            if c.poll_timeout().is_some_and(|at| now >= at) {
                c.handle_timeout(now);
            }
            if let Some(t) = c.poll_transmit(&mut owner_ids()) {
                prop_assert!(out.is_none(), "two checks out");
                prop_assert!(c.poll_transmit(&mut owner_ids()).is_none());
                out = Some((t.id, now + T));
            }
            if answer && let Some((id, _)) = out.take() {
                let outcome = replicas.map_or(RequestOutcome::TimedOut, info);
                c.handle_outcome(now, id, outcome);
                if let Some(r) = replicas {
                    let on = r > 1;
                    let event = next_event(&mut c);
                    if on == expected {
                        prop_assert_eq!(event, None);
                    } else {
                        prop_assert_eq!(event, Some(ReplicasCheckEvent::ConfirmReads { replicas: r as usize, on }));
                    }
                    expected = on;
                }
            }
            prop_assert_eq!(next_event(&mut c), None);
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
    assert_eq!(next_event(&mut c), None, "the first sight is no change");
    let id = check_at(&mut c, t0 + 2 * EVERY);
    c.handle_outcome(t0 + 2 * EVERY, id, info_created("2026-12-05T03:00:00Z"));
    assert_eq!(next_event(&mut c), None, "the same stream");
    let id = check_at(&mut c, t0 + 3 * EVERY);
    c.handle_outcome(t0 + 3 * EVERY, id, info_created("2026-12-05T03:09:00Z"));
    assert_eq!(next_event(&mut c), Some(ReplicasCheckEvent::StreamReplaced));
    let id = check_at(&mut c, t0 + 4 * EVERY);
    c.handle_outcome(
        t0 + 4 * EVERY,
        id,
        crate::sim::api_error(404, 10059, "stream not found"),
    );
    assert_eq!(next_event(&mut c), Some(ReplicasCheckEvent::StreamReplaced));
    // Unavailable or timed out: nothing to say.
    let id = check_at(&mut c, t0 + 5 * EVERY);
    c.handle_outcome(t0 + 5 * EVERY, id, RequestOutcome::TimedOut);
    assert_eq!(next_event(&mut c), None);
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
            let t = c
                .poll_transmit(&mut owner_ids())
                .expect("the next shard is asked");
            assert_eq!(
                t.request.subject,
                format!("$JS.API.STREAM.INFO.KV_leases_{i}")
            );
            assert!(c.poll_transmit(&mut owner_ids()).is_none(), "one at a time");
            let (replicas, made) = match (round, i) {
                (1, 1) => (3, "later"),
                _ => (1, "first"),
            };
            c.handle_outcome(at, t.id, created(replicas, made));
        }
        assert!(
            c.poll_transmit(&mut owner_ids()).is_none(),
            "the round is over"
        );
        assert_eq!(c.poll_timeout(), Some(at + EVERY));
    }
    assert_eq!(next_event(&mut c), Some(ReplicasCheckEvent::StreamReplaced));
    assert_eq!(
        next_event(&mut c),
        Some(ReplicasCheckEvent::ConfirmReads {
            replicas: 3,
            on: true
        })
    );
    // Shard 2 answered one replica after shard 1's three: still on, said once.
    assert_eq!(
        next_event(&mut c),
        None,
        "the R1 shard after the R3 one changes nothing"
    );
    assert!(c.confirm_reads());
}

/// What a row's last event must be.
type Says = fn(&Option<ReplicasCheckEvent>) -> bool;

fn info_at(created: &str, first_seq: Option<u64>, last_seq: u64) -> RequestOutcome {
    let mut config = json!({"num_replicas": 1});
    if let Some(first) = first_seq {
        config["first_seq"] = json!(first);
    }
    RequestOutcome::reply(
        json!({"config": config, "created": created, "state": {"last_seq": last_seq}}).to_string(),
    )
}

/// Fences never repeat: a stream whose last sequence went below the highest seen,
/// or made anew from a sequence at or below it, is rewound; one made anew from
/// above it (the documented restore) is only replaced; a stream gone and back is
/// judged against what it had.
#[test]
fn a_stream_whose_sequence_went_back_is_rewound() {
    let gone = crate::sim::api_error(404, 10059, "stream not found");
    // (answers in turn, what the last one says)
    let table: Vec<(Vec<RequestOutcome>, Says)> = vec![
        // Growing, the same stream: nothing.
        (vec![info_at("a", None, 10), info_at("a", None, 12)], |e| {
            e.is_none()
        }),
        // The same stream, its last sequence back below (restored in place) at
        // two looks in a row.
        (
            vec![
                info_at("a", None, 10),
                info_at("a", None, 4),
                info_at("a", None, 4),
            ],
            |e| matches!(e, Some(ReplicasCheckEvent::Rewound(_))),
        ),
        // Made anew from 1: rewound even once its writes passed the old high.
        (vec![info_at("a", None, 10), info_at("b", None, 50)], |e| {
            matches!(e, Some(ReplicasCheckEvent::Rewound(_)))
        }),
        // Made anew with first_seq above every sequence seen: only replaced.
        (
            vec![info_at("a", None, 10), info_at("b", Some(11), 10)],
            |e| e == &Some(ReplicasCheckEvent::StreamReplaced),
        ),
        // Made anew with first_seq at the old high: rewound.
        (
            vec![info_at("a", None, 10), info_at("b", Some(10), 12)],
            |e| matches!(e, Some(ReplicasCheckEvent::Rewound(_))),
        ),
        // Gone, then made again from 1.
        (
            vec![info_at("a", None, 10), gone.clone(), info_at("b", None, 2)],
            |e| matches!(e, Some(ReplicasCheckEvent::Rewound(_))),
        ),
        // Gone, then made again above: replaced (what was known is forgotten).
        (
            vec![
                info_at("a", None, 10),
                gone.clone(),
                info_at("b", Some(100), 99),
            ],
            |e| e == &Some(ReplicasCheckEvent::StreamReplaced),
        ),
        // Below at one look only (a new stream leader still applying its log):
        // nothing, whatever follows.
        (vec![info_at("a", None, 10), info_at("a", None, 4)], |e| {
            e.is_none()
        }),
        (
            vec![
                info_at("a", None, 10),
                info_at("a", None, 4),
                info_at("a", None, 11),
                info_at("a", None, 4),
            ],
            |e| e.is_none(),
        ),
    ];
    for (row, (answers, says)) in table.into_iter().enumerate() {
        let t0 = Instant::now();
        let mut c = ReplicasCheck::new(EVERY, T, 1, t0);
        let mut last = None;
        for (i, answer) in answers.into_iter().enumerate() {
            let at = t0 + EVERY * (i as u32 + 1);
            let id = check_at(&mut c, at);
            c.handle_outcome(at, id, answer);
            last = next_event(&mut c);
            // A gone stream says replaced at once: the row judges the last answer.
            if last == Some(ReplicasCheckEvent::StreamReplaced) && i == 1 && row >= 5 {
                last = next_event(&mut c);
            }
        }
        assert!(says(&last), "row {row}: {last:?}");
    }
}

/// Readiness reads the check: an answer keeps the bucket reachable, a timeout,
/// no responders or an API error make it unreachable (said once), the next
/// answer reachable again; `check_soon` asks at once.
#[test]
fn the_bucket_is_unreachable_from_a_failed_look_until_the_next_answer() {
    let t0 = Instant::now();
    let mut c = ReplicasCheck::new(EVERY, T, 1, t0);
    let reach = |c: &mut ReplicasCheck| {
        std::iter::from_fn(|| c.poll_event())
            .filter_map(|e| match e {
                ReplicasCheckEvent::Reachable(r) => Some(r.is_ok()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let id = check_at(&mut c, t0 + EVERY);
    c.handle_outcome(t0 + EVERY, id, info(1));
    assert_eq!(
        reach(&mut c),
        Vec::<bool>::new(),
        "reachable from the start"
    );
    let error = r#"{"error":{"code":503,"err_code":10008,"description":"x"}}"#;
    for failed in [
        RequestOutcome::TimedOut,
        RequestOutcome::NoResponders,
        RequestOutcome::reply(error),
    ] {
        let at = c.poll_timeout().unwrap();
        let id = check_at(&mut c, at);
        c.handle_outcome(at, id, failed.clone());
        assert_eq!(reach(&mut c), vec![false], "{failed:?}");
        let at = c.poll_timeout().unwrap();
        let id = check_at(&mut c, at);
        c.handle_outcome(at, id, failed.clone());
        assert_eq!(reach(&mut c), Vec::<bool>::new(), "said once");
        let soon = at + Duration::from_millis(1);
        c.check_soon(soon);
        assert_eq!(c.poll_timeout(), Some(soon), "asked at once");
        let id = check_at(&mut c, soon);
        c.handle_outcome(soon, id, info(1));
        assert_eq!(reach(&mut c), vec![true]);
    }
}

/// What startup saw is the first thing compared: a stream made anew before the
/// check's first look is caught at that look (one below at one look waits for
/// the next).
#[test]
fn the_first_look_compares_with_what_startup_saw() {
    // (startup saw, first answer, rewound)
    let table = [
        (Some((Some("a"), 10)), info_at("a", None, 4), false),
        (Some((Some("a"), 10)), info_at("b", None, 50), true),
        (Some((Some("a"), 10)), info_at("b", Some(11), 10), false),
        (Some((Some("a"), 10)), info_at("a", None, 12), false),
        (None, info_at("b", None, 4), false),
    ];
    for (row, (seen, answer, rewound)) in table.into_iter().enumerate() {
        let t0 = Instant::now();
        let mut c = ReplicasCheck::new(EVERY, T, 1, t0);
        if let Some((created, last)) = seen {
            c = c.with_seen(&[(created.map(str::to_string), last)]);
        }
        let id = check_at(&mut c, t0 + EVERY);
        c.handle_outcome(t0 + EVERY, id, answer);
        let got = matches!(next_event(&mut c), Some(ReplicasCheckEvent::Rewound(_)));
        assert_eq!(got, rewound, "row {row}");
    }
}
