//! Table tests of the campaign machine: one rule each (one campaign per key, the cap,
//! the queue and its cancellations, change-event wake-ups, request deadlines, the
//! inbox).

use std::time::{Duration, Instant};

use super::holder::{body, granted, not_granted, renewed};
use crate::change::{ChangeEvent, ChangeKind};
use crate::holder::OutcomeClass;
use crate::holder::campaign::{
    AnsweredRequest, Campaign, CampaignEvent, GroupId, InboxVerdict, RejectId,
};
use crate::holder::guard::RejectReason;
use crate::holder::{HolderConfig, HolderEvent, StepDownReason};
use crate::io::HANDOFF_BOUND;
use crate::io::{RequestOutcome, TransmitKind};
use crate::test_support::HolderRequest;
use crate::wire::{Endpoint, ErrorKind};

const TTL: Duration = Duration::from_secs(15);

fn configs(keys: &[&str]) -> Vec<HolderConfig> {
    keys.iter()
        .map(|k| HolderConfig::new(*k, "h1", TTL))
        .collect()
}

/// A request the campaign sent, with the key whose holder sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CampaignRequest {
    key: String,
    request: HolderRequest,
}

/// Watches and refusals, which the tests of other rules leave out.
fn is_watch(e: &CampaignEvent) -> bool {
    matches!(
        e,
        CampaignEvent::Watch { .. }
            | CampaignEvent::Unwatch { .. }
            | CampaignEvent::CancelWatch { .. }
            | CampaignEvent::Holder {
                event: HolderEvent::NotGranted { .. },
                ..
            }
    )
}

/// What the campaign reports for the adapter's metrics and request bookkeeping
/// (answers, cancels, ownership gauges, campaign times), which the tests of other
/// rules leave out.
fn is_bookkeeping(e: &CampaignEvent) -> bool {
    matches!(
        e,
        CampaignEvent::Cancel { .. }
            | CampaignEvent::Leading { .. }
            | CampaignEvent::ElectedAfter { .. }
            | CampaignEvent::Answered(_)
    )
}

fn watch(key: &str) -> CampaignEvent {
    CampaignEvent::Watch {
        key: key.to_string(),
    }
}

fn unwatch(key: &str) -> CampaignEvent {
    CampaignEvent::Unwatch {
        key: key.to_string(),
    }
}

struct Run {
    campaign: Campaign,
    t0: Instant,
}

impl Run {
    fn new() -> Self {
        Self {
            campaign: Campaign::new("h1", Instant::now()).unwrap(),
            t0: Instant::now(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// A group of `keys` added at 0, its subscribes reported made at once (the
    /// tests of other rules leave the hand-off bound out).
    fn group(&mut self, keys: &[&str], max_held: usize) -> GroupId {
        let now = self.at(0);
        let group = self
            .campaign
            .add_group(now, configs(keys), max_held)
            .unwrap();
        for key in keys {
            self.campaign.handle_watched(now, key);
        }
        group
    }

    fn requests(&mut self) -> Vec<CampaignRequest> {
        std::iter::from_fn(|| {
            let t = self.campaign.poll_transmit()?;
            assert_eq!(t.transmit.kind, TransmitKind::Lease(t.endpoint));
            Some(CampaignRequest {
                key: t.key,
                request: t.transmit.into(),
            })
        })
        .collect()
    }

    fn request(&mut self) -> CampaignRequest {
        let mut all = self.requests();
        assert_eq!(all.len(), 1, "one request: {all:?}");
        all.remove(0)
    }

    fn answer(&mut self, ms: u64, r: &CampaignRequest, outcome: RequestOutcome) {
        let now = self.at(ms);
        self.campaign.handle_outcome(now, r.request.id, outcome);
    }

    /// At the campaign tick due by `ms`, and on a change event freeing `key` just
    /// after, no acquire goes out (the group is at its cap).
    fn no_acquire_at_its_tick_or_on_a_release_of(&mut self, ms: u64, key: &str) {
        self.campaign.handle_timeout(self.at(ms));
        let due = self.requests();
        assert!(
            due.iter().all(|r| r.request.endpoint != Endpoint::Acquire),
            "{due:?}"
        );
        let free = ChangeEvent {
            kind: ChangeKind::Released,
            revision: 5,
            holder: None,
        };
        self.campaign.handle_change(self.at(ms + 100), key, &free);
        assert_eq!(self.requests(), []);
    }

    /// The events but watches and refusals (see [`Run::all_events`]).
    fn events(&mut self) -> Vec<CampaignEvent> {
        std::iter::from_fn(|| self.campaign.poll_event())
            .filter(|e| !is_watch(e) && !is_bookkeeping(e))
            .collect()
    }

    /// Every event, watches included (bookkeeping left out).
    fn all_events(&mut self) -> Vec<CampaignEvent> {
        std::iter::from_fn(|| self.campaign.poll_event())
            .filter(|e| !is_bookkeeping(e))
            .collect()
    }

    /// The bookkeeping events only.
    fn bookkeeping(&mut self) -> Vec<CampaignEvent> {
        std::iter::from_fn(|| self.campaign.poll_event())
            .filter(is_bookkeeping)
            .collect()
    }

    /// Grants `r` at `ms` with `revision` and confirms it with the renew that follows.
    fn elect(&mut self, ms: u64, r: &CampaignRequest, revision: u64) {
        self.answer(ms, r, granted(revision));
        let confirm = self.request();
        assert_eq!(
            (confirm.request.endpoint, confirm.key.as_str()),
            (Endpoint::Renew, r.key.as_str())
        );
        self.answer(ms, &confirm, renewed(revision));
    }
}

fn endpoints(requests: &[CampaignRequest]) -> Vec<(Endpoint, &str)> {
    requests
        .iter()
        .map(|r| (r.request.endpoint, r.key.as_str()))
        .collect()
}

#[test]
fn one_holder_id_campaigns_for_a_key_once_until_its_group_finishes() {
    let mut run = Run::new();
    let first = run.group(&["leader"], 1);
    let now = run.at(0);
    let again = run
        .campaign
        .add_group(now, configs(&["other", "leader"]), 1);
    let e = again.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.error.contains("\"leader\""), "{}", e.error);
    // Nothing of the refused group was started.
    let acquire = run.request();
    assert_eq!(acquire.key, "leader");
    let dup = run.campaign.add_group(now, configs(&["a", "a"]), 1);
    assert!(dup.is_err(), "a key twice in one group");
    // Stopped with its acquire in flight, the group waits for that answer (it may
    // grant, and then there is something to release).
    run.campaign.handle_stop_group(run.at(1), first);
    assert_eq!(run.events(), []);
    assert!(
        run.campaign
            .add_group(now, configs(&["leader"]), 1)
            .is_err()
    );
    run.answer(2, &acquire, not_granted(4));
    assert_eq!(run.events(), [CampaignEvent::Finished { group: first }]);
    run.group(&["leader"], 1);
}

/// The campaign says which keys' change events to watch: a group's keys while it
/// runs, and no longer once it has finished; a key campaigned for again is
/// watched again.
#[test]
fn a_group_watches_its_keys_until_it_finishes() {
    let mut run = Run::new();
    let group = run.group(&["a", "b"], 1);
    assert_eq!(run.all_events(), [watch("a"), watch("b")]);
    let acquire = run.request();
    run.campaign.handle_stop_group(run.at(1), group);
    assert_eq!(
        run.all_events(),
        [],
        "still waiting for the acquire's answer"
    );
    run.answer(2, &acquire, not_granted(4));
    assert_eq!(
        run.all_events(),
        [
            unwatch("a"),
            unwatch("b"),
            CampaignEvent::Finished { group }
        ]
    );
    run.group(&["b"], 1);
    assert_eq!(run.all_events(), [watch("b")]);
}

/// A key this holder owns is not watched: its change events would only be its own
/// renewals, one a renewal. It is watched again when it steps down and its group
/// campaigns on; once its group stops it is not watched again, and never
/// unwatched twice.
#[test]
fn an_owned_key_is_unwatched_and_watched_again_when_it_steps_down() {
    let watches = |run: &mut Run| -> Vec<CampaignEvent> {
        run.all_events()
            .into_iter()
            .filter(|e| {
                matches!(
                    e,
                    CampaignEvent::Watch { .. } | CampaignEvent::Unwatch { .. }
                )
            })
            .collect()
    };
    let mut run = Run::new();
    let group = run.group(&["a"], 1);
    assert_eq!(watches(&mut run), [watch("a")]);
    let acquire = run.request();
    run.elect(0, &acquire, 3);
    assert_eq!(watches(&mut run), [unwatch("a")], "elected");
    // Its renew is answered `lost`: it steps down and campaigns again, watched.
    run.campaign.handle_timeout(run.at(5_000));
    let renew = run.request();
    assert_eq!(renew.request.endpoint, Endpoint::Renew);
    let lost = RequestOutcome::reply(r#"{"error":"gone","kind":"lost"}"#);
    run.answer(5_010, &renew, lost);
    assert_eq!(watches(&mut run), [watch("a")], "stepped down");
    run.campaign.handle_watched(run.at(5_010), "a");
    // Elected again; then the group stops: the release goes out, and the key is
    // neither watched again nor unwatched a second time when the group finishes.
    run.campaign.handle_timeout(run.at(6_010));
    let again = run.request();
    assert_eq!(again.request.endpoint, Endpoint::Acquire);
    run.elect(6_020, &again, 7);
    assert_eq!(watches(&mut run), [unwatch("a")], "elected again");
    run.campaign.handle_stop_group(run.at(6_100), group);
    let release = run.request();
    assert_eq!(release.request.endpoint, Endpoint::Release);
    run.answer(
        6_110,
        &release,
        RequestOutcome::reply(r#"{"released":true}"#),
    );
    let finished: Vec<CampaignEvent> = run
        .all_events()
        .into_iter()
        .filter(|e| !matches!(e, CampaignEvent::Holder { .. }))
        .collect();
    assert_eq!(finished, [CampaignEvent::Finished { group }]);
}

/// A balanced set watches its presence keys too; a semaphore, its slots.
#[test]
fn balanced_sets_and_semaphores_watch_every_key_they_count_by() {
    let mut run = Run::new();
    let now = run.at(0);
    run.campaign
        .add_balanced_group(now, "set", configs(&["s0", "s1"]))
        .unwrap();
    let mut watched: Vec<CampaignEvent> = run.all_events();
    watched.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(
        watched,
        [
            watch("s0"),
            watch("s1"),
            watch("set-member-0"),
            watch("set-member-1")
        ]
    );
    run.campaign
        .add_semaphore(now, HolderConfig::new("jobs", "h1", TTL), 2)
        .unwrap();
    assert_eq!(run.all_events(), [watch("jobs-0"), watch("jobs-1")]);
}

#[test]
fn a_config_of_another_holder_id_or_an_empty_group_is_refused() {
    let mut run = Run::new();
    let now = run.at(0);
    let other = vec![HolderConfig::new("k", "h2", TTL)];
    assert!(run.campaign.add_group(now, other, 1).is_err());
    assert!(run.campaign.add_group(now, Vec::new(), 1).is_err());
    assert!(Campaign::new("bad holder", Instant::now()).is_err());
}

#[test]
fn a_group_sends_no_more_campaign_acquires_than_it_may_hold() {
    let mut run = Run::new();
    run.group(&["s0", "s1", "s2"], 1);
    let first = run.request();
    assert_eq!(first.key, "s0");
    // Held by another: the next key gets its turn.
    run.answer(10, &first, not_granted(4));
    let second = run.request();
    assert_eq!(second.key, "s1");
    run.elect(20, &second, 9);
    // s1 is held: the cap is reached, no acquire goes out, not even when s0's
    // campaign tick comes or a change event says s0 is free.
    run.no_acquire_at_its_tick_or_on_a_release_of(5_100, "s0");
}

#[test]
fn a_group_of_many_keys_has_at_most_max_campaigns_in_flight_acquires_out() {
    use crate::holder::campaign::MAX_CAMPAIGNS_IN_FLIGHT;
    let mut run = Run::new();
    let names: Vec<String> = (0..100).map(|i| format!("s{i}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    run.group(&keys, keys.len());
    let first = run.requests();
    assert_eq!(first.len(), MAX_CAMPAIGNS_IN_FLIGHT, "not all 100 at once");
    assert!(
        first
            .iter()
            .all(|r| r.request.endpoint == Endpoint::Acquire)
    );
    // Each answer lets one more out.
    run.answer(10, &first[0], not_granted(4));
    let next = run.request();
    assert_eq!(next.request.endpoint, Endpoint::Acquire);
    assert!(
        !first.iter().any(|r| r.key == next.key),
        "a key not yet asked"
    );
    let mut revision = 10;
    for r in first.iter().skip(1) {
        revision += 1;
        run.answer(20, r, granted(revision));
    }
    // The granted keys' confirming renews go out, and acquires refill the window:
    // `next` is still out, so one fewer than the bound.
    let out = run.requests();
    let acquires = out
        .iter()
        .filter(|r| r.request.endpoint == Endpoint::Acquire)
        .count();
    assert_eq!(acquires, MAX_CAMPAIGNS_IN_FLIGHT - 1, "{out:?}");
}

#[test]
fn a_held_key_lost_makes_room_for_a_waiting_one() {
    let mut run = Run::new();
    run.group(&["s0", "s1"], 1);
    let first = run.request();
    run.elect(0, &first, 3);
    // s1's queued acquire waited as long as its holder waits for an answer
    // (3750 ms): cancelled, never sent; it is asked again at s1's next tick.
    run.campaign.handle_timeout(run.at(3_750));
    assert_eq!(run.requests(), []);
    // The renew is answered `lost`: s0 steps down, and s1 gets its turn.
    run.campaign.handle_timeout(run.at(5_000));
    let renew = run.request();
    assert_eq!(renew.request.endpoint, Endpoint::Renew);
    let lost = RequestOutcome::reply(r#"{"error":"gone","kind":"lost"}"#);
    run.answer(5_010, &renew, lost);
    // s0 waits out the old lease's expiry marker (1 s), then asks again: another
    // holder has it, so the room goes to s1 at its tick.
    assert_eq!(run.requests(), []);
    run.campaign.handle_timeout(run.at(6_010));
    let again = run.request();
    assert_eq!(
        (again.key.as_str(), again.request.endpoint),
        ("s0", Endpoint::Acquire)
    );
    run.answer(6_020, &again, not_granted(5));
    run.campaign.handle_timeout(run.at(8_750));
    let sent = run.requests();
    assert!(
        endpoints(&sent).contains(&(Endpoint::Acquire, "s1")),
        "{sent:?}"
    );
    assert!(run.events().iter().any(|e| matches!(e,
        CampaignEvent::Holder { key, event: HolderEvent::SteppedDown { reason: StepDownReason::Lost }, .. }
            if key == "s0")));
}

#[test]
fn a_queued_acquire_of_a_stopped_group_is_cancelled_never_sent() {
    let mut run = Run::new();
    let group = run.group(&["s0", "s1"], 1);
    let first = run.request();
    run.elect(0, &first, 3);
    run.campaign.handle_stop_group(run.at(100), group);
    // Only the release of s0 goes out; s1's queued acquire never does.
    let sent = run.requests();
    assert_eq!(endpoints(&sent), [(Endpoint::Release, "s0")]);
    assert_eq!(body(&sent[0].request)["revision"], 3);
    let released = r#"{"released":true,"held":false,"key":"s0","holder":"h1","revision":4}"#;
    run.answer(110, &sent[0], RequestOutcome::reply(released));
    assert_eq!(run.requests(), []);
    let events = run.events();
    assert!(
        events.contains(&CampaignEvent::Finished { group }),
        "{events:?}"
    );
    assert!(run.campaign.is_done());
}

#[test]
fn a_change_that_may_free_the_key_wakes_its_campaign_a_renewal_does_not() {
    let mut run = Run::new();
    run.group(&["leader"], 1);
    let first = run.request();
    run.answer(10, &first, not_granted(4));
    let renewal = ChangeEvent {
        kind: ChangeKind::Renewed,
        revision: 5,
        holder: Some("h2".into()),
    };
    run.campaign.handle_change(run.at(100), "leader", &renewal);
    assert_eq!(run.requests(), []);
    for kind in [
        ChangeKind::Expired,
        ChangeKind::Released,
        ChangeKind::Deleted,
    ] {
        let event = ChangeEvent {
            kind,
            revision: 6,
            holder: None,
        };
        run.campaign.handle_change(run.at(200), "leader", &event);
        let ask = run.request();
        assert_eq!(ask.request.endpoint, Endpoint::Acquire, "{kind:?}");
        run.answer(210, &ask, not_granted(7));
    }
}

#[test]
fn a_request_unanswered_by_its_deadline_times_out_in_the_machine() {
    let mut run = Run::new();
    run.group(&["leader"], 1);
    let first = run.request();
    let deadline = run.at(0) + first.request.timeout;
    assert_eq!(run.campaign.poll_timeout(), Some(deadline));
    run.bookkeeping();
    run.campaign.handle_timeout(deadline);
    // The adapter drops it now: no timer of its own bounds the request.
    let cancels: Vec<CampaignEvent> = run
        .bookkeeping()
        .into_iter()
        .filter(|e| matches!(e, CampaignEvent::Cancel { .. }))
        .collect();
    assert_eq!(
        cancels,
        [CampaignEvent::Cancel {
            id: first.request.id
        }]
    );
    // Timed out: a grant arriving now is for a request nobody waits for.
    run.answer(
        deadline.duration_since(run.t0).as_millis() as u64,
        &first,
        granted(3),
    );
    let retry = run.requests();
    assert!(retry.iter().all(|r| r.request.id != first.request.id));
    assert!(run.campaign.tenure("leader", deadline).is_none());
    assert_eq!(run.events(), []);
}

#[test]
fn the_inbox_accepts_only_keys_owned_now_with_a_fence_of_the_tenure() {
    let mut run = Run::new();
    let group = run.group(&["leader"], 1);
    let subject = "dagnats.lease.inbox.h1.leader";
    let reject = |r| InboxVerdict::Reject(r);
    assert_eq!(
        run.campaign
            .check_inbox(run.at(0), subject, Some("3"), true),
        reject(RejectReason::NotOwner)
    );
    let first = run.request();
    run.elect(0, &first, 3);
    let InboxVerdict::Deliver(ok) = run
        .campaign
        .check_inbox(run.at(1), subject, Some("3"), true)
    else {
        panic!("accepted");
    };
    assert_eq!((ok.key.as_str(), ok.fence), ("leader", 3));
    assert_eq!(
        run.campaign
            .check_inbox(run.at(1), subject, Some("2"), true),
        reject(RejectReason::StaleFence)
    );
    assert_eq!(
        run.campaign
            .check_inbox(run.at(1), "dagnats.lease.inbox.h2.leader", Some("3"), true),
        reject(RejectReason::WrongSubject)
    );
    assert_eq!(run.campaign.held(group, run.at(1)).len(), 1);
    // Past the deadline, with no event yet, the key is no longer owned.
    let late = run.at(15_000);
    assert_eq!(
        run.campaign.check_inbox(late, subject, Some("3"), true),
        reject(RejectReason::NotOwner)
    );
    run.campaign.handle_stop_group(run.at(100), group);
    assert_eq!(
        run.campaign
            .check_inbox(run.at(101), subject, Some("3"), true),
        reject(RejectReason::NotOwner)
    );
}

#[test]
fn an_accepted_forward_nobody_reads_is_dropped_unanswered_and_a_bad_one_still_rejected() {
    let mut run = Run::new();
    run.group(&["leader"], 1);
    let subject = "dagnats.lease.inbox.h1.leader";
    let first = run.request();
    run.elect(0, &first, 3);
    assert_eq!(
        run.campaign
            .check_inbox(run.at(1), subject, Some("3"), false),
        InboxVerdict::Ignore
    );
    assert_eq!(
        run.campaign
            .check_inbox(run.at(1), subject, Some("2"), false),
        InboxVerdict::Reject(RejectReason::StaleFence)
    );
}

/// The subscribes a group asks for ([`CampaignEvent::Watch`]), by what the
/// adapter reported of each by `ms`.
fn hand_off_watches(run: &mut Run, ms: u64) -> Vec<CampaignEvent> {
    run.campaign.handle_timeout(run.at(ms));
    run.all_events()
        .into_iter()
        .filter(|e| matches!(e, CampaignEvent::CancelWatch { .. }))
        .collect()
}

#[test]
fn a_subscribe_not_reported_within_the_handoff_bound_is_given_up() {
    let mut run = Run::new();
    let bound = HANDOFF_BOUND.as_millis() as u64;
    let group = run
        .campaign
        .add_group(run.at(0), configs(&["slow", "made", "gone"]), 3)
        .unwrap();
    assert_eq!(
        run.all_events(),
        [watch("slow"), watch("made"), watch("gone")]
    );
    // Only the subscribe of "made" is reported, halfway to the bound.
    run.campaign.handle_watched(run.at(bound / 2), "made");
    assert!(run.campaign.poll_timeout().unwrap() <= run.at(bound));
    assert_eq!(
        hand_off_watches(&mut run, bound - 1),
        [],
        "not before the bound"
    );
    assert_eq!(
        hand_off_watches(&mut run, bound),
        [
            CampaignEvent::CancelWatch {
                key: "gone".to_string()
            },
            CampaignEvent::CancelWatch {
                key: "slow".to_string()
            },
        ],
        "at the bound, those not reported; a reported one never"
    );
    // A report after the bound changes nothing, and nothing is given up twice.
    run.campaign.handle_watched(run.at(bound + 1), "slow");
    assert_eq!(hand_off_watches(&mut run, 10 * bound), []);
    // A group's end drops a subscribe still under way: no give-up after it.
    run.campaign.handle_stop_group(run.at(10 * bound), group);
    let again = run
        .campaign
        .add_group(run.at(10 * bound), configs(&["other"]), 1)
        .unwrap();
    run.campaign.handle_stop_group(run.at(10 * bound), again);
    for r in run.requests() {
        run.answer(10 * bound, &r, RequestOutcome::NoResponders);
    }
    let ends = run.all_events();
    assert!(ends.contains(&unwatch("other")), "{ends:?}");
    assert_eq!(hand_off_watches(&mut run, 20 * bound), []);
}

#[test]
fn a_rejected_forward_is_answered_and_the_reply_given_up_at_the_handoff_bound() {
    let mut run = Run::new();
    let bound = HANDOFF_BOUND.as_millis() as u64;
    let group = run.group(&["leader"], 1);
    let first = run.request();
    run.elect(0, &first, 3);
    run.all_events();
    let subject = "dagnats.lease.inbox.h1.leader";
    let inbox = |run: &mut Run, ms, reply, fence| {
        let now = run.at(ms);
        let verdict = run
            .campaign
            .handle_inbox(now, subject, reply, Some(fence), true);
        (verdict, run.all_events())
    };
    // Delivered, or rejected without a reply subject: nothing to publish.
    let (verdict, events) = inbox(&mut run, 1, Some("_INBOX.a"), "3");
    assert!(matches!(verdict, InboxVerdict::Deliver(_)) && events.is_empty());
    let (verdict, events) = inbox(&mut run, 1, None, "2");
    assert_eq!(
        (verdict, events),
        (InboxVerdict::Reject(RejectReason::StaleFence), vec![])
    );
    // Rejected with one: a reject reply, each with its own id.
    let reject = |id, to: &str| CampaignEvent::Reject {
        id: RejectId(id),
        to: to.to_string(),
    };
    let (verdict, events) = inbox(&mut run, 10, Some("_INBOX.b"), "2");
    assert_eq!(verdict, InboxVerdict::Reject(RejectReason::StaleFence));
    assert_eq!(events, [reject(0, "_INBOX.b")]);
    let (_, events) = inbox(&mut run, 20, Some("_INBOX.c"), "1");
    assert_eq!(events, [reject(1, "_INBOX.c")]);
    // The member's stop waits for the rejects under way.
    run.campaign.handle_stop_group(run.at(30), group);
    for r in run.requests() {
        run.answer(30, &r, RequestOutcome::NoResponders);
    }
    run.all_events();
    assert!(!run.campaign.is_done(), "two rejects are being handed over");
    run.campaign.handle_reject_sent(run.at(40), RejectId(1));
    assert!(run.campaign.poll_timeout().unwrap() <= run.at(10 + bound));
    run.campaign.handle_timeout(run.at(10 + bound - 1));
    assert_eq!(run.all_events(), [], "not before the bound");
    run.campaign.handle_timeout(run.at(10 + bound));
    assert_eq!(
        run.all_events(),
        [CampaignEvent::CancelReject { id: RejectId(0) }],
        "the one not taken, at its bound; the one taken never"
    );
    assert!(run.campaign.is_done());
    run.campaign.handle_timeout(run.at(20 + bound));
    assert_eq!(run.all_events(), []);
}

#[test]
fn a_key_refused_for_good_is_not_retried_and_a_group_of_only_such_keys_finishes() {
    let mut run = Run::new();
    let group = run.group(&["leader"], 1);
    let first = run.request();
    let invalid = RequestOutcome::reply(r#"{"error":"no","kind":"unsupported"}"#);
    run.answer(10, &first, invalid);
    let events = run.events();
    assert!(
        matches!(&events[..], [
            CampaignEvent::Holder { event: HolderEvent::Failed { kind: ErrorKind::Unsupported, .. }, .. },
            CampaignEvent::Finished { group: g },
        ] if *g == group),
        "{events:?}"
    );
    run.campaign.handle_timeout(run.at(60_000));
    assert_eq!(run.requests(), []);
}

#[test]
fn a_semaphore_holds_one_of_its_slots_trying_them_in_turn() {
    let mut run = Run::new();
    let now = run.at(0);
    let slot = |name: &str| HolderConfig::new(name, "h1", TTL);
    for bad in [0, crate::holder::campaign::MAX_PERMITS + 1] {
        let e = run
            .campaign
            .add_semaphore(now, slot("jobs"), bad)
            .unwrap_err();
        assert!(e.error.contains("permits"), "{}", e.error);
    }
    // Slot keys are lease keys: `<name>-<i>` must fit the key bounds.
    let long = "n".repeat(crate::wire::MAX_NAME_LEN - 1);
    let e = run.campaign.add_semaphore(now, slot(&long), 1).unwrap_err();
    assert!(e.error.contains("`key`"), "{}", e.error);

    run.campaign.add_semaphore(now, slot("jobs"), 3).unwrap();
    let first = run.request();
    assert_eq!(
        (first.key.as_str(), first.request.endpoint),
        ("jobs-0", Endpoint::Acquire)
    );
    // Slot 0 is taken: slot 1 gets its turn, and is granted.
    run.answer(10, &first, not_granted(4));
    let second = run.request();
    assert_eq!(second.key, "jobs-1");
    run.elect(20, &second, 9);
    assert!(run.campaign.tenure("jobs-1", run.at(30)).is_some());
    // One slot held: no acquire for the others, at their ticks or on a release.
    run.no_acquire_at_its_tick_or_on_a_release_of(5_100, "jobs-0");
}

#[test]
fn the_keys_of_a_group_won_in_one_burst_renew_spread_over_a_quarter_interval() {
    let mut run = Run::new();
    run.group(&["s0", "s1", "s2", "s3"], 4);
    let acquires = run.requests();
    assert_eq!(acquires.len(), 4);
    for (i, r) in acquires.iter().enumerate() {
        run.elect(0, r, 10 + i as u64);
    }
    // Each renews the first time a quarter of ttl/3 (1250 ms) × i / 4 before ttl/3
    // (5000 ms); each answered at once.
    let next_renewals = |run: &mut Run| {
        let mut renewals = Vec::new();
        while renewals.len() < 4 {
            let at = run.campaign.poll_timeout().expect("a renewal is due");
            run.campaign.handle_timeout(at);
            for r in run.requests() {
                assert_eq!(r.request.endpoint, Endpoint::Renew);
                let ms = at.duration_since(run.t0);
                run.answer(ms.as_millis() as u64, &r, renewed(20));
                renewals.push((r.key.clone(), ms));
            }
        }
        renewals.sort();
        renewals
    };
    let every = TTL / 3;
    let first: Vec<(String, Duration)> = (0..4u32)
        .map(|i| (format!("s{i}"), every - every / 4 * i / 4))
        .collect();
    assert_eq!(first[3].1, Duration::from_micros(4_062_500));
    assert_eq!(next_renewals(&mut run), first);
    // After the first, every key renews each ttl/3: the spread stays, and no key
    // renews more often than its schedule asks.
    let second: Vec<(String, Duration)> = first
        .iter()
        .map(|(key, at)| (key.clone(), *at + every))
        .collect();
    assert_eq!(next_renewals(&mut run), second);
}

/// A balanced set of four shards held by h1 alone, every shard and presence key 0
/// won at 0 ms (shard `s<i>` at revision 10 + i); then h2's presence shows at
/// `ms`: h1's share drops to two, so it sheds the newest tenure, `s3`, at its next
/// tick. Returns the run and the deadline `s3` was elected with.
fn balanced_run_with_a_new_member(ms: u64) -> (Run, GroupId, Instant) {
    let mut run = Run::new();
    let now = run.at(0);
    let shards = configs(&["s0", "s1", "s2", "s3"]);
    let group = run.campaign.add_balanced_group(now, "set", shards).unwrap();
    let acquires = run.requests();
    for r in &acquires {
        let revision = match r.key.strip_prefix("set-") {
            Some(_) => 5,
            None => 10 + r.key[1..].parse::<u64>().unwrap(),
        };
        run.elect(0, r, revision);
    }
    let deadline = run.campaign.tenure("s3", now).unwrap().deadline;
    run.events();
    let joined = ChangeEvent {
        kind: ChangeKind::Acquired,
        revision: 20,
        holder: Some("h2".into()),
    };
    run.campaign
        .handle_change(run.at(ms), "set-member-1", &joined);
    (run, group, deadline)
}

fn releases(requests: &[CampaignRequest]) -> Vec<&str> {
    requests
        .iter()
        .filter(|r| r.request.endpoint == Endpoint::Release)
        .map(|r| r.key.as_str())
        .collect()
}

#[test]
fn a_shed_shard_steps_down_at_once_and_is_released_when_the_application_is_done() {
    let (mut run, group, deadline) = balanced_run_with_a_new_member(100);
    run.campaign.handle_timeout(run.at(200));
    // Revoked: not owned from now on, the event names the key and the deadline that
    // still holds, and nothing is released yet.
    assert_eq!(
        run.events(),
        [CampaignEvent::Holder {
            group,
            key: "s3".into(),
            event: HolderEvent::SteppedDown {
                reason: StepDownReason::Revoked { deadline }
            },
        }]
    );
    assert!(run.campaign.tenure("s3", run.at(200)).is_none());
    assert!(!run.campaign.held(group, run.at(200)).contains_key("s3"));
    let subject = "dagnats.lease.inbox.h1.s3";
    assert_eq!(
        run.campaign
            .check_inbox(run.at(200), subject, Some("13"), true),
        InboxVerdict::Reject(RejectReason::NotOwner)
    );
    assert_eq!(releases(&run.requests()), Vec::<&str>::new());
    // The machine wakes at the deadline at the latest.
    assert!(run.campaign.poll_timeout().unwrap() <= deadline);
    // `done` for a key not being revoked changes nothing.
    run.campaign.handle_stopped_writing(run.at(300), "s0");
    assert_eq!(run.requests(), []);
    assert!(run.campaign.tenure("s0", run.at(300)).is_some());
    // The application is done with s3: released at once, with its fence.
    run.campaign.handle_stopped_writing(run.at(400), "s3");
    let sent = run.requests();
    assert_eq!(endpoints(&sent), [(Endpoint::Release, "s3")]);
    assert_eq!(body(&sent[0].request)["revision"], 13);
}

#[test]
fn a_shed_shard_not_done_with_is_released_at_the_last_deadline_handed_out() {
    let (mut run, _, deadline) = balanced_run_with_a_new_member(4_000);
    run.campaign.handle_timeout(run.at(4_100));
    assert_eq!(releases(&run.requests()), Vec::<&str>::new());
    // s3's renew comes due while it is revoked: none goes out, and nothing of the
    // revoked key is released before its deadline.
    let mut sent = Vec::new();
    let mut at = run.at(4_100);
    while at < deadline {
        run.campaign.handle_timeout(at);
        sent.extend(run.requests());
        at = run.campaign.poll_timeout().unwrap();
        assert!(at <= deadline);
    }
    assert!(
        !sent.iter().any(|r| r.key == "s3"),
        "{:?}",
        endpoints(&sent)
    );
    assert!(!run.events().iter().any(|e| matches!(e,
            CampaignEvent::Holder { key, event: HolderEvent::Renewed { .. }, .. } if key == "s3")),);
    // Shed later, s2 was elected with the same deadline: both go now.
    run.campaign.handle_timeout(deadline);
    assert!(releases(&run.requests()).contains(&"s3"));
}

#[test]
fn a_renew_in_flight_at_the_revocation_hands_out_no_new_deadline() {
    let (mut run, _, deadline) = balanced_run_with_a_new_member(4_000);
    // s3 renews at 4062.5 ms (renewals are spread over a quarter interval); at its
    // tick after the member joined, its renew goes out and it is revoked.
    run.campaign.handle_timeout(run.at(4_100));
    let renewals = run.requests();
    let renew = renewals.iter().find(|r| r.key == "s3").expect("s3 renews");
    assert_eq!(renew.request.endpoint, Endpoint::Renew);
    let revoked = run.events();
    assert!(
        matches!(&revoked[..], [CampaignEvent::Holder { key, event: HolderEvent::SteppedDown {
            reason: StepDownReason::Revoked { deadline: d } }, .. }] if key == "s3" && *d == deadline),
        "{revoked:?}"
    );
    // The renew lands: no event, no new deadline; the fence it wrote is released
    // at the old deadline.
    run.answer(4_200, renew, renewed(30));
    assert_eq!(run.events(), []);
    assert!(run.campaign.tenure("s3", run.at(4_200)).is_none());
    run.campaign
        .handle_timeout(deadline - Duration::from_millis(1));
    assert_eq!(releases(&run.requests()), Vec::<&str>::new());
    run.campaign.handle_timeout(deadline);
    let sent: Vec<CampaignRequest> = run
        .requests()
        .into_iter()
        .filter(|r| r.request.endpoint == Endpoint::Release)
        .collect();
    assert_eq!(endpoints(&sent), [(Endpoint::Release, "s3")]);
    assert_eq!(body(&sent[0].request)["revision"], 30);
}

#[test]
fn stopping_a_group_releases_a_revoked_shard_at_once() {
    let (mut run, group, _) = balanced_run_with_a_new_member(100);
    run.campaign.handle_timeout(run.at(200));
    assert_eq!(releases(&run.requests()), Vec::<&str>::new());
    run.campaign.handle_stop_group(run.at(300), group);
    let mut released = releases(&run.requests())
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    released.sort();
    assert_eq!(released, ["s0", "s1", "s2", "s3", "set-member-0"]);
}

#[test]
fn a_shed_shard_is_not_asked_for_again_until_a_campaign_interval_after_its_release() {
    let mut run = Run::new();
    let now = run.at(0);
    let group = run
        .campaign
        .add_balanced_group(now, "set", configs(&["s0", "s1", "s2"]))
        .unwrap();
    for r in run.requests() {
        let revision = if r.key.starts_with("set-") {
            5
        } else {
            10 + r.key[1..].parse::<u64>().unwrap()
        };
        run.elect(0, &r, revision);
    }
    let joined = ChangeEvent {
        kind: ChangeKind::Acquired,
        revision: 20,
        holder: Some("h2".into()),
    };
    run.campaign
        .handle_change(run.at(100), "set-member-1", &joined);
    let released = |key: &str, revision: u64| {
        RequestOutcome::reply(format!(
            r#"{{"released":true,"held":false,"key":"{key}","holder":"h1","revision":{revision}}}"#
        ))
    };
    // h1 holds 3, its cap is 2: s2 goes first; a renew interval later, still above
    // the floor (1) while h2 holds none, s1 goes too.
    // Renewals due meanwhile are answered, writing revision 30 and on.
    let mut next_revision = 30;
    for (ms, key) in [(200, "s2"), (5_200, "s1")] {
        run.campaign.handle_timeout(run.at(ms));
        for renew in run.requests() {
            assert_eq!(renew.request.endpoint, Endpoint::Renew);
            run.answer(ms + 50, &renew, renewed(next_revision));
            next_revision += 1;
        }
        run.campaign.handle_stopped_writing(run.at(ms + 100), key);
        let sent = run.requests();
        let release = sent
            .iter()
            .find(|r| r.request.endpoint == Endpoint::Release)
            .unwrap_or_else(|| panic!("{key} released: {:?}", endpoints(&sent)));
        assert_eq!(release.key, key);
        run.answer(ms + 110, release, released(key, next_revision));
    }
    assert_eq!(run.campaign.held(group, run.at(5_310)).len(), 1);
    // There is room for one more, and s1 was just released: it is not asked for
    // (s2, released 5 s ago, is).
    let asked: Vec<CampaignRequest> = run
        .requests()
        .into_iter()
        .filter(|r| r.request.endpoint == Endpoint::Acquire)
        .collect();
    assert_eq!(endpoints(&asked), [(Endpoint::Acquire, "s2")]);
}

// The health gate: one rule each.

fn unhealthy(deadline: Instant) -> HolderEvent {
    HolderEvent::SteppedDown {
        reason: StepDownReason::Unhealthy { deadline },
    }
}

#[test]
fn an_unhealthy_group_sends_no_campaign_acquire_and_asks_at_once_when_healthy_again() {
    let mut run = Run::new();
    let group = run.group(&["leader"], 1);
    assert!(run.campaign.is_healthy(group));
    // Unhealthy before its first acquire was taken: taken back, never sent.
    run.campaign.handle_health(run.at(0), group, false);
    assert!(!run.campaign.is_healthy(group));
    assert_eq!(run.requests(), []);
    // Neither its campaign ticks nor a change event freeing the key send one.
    run.no_acquire_at_its_tick_or_on_a_release_of(5_000, "leader");
    run.no_acquire_at_its_tick_or_on_a_release_of(20_000, "leader");
    // The acquire queued at 20.1 s waited its holder's timeout (3750 ms) and was
    // cancelled, never sent: the next tick is a campaign interval away.
    run.campaign.handle_timeout(run.at(23_850));
    assert_eq!(run.requests(), []);
    assert!(run.campaign.poll_timeout().unwrap() > run.at(28_000));
    // Healthy again: it asks at once, not at its next tick.
    run.campaign.handle_health(run.at(24_000), group, true);
    let ask = run.request();
    assert_eq!(
        (ask.key.as_str(), ask.request.endpoint),
        ("leader", Endpoint::Acquire)
    );
    // Healthy reported again changes nothing.
    run.campaign.handle_health(run.at(24_100), group, true);
    assert_eq!(run.requests(), []);
    run.elect(24_100, &ask, 3);
    assert!(run.campaign.tenure("leader", run.at(24_200)).is_some());
}

#[test]
fn a_leader_unhealthy_for_unhealthy_for_steps_down_and_is_released_when_done() {
    let mut run = Run::new();
    let group = run.group(&["leader"], 1);
    let first = run.request();
    run.elect(0, &first, 3);
    let deadline = run.campaign.tenure("leader", run.at(0)).unwrap().deadline;
    run.events();
    run.campaign
        .set_unhealthy_for(run.at(0), group, Duration::from_secs(3));
    run.campaign.handle_health(run.at(1_000), group, false);
    // Still leading, and the machine wakes at the health deadline.
    assert_eq!(run.campaign.poll_timeout(), Some(run.at(4_000)));
    run.campaign.handle_timeout(run.at(3_999));
    assert_eq!(run.events(), []);
    assert!(run.campaign.tenure("leader", run.at(3_999)).is_some());
    // Unhealthy for 3 s: steps down at once, like a revocation, naming the last
    // deadline handed out; nothing released yet.
    run.campaign.handle_timeout(run.at(4_000));
    assert_eq!(
        run.events(),
        [CampaignEvent::Holder {
            group,
            key: "leader".into(),
            event: unhealthy(deadline),
        }]
    );
    assert!(run.campaign.tenure("leader", run.at(4_000)).is_none());
    assert_eq!(run.requests(), []);
    // The application is done with it: released now, with its fence.
    run.campaign.handle_stopped_writing(run.at(4_100), "leader");
    let sent = run.requests();
    assert_eq!(endpoints(&sent), [(Endpoint::Release, "leader")]);
    assert_eq!(body(&sent[0].request)["revision"], 3);
    let released = r#"{"released":true,"held":false,"key":"leader","holder":"h1","revision":4}"#;
    run.answer(4_110, &sent[0], RequestOutcome::reply(released));
    // Still unhealthy: the key is not asked for again.
    run.no_acquire_at_its_tick_or_on_a_release_of(10_000, "leader");
    // Healthy again: asked for at once.
    run.campaign.handle_health(run.at(10_300), group, true);
    let ask = run.request();
    assert_eq!(ask.request.endpoint, Endpoint::Acquire);
}

#[test]
fn a_leader_unhealthy_and_not_done_with_is_released_at_its_last_deadline() {
    let mut run = Run::new();
    let group = run.group(&["leader"], 1);
    let first = run.request();
    run.elect(0, &first, 3);
    let deadline = run.campaign.tenure("leader", run.at(0)).unwrap().deadline;
    run.campaign
        .set_unhealthy_for(run.at(0), group, Duration::from_secs(1));
    run.campaign.handle_health(run.at(100), group, false);
    run.campaign.handle_timeout(run.at(1_100));
    assert!(run.events().iter().any(|e| matches!(e,
        CampaignEvent::Holder { event, .. } if *event == unhealthy(deadline))));
    // No renew while revoked, no release before the deadline.
    let mut sent = Vec::new();
    let mut at = run.at(1_100);
    while at < deadline {
        run.campaign.handle_timeout(at);
        sent.extend(run.requests());
        at = run.campaign.poll_timeout().unwrap();
    }
    assert_eq!(endpoints(&sent), []);
    run.campaign.handle_timeout(deadline);
    assert_eq!(endpoints(&run.requests()), [(Endpoint::Release, "leader")]);
}

#[test]
fn a_blip_shorter_than_unhealthy_for_changes_nothing_and_the_wait_starts_over() {
    let mut run = Run::new();
    let group = run.group(&["leader"], 1);
    let first = run.request();
    run.elect(0, &first, 3);
    run.events();
    run.campaign
        .set_unhealthy_for(run.at(0), group, Duration::from_secs(3));
    run.campaign.handle_health(run.at(1_000), group, false);
    run.campaign.handle_health(run.at(2_000), group, true);
    run.campaign.handle_health(run.at(2_500), group, false);
    // Unhealthy again reported: the wait still counts from 2500 ms.
    run.campaign.handle_health(run.at(3_000), group, false);
    run.campaign.handle_timeout(run.at(4_000));
    assert_eq!(run.events(), []);
    // It renews while unhealthy.
    run.campaign.handle_timeout(run.at(5_000));
    let renew = run.request();
    assert_eq!(renew.request.endpoint, Endpoint::Renew);
    run.answer(5_010, &renew, renewed(4));
    let deadline = run
        .campaign
        .tenure("leader", run.at(5_010))
        .unwrap()
        .deadline;
    run.events();
    assert_eq!(run.campaign.poll_timeout(), Some(run.at(5_500)));
    run.campaign.handle_timeout(run.at(5_500));
    assert_eq!(
        run.events(),
        [CampaignEvent::Holder {
            group,
            key: "leader".into(),
            event: unhealthy(deadline),
        }]
    );
}

#[test]
fn a_grant_arriving_past_the_unhealthy_deadline_elects_nobody_and_is_released() {
    let mut run = Run::new();
    let group = run.group(&["leader"], 1);
    let first = run.request();
    // The acquire went out healthy; the group turns unhealthy before its answer.
    run.campaign
        .set_unhealthy_for(run.at(0), group, Duration::from_millis(500));
    run.campaign.handle_health(run.at(100), group, false);
    // Nothing held: no wake-up for health.
    assert_eq!(
        run.campaign.poll_timeout(),
        Some(run.at(0) + first.request.timeout)
    );
    run.answer(1_000, &first, granted(3));
    // Granted after the deadline: its confirming renew was on its way already; it
    // elects nobody, and the key is released as soon as it is answered.
    let confirm = run.request();
    assert_eq!(confirm.request.endpoint, Endpoint::Renew);
    run.answer(1_010, &confirm, renewed(4));
    let sent = run.requests();
    assert_eq!(endpoints(&sent), [(Endpoint::Release, "leader")]);
    assert_eq!(body(&sent[0].request)["revision"], 4);
    assert_eq!(run.events(), []);
    assert!(run.campaign.tenure("leader", run.at(1_010)).is_none());
}

#[test]
fn a_revoked_shard_stays_revoked_whatever_the_health_and_an_unhealthy_set_leaves() {
    let (mut run, group, s3_deadline) = balanced_run_with_a_new_member(100);
    run.campaign.handle_timeout(run.at(200));
    assert_eq!(run.events().len(), 1, "s3 revoked for balance");
    run.campaign
        .set_unhealthy_for(run.at(300), group, Duration::from_secs(1));
    run.campaign.handle_health(run.at(300), group, false);
    run.campaign.handle_timeout(run.at(1_300));
    // Every shard held steps down for health; s3, revoked already, hears nothing
    // more; the presence key, which guards no writes, is released at once.
    let mut stepped: Vec<String> = run
        .events()
        .into_iter()
        .filter_map(|e| match e {
            CampaignEvent::Holder {
                key,
                event:
                    HolderEvent::SteppedDown {
                        reason: StepDownReason::Unhealthy { .. },
                    },
                ..
            } => Some(key),
            _ => None,
        })
        .collect();
    stepped.sort();
    assert_eq!(stepped, ["s0", "s1", "s2"]);
    assert_eq!(releases(&run.requests()), ["set-member-0"]);
    // Healthy again: s3 is still kept until `done` or its deadline, not sooner.
    run.campaign.handle_health(run.at(1_400), group, true);
    assert_eq!(releases(&run.requests()), Vec::<&str>::new());
    run.campaign
        .handle_timeout(s3_deadline - Duration::from_millis(1));
    assert_eq!(releases(&run.requests()), Vec::<&str>::new());
    run.campaign.handle_stopped_writing(run.at(1_500), "s3");
    assert_eq!(releases(&run.requests()), ["s3"]);
}

#[test]
fn a_health_step_down_due_with_a_renewal_sends_no_renew() {
    let mut run = Run::new();
    let group = run.group(&["leader"], 1);
    let first = run.request();
    run.elect(0, &first, 3);
    run.events();
    run.campaign
        .set_unhealthy_for(run.at(0), group, Duration::from_secs(4));
    run.campaign.handle_health(run.at(1_000), group, false);
    // The renewal is due at 5000 ms, the step-down too: the step-down wins.
    run.campaign.handle_timeout(run.at(5_000));
    assert_eq!(endpoints(&run.requests()), []);
    assert!(matches!(
        &run.events()[..],
        [CampaignEvent::Holder {
            event: HolderEvent::SteppedDown {
                reason: StepDownReason::Unhealthy { .. }
            },
            ..
        }]
    ));
    assert_eq!(
        run.campaign.status("leader"),
        Some(crate::holder::HolderStatus::Stopping)
    );
    assert_eq!(run.campaign.status("other"), None);
}

/// `hand_over`: the key steps down and is released at once, and the group asks for
/// it again only a campaign interval after the release, so a waiting member (woken
/// by the release) is elected first; the group campaigns on.
#[test]
fn a_handed_over_key_is_released_now_and_asked_for_again_a_campaign_interval_later() {
    let mut run = Run::new();
    let group = run.group(&["leader"], 1);
    let acquire = run.request();
    run.elect(0, &acquire, 7);
    run.events();
    run.campaign.handle_hand_over(run.at(1_000), group);
    assert!(matches!(
        &run.events()[..],
        [CampaignEvent::Holder {
            event: HolderEvent::SteppedDown {
                reason: StepDownReason::HandedOver
            },
            ..
        }]
    ));
    assert_eq!(run.campaign.tenure("leader", run.at(1_000)), None);
    let release = run.request();
    assert_eq!(release.request.endpoint, Endpoint::Release);
    assert_eq!(body(&release.request)["revision"], 7);
    let released = RequestOutcome::reply(
        serde_json::json!({"released": true, "held": false, "key": "leader",
            "holder": "h1", "revision": 8})
        .to_string(),
    );
    run.answer(1_010, &release, released);
    // The release's own change event wakes nobody here: no acquire until the
    // campaign interval (ttl/3) after the release.
    let free = ChangeEvent {
        kind: ChangeKind::Released,
        revision: 8,
        holder: None,
    };
    run.campaign.handle_change(run.at(1_020), "leader", &free);
    assert_eq!(run.requests(), []);
    run.campaign.handle_timeout(run.at(6_009));
    assert_eq!(run.requests(), []);
    run.campaign.handle_timeout(run.at(6_010));
    let again = run.request();
    assert_eq!(
        (again.request.endpoint, again.key.as_str()),
        (Endpoint::Acquire, "leader")
    );
}

/// Random groups started, stopped and answered, subscribes reported made or left
/// hanging: the keys watched are those of the groups not yet finished that this
/// holder does not own (a key of a running group, not stopped, not owned, is
/// watched; an owned key is not), each watched once at a time; every request is
/// for a key of a group not yet finished, and nothing is watched once every group
/// has finished; a subscribe is given up only while under way and not before
/// [`HANDOFF_BOUND`], and none is under way past it after a timeout.
fn watch_world(ops: &[(u8, u8, u8)]) -> Result<(), String> {
    const POOL: [&str; 4] = ["a", "b", "c", "d"];
    let mut run = Run::new();
    let mut watched = std::collections::BTreeSet::new();
    let mut owned = std::collections::BTreeSet::new();
    // The groups not yet finished: their keys, and whether they were stopped.
    let mut running: std::collections::BTreeMap<GroupId, (Vec<String>, bool)> = Default::default();
    // Subscribes under way, since when.
    let mut subscribing: std::collections::BTreeMap<String, Instant> = Default::default();
    let mut groups: Vec<GroupId> = Vec::new();
    let mut out: Vec<CampaignRequest> = Vec::new();
    let mut ms = 0;
    for &(op, x, y) in ops {
        ms += u64::from(y) * 20;
        let now = run.at(ms);
        let mut timed_out = false;
        match op % 5 {
            0 => {
                let keys: Vec<&str> = POOL
                    .iter()
                    .copied()
                    .filter(|_| x % 2 == 1)
                    .take(2)
                    .collect();
                let keys = if keys.is_empty() {
                    vec![POOL[usize::from(x) % 4]]
                } else {
                    keys
                };
                if let Ok(g) = run.campaign.add_group(now, configs(&keys), 1) {
                    groups.push(g);
                    let keys = keys.iter().map(|k| k.to_string()).collect();
                    running.insert(g, (keys, false));
                }
            }
            1 if !groups.is_empty() => {
                let g = groups.remove(usize::from(x) % groups.len());
                run.campaign.handle_stop_group(now, g);
                if let Some((_, stopped)) = running.get_mut(&g) {
                    *stopped = true;
                }
            }
            2 if !out.is_empty() => {
                let r = out.remove(usize::from(x) % out.len());
                let outcome = match y % 3 {
                    0 => granted(u64::from(x) + 1),
                    1 => not_granted(u64::from(x) + 1),
                    _ => RequestOutcome::NoResponders,
                };
                run.campaign.handle_outcome(now, r.request.id, outcome);
            }
            3 if !subscribing.is_empty() => {
                let key = subscribing.keys().nth(usize::from(x) % subscribing.len());
                let key = key.cloned().expect("one of them");
                subscribing.remove(&key);
                run.campaign.handle_watched(now, &key);
            }
            _ => {
                run.campaign.handle_timeout(now);
                timed_out = true;
            }
        }
        // A group's keys are watched from its start to its end; a request the
        // campaign cancels is dropped.
        for e in std::iter::from_fn(|| run.campaign.poll_event()).collect::<Vec<_>>() {
            match e {
                CampaignEvent::Cancel { id } => out.retain(|r| r.request.id != id),
                CampaignEvent::Watch { key } if !watched.insert(key.clone()) => {
                    return Err(format!("{ms} ms: {key} watched twice"));
                }
                CampaignEvent::Watch { key } => {
                    subscribing.insert(key, now);
                }
                CampaignEvent::Unwatch { key } if !watched.remove(&key) => {
                    return Err(format!("{ms} ms: {key} unwatched unwatched"));
                }
                CampaignEvent::Unwatch { key } => {
                    subscribing.remove(&key);
                }
                CampaignEvent::Leading { key, owns: true } => {
                    owned.insert(key);
                }
                CampaignEvent::Leading { key, owns: false } => {
                    owned.remove(&key);
                }
                CampaignEvent::Finished { group } => {
                    running.remove(&group);
                }
                CampaignEvent::CancelWatch { key } => match subscribing.remove(&key) {
                    None => return Err(format!("{ms} ms: {key} given up, not under way")),
                    Some(since) if now < since + HANDOFF_BOUND => {
                        return Err(format!(
                            "{ms} ms: the subscribe of {key} from {:?} given up before the bound",
                            since - run.t0
                        ));
                    }
                    Some(_) => {}
                },
                _ => {}
            }
        }
        let late = subscribing.iter().find(|(_, s)| **s + HANDOFF_BOUND <= now);
        if let (true, Some((key, since))) = (timed_out, late) {
            return Err(format!(
                "{ms} ms: the subscribe of {key} from {:?} still under way past the bound",
                *since - run.t0
            ));
        }
        for (keys, stopped) in running.values() {
            for key in keys {
                if owned.contains(key) && watched.contains(key) {
                    return Err(format!("{ms} ms: {key} owned and watched"));
                }
                if !stopped && !owned.contains(key) && !watched.contains(key) {
                    return Err(format!("{ms} ms: {key} campaigned for, not watched"));
                }
            }
        }
        for r in run.requests() {
            if !running.values().any(|(keys, _)| keys.contains(&r.key)) {
                return Err(format!("{ms} ms: a request for {} of no group", r.key));
            }
            out.push(r);
        }
    }
    for g in groups {
        run.campaign.handle_stop_group(run.at(ms), g);
    }
    // Answer everything still out as refused, until every group is finished.
    for step in 1..50 {
        let now = run.at(ms + step * 1_000);
        for r in std::mem::take(&mut out) {
            run.campaign
                .handle_outcome(now, r.request.id, RequestOutcome::NoResponders);
        }
        run.campaign.handle_timeout(now);
        out.extend(run.requests());
        for e in run.all_events() {
            match e {
                CampaignEvent::Watch { key } => {
                    watched.insert(key);
                }
                CampaignEvent::Unwatch { key } => {
                    watched.remove(&key);
                }
                _ => {}
            }
        }
    }
    if run.campaign.is_done() && !watched.is_empty() {
        return Err(format!("every group finished, still watched: {watched:?}"));
    }
    Ok(())
}

proptest::proptest! {
    #[test]
    fn the_keys_watched_are_the_running_groups_keys(
        ops in proptest::collection::vec((0u8..5, proptest::prelude::any::<u8>(), 0u8..50), 0..80),
    ) {
        if let Err(v) = watch_world(&ops) {
            proptest::prop_assert!(false, "{}", v);
        }
    }
}

/// The driver's randomness reaches the holders a campaign makes: two members
/// alike but for their seed, refused by the service at the same instants, retry
/// their renews at different instants from the second failure on.
#[test]
fn a_campaigns_seed_spreads_its_holders_retries() {
    let second_retry = |seed: u64| {
        let mut run = Run::new();
        run.campaign.seed_jitter(seed);
        run.group(&["a"], 1);
        let acquire = run.request();
        run.elect(0, &acquire, 7);
        let mut at = 5000;
        let mut retries = Vec::new();
        for _ in 0..2 {
            run.campaign.handle_timeout(run.at(at));
            let renew = run.request();
            assert_eq!(renew.request.endpoint, Endpoint::Renew);
            run.answer(at + 10, &renew, super::holder::error("unavailable"));
            let next = run.campaign.poll_timeout().expect("a retry");
            retries.push(next - run.at(at + 10));
            at = (next - run.t0).as_millis() as u64;
        }
        retries
    };
    let (a, b) = (second_retry(1), second_retry(2));
    // The first retry is retry_every (1 s) for both; the second differs.
    assert_eq!(
        (a[0], b[0]),
        (Duration::from_secs(1), Duration::from_secs(1))
    );
    assert!(a[1] >= Duration::from_secs(2) && b[1] >= Duration::from_secs(2));
    assert_ne!(a[1], b[1], "{a:?} {b:?}");
}

/// The answers the campaign reported, in order.
fn answers(events: &[CampaignEvent]) -> Vec<AnsweredRequest> {
    events
        .iter()
        .filter_map(|e| match e {
            CampaignEvent::Answered(a) => Some(a.clone()),
            _ => None,
        })
        .collect()
}

/// A refusal naming holder `error`: the word quoted in a reply that is no error.
fn held_by_a_holder_named_error() -> RequestOutcome {
    let RequestOutcome::Reply { payload, .. } = not_granted(4) else {
        unreachable!("a reply");
    };
    let body = String::from_utf8(payload).expect("UTF-8");
    assert!(body.contains("\"h2\""), "{body}");
    RequestOutcome::reply(body.replace("\"h2\"", "\"error\""))
}

#[test]
fn every_answer_is_reported_with_its_class_read_whole_and_the_time_it_took() {
    use super::holder::error;
    let cases = [
        (RequestOutcome::TimedOut, OutcomeClass::TimedOut),
        (RequestOutcome::NoResponders, OutcomeClass::NoResponders),
        (
            RequestOutcome::Failed("closed".to_string()),
            OutcomeClass::RequestFailed,
        ),
        (error("unavailable"), OutcomeClass::Unavailable),
        (error("internal"), OutcomeClass::Internal),
        // A reply no endpoint's shape reads: the holder cannot read it as yes or no.
        (RequestOutcome::reply("not json"), OutcomeClass::Internal),
        (not_granted(4), OutcomeClass::Clear),
        // A reply whose value says "error" but is a refusal: read whole, not searched.
        (held_by_a_holder_named_error(), OutcomeClass::Clear),
    ];
    for (outcome, class) in cases {
        let mut run = Run::new();
        run.group(&["leader"], 1);
        let first = run.request();
        run.bookkeeping();
        run.answer(40, &first, outcome.clone());
        assert_eq!(
            answers(&run.bookkeeping()),
            [AnsweredRequest {
                key: "leader".to_string(),
                endpoint: Endpoint::Acquire,
                took: Duration::from_millis(40),
                class,
                renew_retry: false,
            }],
            "{outcome:?}"
        );
    }
}

#[test]
fn a_request_the_machine_times_out_is_answered_timed_out_at_its_deadline() {
    let mut run = Run::new();
    run.group(&["leader"], 1);
    let first = run.request();
    run.bookkeeping();
    let deadline = run.at(0) + first.request.timeout;
    run.campaign.handle_timeout(deadline);
    let answered = answers(&run.bookkeeping());
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(
        (answered[0].class, answered[0].took),
        (OutcomeClass::TimedOut, first.request.timeout)
    );
}

#[test]
fn a_request_due_before_it_was_polled_was_never_sent_and_is_withdrawn_not_timed_out() {
    let mut run = Run::new();
    run.group(&["leader"], 1);
    // The acquire is ready but the driver has not polled it by its deadline.
    let timeout = HolderConfig::new("leader", "h1", TTL).request_timeout;
    run.bookkeeping();
    run.campaign.handle_timeout(run.at(0) + timeout);
    let after = run.bookkeeping();
    assert!(answers(&after).is_empty(), "{after:?}");
    assert!(
        !after
            .iter()
            .any(|e| matches!(e, CampaignEvent::Cancel { .. })),
        "{after:?}"
    );
    // Whatever is polled now has its key: nothing is dropped by the driver.
    for r in run.requests() {
        assert_eq!(r.key, "leader");
    }
}

/// Elects `leader` at 0 with revision 3 and returns the first renew of the tenure.
fn first_renew(run: &mut Run) -> CampaignRequest {
    run.group(&["leader"], 1);
    let first = run.request();
    run.elect(0, &first, 3);
    next_renew(run)
}

/// Runs the clock to the next request, a renew.
fn next_renew(run: &mut Run) -> CampaignRequest {
    loop {
        let at = run.campaign.poll_timeout().expect("a renew is due");
        run.campaign.handle_timeout(at);
        let requests = run.requests();
        if let Some(r) = requests.into_iter().next() {
            assert_eq!(r.request.endpoint, Endpoint::Renew);
            return r;
        }
    }
}

#[test]
fn a_renew_after_a_renew_without_a_clear_answer_is_a_retry_and_after_a_clear_one_is_not() {
    use super::holder::error;
    for (unclear, retry) in [
        (RequestOutcome::TimedOut, true),
        (RequestOutcome::NoResponders, true),
        (error("unavailable"), true),
        (renewed(4), false),
    ] {
        let mut run = Run::new();
        let renew = first_renew(&mut run);
        run.bookkeeping();
        let ms = run
            .campaign
            .poll_timeout()
            .map_or(5_000, |t| t.duration_since(run.t0).as_millis() as u64)
            .min(5_100);
        run.answer(ms, &renew, unclear.clone());
        assert_eq!(
            answers(&run.bookkeeping())
                .iter()
                .map(|a| a.renew_retry)
                .collect::<Vec<_>>(),
            [false],
            "the first renew is no retry"
        );
        let again = next_renew(&mut run);
        let at = run.campaign.poll_timeout().expect("a deadline");
        run.campaign
            .handle_outcome(at, again.request.id, renewed(5));
        let answered = answers(&run.bookkeeping());
        assert_eq!(
            answered.last().map(|a| a.renew_retry),
            Some(retry),
            "after {unclear:?}"
        );
        // A clear answer ends the retries.
        let third = next_renew(&mut run);
        let at = run.campaign.poll_timeout().expect("a deadline");
        run.campaign
            .handle_outcome(at, third.request.id, renewed(6));
        assert_eq!(
            answers(&run.bookkeeping()).last().map(|a| a.renew_retry),
            Some(false)
        );
    }
}

#[test]
fn leading_follows_the_holders_elections_and_step_downs() {
    let mut run = Run::new();
    let group = run.group(&["leader"], 1);
    let first = run.request();
    run.bookkeeping();
    run.elect(10, &first, 3);
    let leading = |events: Vec<CampaignEvent>| -> Vec<bool> {
        events
            .into_iter()
            .filter_map(|e| match e {
                CampaignEvent::Leading { key, owns } if key == "leader" => Some(owns),
                _ => None,
            })
            .collect()
    };
    assert_eq!(leading(run.bookkeeping()), [true]);
    run.campaign.handle_stop_group(run.at(20), group);
    assert_eq!(leading(run.bookkeeping()), [false]);
}

#[test]
fn elected_after_counts_from_the_group_start_or_its_last_step_down_that_was_not_a_stop() {
    let mut run = Run::new();
    run.group(&["leader"], 1);
    let first = run.request();
    run.bookkeeping();
    run.elect(300, &first, 3);
    let after = |events: Vec<CampaignEvent>| -> Vec<Duration> {
        events
            .into_iter()
            .filter_map(|e| match e {
                CampaignEvent::ElectedAfter { after, .. } => Some(after),
                _ => None,
            })
            .collect()
    };
    assert_eq!(after(run.bookkeeping()), [Duration::from_millis(300)]);
    // Lost at 5 s: the campaign begins again then.
    let renew = next_renew(&mut run);
    let lost_at = run.campaign.poll_timeout().expect("a deadline");
    run.campaign
        .handle_outcome(lost_at, renew.request.id, super::holder::error("lost"));
    run.bookkeeping();
    let again = loop {
        // Quiet a while first (the lost renew's expiry marker may still come).
        let at = run.campaign.poll_timeout().expect("a campaign tick");
        run.campaign.handle_timeout(at);
        if let Some(r) = run.requests().into_iter().next() {
            break r;
        }
    };
    let asked = run.campaign.poll_timeout().expect("the acquire's deadline") - run.t0;
    let ms = (asked - again.request.timeout).as_millis() as u64;
    run.elect(ms + 700, &again, 9);
    let lost_ms = lost_at.duration_since(run.t0).as_millis() as u64;
    assert_eq!(
        after(run.bookkeeping()),
        [Duration::from_millis(ms + 700 - lost_ms)]
    );
}

#[test]
fn the_candidates_are_a_groups_keys_and_a_semaphores_slots_not_presence_keys() {
    let mut run = Run::new();
    let now = run.at(0);
    let set = run
        .campaign
        .add_balanced_group(now, "set", configs(&["s0", "s1"]))
        .unwrap();
    let jobs = run
        .campaign
        .add_semaphore(now, HolderConfig::new("jobs", "h1", TTL), 2)
        .unwrap();
    let leader = run.group(&["leader"], 1);
    let of = |g| run.campaign.candidates(g).collect::<Vec<_>>();
    assert_eq!(of(set), ["s0", "s1"], "no presence key");
    assert_eq!(of(jobs), ["jobs-0", "jobs-1"]);
    assert_eq!(of(leader), ["leader"]);
    // The presence group of the set campaigns for no candidate of the application's.
    assert_eq!(of(GroupId(set.0 - 1)), Vec::<&str>::new());
}

#[test]
fn an_outcome_for_a_request_not_yet_polled_is_ignored_and_the_request_still_goes_out() {
    let mut run = Run::new();
    run.group(&["leader"], 1);
    // The campaign's own ids start at 0: the acquire waits to be polled under it.
    let first = crate::io::TransmitId(0);
    run.campaign.handle_outcome(run.at(1), first, granted(3));
    assert!(answers(&run.bookkeeping()).is_empty());
    let acquire = run.request();
    assert_eq!(
        (acquire.request.id, acquire.request.endpoint),
        (first, Endpoint::Acquire)
    );
}
