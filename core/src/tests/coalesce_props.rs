//! Coalesced and single execution of the same calls give the same replies.
//!
//! A coalesced run drives calls against the simulated JetStream with every write
//! (and read confirmation) going through a [`Coalescer`], in a random order of
//! read answers, send deliveries and clock moves; it records the order in which
//! the stream took each operation. A single run drives fresh copies of the same
//! calls with every write sent alone, in that recorded order, against a fresh
//! stream. Every call must see the same outcomes, so give the same reply, and the
//! two streams must hold the same messages.

use super::support::owner_ids;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::json;

use crate::call::{Call, CallConfig, CallEvent};

use crate::io::{NatsRequest, Transmit, TransmitId};
use crate::service::coalesce::{Coalescer, CoalescerConfig, CoalescerEvent};
use crate::sim::SimJetStream;
use crate::wire::{Endpoint, Response};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Call `i`'s `k`-th effect reached the stream (alone, or in a stored batch).
    Op(usize, u32),
    /// The clock moved on.
    Advance(u64),
}

fn calls_from(bytes: &[u8], replicated: bool) -> Vec<(Endpoint, String)> {
    bytes
        .chunks(3)
        .filter(|c| c.len() == 3)
        .map(|c| {
            let holder = format!("h{}", c[1] % 3);
            let key = format!("k{}", (c[1] / 3) % 4);
            let revision = u64::from(c[2] % 12);
            let ttl_ms = (u64::from(c[2] % 3) + 1) * 1000;
            match c[0] % 4 {
                0 => (
                    Endpoint::Acquire,
                    json!({"key": key, "holder": holder, "ttl_ms": ttl_ms}),
                ),
                1 => (
                    Endpoint::Renew,
                    json!({"key": key, "holder": holder, "revision": revision}),
                ),
                2 => (
                    Endpoint::Release,
                    json!({"key": key, "holder": holder, "revision": revision}),
                ),
                _ if replicated => (Endpoint::Owner, json!({"key": key})),
                _ => (
                    Endpoint::Acquire,
                    json!({"key": key, "holder": holder, "ttl_ms": ttl_ms}),
                ),
            }
        })
        .map(|(e, b)| (e, b.to_string()))
        .collect()
}

struct Driver {
    base: Instant,
    sim: SimJetStream,
    calls: Vec<Call>,
    /// Each call's effects issued so far.
    issued: Vec<u32>,
    replies: Vec<Option<Response>>,
}

impl Driver {
    fn new(calls: &[(Endpoint, String)], replicated: bool, sim_atomic: bool) -> Self {
        let base = Instant::now();
        let sim = SimJetStream::new().with_atomic(sim_atomic);
        let mut config = CallConfig::ready(64 * 1024);
        if replicated {
            config = config.for_replicas(3);
        }
        let made = calls
            .iter()
            .map(|(e, b)| Call::new(config, *e, b.as_bytes(), sim.wall(), base))
            .collect();
        Self {
            base,
            sim,
            calls: made,
            issued: vec![0; calls.len()],
            replies: vec![None; calls.len()],
        }
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.sim.now_ms)
    }

    /// Call `i`'s next effects: its reply, or requests (with their index `k`).
    fn drain(&mut self, i: usize) -> Vec<(u32, TransmitId, NatsRequest, bool)> {
        let mut out = Vec::new();
        while let Some(t) = self.calls[i].poll_transmit(&mut owner_ids()) {
            let k = self.issued[i];
            self.issued[i] += 1;
            out.push((k, t.id, t.request, t.kind.is_stream_write()));
        }
        while let Some(event) = self.calls[i].poll_event() {
            match event {
                CallEvent::Replied(r) => self.replies[i] = Some(r),
                CallEvent::Kv(_) => {}
            }
        }
        out
    }
}

/// The coalesced run: its replies, its stream and the order the stream took things.
fn coalesced(
    calls: &[(Endpoint, String)],
    script: &[u8],
    replicated: bool,
    sim_atomic: bool,
    config: CoalescerConfig,
) -> (Vec<Option<Response>>, SimJetStream, Vec<Step>, (u64, u64)) {
    let mut d = Driver::new(calls, replicated, sim_atomic);
    let mut co = Coalescer::new(config, Instant::now());
    let mut trace = Vec::new();
    let mut reads: Vec<(usize, u32, TransmitId, NatsRequest)> = Vec::new();
    let mut sends: Vec<Transmit> = Vec::new();
    let mut writes: BTreeMap<TransmitId, (usize, u32, TransmitId)> = BTreeMap::new();
    let mut ready: Vec<usize> = (0..calls.len()).collect();

    let mut script = script.iter().copied();
    loop {
        // Route everything that is ready: call effects into reads and the
        // coalescer, the coalescer's outputs into sends and back into calls.
        loop {
            let mut moved = false;
            for i in std::mem::take(&mut ready) {
                for (k, id, req, is_write) in d.drain(i) {
                    moved = true;
                    if is_write {
                        // One id names the write from the call to the coalescer and back.
                        writes.insert(id, (i, k, id));
                        co.handle_write(d.now(), id, req);
                    } else {
                        reads.push((i, k, id, req));
                    }
                }
            }
            while let Some(t) = co.poll_transmit(&mut owner_ids()) {
                moved = true;
                sends.push(t);
            }
            while let Some(CoalescerEvent::Outcome { write, outcome }) = co.poll_event() {
                moved = true;
                let (i, _, id) = writes.remove(&write).expect("a write it was given");
                let now = d.now();
                d.calls[i].handle_outcome(now, id, outcome);
                ready.push(i);
            }
            if !moved {
                break;
            }
        }
        if reads.is_empty() && sends.is_empty() {
            break;
        }
        // Pick what happens next: from the script, then in order to the end.
        let (what, pick) = match (script.next(), script.next()) {
            (Some(a), Some(b)) => (a, b as usize),
            _ => (0, 0),
        };
        if what % 7 == 6 {
            let ms = u64::from(pick as u8) * 8;
            d.sim.advance(ms);
            trace.push(Step::Advance(ms));
            continue;
        }
        let take_read = !reads.is_empty() && (sends.is_empty() || what % 2 == 0);
        if take_read {
            let (i, k, id, req) = reads.remove(pick % reads.len());
            let outcome = d.sim.handle(&req);
            trace.push(Step::Op(i, k));
            let now = d.now();
            d.calls[i].handle_outcome(now, id, outcome);
            ready.push(i);
        } else {
            let s = sends.remove(pick % sends.len());
            for m in &s.publish {
                d.sim.handle_publish(m);
            }
            let before = d.sim.log.len();
            let outcome = d.sim.handle(&s.request);
            let stored_batch = !s.publish.is_empty() && d.sim.log.len() > before;
            let members: Vec<(usize, u32)> = co
                .writes_of(s.id)
                .iter()
                .map(|w| {
                    let (i, k, _) = writes[w];
                    (i, k)
                })
                .collect();
            if s.publish.is_empty() || stored_batch {
                for (i, k) in members {
                    trace.push(Step::Op(i, k));
                }
            }
            co.handle_outcome(d.now(), s.id, outcome);
        }
    }
    let counts = co.batch_counts();
    (d.replies, d.sim, trace, (counts.sent, counts.failed))
}

/// The single run: the same calls, every effect alone, in the recorded order.
fn single(
    calls: &[(Endpoint, String)],
    trace: &[Step],
    replicated: bool,
    sim_atomic: bool,
) -> Result<(Vec<Option<Response>>, SimJetStream), String> {
    let mut d = Driver::new(calls, replicated, sim_atomic);
    let mut pending: BTreeMap<(usize, u32), (TransmitId, NatsRequest)> = BTreeMap::new();
    for i in 0..calls.len() {
        for (k, id, req, _) in d.drain(i) {
            pending.insert((i, k), (id, req));
        }
    }
    for step in trace {
        match *step {
            Step::Advance(ms) => d.sim.advance(ms),
            Step::Op(i, k) => {
                let (id, req) = pending
                    .remove(&(i, k))
                    .ok_or_else(|| format!("call {i} has no effect {k} in the single run"))?;
                let outcome = d.sim.handle(&req);
                let now = d.now();
                d.calls[i].handle_outcome(now, id, outcome);
                for (k, id, req, _) in d.drain(i) {
                    pending.insert((i, k), (id, req));
                }
            }
        }
    }
    if !pending.is_empty() {
        return Err(format!(
            "effects left in the single run: {:?}",
            pending.keys()
        ));
    }
    Ok((d.replies, d.sim))
}

fn same_replies(
    bytes: &[u8],
    script: &[u8],
    replicated: bool,
    sim_atomic: bool,
    config: CoalescerConfig,
) -> Result<(u64, u64), String> {
    let calls = calls_from(bytes, replicated);
    let (replies, sim, trace, counts) = coalesced(&calls, script, replicated, sim_atomic, config);
    if let Some(i) = replies.iter().position(Option::is_none) {
        return Err(format!("call {i} never replied in the coalesced run"));
    }
    let (alone, alone_sim) = single(&calls, &trace, replicated, sim_atomic)?;
    for (i, (a, b)) in replies.iter().zip(&alone).enumerate() {
        if a != b {
            return Err(format!(
                "call {i} {:?}: coalesced {a:?}, single {b:?}",
                calls[i]
            ));
        }
    }
    let shape = |s: &SimJetStream| {
        s.log
            .iter()
            .map(|m| (m.seq, m.key.clone(), m.kind, m.time_ms, m.data.clone()))
            .collect::<Vec<_>>()
    };
    if shape(&sim) != shape(&alone_sim) {
        return Err("the two streams differ".to_string());
    }
    if counts.0 - counts.1 != sim.batches_committed {
        return Err(format!(
            "batches {counts:?}, stored {}",
            sim.batches_committed
        ));
    }
    Ok(counts)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Acquire, renew, release (and owner with read confirmations on a replicated
    /// bucket), coalesced into atomic batches or sent alone: the same replies.
    #[test]
    fn coalesced_and_single_execution_give_the_same_replies(
        bytes in proptest::collection::vec(any::<u8>(), 0..120),
        script in proptest::collection::vec(any::<u8>(), 0..400),
        replicated in any::<bool>(),
        sim_atomic in prop_oneof![4 => Just(true), 1 => Just(false)],
        max_batch in 1usize..6,
        max_in_flight in 1usize..3,
        single_window in 1usize..3,
        min_batch in 2usize..4,
    ) {
        let config = CoalescerConfig {
            max_batch,
            max_in_flight,
            single_window,
            min_batch,
            ..CoalescerConfig::atomic("t-")
        };
        if let Err(v) = same_replies(&bytes, &script, replicated, sim_atomic, config) {
            prop_assert!(false, "{}", v);
        }
    }
}

/// The property has teeth: over a fixed set of seeds, batches are stored and
/// batches fail (and are retried) in the coalesced runs.
#[test]
fn the_coalesced_runs_store_batches() {
    let (mut sent, mut failed) = (0, 0);
    for seed in 0..40u8 {
        let bytes: Vec<u8> = (0..90u32)
            .map(|n| {
                (n as u8)
                    .wrapping_mul(37)
                    .wrapping_add(seed.wrapping_mul(11))
            })
            .collect();
        let script: Vec<u8> = (0..300u32)
            .map(|n| (n as u8).wrapping_mul(13).wrapping_add(seed))
            .collect();
        let (s, f) = same_replies(
            &bytes,
            &script,
            seed % 2 == 0,
            true,
            CoalescerConfig {
                single_window: 1,
                min_batch: 2,
                max_in_flight: 1,
                ..CoalescerConfig::atomic("t-")
            },
        )
        .unwrap();
        sent += s;
        failed += f;
    }
    assert!(sent - failed > 10, "only {} batches stored", sent - failed);
    assert!(failed > 3, "only {failed} batches failed and were retried");
}
