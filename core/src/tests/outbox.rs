//! Table tests of the ground layer every machine keeps its things out with
//! ([`crate::outbox`]): ids, the deadline set, the requests out and their give-up.

use std::time::{Duration, Instant};

use crate::io::{HANDOFF_BOUND, TransmitId};
use crate::outbox::{CallId, Due, Handoff, Ids, Requests};

fn at(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

#[test]
fn ids_are_allocated_in_order_never_one_twice() {
    let mut ids: Ids<CallId> = Ids::starting_from(1);
    let got: Vec<CallId> = (0..4).map(|_| ids.allocate()).collect();
    assert_eq!(got, vec![CallId(1), CallId(2), CallId(3), CallId(4)]);
    let mut effects: Ids<TransmitId> = Ids::default();
    assert_eq!(effects.allocate(), TransmitId(0));
    assert_eq!(effects.allocate(), TransmitId(1));
}

#[test]
fn due_gives_the_earliest_instant_first() {
    let t0 = Instant::now();
    let mut due = Due::new();
    due.insert("b", at(t0, 30));
    due.insert("a", at(t0, 10));
    due.insert("c", at(t0, 20));
    assert_eq!(due.next(), Some(at(t0, 10)));
    let popped: Vec<&str> = std::iter::from_fn(|| due.pop_due(at(t0, 100))).collect();
    assert_eq!(popped, vec!["a", "c", "b"]);
    assert!(due.is_empty());
    assert_eq!(due.next(), None);
}

#[test]
fn due_pops_only_what_is_due_at_or_before_now() {
    let t0 = Instant::now();
    let mut due = Due::new();
    due.insert(1u64, at(t0, 10));
    due.insert(2u64, at(t0, 20));
    assert_eq!(
        due.pop_due(at(t0, 9)),
        None,
        "nothing due before its instant"
    );
    assert_eq!(due.pop_due(at(t0, 10)), Some(1), "due at its instant");
    assert_eq!(due.pop_due(at(t0, 19)), None);
    assert_eq!(due.len(), 1);
    assert_eq!(due.due(at(t0, 20)).copied().collect::<Vec<_>>(), vec![2]);
    assert_eq!(due.len(), 1, "looking at what is due takes nothing");
}

#[test]
fn due_at_the_same_instant_comes_in_key_order() {
    let t0 = Instant::now();
    let mut due = Due::new();
    for k in [3u64, 1, 2] {
        due.insert(k, at(t0, 5));
    }
    let popped: Vec<u64> = std::iter::from_fn(|| due.pop_due(at(t0, 5))).collect();
    assert_eq!(popped, vec![1, 2, 3]);
}

#[test]
fn a_key_is_due_once_a_new_instant_replaces_its_old() {
    let t0 = Instant::now();
    let mut due = Due::new();
    assert_eq!(due.insert("k", at(t0, 10)), None);
    assert_eq!(due.insert("k", at(t0, 50)), Some(at(t0, 10)));
    assert_eq!(due.len(), 1);
    assert_eq!(due.next(), Some(at(t0, 50)));
    assert_eq!(due.pop_due(at(t0, 10)), None, "the old instant is gone");
    assert_eq!(due.get(&"k"), Some(at(t0, 50)));
}

#[test]
fn a_key_removed_or_set_to_none_is_never_due() {
    let t0 = Instant::now();
    let mut due = Due::new();
    due.insert("gone", at(t0, 10));
    due.insert("unset", at(t0, 10));
    assert_eq!(due.remove(&"gone"), Some(at(t0, 10)));
    assert_eq!(due.remove(&"gone"), None, "a second remove finds nothing");
    due.set("unset", None);
    assert!(!due.contains(&"unset"));
    assert_eq!(due.pop_due(at(t0, 100)), None);
    due.set("again", Some(at(t0, 1)));
    assert_eq!(due.pop_due(at(t0, 1)), Some("again"));
}

#[test]
fn an_answered_request_takes_its_route_and_is_never_timed_out() {
    let t0 = Instant::now();
    let mut out = Requests::new();
    out.insert(TransmitId(1), "startup", Some(at(t0, 10)));
    assert_eq!(out.take(&TransmitId(1)), Some("startup"));
    assert_eq!(
        out.take(&TransmitId(1)),
        None,
        "an outcome twice is ignored"
    );
    assert_eq!(out.pop_timed_out(at(t0, 100)), None);
    assert_eq!(out.next_due(), None);
    assert!(out.is_empty());
}

#[test]
fn the_give_up_hands_back_each_request_past_its_deadline_once() {
    let t0 = Instant::now();
    let mut out = Requests::new();
    out.insert(TransmitId(1), "late", Some(at(t0, 10)));
    out.insert(TransmitId(2), "later", Some(at(t0, 20)));
    assert_eq!(out.next_due(), Some(at(t0, 10)));
    assert_eq!(out.pop_timed_out(at(t0, 9)), None);
    assert_eq!(out.timed_out(at(t0, 15)).count(), 1);
    assert_eq!(out.pop_timed_out(at(t0, 15)), Some((TransmitId(1), "late")));
    assert_eq!(out.pop_timed_out(at(t0, 15)), None);
    assert!(
        !out.contains(&TransmitId(1)),
        "given up: its outcome finds no route"
    );
    assert_eq!(out.len(), 1);
}

#[test]
fn a_request_whose_part_keeps_the_deadline_is_never_timed_out_here() {
    let t0 = Instant::now();
    let mut out = Requests::new();
    out.insert(CallId(7), "call", None);
    assert_eq!(out.next_due(), None);
    assert_eq!(out.pop_timed_out(at(t0, 1_000_000)), None);
    assert_eq!(out.get(&CallId(7)), Some(&"call"));
}

#[test]
fn a_command_not_reported_done_is_given_up_at_the_handoff_bound() {
    let t0 = Instant::now();
    let mut out = Handoff::new();
    out.hand(t0, "reply");
    assert_eq!(out.next_due(), Some(t0 + HANDOFF_BOUND));
    assert_eq!(
        out.pop_given_up(t0 + HANDOFF_BOUND - Duration::from_millis(1)),
        None
    );
    assert_eq!(out.pop_given_up(t0 + HANDOFF_BOUND), Some("reply"));
    assert!(out.is_empty());
    assert!(
        !out.forget(&"reply"),
        "a report after the give-up finds nothing"
    );
}

#[test]
fn a_command_reported_done_is_never_given_up() {
    let t0 = Instant::now();
    let mut out = Handoff::new();
    out.hand(t0, 1u64);
    assert!(out.forget(&1));
    assert_eq!(out.pop_given_up(t0 + HANDOFF_BOUND * 2), None);
    assert_eq!(out.next_due(), None);
}

#[test]
fn a_command_handed_again_starts_its_bound_anew() {
    let t0 = Instant::now();
    let later = t0 + Duration::from_secs(1);
    let mut out = Handoff::new();
    out.hand(t0, "watch k");
    out.hand(later, "watch k");
    assert_eq!(out.pop_given_up(t0 + HANDOFF_BOUND), None);
    assert_eq!(out.pop_given_up(later + HANDOFF_BOUND), Some("watch k"));
}
