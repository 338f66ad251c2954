//! Table tests of `elect`'s decisions: one per rule of [`crate::holder::elect`].

use std::time::{Duration, Instant};

use time::OffsetDateTime;
use time::macros::datetime;

use crate::change::{ChangeEvent, ChangeKind};
use crate::holder::Tenure;
use crate::holder::elect::{
    LeaderChange, LeaderWatch, Leadership, OwnerRead, leader_state, shards_state,
};

const WALL: OffsetDateTime = datetime!(2026-10-18 12:00:00 UTC);

fn tenure(now: Instant, left: Duration) -> Tenure {
    Tenure {
        tenure: 7,
        fence: 9,
        deadline: now + left,
    }
}

#[test]
fn a_tenure_reports_leader_with_its_fences_and_the_time_left_rounded_down() {
    let now = Instant::now();
    let s = leader_state(
        "k",
        "h",
        Some(tenure(now, Duration::from_micros(4_999_999))),
        false,
        now,
        WALL,
    );
    assert!(s.leader);
    assert_eq!(s.http_status(), 200);
    assert_eq!((s.fence, s.revision), (Some(7), Some(9)));
    // 4.999999 s left: 4999 ms, never 5000.
    assert_eq!(s.valid_for_ms, 4_999);
    assert_eq!(s.deadline, Some(WALL + Duration::from_millis(4_999)));
    assert_eq!(s.now, WALL);
}

#[test]
fn no_tenure_reports_not_leader_with_503_and_no_fence() {
    let now = Instant::now();
    let s = leader_state("k", "h", None, false, now, WALL);
    assert!(!s.leader);
    assert_eq!(s.http_status(), 503);
    assert_eq!((s.fence, s.revision, s.deadline), (None, None, None));
    assert_eq!(s.valid_for_ms, 0);
}

#[test]
fn under_a_millisecond_left_is_not_leading() {
    let now = Instant::now();
    let s = leader_state(
        "k",
        "h",
        Some(tenure(now, Duration::from_micros(999))),
        false,
        now,
        WALL,
    );
    assert!(!s.leader);
    assert_eq!(s.http_status(), 503);
}

#[test]
fn a_deadline_already_passed_is_not_leading() {
    let now = Instant::now();
    let t = tenure(now, Duration::ZERO);
    let later = now + Duration::from_millis(5);
    assert!(!leader_state("k", "h", Some(t), false, later, WALL).leader);
}

#[test]
fn a_stopping_process_leads_no_more_even_within_its_deadline() {
    let now = Instant::now();
    let t = tenure(now, Duration::from_secs(10));
    let s = leader_state("k", "h", Some(t), true, now, WALL);
    assert!(!s.leader);
    assert_eq!(s.valid_for_ms, 0);
}

#[test]
fn the_body_names_every_field_an_application_reads() {
    let now = Instant::now();
    let t = tenure(now, Duration::from_secs(2));
    let body = serde_json::to_value(leader_state("k", "h", Some(t), false, now, WALL)).unwrap();
    assert_eq!(
        body,
        serde_json::json!({
            "leader": true, "key": "k", "holder": "h", "fence": 7, "revision": 9,
            "valid_for_ms": 2000, "deadline": "2026-10-18T12:00:02Z",
            "now": "2026-10-18T12:00:00Z",
        })
    );
    let body = serde_json::to_value(leader_state("k", "h", None, false, now, WALL)).unwrap();
    assert_eq!(
        body,
        serde_json::json!({
            "leader": false, "key": "k", "holder": "h", "valid_for_ms": 0,
            "now": "2026-10-18T12:00:00Z",
        })
    );
}

#[test]
fn a_stop_with_nothing_handed_out_releases_at_once() {
    let now = Instant::now();
    let mut l = Leadership::new("k", "h");
    assert!(!l.state(None, now, WALL).leader);
    l.stop();
    assert!(l.is_stopping());
    assert_eq!(l.release_at(now), None);
}

#[test]
fn a_stop_releases_only_after_the_latest_deadline_handed_out() {
    let now = Instant::now();
    let mut l = Leadership::new("k", "h");
    let t = tenure(now, Duration::from_millis(1_500));
    assert!(l.state(Some(t), now, WALL).leader);
    // Renewed: a later deadline handed out; an earlier read does not lower it.
    let later = now + Duration::from_millis(500);
    let renewed = tenure(later, Duration::from_millis(2_000));
    assert!(l.state(Some(renewed), later, WALL).leader);
    assert!(l.state(Some(t), now, WALL).leader);
    l.stop();
    let end = later + Duration::from_millis(2_000);
    assert_eq!(l.release_at(later), Some(end));
    assert_eq!(l.release_at(end), None, "passed: release now");
}

#[test]
fn after_a_stop_nothing_more_is_handed_out() {
    let now = Instant::now();
    let mut l = Leadership::new("k", "h");
    l.stop();
    let s = l.state(Some(tenure(now, Duration::from_secs(5))), now, WALL);
    assert!(!s.leader);
    assert_eq!(l.release_at(now), None);
}

#[test]
fn a_shard_set_reports_only_the_shards_with_time_left_and_503_with_none() {
    let now = Instant::now();
    let held: std::collections::BTreeMap<String, Tenure> = [
        ("s-0".to_string(), tenure(now, Duration::from_millis(1_200))),
        ("s-1".to_string(), tenure(now, Duration::from_micros(400))),
    ]
    .into();
    let s = shards_state("s", "h", &held, false, now, WALL);
    assert!(s.leader);
    assert_eq!(s.http_status(), 200);
    let keys: Vec<_> = s
        .shards
        .iter()
        .map(|l| (l.key.as_str(), l.valid_for_ms))
        .collect();
    assert_eq!(keys, [("s-0", 1_200)], "under 1 ms left is not held");
    assert_eq!(s.shards[0].deadline, WALL + Duration::from_millis(1_200));
    let none = shards_state("s", "h", &held, true, now, WALL);
    assert!(!none.leader && none.shards.is_empty(), "stopping: none");
    assert_eq!(none.http_status(), 503);
}

#[test]
fn a_stopping_shard_set_releases_after_the_latest_deadline_of_any_shard() {
    let now = Instant::now();
    let mut l = Leadership::new("s", "h");
    let held: std::collections::BTreeMap<String, Tenure> = [
        ("s-0".to_string(), tenure(now, Duration::from_millis(700))),
        ("s-1".to_string(), tenure(now, Duration::from_millis(1_900))),
    ]
    .into();
    assert_eq!(l.shards_state(&held, now, WALL).shards.len(), 2);
    l.stop();
    assert_eq!(l.release_at(now), Some(now + Duration::from_millis(1_900)));
}

const RESYNC: Duration = Duration::from_secs(10);

fn event(kind: ChangeKind, revision: u64, holder: Option<&str>) -> ChangeEvent {
    ChangeEvent {
        kind,
        revision,
        holder: holder.map(str::to_string),
    }
}

fn changes(w: &mut LeaderWatch) -> Vec<(Option<String>, u64)> {
    std::iter::from_fn(|| w.poll_event())
        .map(
            |LeaderChange {
                 leader, revision, ..
             }| (leader, revision),
        )
        .collect()
}

fn held(holder: &str, revision: u64) -> OwnerRead {
    OwnerRead::Held {
        holder: holder.to_string(),
        revision,
    }
}

fn some(h: &str) -> Option<String> {
    Some(h.to_string())
}

/// A watch whose first read found `a` at revision 5.
fn watching_a(now: Instant) -> LeaderWatch {
    let mut w = LeaderWatch::new("k", RESYNC, now);
    assert!(w.poll_read());
    w.handle_read(now, held("a", 5));
    assert_eq!(changes(&mut w), [(some("a"), 5)]);
    w
}

#[test]
fn the_watch_reads_the_owner_first_and_reports_it() {
    let now = Instant::now();
    let mut w = LeaderWatch::new("k", RESYNC, now);
    assert!(w.poll_read());
    assert!(!w.poll_read(), "one read at a time");
    w.handle_read(now, OwnerRead::Free);
    assert_eq!(changes(&mut w), [(None, 0)]);
}

#[test]
fn a_renewal_by_the_leader_is_no_change() {
    let now = Instant::now();
    let mut w = watching_a(now);
    w.handle_change(now, &event(ChangeKind::Renewed, 6, Some("a")));
    w.handle_change(now, &event(ChangeKind::Renewed, 8, Some("a")));
    assert_eq!(changes(&mut w), []);
}

#[test]
fn release_expiry_and_delete_free_the_key_and_an_acquire_names_the_new_leader() {
    let now = Instant::now();
    for kind in [
        ChangeKind::Released,
        ChangeKind::Expired,
        ChangeKind::Deleted,
    ] {
        let mut w = watching_a(now);
        w.handle_change(now, &event(kind, 6, None));
        w.handle_change(now, &event(ChangeKind::Acquired, 7, Some("b")));
        assert_eq!(changes(&mut w), [(None, 6), (some("b"), 7)], "{kind:?}");
    }
}

#[test]
fn an_event_at_or_below_the_newest_revision_seen_is_ignored() {
    let now = Instant::now();
    let mut w = watching_a(now);
    w.handle_change(now, &event(ChangeKind::Released, 5, None));
    w.handle_change(now, &event(ChangeKind::Acquired, 3, Some("z")));
    assert_eq!(changes(&mut w), []);
}

#[test]
fn a_read_older_than_an_event_is_ignored() {
    let now = Instant::now();
    let mut w = watching_a(now);
    w.handle_timeout(now + RESYNC);
    assert!(w.poll_read());
    w.handle_change(now, &event(ChangeKind::Acquired, 9, Some("b")));
    w.handle_read(now, held("a", 6));
    assert_eq!(changes(&mut w), [(some("b"), 9)]);
}

#[test]
fn a_free_read_overtaken_by_an_event_is_read_again() {
    let now = Instant::now();
    let mut w = watching_a(now);
    w.handle_timeout(now + RESYNC);
    assert!(w.poll_read());
    w.handle_change(now, &event(ChangeKind::Acquired, 9, Some("b")));
    w.handle_read(now, OwnerRead::Free);
    assert_eq!(changes(&mut w), [(some("b"), 9)]);
    assert!(w.poll_read(), "read again");
    w.handle_read(now, OwnerRead::Free);
    assert_eq!(changes(&mut w), [(None, 0)]);
}

#[test]
fn a_missed_acquire_shows_through_the_next_holders_renewal() {
    let now = Instant::now();
    let mut w = watching_a(now);
    w.handle_change(now, &event(ChangeKind::Renewed, 12, Some("b")));
    assert_eq!(changes(&mut w), [(some("b"), 12)]);
}

#[test]
fn a_write_the_service_did_not_make_asks_for_a_read() {
    let now = Instant::now();
    let mut w = watching_a(now);
    assert!(!w.poll_read());
    w.handle_change(now, &event(ChangeKind::Written, 6, None));
    assert_eq!(changes(&mut w), []);
    assert!(w.poll_read());
}

#[test]
fn the_owner_is_read_again_every_resync_and_a_failed_read_waits_for_the_next() {
    let now = Instant::now();
    let mut w = watching_a(now);
    w.handle_timeout(now + RESYNC / 2);
    assert!(!w.poll_read(), "not yet");
    assert_eq!(w.poll_timeout(), now + RESYNC);
    w.handle_timeout(now + RESYNC);
    assert!(w.poll_read());
    w.handle_read(now + RESYNC, OwnerRead::Failed);
    assert!(!w.poll_read());
    assert_eq!(w.poll_timeout(), now + RESYNC * 2);
    assert_eq!(changes(&mut w), []);
}
