//! Property tests: many concurrent calls from many holders through the simulated
//! JetStream, with random interleavings, expiries, lost replies and stale fences;
//! the world checks every lease invariant after every step (see `sim::World`).

use proptest::prelude::*;

use crate::sim::{Op, OwnerBehaviour, World};
use crate::wire::Response;

fn ops(bytes: &[u8]) -> Vec<Op> {
    crate::sim::ops_from_bytes(bytes)
}

fn run(holders: usize, keys: usize, ops: Vec<Op>) -> Result<World, String> {
    let mut world = World::new(holders, keys, 4096);
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
    ) {
        if let Err(v) = run(holders, keys, ops(&bytes)) {
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
            world.apply(Op::Step { call: c, lose_reply: 1, owner: OwnerBehaviour::Echo }).unwrap();
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
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200 {
        let bytes: Vec<u8> = (0..3000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let world = run(3, 2, ops(&bytes)).unwrap();
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
    println!("outcomes over 200 worlds: {seen:?}");
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
