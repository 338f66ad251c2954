//! Table tests of admission: start, wait, refuse, and the room kept for renewals.

use std::time::Instant;

use crate::service::admit::{Admission, AdmissionEvent};
use crate::wire::{Endpoint, ErrorKind, Response};

fn drain(a: &mut Admission<u32>) -> Vec<AdmissionEvent<u32>> {
    std::iter::from_fn(|| a.poll_event()).collect()
}

fn started(events: &[AdmissionEvent<u32>]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            AdmissionEvent::Start(_, r) => Some(*r),
            AdmissionEvent::Overloaded(..) => None,
        })
        .collect()
}

fn overloaded(events: &[AdmissionEvent<u32>]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            AdmissionEvent::Overloaded(_, r, Response::Error(e))
                if e.kind == ErrorKind::Unavailable =>
            {
                Some(*r)
            }
            AdmissionEvent::Overloaded(..) => panic!("a refusal is `unavailable`: {e:?}"),
            AdmissionEvent::Start(..) => None,
        })
        .collect()
}

#[test]
fn below_the_bound_every_request_starts_at_once() {
    let now = Instant::now();
    let mut a = Admission::new(3, 4, now);
    for (i, e) in [Endpoint::Acquire, Endpoint::Owner, Endpoint::Renew]
        .into_iter()
        .enumerate()
    {
        a.handle_request(now, e, i as u32);
    }
    let events = drain(&mut a);
    assert_eq!(started(&events), [0, 1, 2]);
    assert_eq!(a.counts(), counts(3, 0, 0));
}

#[test]
fn past_the_bound_requests_wait_and_start_in_order_as_calls_end() {
    let now = Instant::now();
    let mut a = Admission::new(1, 4, now);
    a.handle_request(now, Endpoint::Forward, 0);
    a.handle_request(now, Endpoint::Forward, 1);
    a.handle_request(now, Endpoint::Renew, 2);
    assert_eq!(started(&drain(&mut a)), [0]);
    assert_eq!(a.counts(), counts(1, 2, 0));
    a.handle_finished(now);
    assert_eq!(started(&drain(&mut a)), [1]);
    a.handle_finished(now);
    assert_eq!(started(&drain(&mut a)), [2]);
    a.handle_finished(now);
    assert!(drain(&mut a).is_empty());
    assert!(a.is_idle());
}

#[test]
fn a_full_queue_refuses_at_once_with_unavailable() {
    let now = Instant::now();
    let mut a = Admission::new(1, 2, now);
    a.handle_request(now, Endpoint::Renew, 0);
    a.handle_request(now, Endpoint::Renew, 1);
    a.handle_request(now, Endpoint::Release, 2);
    a.handle_request(now, Endpoint::Renew, 3);
    let events = drain(&mut a);
    assert_eq!(started(&events), [0]);
    assert_eq!(
        overloaded(&events),
        [3],
        "two wait, the third past the bound"
    );
    assert_eq!(a.counts(), counts(1, 2, 1));
}

#[test]
fn half_the_queue_is_kept_for_renew_and_release() {
    let now = Instant::now();
    let mut a = Admission::new(1, 4, now);
    a.handle_request(now, Endpoint::Acquire, 0);
    // Acquire, owner and forward may fill half the queue.
    a.handle_request(now, Endpoint::Acquire, 1);
    a.handle_request(now, Endpoint::Owner, 2);
    a.handle_request(now, Endpoint::Forward, 3);
    a.handle_request(now, Endpoint::Acquire, 4);
    // Renew and release take the rest.
    a.handle_request(now, Endpoint::Renew, 5);
    a.handle_request(now, Endpoint::Release, 6);
    a.handle_request(now, Endpoint::Renew, 7);
    let events = drain(&mut a);
    assert_eq!(started(&events), [0]);
    assert_eq!(overloaded(&events), [3, 4, 7]);
    for _ in 0..5 {
        a.handle_finished(now);
    }
    assert_eq!(started(&drain(&mut a)), [1, 2, 5, 6]);
}

#[test]
fn stopping_starts_every_waiting_request() {
    let now = Instant::now();
    let mut a = Admission::new(1, 4, now);
    for i in 0..3 {
        a.handle_request(now, Endpoint::Renew, i);
    }
    drain(&mut a);
    a.handle_stop(now);
    assert_eq!(started(&drain(&mut a)), [1, 2]);
    a.handle_request(now, Endpoint::Acquire, 9);
    assert_eq!(started(&drain(&mut a)), [9], "no bound once stopping");
}

#[test]
fn a_bound_of_zero_still_runs_one_call() {
    let now = Instant::now();
    let mut a = Admission::new(0, 0, now);
    a.handle_request(now, Endpoint::Owner, 0);
    a.handle_request(now, Endpoint::Owner, 1);
    let events = drain(&mut a);
    assert_eq!(started(&events), [0]);
    assert_eq!(overloaded(&events), [1]);
}

fn ta() -> Option<String> {
    Some("TA".into())
}

fn tb() -> Option<String> {
    Some("TB".into())
}

#[test]
fn tenants_start_their_waiting_calls_in_turn_so_a_flood_does_not_hold_back_another_tenant() {
    let now = Instant::now();
    let mut a = Admission::new(1, 100, now);
    a.handle_tenant_request(now, ta(), Endpoint::Renew, 0);
    assert_eq!(started(&drain(&mut a)), [0]);
    // TA floods with 10 renewals; TB's one renewal arrives after them.
    for i in 1..=10 {
        a.handle_tenant_request(now, ta(), Endpoint::Renew, i);
    }
    a.handle_tenant_request(now, tb(), Endpoint::Renew, 100);
    assert!(drain(&mut a).is_empty());
    a.handle_finished(now);
    a.handle_finished(now);
    a.handle_finished(now);
    let order: Vec<u32> = started(&drain(&mut a));
    assert_eq!(order, [1, 100, 2], "TB starts second, not eleventh");
}

#[test]
fn a_full_room_makes_space_for_a_tenant_with_fewer_waiting_at_the_floods_expense() {
    let now = Instant::now();
    let mut a = Admission::new(1, 4, now);
    a.handle_tenant_request(now, ta(), Endpoint::Renew, 0);
    for i in 1..=4 {
        a.handle_tenant_request(now, ta(), Endpoint::Renew, i);
    }
    assert_eq!(started(&drain(&mut a)), [0]);
    // The room is full of TA's; TB's renewal takes the place of TA's last.
    a.handle_tenant_request(now, tb(), Endpoint::Renew, 100);
    assert_eq!(overloaded(&drain(&mut a)), [4]);
    // TA's next finds the room full and no longer queue to take from.
    a.handle_tenant_request(now, ta(), Endpoint::Renew, 5);
    assert_eq!(overloaded(&drain(&mut a)), [5]);
    assert_eq!(a.counts(), counts(1, 4, 2));
    for _ in 0..4 {
        a.handle_finished(now);
    }
    assert_eq!(started(&drain(&mut a)), [1, 100, 2, 3]);
    assert!(!a.is_idle(), "3 still runs");
    a.handle_finished(now);
    assert!(a.is_idle());
}

#[test]
fn without_tenants_waiting_requests_start_in_arrival_order_as_before() {
    let now = Instant::now();
    let mut a = Admission::new(1, 10, now);
    for i in 0..5 {
        a.handle_request(now, Endpoint::Renew, i);
    }
    for _ in 0..5 {
        a.handle_finished(now);
    }
    assert_eq!(started(&drain(&mut a)), [0, 1, 2, 3, 4]);
}

#[test]
fn a_tenant_runs_at_most_its_share_so_its_slow_calls_leave_slots_for_others() {
    let now = Instant::now();
    let mut a = Admission::new(4, 100, now).with_tenant_share(2);
    // TA's slow calls: two run, the rest wait though slots are free.
    for i in 0..5 {
        a.handle_tenant_request(now, ta(), Endpoint::Forward, i);
    }
    assert_eq!(started(&drain(&mut a)), [0, 1]);
    // TB's renewal starts at once.
    a.handle_tenant_request(now, tb(), Endpoint::Renew, 100);
    assert_eq!(started(&drain(&mut a)), [100]);
    // TB's ending starts none of TA's (TA is at its share)...
    a.handle_tenant_finished(now, tb());
    assert!(drain(&mut a).is_empty());
    // ...TA's own ending starts its next.
    a.handle_tenant_finished(now, ta());
    assert_eq!(started(&drain(&mut a)), [2]);
    assert_eq!(a.counts(), counts(2, 2, 0));
    // Stopping lifts the share.
    a.handle_stop(now);
    assert_eq!(started(&drain(&mut a)), [3, 4]);
}

#[test]
fn a_groups_renewals_wait_in_a_lane_of_their_own_that_takes_turns_with_single_calls() {
    let now = Instant::now();
    let mut a = Admission::new(1, 100, now);
    a.handle_request(now, Endpoint::Renew, 0);
    assert_eq!(started(&drain(&mut a)), [0]);
    // A renew_many's four renewals wait; an acquire and a renew arrive after them.
    for i in 1..=4 {
        a.handle_item_of(now, None, Endpoint::Renew, i);
    }
    a.handle_request(now, Endpoint::Acquire, 100);
    a.handle_request(now, Endpoint::Renew, 101);
    assert!(drain(&mut a).is_empty());
    for _ in 0..6 {
        a.handle_finished(now);
    }
    assert_eq!(
        started(&drain(&mut a)),
        [1, 100, 2, 101, 3, 4],
        "the single calls start between the group's renewals, not after all four"
    );
}

#[test]
fn a_groups_renewal_that_finds_the_room_full_is_refused_alone_and_the_others_wait() {
    let now = Instant::now();
    let mut a = Admission::new(1, 2, now);
    for i in 0..5 {
        a.handle_item_of(now, None, Endpoint::Renew, i);
    }
    let events = drain(&mut a);
    assert_eq!(started(&events), [0]);
    assert_eq!(overloaded(&events), [3, 4]);
    assert_eq!(a.counts(), counts(1, 2, 2));
    // Half the room is still kept for renewals: an acquire is refused.
    a.handle_request(now, Endpoint::Acquire, 100);
    assert_eq!(overloaded(&drain(&mut a)), [100]);
}

#[test]
fn with_tenants_each_tenants_group_lane_takes_its_turn_too() {
    let now = Instant::now();
    let mut a = Admission::new(1, 100, now);
    a.handle_tenant_request(now, ta(), Endpoint::Renew, 0);
    for i in 1..=3 {
        a.handle_item_of(now, ta(), Endpoint::Renew, i);
    }
    a.handle_tenant_request(now, ta(), Endpoint::Acquire, 10);
    a.handle_tenant_request(now, tb(), Endpoint::Renew, 20);
    for _ in 0..6 {
        a.handle_tenant_finished(now, ta());
    }
    assert_eq!(started(&drain(&mut a)), [0, 1, 10, 20, 2, 3]);
}

/// The counts as a named struct, for the table rows above.
fn counts(
    running: usize,
    waiting: usize,
    overloaded: u64,
) -> crate::service::admit::AdmissionCounts {
    crate::service::admit::AdmissionCounts {
        running,
        waiting,
        overloaded,
    }
}
