//! The tombstone sweep: a release's tombstone is purged once it is stored, so
//! releasing ever new keys does not grow the stream for ever.
//!
//! A release is still a tombstone (`KV-Operation: DEL`, no TTL): it is the one
//! change event subscribers see, and the fence check of a late renew or release
//! reads it. Once it is stored at revision `r`, the service purges the key's
//! messages below `r + 1` (`$JS.API.STREAM.PURGE.KV_leases` with `filter` and
//! `seq`). That purge is conditional on the sequence: if the key moved on (a new
//! acquire at `r' > r`), it removes nothing. It is not republished (no second
//! event), leaves no marker, and the stream's last sequence stays: sequences are
//! never reused, so the next acquire of the key gets a higher revision, across a
//! server restart too (checked on 2.11.11 and 2.15.1).
//!
//! Why not a TTL on the tombstone: an expiry is not atomic on nats-server (the
//! `MaxAge` marker rolls up whatever the key holds when it applies), so an acquire
//! landing over a tombstone at its end could be wiped after it was granted. The
//! holder worlds of the simulator found exactly that.
//!
//! The sweep runs beside the calls, after their replies: one purge out at a time,
//! at most [`MAX_PENDING`] waiting (past that the oldest is dropped and left in
//! the stream: a tombstone costs a few bytes, never a wrong answer).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::io::{EffectId, NatsRequest, RequestOutcome, Transmit, TransmitKind};
use crate::js;
use crate::shard::ShardMap;

/// Tombstones waiting to be purged, at most.
pub const MAX_PENDING: usize = 4096;

/// What the sweep reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepEvent {
    /// The purge of `key` below `revision + 1` removed `purged` messages (0 when
    /// the key had moved on).
    Purged {
        /// The released key.
        key: String,
        /// The tombstone's revision.
        revision: u64,
        /// Messages removed.
        purged: u64,
    },
    /// The purge failed; the tombstone stays in the stream.
    Failed {
        /// The released key.
        key: String,
        /// Why, for the log.
        reason: String,
    },
    /// The queue was full: the oldest tombstone was dropped unpurged.
    Dropped {
        /// Its key.
        key: String,
    },
}

/// The sweep machine. See the [module docs](self).
#[derive(Debug)]
pub struct TombstoneSweep {
    timeout: Duration,
    pending: VecDeque<(String, u64)>,
    in_flight: Option<(EffectId, String, u64)>,
    next_id: u64,
    events: VecDeque<SweepEvent>,
    shards: ShardMap,
}

impl TombstoneSweep {
    /// A sweep whose purges time out after `timeout`.
    pub fn new(timeout: Duration, _now: Instant) -> Self {
        Self {
            timeout,
            pending: VecDeque::new(),
            in_flight: None,
            next_id: 0,
            events: VecDeque::new(),
            shards: ShardMap::SINGLE,
        }
    }

    /// The same sweep on a sharded bucket: each purge goes to the stream of its
    /// key's shard, filtered to the key.
    pub fn with_shards(self, shards: ShardMap) -> Self {
        Self { shards, ..self }
    }

    /// A release stored its tombstone for `key` at `revision`.
    pub fn handle_released(&mut self, _now: Instant, key: String, revision: u64) {
        if self.pending.len() >= MAX_PENDING
            && let Some((key, _)) = self.pending.pop_front()
        {
            self.events.push_back(SweepEvent::Dropped { key });
        }
        self.pending.push_back((key, revision));
    }

    /// The outcome of the purge sent as `id`.
    pub fn handle_outcome(&mut self, _now: Instant, id: EffectId, outcome: RequestOutcome) {
        let Some((sent, key, revision)) = self.in_flight.take() else {
            return;
        };
        if sent != id {
            self.in_flight = Some((sent, key, revision));
            return;
        }
        let event = match js::parse_api_reply(&outcome) {
            Ok(Ok(reply)) => SweepEvent::Purged {
                key,
                revision,
                purged: reply.get("purged").and_then(|n| n.as_u64()).unwrap_or(0),
            },
            Ok(Err(e)) => SweepEvent::Failed {
                key,
                reason: format!("JetStream refused the purge: {e:?}"),
            },
            Err(e) => SweepEvent::Failed {
                key,
                reason: format!("{e:?}"),
            },
        };
        self.events.push_back(event);
    }

    /// The next purge to send: one at a time.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.in_flight.is_some() {
            return None;
        }
        let (key, revision) = self.pending.pop_front()?;
        self.next_id += 1;
        let id = EffectId(self.next_id);
        let request = purge_request_at(&key, revision, self.timeout, &self.shards);
        self.in_flight = Some((id, key, revision));
        Some(Transmit::new(id, TransmitKind::Api, request))
    }

    /// What happened since the last poll.
    pub fn poll_event(&mut self) -> Option<SweepEvent> {
        self.events.pop_front()
    }

    /// Nothing waits and nothing is out.
    pub fn is_done(&self) -> bool {
        self.pending.is_empty() && self.in_flight.is_none() && self.events.is_empty()
    }
}

/// Purges `key`'s messages below `revision + 1`: the tombstone at `revision`,
/// never a later record.
pub fn purge_request(key: &str, revision: u64, timeout: Duration) -> NatsRequest {
    purge_request_at(key, revision, timeout, &ShardMap::SINGLE)
}

/// [`purge_request`] to the stream of the storage key's shard.
pub fn purge_request_at(
    key: &str,
    revision: u64,
    timeout: Duration,
    shards: &ShardMap,
) -> NatsRequest {
    js::api_request(
        shards.api_subject("STREAM.PURGE", key),
        &json!({ "filter": shards.kv_subject(key), "seq": revision.saturating_add(1) }),
        timeout,
    )
}
