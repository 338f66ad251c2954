//! The holder library against a real nats-server and the service: election,
//! failover with a higher fence, step-down on `lost`, forwarding to the elected owner
//! with the reject rules, and shards spread over several members.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use common::Fx;
use dagnats_leases_core::RequestOutcome;
use dagnats_leases_core::change::{ChangeEvent, ChangeKind};
use dagnats_leases_core::holder::{HolderConfig, StepDownReason};
use dagnats_leases_core::subjects::{HDR_FENCE, HDR_REJECT, changed_subject};
use dagnats_leases_core::wire::{Endpoint, ErrorKind};
use dagnats_leases_tokio::client::{LeaseClient, LeaseErrorKind, change_event};
use dagnats_leases_tokio::member::{
    CampaignObserver, Change, Elector, Member, ObservedRequest, Ownership, Semaphore, Shards,
};
use futures::StreamExt;

const TTL: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(20);

async fn member(fx: &Fx, holder: &str) -> Member {
    Member::new(common::connect(&fx.server).await, holder).expect("valid holder")
}

async fn next(elector: &mut Elector) -> Change {
    tokio::time::timeout(WAIT, elector.next())
        .await
        .expect("an ownership change in time")
        .expect("the elector runs")
}

async fn next_shard(shards: &mut Shards) -> Change {
    tokio::time::timeout(WAIT, shards.next())
        .await
        .expect("a shard change in time")
        .expect("the shards run")
}

fn fence_of(change: &Change) -> u64 {
    match change.ownership {
        Ownership::Elected { fence } => fence,
        ref other => panic!("expected an election, got {other:?}"),
    }
}

#[tokio::test]
async fn one_of_three_is_elected_and_on_stop_another_takes_over_with_a_higher_fence() {
    let fx = Fx::start().await;
    let leases = LeaseClient::new(fx.client.clone());
    let members = [
        member(&fx, "r0").await,
        member(&fx, "r1").await,
        member(&fx, "r2").await,
    ];
    let mut electors: Vec<Elector> = members
        .iter()
        .map(|m| m.elect("leader", TTL).unwrap())
        .collect();
    // Whoever is elected first is the owner the service reports.
    let (first, change) = {
        let waits = electors.iter_mut().map(|e| Box::pin(next(e)));
        let (change, index, _) = futures::future::select_all(waits).await;
        (index, change)
    };
    let fence = fence_of(&change);
    let owner = leases.owner("leader").await.unwrap().expect("held");
    assert_eq!(owner.holder, format!("r{first}"));
    // The tenure began at the revision of the renew that confirmed the grant: the
    // key's revision when the election was announced (a renewal may follow since).
    assert_eq!(electors[first].tenure().map(|t| t.tenure), Some(fence));
    assert!(owner.revision >= fence, "{} below {fence}", owner.revision);
    // Nobody else believes it leads.
    for (i, e) in electors.iter().enumerate() {
        assert_eq!(e.is_leader(), i == first, "r{i}");
    }
    // The leader stops (steps down and releases): another is elected above its fence.
    let leader = electors.remove(first);
    leader.stop().await;
    let waits = electors.iter_mut().map(|e| Box::pin(next(e)));
    let (change, _, _) = futures::future::select_all(waits).await;
    let new_fence = fence_of(&change);
    assert!(new_fence > fence, "fence {new_fence} not above {fence}");
    let owner = leases.owner("leader").await.unwrap().expect("held");
    assert_ne!(owner.holder, format!("r{first}"));
    for e in electors {
        e.stop().await;
    }
}

#[tokio::test]
async fn a_leader_steps_down_when_renew_says_lost() {
    let fx = Fx::start().await;
    let m = member(&fx, "victim").await;
    let mut elector = m.elect("leader", TTL).unwrap();
    fence_of(&next(&mut elector).await);
    // Someone with the same holder ID and fence releases it (an operator by hand),
    // and another holder takes the key: the next renew is `lost`. The current fence
    // is the latest renew's: ask again if a renewal moved it in between.
    let leases = LeaseClient::new(fx.client.clone());
    loop {
        let fence = elector.tenure().expect("leading").fence;
        match leases.release("leader", "victim", fence).await {
            Ok(_) => break,
            Err(e) if e.kind() == LeaseErrorKind::ErrorReply(ErrorKind::FenceMismatch) => {}
            Err(e) => panic!("release: {e}"),
        }
    }
    let taken = leases.acquire("leader", "usurper", TTL * 5).await.unwrap();
    assert!(taken.granted);
    // The elector may first see a renewal race; it must end up stepped down as lost.
    let change = next(&mut elector).await;
    assert_eq!(
        change.ownership,
        Ownership::SteppedDown {
            reason: StepDownReason::Lost
        }
    );
    assert!(!elector.is_leader());
    elector.stop().await;
}

#[tokio::test]
async fn a_forward_reaches_the_elected_owner_and_stale_fences_are_rejected() {
    let fx = Fx::start().await;
    let m = member(&fx, "owner-1").await;
    let mut inbox = m.inbox().await.unwrap();
    let mut elector = m.elect("leader", TTL).unwrap();
    let fence = fence_of(&next(&mut elector).await);
    let echo = tokio::spawn(async move {
        let request = inbox.next().await.expect("a forwarded request");
        assert_eq!(request.key, "leader");
        let reply = format!(
            "{}@{}",
            String::from_utf8_lossy(&request.payload),
            request.fence
        );
        request.respond(reply).await.unwrap();
        inbox
    });
    let leases = LeaseClient::new(fx.client.clone());
    let got = leases
        .forward("leader", b"ping", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(got.holder, "owner-1");
    assert!(got.revision >= fence);
    assert_eq!(
        String::from_utf8_lossy(&got.payload),
        format!("ping@{}", got.revision)
    );
    let inbox = echo.await.unwrap();

    // Straight to the inbox: no fence, a fence below the tenure, or a key not owned.
    let subject = "dagnats.lease.inbox.owner-1.leader";
    let cases: [(&str, Option<String>); 3] = [
        (subject, None),
        (subject, Some((fence - 1).to_string())),
        ("dagnats.lease.inbox.owner-1.other", Some(fence.to_string())),
    ];
    let mut inbox = inbox;
    let serve = tokio::spawn(async move { inbox.next().await.map(|r| r.key) });
    for (subject, fence) in cases {
        let mut headers = HeaderMap::new();
        if let Some(f) = &fence {
            headers.insert(HDR_FENCE, f.as_str());
        }
        let reply = fx
            .client
            .request_with_headers(subject, headers, "x".into())
            .await
            .unwrap();
        let reject = reply.headers.as_ref().and_then(|h| h.get(HDR_REJECT));
        assert_eq!(
            reject.map(|v| v.as_str()),
            Some("stale"),
            "{subject} {fence:?}"
        );
        assert!(reply.payload.is_empty());
    }
    serve.abort();
    elector.stop().await;
}

#[tokio::test]
async fn a_forward_after_the_owner_stopped_is_not_held() {
    let fx = Fx::start().await;
    let m = member(&fx, "gone").await;
    let _inbox = m.inbox().await.unwrap();
    let mut elector = m.elect("leader", TTL).unwrap();
    next(&mut elector).await;
    elector.stop().await;
    let err = LeaseClient::new(fx.client.clone())
        .forward("leader", b"ping", Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::ErrorReply(ErrorKind::NotHeld));
}

#[tokio::test]
async fn shards_spread_over_several_members() {
    let fx = Fx::start().await;
    let keys = ["s0", "s1", "s2", "s3", "s4", "s5"];
    let mut all = Vec::new();
    for i in 0..3 {
        let m = member(&fx, &format!("worker-{i}")).await;
        all.push(m.shards(&keys, 2, TTL).unwrap());
    }
    // Each member ends up with two elections (it stops campaigning at two).
    for shards in all.iter_mut() {
        let mut held = BTreeSet::new();
        while held.len() < 2 {
            let change = next_shard(shards).await;
            if let Ownership::Elected { .. } = change.ownership {
                held.insert(change.key);
            }
        }
    }
    let leases = LeaseClient::new(fx.client.clone());
    let mut owners = BTreeSet::new();
    for key in keys {
        let owner = leases.owner(key).await.unwrap().expect("every shard held");
        owners.insert(owner.holder.clone());
    }
    assert_eq!(owners.len(), 3, "{owners:?}");
    for (i, shards) in all.iter().enumerate() {
        let held = shards.held();
        assert_eq!(held.len(), 2, "worker-{i} holds {held:?}");
        for (key, tenure) in held {
            let owner = leases.owner(&key).await.unwrap().unwrap();
            assert_eq!(owner.holder, format!("worker-{i}"));
            assert!(owner.revision >= tenure.fence);
        }
    }
    for shards in all {
        shards.stop().await;
    }
    for key in keys {
        assert_eq!(leases.owner(key).await.unwrap(), None, "{key} still held");
    }
}

/// Waits, on ownership changes, until `shards` holds `n` keys.
async fn until_holding(shards: &mut Shards, n: usize) {
    while shards.held().len() != n {
        next_shard(shards).await;
    }
}

#[tokio::test]
async fn balanced_shards_share_evenly_as_members_join_and_leave() {
    let fx = Fx::start().await;
    let keys = ["b0", "b1", "b2", "b3", "b4", "b5"];
    let mut all = Vec::new();
    // One member alone takes every shard; each joining member gets an even share,
    // released by the others at a safe point (no lease is taken from its holder): this
    // application never calls `done`, so each moves at its revoked deadline.
    for (i, share) in [6, 3, 2].into_iter().enumerate() {
        let m = member(&fx, &format!("bal-{i}")).await;
        all.push(m.balanced_shards("bal", &keys, TTL).unwrap());
        for shards in all.iter_mut() {
            until_holding(shards, share).await;
        }
    }
    let leases = LeaseClient::new(fx.client.clone());
    let mut owners = std::collections::BTreeMap::new();
    for key in keys {
        let owner = leases.owner(key).await.unwrap().expect("every shard held");
        *owners.entry(owner.holder).or_insert(0) += 1;
    }
    assert_eq!(owners.values().copied().collect::<Vec<_>>(), [2, 2, 2]);
    // A member leaves: the other two take its shards back, three each.
    all.remove(0).stop().await;
    for shards in all.iter_mut() {
        until_holding(shards, 3).await;
    }
    for shards in all {
        shards.stop().await;
    }
    for key in keys {
        assert_eq!(leases.owner(key).await.unwrap(), None, "{key} still held");
    }
    let presence = leases.owner("bal-member-0").await.unwrap();
    assert_eq!(presence, None, "a stopped member releases its presence too");
}

/// A shard the library sheds for a newcomer is revoked: it steps down at once and
/// keeps its lease until the application has stopped writing under it.
/// `stopped_writing` releases it then, so the newcomer is granted it before the
/// revoked deadline (without it the release would wait for that deadline: the move
/// could not come sooner).
#[tokio::test]
async fn a_revoked_shard_moves_as_soon_as_the_application_stopped_writing() {
    revoked_shard_moves("rev", |shards, key| shards.stopped_writing(key)).await;
}

/// `Shards::done`, the deprecated name of `stopped_writing`, still releases a
/// revoked shard before its deadline.
#[tokio::test]
async fn the_deprecated_done_still_releases_a_revoked_shard() {
    #[allow(deprecated)]
    revoked_shard_moves("dep", |shards, key| shards.done(key)).await;
}

/// Runs a balanced set of two shards that a second member joins, and checks the
/// shard revoked from the first moves once `release` was called for it, before its
/// deadline.
async fn revoked_shard_moves(set: &str, release: fn(&Shards, &str)) {
    let fx = Fx::start().await;
    let ttl = Duration::from_secs(15);
    let keys = [format!("{set}0"), format!("{set}1")];
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut first = member(&fx, &format!("{set}-a"))
        .await
        .balanced_shards(set, &keys, ttl)
        .unwrap();
    until_holding(&mut first, 2).await;
    let joined = Instant::now();
    let mut second = member(&fx, &format!("{set}-b"))
        .await
        .balanced_shards(set, &keys, ttl)
        .unwrap();
    // The first member's share drops to one: at its next tick (a renew interval at
    // most) it revokes one shard.
    let (key, deadline) = loop {
        let change = next_shard(&mut first).await;
        if let Ownership::SteppedDown {
            reason: StepDownReason::Revoked { deadline },
        } = change.ownership
        {
            break (change.key, deadline);
        }
    };
    assert!(first.tenure(&key).is_none(), "{key} not owned once revoked");
    assert_eq!(first.held().len(), 1);
    let done = Instant::now();
    release(&first, &key);
    let granted = tokio::time::timeout_at(deadline.into(), async {
        loop {
            let change = next_shard(&mut second).await;
            if change.key == key && matches!(change.ownership, Ownership::Elected { .. }) {
                return Instant::now();
            }
        }
    })
    .await
    .expect("the revoked shard moved before its deadline");
    println!(
        "{key}: revoked {:?} after the join, granted to {set}-b {:?} after the release, \
         {:?} before the revoked deadline",
        done - joined,
        granted - done,
        deadline - granted
    );
    first.stop().await;
    second.stop().await;
}

#[tokio::test]
async fn a_holder_config_outside_the_bounds_is_refused_before_any_request() {
    let fx = Fx::start().await;
    let m = member(&fx, "r0").await;
    let err = m.elect("a.b", TTL).unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::ErrorReply(ErrorKind::Invalid));
    let mut config = HolderConfig::new("leader", "r0", Duration::from_millis(1500));
    config.renew_every = Duration::from_millis(500);
    let err = m.elect_with(config).unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::ErrorReply(ErrorKind::Invalid));
    assert!(Member::new(fx.client.clone(), "bad holder").is_err());
}

#[tokio::test]
async fn one_member_campaigns_for_a_key_once() {
    let fx = Fx::start().await;
    let m = member(&fx, "r0").await;
    let elector = m.elect("leader", TTL).unwrap();
    // A second campaign of the same holder ID would believe it owns the key too.
    let err = m.elect("leader", TTL).unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::ErrorReply(ErrorKind::Invalid));
    let err = m.shards(&["a", "leader"], 1, TTL).unwrap_err();
    assert_eq!(err.kind(), LeaseErrorKind::ErrorReply(ErrorKind::Invalid));
    assert!(
        m.shards(&["a", "a"], 1, TTL).is_err(),
        "a key twice in one set"
    );
    // Once stopped, the key is free to campaign for again.
    elector.stop().await;
    m.elect("leader", TTL).unwrap().stop().await;
}

#[tokio::test]
async fn shards_never_hold_more_than_max_held() {
    let fx = Fx::start().await;
    let keys = ["s0", "s1", "s2", "s3"];
    let m = member(&fx, "greedy").await;
    let mut shards = m.shards(&keys, 2, TTL).unwrap();
    let mut held = BTreeSet::new();
    while held.len() < 2 {
        let change = next_shard(&mut shards).await;
        match change.ownership {
            Ownership::Elected { .. } => assert!(held.insert(change.key)),
            other => panic!("{other:?} before holding two"),
        }
    }
    // Every key was free, yet only two were ever asked for at once: no surplus won
    // and given back.
    let leases = LeaseClient::new(fx.client.clone());
    let mut owned = 0;
    for key in keys {
        if let Some(l) = leases.owner(key).await.unwrap() {
            assert_eq!(l.holder, "greedy");
            owned += 1;
        }
    }
    assert_eq!(owned, 2);
    assert_eq!(shards.held().len(), 2);
    shards.stop().await;
}

async fn next_permit(permit: &mut Semaphore) -> Change {
    tokio::time::timeout(WAIT, permit.next())
        .await
        .expect("a slot change in time")
        .expect("the semaphore runs")
}

/// Three members of a two-permit semaphore: two hold a slot each (distinct slots,
/// each with its own fence), the third waits; when one stops, the third gets the
/// freed slot, never a third at once.
#[tokio::test]
async fn a_semaphore_of_two_permits_among_three_members_admits_two() {
    let fx = Fx::start().await;
    let leases = LeaseClient::new(fx.client.clone());
    let mut permits = Vec::new();
    for i in 0..3 {
        let m = member(&fx, &format!("sem-{i}")).await;
        permits.push((m.semaphore("pool", 2, TTL).unwrap(), m));
    }
    assert!(permits[0].1.semaphore("pool", 0, TTL).is_err(), "0 permits");
    // The first two to be elected hold both slots; the third never is meanwhile.
    let mut elected: Vec<(usize, String, u64)> = Vec::new();
    while elected.len() < 2 {
        let (i, change) = {
            let waits = permits
                .iter_mut()
                .enumerate()
                .map(|(i, (p, _))| Box::pin(async move { (i, next_permit(p).await) }));
            futures::future::select_all(waits).await.0
        };
        elected.push((i, change.key.clone(), fence_of(&change)));
        let holding = permits.iter().filter(|(p, _)| p.held().is_some()).count();
        assert!(holding <= 2, "{holding} members hold a slot of 2");
    }
    let slots: BTreeSet<&str> = elected.iter().map(|(_, k, _)| k.as_str()).collect();
    assert_eq!(slots, BTreeSet::from(["pool-0", "pool-1"]));
    for (i, key, _) in &elected {
        let owner = leases.owner(key).await.unwrap().expect("slot held");
        assert_eq!(owner.holder, format!("sem-{i}"));
    }
    let waiting = (0..3)
        .find(|i| elected.iter().all(|(e, _, _)| e != i))
        .unwrap();
    assert!(permits[waiting].0.held().is_none());

    // One stops: the waiting member takes its slot.
    let (leaving, freed, _) = elected[0].clone();
    let (permit, _member) = permits.remove(leaving);
    permit.stop().await;
    let waiting = if waiting > leaving {
        waiting - 1
    } else {
        waiting
    };
    let change = next_permit(&mut permits[waiting].0).await;
    assert_eq!(change.key, freed);
    fence_of(&change);
    let holding = permits.iter().filter(|(p, _)| p.held().is_some()).count();
    assert_eq!(holding, 2);
    for (p, _) in permits {
        p.stop().await;
    }
    for key in ["pool-0", "pool-1"] {
        assert_eq!(leases.owner(key).await.unwrap(), None, "{key} still held");
    }
}

/// Records what came of each of a member's requests.
struct Outcomes(tokio::sync::mpsc::UnboundedSender<(Endpoint, RequestOutcome)>);

impl CampaignObserver for Outcomes {
    fn request(&self, request: &ObservedRequest<'_>) {
        let _ = self.0.send((request.endpoint, request.outcome.clone()));
    }
}

/// A member's requests carry no timer of their own (async-nats' is off): the
/// campaign's deadline ends them. Against a stand-in for the service that takes every
/// acquire and never answers, the acquire still ends `TimedOut` and the elector still
/// stops. A driver that kept waiting on requests the campaign gave up on fails here.
#[tokio::test]
async fn a_request_nobody_answers_ends_at_the_campaigns_deadline_silent_service_stand_in() {
    let server = dagnats_leases_tests::NatsServer::start();
    let nats = common::connect(&server).await;
    let mut swallowed = nats.subscribe(Endpoint::Acquire.subject()).await.unwrap();
    nats.flush().await.unwrap();
    let (tx, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let member = Member::new(common::connect(&server).await, "silent-1")
        .expect("valid holder")
        .with_observer(Arc::new(Outcomes(tx)));
    let elector = member.elect("silent", TTL).unwrap();
    tokio::time::timeout(WAIT, swallowed.next())
        .await
        .expect("the acquire is sent")
        .expect("the stand-in subscribes");
    let (endpoint, outcome) = tokio::time::timeout(WAIT, outcomes.recv())
        .await
        .expect("the unanswered acquire ends")
        .expect("the member runs");
    assert_eq!(endpoint, Endpoint::Acquire);
    assert_eq!(outcome, RequestOutcome::TimedOut);
    tokio::time::timeout(WAIT, elector.stop())
        .await
        .expect("stop is not held up by a request nobody answers");
}

/// Passes on the endpoint of every request a member's campaigns send, once answered.
struct Sent(tokio::sync::mpsc::UnboundedSender<Endpoint>);

impl CampaignObserver for Sent {
    fn request(&self, request: &ObservedRequest<'_>) {
        let _ = self.0.send(request.endpoint);
    }
}

/// The next change event of `kind` above revision `above` on a subscription to a
/// key's changes.
async fn until_change(
    changes: &mut async_nats::Subscriber,
    kind: ChangeKind,
    above: u64,
) -> ChangeEvent {
    tokio::time::timeout(WAIT, async {
        loop {
            let message = changes.next().await.expect("subscribed");
            let event = change_event(&message);
            if event.kind == kind && event.revision > above {
                return event;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("a {kind:?} change in time"))
}

/// Health-gated leadership end to end: a leader whose health check fails keeps
/// leading for `unhealthy_for` (the TTL), then steps down with the `Unhealthy`
/// reason and keeps the lease, unrenewed, until it is done with it: another member
/// is refused until then, and elected on the release. Unhealthy, the first sends
/// no acquire while the other leads and renews; healthy again it campaigns at
/// once, and is elected when the other stops. Unhealthy once more (at once, with
/// `unhealthy_for` zero), it releases and the key is free. The times are printed.
#[tokio::test]
async fn an_unhealthy_leader_steps_down_releases_and_campaigns_again_once_healthy() {
    let fx = Fx::start().await;
    let leases = LeaseClient::new(fx.client.clone());
    let holder = |lease: Option<dagnats_leases_core::wire::Lease>| lease.map(|l| l.holder);
    let (tx, mut sent) = tokio::sync::mpsc::unbounded_channel();
    let a = member(&fx, "health-a")
        .await
        .with_observer(Arc::new(Sent(tx)));
    let mut leader = a.elect("leader", TTL).unwrap();
    let first = fence_of(&next(&mut leader).await);
    let mut changes = fx
        .client
        .subscribe(changed_subject("leader"))
        .await
        .unwrap();
    fx.client.flush().await.unwrap();
    // What it sent to be elected is behind us.
    while sent.try_recv().is_ok() {}

    let failed = Instant::now();
    leader.set_healthy(false);
    assert!(!leader.health().is_healthy());
    assert!(
        leader.is_leader(),
        "still leading until unhealthy_for has passed"
    );
    let change = next(&mut leader).await;
    let stepped_down = Instant::now();
    let Ownership::SteppedDown {
        reason: StepDownReason::Unhealthy { deadline },
    } = change.ownership
    else {
        panic!("expected a step-down for health, got {change:?}");
    };
    assert!(!leader.is_leader());

    // Another member asks: refused, the lease is kept until health-a is done.
    let (tx_b, mut sent_b) = tokio::sync::mpsc::unbounded_channel();
    let b = member(&fx, "health-b")
        .await
        .with_observer(Arc::new(Sent(tx_b)));
    let mut other = b.elect("leader", TTL).unwrap();
    tokio::time::timeout(WAIT, async {
        while sent_b.recv().await != Some(Endpoint::Acquire) {}
    })
    .await
    .expect("health-b asks");
    let kept = holder(leases.owner("leader").await.unwrap());
    assert!(
        Instant::now() < deadline,
        "checked before the revoked deadline"
    );
    assert_eq!(kept.as_deref(), Some("health-a"));
    leader.stopped_writing();
    let done = Instant::now();
    until_change(&mut changes, ChangeKind::Released, first).await;
    let fence_b = fence_of(&next(&mut other).await);
    let other_elected = Instant::now();

    // Unhealthy, health-a does not campaign: not on the release, not at its ticks,
    // while health-b is elected and renews (the confirming renew, then three renew
    // intervals: more than two of health-a's campaign intervals).
    for _ in 0..4 {
        until_change(&mut changes, ChangeKind::Renewed, 0).await;
    }
    assert_eq!(
        holder(leases.owner("leader").await.unwrap()).as_deref(),
        Some("health-b")
    );
    let mut acquires = 0;
    while let Ok(endpoint) = sent.try_recv() {
        acquires += usize::from(endpoint == Endpoint::Acquire);
    }
    assert_eq!(acquires, 0, "an unhealthy member sent acquires");

    // Healthy again: it asks at once (refused: health-b has it) and is elected when
    // health-b stops.
    let recovered = Instant::now();
    leader.set_healthy(true);
    tokio::time::timeout(WAIT, async {
        while sent.recv().await != Some(Endpoint::Acquire) {}
    })
    .await
    .expect("an acquire once healthy");
    let asked = Instant::now();
    other.stop().await;
    let stopped = Instant::now();
    let again = fence_of(&next(&mut leader).await);
    assert!(again > fence_b, "fence {again} above health-b's {fence_b}");
    let elected = Instant::now();

    // Unhealthy with unhealthy_for zero: steps down at once; done, the key is free.
    leader.health().set_unhealthy_for(Duration::ZERO);
    leader.set_healthy(false);
    let change = next(&mut leader).await;
    assert!(
        matches!(
            change.ownership,
            Ownership::SteppedDown {
                reason: StepDownReason::Unhealthy { .. }
            }
        ),
        "{change:?}"
    );
    leader.stopped_writing();
    until_change(&mut changes, ChangeKind::Released, again).await;
    assert_eq!(holder(leases.owner("leader").await.unwrap()), None);
    println!(
        "health: unhealthy to step-down {:?} (unhealthy_for = TTL {TTL:?}); done to \
         the other elected {:?}; healthy to first acquire {:?}; other stopped to \
         elected {:?}",
        stepped_down - failed,
        other_elected - done,
        asked - recovered,
        elected - stopped
    );
    leader.stop().await;
}

/// A shard set whose health check fails for `unhealthy_for` steps down from every
/// shard with the `Unhealthy` reason; once the application has stopped writing under
/// each, the other member of the set is granted them all. The times are printed.
#[tokio::test]
async fn an_unhealthy_shard_set_hands_its_shards_to_a_healthy_member() {
    let fx = Fx::start().await;
    let keys = ["hs0", "hs1"];
    let mut sick = member(&fx, "shards-a").await.shards(&keys, 2, TTL).unwrap();
    until_holding(&mut sick, 2).await;
    let mut well = member(&fx, "shards-b").await.shards(&keys, 2, TTL).unwrap();
    sick.health().set_unhealthy_for(Duration::from_millis(500));
    let failed = Instant::now();
    sick.set_healthy(false);
    let mut stepped = BTreeSet::new();
    while stepped.len() < keys.len() {
        let change = next_shard(&mut sick).await;
        match change.ownership {
            Ownership::SteppedDown {
                reason: StepDownReason::Unhealthy { .. },
            } => {
                sick.stopped_writing(&change.key);
                stepped.insert(change.key);
            }
            // An election read late: held() counted it already.
            Ownership::Elected { .. } => {}
            other => panic!(
                "{}: expected a step-down for health, got {other:?}",
                change.key
            ),
        }
    }
    let done = Instant::now();
    assert!(sick.held().is_empty());
    until_holding(&mut well, 2).await;
    let moved = Instant::now();
    assert!(sick.held().is_empty(), "an unhealthy set took a shard back");
    println!(
        "shards: unhealthy to both stepped down {:?} (unhealthy_for 500 ms); done to \
         both held by the other {:?}",
        done - failed,
        moved - done
    );
    sick.stop().await;
    well.stop().await;
}
