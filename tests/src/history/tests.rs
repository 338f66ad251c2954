//! The checker's unit tests: histories that must fail and histories that must pass.

use super::*;
use dagnats_leases_core::shard::ShardMap;

const S: Nanos = 1_000_000_000;
const TTL: u64 = 2_000;

fn call(key: &str, caller: &str, op: Op, sent: Nanos, replied: Nanos, o: Outcome) -> Record {
    Record::Call(Call {
        key: key.into(),
        caller: caller.into(),
        op,
        sent,
        replied,
        outcome: o,
    })
}
fn grant(caller: &str, sent: Nanos, rev: u64) -> Record {
    call(
        "k",
        caller,
        Op::Acquire,
        sent,
        sent + ms(1),
        Outcome::Granted {
            revision: rev,
            ttl_ms: TTL,
            write_lb: sent,
        },
    )
}
fn renew(caller: &str, sent: Nanos, rev: u64) -> Record {
    call(
        "k",
        caller,
        Op::Renew,
        sent,
        sent + ms(1),
        Outcome::Renewed {
            revision: rev,
            ttl_ms: TTL,
        },
    )
}
fn release(caller: &str, sent: Nanos, rev: u64) -> Record {
    call(
        "k",
        caller,
        Op::Release,
        sent,
        sent + ms(1),
        Outcome::Released { revision: rev },
    )
}
fn read(sent: Nanos, o: Outcome) -> Record {
    call("k", "reader", Op::Read, sent, sent + ms(1), o)
}
fn belief(holder: &str, rev: u64, from: Nanos, until: Nanos) -> Record {
    Record::Belief(Belief {
        key: "k".into(),
        holder: holder.into(),
        revision: rev,
        from,
        until,
    })
}
fn expiry(seq: u64, observed: Nanos) -> Record {
    Record::Expiry(Expiry {
        key: "k".into(),
        seq,
        observed,
    })
}
fn write(holder: &str, rev: u64, at: Nanos, accepted: bool) -> Record {
    Record::Store(StoreWrite {
        key: "k".into(),
        holder: holder.into(),
        revision: rev,
        at,
        accepted,
    })
}
fn rules(records: &[Record]) -> Vec<Rule> {
    check(records, ShardMap::SINGLE)
        .violations
        .iter()
        .map(|v| v.rule)
        .collect()
}

/// A clean history: a grants, renews, expires; b takes over and releases; a again.
fn clean() -> Vec<Record> {
    vec![
        grant("a", 10 * S, 1),
        belief("a", 1, 10 * S + ms(1), 12 * S + ms(600)),
        renew("a", 10 * S + ms(600), 2),
        write("a", 1, 10 * S + ms(5), true),
        write("a", 2, 11 * S, true),
        read(
            11 * S,
            Outcome::Held {
                holder: "a".into(),
                revision: 2,
            },
        ),
        expiry(3, 12 * S + ms(800)),
        grant("b", 13 * S, 4),
        belief("b", 4, 13 * S + ms(1), 14 * S),
        write("b", 4, 13 * S + ms(10), true),
        write("a", 2, 13 * S + ms(20), false),
        release("b", 14 * S, 5),
        read(14 * S + ms(10), Outcome::Free),
        grant("a", 15 * S, 6),
        grant("a", 15 * S + ms(100), 6), // an idempotent retry: the same tenure
        belief("a", 6, 15 * S + ms(1), 17 * S),
    ]
}

#[test]
fn a_clean_history_passes() {
    let v = check(&clean(), ShardMap::SINGLE);
    assert!(v.violations.is_empty(), "{v}");
    assert_eq!((v.grants, v.renewals, v.releases, v.expiries), (3, 1, 1, 1));
    assert_eq!((v.reads, v.store_writes, v.store_rejected), (2, 4, 1));
}

#[test]
fn concurrent_calls_may_see_either_order() {
    // b's read overlaps a's renew: seeing the old revision is linearizable.
    let h = vec![
        grant("a", 10 * S, 1),
        call(
            "k",
            "a",
            Op::Renew,
            11 * S,
            11 * S + ms(50),
            Outcome::Renewed {
                revision: 2,
                ttl_ms: TTL,
            },
        ),
        read(
            11 * S + ms(10),
            Outcome::Held {
                holder: "a".into(),
                revision: 1,
            },
        ),
    ];
    assert_eq!(rules(&h), vec![]);
}

#[test]
fn overlapping_beliefs_fail() {
    let h = vec![
        belief("a", 1, 10 * S, 12 * S),
        belief("b", 4, 11 * S, 13 * S),
    ];
    assert_eq!(rules(&h), vec![Rule::OverlappingBeliefs]);
    // The same holder's two beliefs may touch; disjoint ones of two holders pass.
    let h = vec![
        belief("a", 1, 10 * S, 12 * S),
        belief("a", 3, 11 * S, 13 * S),
        belief("b", 4, 13 * S, 14 * S),
    ];
    assert_eq!(rules(&h), vec![]);
}

#[test]
fn a_grant_while_a_lease_stands_fails() {
    // a renewed at 10.6 s with a 2 s TTL: the lease stands until 12.6 s at least.
    let h = vec![
        grant("a", 10 * S, 1),
        renew("a", 10 * S + ms(600), 2),
        grant("b", 12 * S, 3),
    ];
    assert_eq!(rules(&h), vec![Rule::GrantWhileHeld]);
    // After a release by a, b may be granted at once.
    let h = vec![
        grant("a", 10 * S, 1),
        release("a", 10 * S + ms(500), 2),
        grant("b", 10 * S + ms(600), 3),
    ];
    assert_eq!(rules(&h), vec![]);
    // An unanswered release may have freed it: not a violation.
    let h = vec![
        grant("a", 10 * S, 1),
        call(
            "k",
            "a",
            Op::Release,
            10 * S + ms(500),
            11 * S,
            Outcome::Unknown {
                why: "timeout".into(),
            },
        ),
        grant("b", 11 * S, 3),
    ];
    assert_eq!(rules(&h), vec![]);
}

#[test]
fn an_idempotent_grant_is_bounded_by_its_earliest_write() {
    // a's first acquire went unanswered at 10 s; the retry at 11 s is granted
    // idempotently, so the lease may end at 12 s: b at 12.1 s is fine.
    let h = vec![
        call(
            "k",
            "a",
            Op::Acquire,
            10 * S,
            11 * S,
            Outcome::Unknown {
                why: "timeout".into(),
            },
        ),
        call(
            "k",
            "a",
            Op::Acquire,
            11 * S,
            11 * S + ms(1),
            Outcome::Granted {
                revision: 1,
                ttl_ms: TTL,
                write_lb: 10 * S,
            },
        ),
        grant("b", 12 * S + ms(100), 3),
    ];
    assert_eq!(rules(&h), vec![]);
}

#[test]
fn a_read_of_another_owner_or_free_while_a_lease_stands_fails() {
    let h = vec![
        grant("a", 10 * S, 1),
        read(
            11 * S,
            Outcome::Held {
                holder: "b".into(),
                revision: 3,
            },
        ),
    ];
    assert_eq!(rules(&h), vec![Rule::GrantWhileHeld]);
    let h = vec![grant("a", 10 * S, 1), read(11 * S, Outcome::Free)];
    assert_eq!(rules(&h), vec![Rule::GrantWhileHeld]);
}

#[test]
fn a_revision_handed_out_twice_fails() {
    let h = vec![grant("a", 10 * S, 5), grant("b", 20 * S, 5)];
    let r = rules(&h);
    assert!(r.contains(&Rule::ReusedRevision), "{r:?}");
    assert!(r.contains(&Rule::RevisionNotHigher), "{r:?}");
    let h = vec![grant("a", 10 * S, 5), expiry(5, 13 * S)];
    assert!(rules(&h).contains(&Rule::ReusedRevision));
}

#[test]
fn a_revision_of_two_keys_fails() {
    let mut other = grant("b", 20 * S, 5);
    if let Record::Call(c) = &mut other {
        c.key = "j".into();
    }
    let h = vec![grant("a", 10 * S, 5), other];
    assert_eq!(rules(&h), vec![Rule::ReusedRevision]);
}

#[test]
fn a_tenure_not_higher_than_an_earlier_one_fails() {
    // After a restart b gets revision 3, lower than a's 4 seen before.
    let h = vec![
        grant("a", 10 * S, 2),
        renew("a", 10 * S + ms(600), 4),
        grant("b", 20 * S, 3),
    ];
    assert_eq!(rules(&h), vec![Rule::RevisionNotHigher]);
    // Lower than an expiry marker seen before the request.
    let h = vec![
        grant("a", 10 * S, 2),
        expiry(6, 13 * S),
        grant("b", 14 * S, 5),
    ];
    assert_eq!(rules(&h), vec![Rule::RevisionNotHigher]);
}

#[test]
fn a_stale_read_fails() {
    let h = vec![
        grant("a", 10 * S, 1),
        renew("a", 10 * S + ms(600), 2),
        read(
            11 * S,
            Outcome::Held {
                holder: "a".into(),
                revision: 1,
            },
        ),
    ];
    assert_eq!(rules(&h), vec![Rule::RevisionNotHigher]);
}

fn read_by(caller: &str, sent: Nanos, o: Outcome) -> Record {
    call("k", caller, Op::Read, sent, sent + ms(1), o)
}

#[test]
fn stale_reports_are_violations_and_counted_as_such() {
    // a is granted 1 and renews to 2; then reports of a at 1, "free" while a's
    // lease stands, and b's acquire told a holds it at 1: three stale reports.
    let h = vec![
        grant("a", 10 * S, 1),
        renew("a", 10 * S + ms(600), 2),
        read_by(
            "reader",
            11 * S,
            Outcome::Held {
                holder: "a".into(),
                revision: 1,
            },
        ),
        read_by("reader", 11 * S + ms(100), Outcome::Free),
        call(
            "k",
            "b",
            Op::Acquire,
            11 * S + ms(200),
            11 * S + ms(201),
            Outcome::Held {
                holder: "a".into(),
                revision: 1,
            },
        ),
    ];
    let v = check(&h, ShardMap::SINGLE);
    // The "free" read breaks both the grant's and the renewal's standing lease.
    assert_eq!(v.violations.len(), 4, "{v}");
    assert_eq!(v.stale_reports(), 3, "three calls, each counted once: {v}");
    assert!(v.summary().contains("stale reports: 3"), "{}", v.summary());
    // A repeat grant answered from the old state is a stale report; the same
    // answer claimed as a fresh write is a violation but no report.
    let stale = |write_lb: Nanos| {
        vec![
            grant("b", 5 * S, 1),
            renew("b", 5 * S + ms(300), 2),
            grant("a", 10 * S, 5),
            call(
                "k",
                "b",
                Op::Acquire,
                11 * S,
                11 * S + ms(1),
                Outcome::Granted {
                    revision: 1,
                    ttl_ms: 2000,
                    write_lb,
                },
            ),
        ]
    };
    let v = check(&stale(5 * S), ShardMap::SINGLE);
    assert_eq!(v.stale_reports(), 1, "{v}");
    let v = check(&stale(11 * S), ShardMap::SINGLE);
    assert!(
        !v.violations.is_empty(),
        "a fresh grant below a revision passed"
    );
    assert_eq!(v.stale_reports(), 0, "{v}");
    // What a write, a belief or the store shows is never a report.
    let h = vec![
        belief("a", 1, 11 * S, 11 * S + ms(500)),
        belief("b", 4, 11 * S + ms(100), 11 * S + ms(600)),
    ];
    let v = check(&h, ShardMap::SINGLE);
    assert_eq!((v.violations.len(), v.stale_reports()), (1, 0), "{v}");
    let h = vec![grant("a", 10 * S, 1), grant("b", 11 * S, 3)];
    assert_eq!(check(&h, ShardMap::SINGLE).stale_reports(), 0);
}

#[test]
fn a_renew_that_does_not_raise_the_fence_fails() {
    let h = vec![grant("a", 10 * S, 3), renew("a", 10 * S + ms(600), 3)];
    assert_eq!(rules(&h), vec![Rule::RevisionNotHigher]);
}

#[test]
fn an_old_owners_write_accepted_after_the_new_owners_fails() {
    // A store that let a through with fence 2 after b wrote with 2 (a reused fence).
    let h = vec![
        grant("a", 10 * S, 2),
        write("b", 2, 13 * S, true),
        write("a", 2, 13 * S + ms(1), true),
    ];
    let r = rules(&h);
    assert!(r.contains(&Rule::StaleWriteAccepted), "{r:?}");
    assert!(r.contains(&Rule::ForgedFence), "b never got 2: {r:?}");
    // A broken store that accepts a lower fence after a higher one.
    let h = vec![
        grant("a", 10 * S, 2),
        expiry(3, 12 * S + ms(500)),
        grant("b", 13 * S, 4),
        write("b", 4, 13 * S + ms(5), true),
        write("a", 2, 13 * S + ms(6), true),
    ];
    assert_eq!(rules(&h), vec![Rule::StaleWriteAccepted]);
}

#[test]
fn a_late_write_before_the_new_owner_writes_is_counted_not_a_violation() {
    let h = vec![
        grant("a", 10 * S, 2),
        write("a", 2, 13 * S, true), // after 10 + 2 + 0.325 s: late
        grant("b", 13 * S + ms(10), 4),
        write("b", 4, 13 * S + ms(20), true),
        write("a", 2, 13 * S + ms(30), false),
    ];
    let v = check(&h, ShardMap::SINGLE);
    assert!(v.violations.is_empty(), "{v}");
    assert_eq!((v.late_accepted, v.store_rejected), (1, 1));
}

#[test]
fn the_fenced_store_rejects_lower_fences_and_records_all() {
    let history = History::new();
    let store = FencedStore::new(history.clone());
    assert!(store.write("k", "a", 3));
    assert!(store.write("k", "a", 3));
    assert!(store.write("k", "b", 5));
    assert!(!store.write("k", "a", 3));
    assert!(store.write("j", "a", 1), "keys are fenced apart");
    let accepted: Vec<bool> = history
        .records()
        .iter()
        .map(|r| match r {
            Record::Store(w) => w.accepted,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(accepted, vec![true, true, true, false, true]);
}

#[test]
fn records_round_trip_as_json_lines() {
    for r in clean() {
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), r);
    }
}

/// (b1) across keys follows the shard map the checker is given: two keys of
/// different shards may share a revision (each stream numbers its own), two keys
/// of one stream may not.
#[test]
fn a_revision_shared_across_shards_is_no_reuse_within_one_stream_it_is() {
    let three = ShardMap::new(3).unwrap();
    let a = "k";
    let b = (0..)
        .map(|n| format!("other-{n}"))
        .find(|k| three.shard_of(k) != three.shard_of(a))
        .unwrap();
    let granted = |key: &str, caller: &str, sent: Nanos| {
        call(
            key,
            caller,
            Op::Acquire,
            sent,
            sent + ms(1),
            Outcome::Granted {
                revision: 7,
                ttl_ms: TTL,
                write_lb: sent,
            },
        )
    };
    let h = vec![granted(a, "x", S), granted(&b, "y", 2 * S)];
    assert!(
        !check(&h, three)
            .violations
            .iter()
            .any(|v| v.rule == Rule::ReusedRevision)
    );
    assert!(
        check(&h, ShardMap::SINGLE)
            .violations
            .iter()
            .any(|v| v.rule == Rule::ReusedRevision)
    );
}
