//! Property tests: many concurrent calls from many holders through the lease
//! service and the simulated JetStream, with random interleavings, expiries, lost
//! replies and stale fences; the world checks every lease invariant after every
//! step (see `sim::World`).

use proptest::prelude::*;

use crate::sim::{Op, OwnerBehaviour, World};
use crate::wire::{Endpoint, ErrorKind, ErrorReply, Response};

fn ops(bytes: &[u8]) -> Vec<Op> {
    crate::sim::ops_from_bytes(bytes)
}

fn run(holders: usize, keys: usize, ops: Vec<Op>) -> Result<World, String> {
    run_in(World::new(holders, keys, 4096), ops)
}

fn run_in(mut world: World, ops: Vec<Op>) -> Result<World, String> {
    for (n, op) in ops.into_iter().enumerate() {
        let shown = format!("{op:?}");
        world
            .apply(op)
            .map_err(|v| format!("step {n} ({shown}): {v}"))?;
    }
    world.finish().map_err(|v| format!("finishing: {v}"))?;
    Ok(world)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    /// Random interleavings of every call kind, with expiries and lost replies.
    #[test]
    fn invariants_hold_under_random_interleavings(
        holders in 2usize..5,
        keys in 1usize..3,
        bytes in proptest::collection::vec(any::<u8>(), 0..3000),
        expiry_seed in any::<u64>(),
    ) {
        let world = World::new(holders, keys, 4096).with_expiry_seed(expiry_seed);
        if let Err(v) = run_in(world, ops(&bytes)) {
            prop_assert!(false, "{}", v);
        }
    }

    /// A replicated bucket whose stream leader is cut off and healed at random:
    /// calls that reach the deposed leader read its old state, yet no reply ever
    /// shows a stale owner, grant, fence check or forward target.
    #[test]
    fn confirmed_reads_never_answer_from_a_deposed_leader(
        holders in 2usize..5,
        keys in 1usize..3,
        bytes in proptest::collection::vec(any::<u8>(), 0..3000),
    ) {
        let world = World::new(holders, keys, 4096).replicated(true);
        if let Err(v) = run_in(world, ops(&bytes)) {
            prop_assert!(false, "{}", v);
        }
    }

    /// The same worlds with the service acting on what it knows of each key
    /// (renew and release straight to their conditional write, owner on a
    /// replicated bucket straight to its confirmation), its map fed by the service
    /// itself from its calls and from change events that arrive one step late:
    /// every invariant still holds, on one replica and with the stream leader cut
    /// off and healed at random.
    #[test]
    fn invariants_hold_when_calls_act_on_known_revisions(
        holders in 2usize..5,
        keys in 1usize..3,
        bytes in proptest::collection::vec(any::<u8>(), 0..3000),
        expiry_seed in any::<u64>(),
        replicated in any::<bool>(),
    ) {
        let mut world = World::new(holders, keys, 4096)
            .with_expiry_seed(expiry_seed)
            .with_known();
        if replicated {
            world = world.replicated(true);
        }
        if let Err(v) = run_in(world, ops(&bytes)) {
            prop_assert!(false, "{}", v);
        }
    }

    /// Many acquirers of one key, interleaved at random with no faults: exactly one wins.
    #[test]
    fn concurrent_acquirers_exactly_one_wins(
        n in 2usize..17,
        order in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut world = World::new(n, 1, 4096);
        for h in 0..n {
            world.apply(Op::Acquire { holder: h as u8, key: 0, ttl_s: 2 }).unwrap();
        }
        for c in order {
            if world.in_flight() == 0 { break; }
            world.apply(Op::Step { call: c, lose_reply: 1, owner: OwnerBehaviour::Echo, via_cut: false }).unwrap();
        }
        world.finish().unwrap();
        let winners: Vec<_> = world.replies.iter().filter(|(_, r)| matches!(r, Response::Acquired(a) if a.granted)).collect();
        prop_assert_eq!(winners.len(), 1, "replies: {:?}", world.replies);
        let losers = world.replies.iter().filter(|(_, r)| matches!(r, Response::Acquired(a) if !a.granted)).count();
        prop_assert_eq!(losers, n - 1, "without faults every other acquirer is told who won");
    }
}

/// The random worlds reach every outcome the invariants judge: a property test
/// that never sees a fence mismatch or an owner timeout would prove nothing.
#[test]
fn random_worlds_cover_every_outcome() {
    use std::collections::BTreeMap;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut expired_unmarked = 0;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200 {
        let bytes = seeded_bytes(&mut state, 3000);
        let world = run(3, 2, ops(&bytes)).unwrap();
        expired_unmarked += world.sim.expired_unmarked_reads.get();
        for (_, r) in &world.replies {
            let name = match r {
                Response::Acquired(a) if a.granted => "granted".to_string(),
                Response::Acquired(_) => "not granted".to_string(),
                Response::Lease(_) => "lease".to_string(),
                Response::Released(_) => "released".to_string(),
                Response::Free(_) => "free".to_string(),
                Response::Forwarded(_) => "forwarded".to_string(),
                Response::Error(e) => e.kind.to_string(),
            };
            *seen.entry(name).or_default() += 1;
        }
    }
    println!(
        "outcomes over 200 worlds: {seen:?}, {expired_unmarked} reads of a lease expired but not yet marked"
    );
    assert!(
        expired_unmarked > 0,
        "the server's late expiry was never seen by a call"
    );
    for want in [
        "granted",
        "not granted",
        "lease",
        "released",
        "free",
        "forwarded",
        "invalid",
        "lost",
        "fence_mismatch",
        "unavailable",
        "not_held",
        "owner_unavailable",
        "owner_rejected",
        "owner_timeout",
        "reply_too_large",
    ] {
        assert!(
            seen.get(want).copied().unwrap_or(0) > 0,
            "never saw {want}: {seen:?}"
        );
    }
}

fn seeded_bytes(state: &mut u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *state as u8
        })
        .collect()
}

/// The control: the same replicated worlds with read confirmation switched off
/// must be caught answering from the deposed leader, or the check above proves
/// nothing.
#[test]
fn without_confirmation_the_checks_catch_stale_reads() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut caught = 0;
    let mut first = None;
    for _ in 0..200 {
        let bytes = seeded_bytes(&mut state, 3000);
        let world = World::new(3, 2, 4096).replicated(false);
        if let Err(v) = run_in(world, ops(&bytes)) {
            assert!(v.contains("stale read"), "another violation: {v}");
            caught += 1;
            first.get_or_insert(v);
        }
    }
    println!("stale reads caught in {caught} of 200 unconfirmed worlds, first: {first:?}");
    assert!(caught > 0, "no world without confirmation was caught");
}

/// The same, step by step: a lease expires and another holder takes it while the
/// old leader is cut off; an `owner` call that reaches the old leader must fail
/// the check without confirmation and end `unavailable` with it.
#[test]
fn an_owner_read_through_the_deposed_leader() {
    let script = |confirm: bool| -> Result<World, String> {
        let mut w = World::new(2, 1, 4096).replicated(confirm);
        let step = |via_cut| Op::Step {
            call: 0,
            lose_reply: 1,
            owner: OwnerBehaviour::Echo,
            via_cut,
        };
        w.apply(Op::Acquire {
            holder: 0,
            key: 0,
            ttl_s: 0,
        })?;
        w.apply(step(false))?;
        w.apply(Op::Partition { cut: true })?;
        // Past the TTL and the server's late expiry (up to 325 ms).
        w.apply(Op::Advance { ms: 1100 })?;
        w.apply(Op::Advance { ms: 300 })?;
        w.apply(Op::Acquire {
            holder: 1,
            key: 0,
            ttl_s: 0,
        })?;
        w.apply(step(false))?;
        w.apply(Op::Owner { key: 0 })?;
        w.apply(step(true))?;
        while w.in_flight() > 0 {
            w.apply(step(true))?;
        }
        Ok(w)
    };
    let err = script(false).expect_err("a stale owner reply went unnoticed");
    assert!(err.contains("stale read"), "{err}");
    let w = script(true).expect("confirmed reads");
    let (_, last) = w.replies.last().expect("the owner call replied");
    assert_eq!(
        last.error_kind(),
        Some(crate::wire::ErrorKind::Unavailable),
        "{last:?}"
    );
}

/// The mutant: a service that answers every acquire `unavailable` (as a service
/// still starting would), its replies changed on their way out. Each reply it
/// gives is a kind the old judge took in any state; judged against the model,
/// the worlds must catch it.
fn acquire_always_unavailable(endpoint: Endpoint, reply: Response) -> Response {
    // Only a valid acquire: an invalid one is still answered `invalid`.
    match (endpoint, reply.error_kind()) {
        (Endpoint::Acquire, kind) if kind != Some(ErrorKind::Invalid) => Response::Error(
            ErrorReply::new(ErrorKind::Unavailable, "the lease service is starting"),
        ),
        (_, _) => reply,
    }
}

#[test]
fn the_judge_catches_a_core_that_answers_every_acquire_unavailable() {
    let mut state = 0x51_7cc1_b727_220au64;
    let (mut with_acquire, mut caught) = (0, 0);
    let mut first = None;
    for _ in 0..100 {
        let ops = ops(&seeded_bytes(&mut state, 3000));
        if !ops.iter().any(|op| matches!(op, Op::Acquire { .. })) {
            continue;
        }
        with_acquire += 1;
        let world = World::new(3, 2, 4096).with_mutant(acquire_always_unavailable);
        if let Err(v) = run_in(world, ops) {
            caught += 1;
            first.get_or_insert(v);
        }
    }
    println!("the mutant was caught in {caught} of {with_acquire} worlds, first: {first:?}");
    assert!(with_acquire > 50, "too few worlds acquire: {with_acquire}");
    assert_eq!(caught, with_acquire, "a world let the mutant pass");
}

/// The service feeds its known map itself: with the map on, most renewals and
/// releases go straight to their write, none without it. A service whose feeding
/// is cut reads first every time, as without the map, and fails this.
#[test]
fn known_worlds_renew_without_reading_first() {
    let count = |known: bool| {
        let mut state = 0x6a09_e667_f3bc_c908u64;
        let mut reads = crate::sim::Reads::default();
        for _ in 0..60 {
            let mut world = World::new(3, 2, 4096);
            if known {
                world = world.with_known();
            }
            let world = run_in(world, ops(&seeded_bytes(&mut state, 3000))).unwrap();
            reads.fenced += world.reads.fenced;
            reads.unread += world.reads.unread;
        }
        reads
    };
    let (with, without) = (count(true), count(false));
    println!(
        "renewals and releases without a read first: {with:?} with the map, {without:?} without"
    );
    assert_eq!(
        without.unread, 0,
        "without the map every renewal reads first"
    );
    assert!(
        with.unread * 2 > with.fenced,
        "the service's known map spared too few reads: {with:?}"
    );
}
