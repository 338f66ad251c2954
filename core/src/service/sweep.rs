//! The tombstone sweep: a release's tombstone is purged once it is stored, and
//! whatever the sweep missed is found again by a scan of the stream, so releasing
//! ever new keys does not grow the stream for ever.
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
//! holder worlds of the simulator found exactly that. nats-server has no purge of
//! many subjects each below its own sequence either, so the sweep keeps up by
//! having up to [`MAX_IN_FLIGHT`] purges out at once.
//!
//! The rules:
//! - **purge**: each tombstone queued is purged below its revision + 1, up to
//!   [`MAX_IN_FLIGHT`] at once, oldest first;
//! - **overflow defers to a scan**: past [`MAX_PENDING`] queued, a released
//!   tombstone is not queued but reported ([`TombstoneSweepEvent::Deferred`]) and
//!   left to a scan of its stream;
//! - **a failed purge defers to a scan**: the tombstone stays in the stream, so its
//!   stream is scanned after [`RETRY_AFTER`];
//! - **scan at start**: [`TombstoneSweep::handle_serving`] scans every stream once
//!   (a service stopped or killed before its purges left tombstones behind);
//! - **a loss ahead of a scan is its own**: a tombstone missed at or past the
//!   sequence a scan under way will still read needs no second scan; one behind it
//!   does;
//! - **the scan reads in order and never loses**: `$JS.API.STREAM.MSG.GET` with
//!   `next_by_subj` (the stream's subjects) from sequence 1 on, one read out per
//!   stream, only while the queue has room; a tombstone (`KV-Operation: DEL` or
//!   `PURGE` without `Nats-Marker-Reason`) is queued for its purge; the scan ends
//!   at the stream's end (no message found);
//! - **a failed read pauses the scans**: they resume where they were after
//!   [`RETRY_AFTER`].

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::json;

use crate::io::{NatsRequest, RequestOutcome, Transmit, TransmitId, TransmitKind};
use crate::js;
use crate::outbox::Ids;
use crate::shard::ShardMap;
use crate::subjects::{HDR_KV_OPERATION, HDR_MARKER_REASON};

/// Tombstones waiting to be purged, at most.
pub const MAX_PENDING: usize = 4096;

/// Purges out at once, at most: one at a time fell behind a churn of 1,150 to
/// 2,100 releases a second (thousands of tombstones past the queue's bound).
pub const MAX_IN_FLIGHT: usize = 32;

/// How long the scans wait after a failed read or a failed purge.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Why a stream is scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanReason {
    /// The service began serving: an earlier process may have left tombstones.
    Start,
    /// A tombstone was not queued: the queue was full.
    Overflow,
    /// A purge failed.
    FailedPurge,
}

/// What the sweep reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TombstoneSweepEvent {
    /// The purge failed; the tombstone stays until a scan finds it.
    Failed {
        /// The released key.
        key: String,
        /// Why, for the log.
        reason: String,
    },
    /// The queue was full: the tombstone waits for a scan of its stream.
    Deferred {
        /// Its key.
        key: String,
    },
    /// A scan of `stream` began.
    ScanStarted {
        /// The stream.
        stream: String,
        /// Why.
        reason: ScanReason,
    },
    /// A scan of `stream` reached its end.
    Scanned {
        /// The stream.
        stream: String,
        /// Messages read.
        read: u64,
        /// Tombstones found and queued.
        found: u64,
    },
    /// A scan's read failed: the scans resume where they were after
    /// [`RETRY_AFTER`].
    ScanFailed {
        /// The stream.
        stream: String,
        /// Why, for the log.
        reason: String,
    },
}

/// One tombstone to purge: in which stream, on which subject, at which sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tombstone {
    shard: u32,
    key: String,
    subject: String,
    revision: u64,
}

/// A request out.
#[derive(Debug)]
enum Out {
    Purge(Tombstone),
    Read(u32),
}

/// A scan under way of one stream.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    /// The next sequence to read from.
    next: u64,
    read: u64,
    found: u64,
}

/// One stream's scan: due, under way, or neither.
#[derive(Debug, Default)]
struct StreamScan {
    due: Option<ScanReason>,
    cursor: Option<Cursor>,
    reading: bool,
}

/// What one scan read found.
#[derive(Debug, PartialEq, Eq)]
enum ReadFound {
    /// The message at `seq` on `subject`, a tombstone or not.
    Message {
        seq: u64,
        subject: String,
        tombstone: bool,
    },
    /// No message at or after the sequence: the stream's end.
    End,
}

/// The sweep machine. See the [module docs](self).
#[derive(Debug)]
pub struct TombstoneSweep {
    timeout: Duration,
    pending: VecDeque<Tombstone>,
    out: HashMap<TransmitId, Out>,
    purges_out: usize,
    scans: Vec<StreamScan>,
    /// Scans wait until then after a failure.
    paused_until: Option<Instant>,
    events: VecDeque<TombstoneSweepEvent>,
    shards: ShardMap,
}

impl TombstoneSweep {
    /// A sweep whose requests time out after `timeout`.
    pub fn new(timeout: Duration, _now: Instant) -> Self {
        Self {
            timeout,
            pending: VecDeque::new(),
            out: HashMap::new(),
            purges_out: 0,
            scans: vec![StreamScan::default()],
            paused_until: None,
            events: VecDeque::new(),
            shards: ShardMap::SINGLE,
        }
    }

    /// The same sweep on a sharded bucket: each purge goes to the stream of its
    /// key's shard, filtered to the key, and each stream is scanned alone.
    pub fn with_shards(self, shards: ShardMap) -> Self {
        Self {
            shards,
            scans: shards.indexes().map(|_| StreamScan::default()).collect(),
            ..self
        }
    }

    /// The service serves leases now: every stream is scanned once (rule: scan at
    /// start).
    pub fn handle_serving(&mut self, _now: Instant) {
        for scan in &mut self.scans {
            scan.due.get_or_insert(ScanReason::Start);
        }
    }

    /// A release stored its tombstone for `key` at `revision`.
    pub fn handle_released(&mut self, _now: Instant, key: String, revision: u64) {
        let shard = self.shards.shard_of(&key);
        if self.pending.len() >= MAX_PENDING {
            self.missed(shard, revision, ScanReason::Overflow);
            self.events.push_back(TombstoneSweepEvent::Deferred { key });
            return;
        }
        let subject = self.shards.kv_subject(&key);
        self.pending.push_back(Tombstone {
            shard,
            key,
            subject,
            revision,
        });
    }

    /// A tombstone at `revision` in stream `shard` stays: its stream is scanned,
    /// unless a scan under way is still to read that far.
    fn missed(&mut self, shard: u32, revision: u64, reason: ScanReason) {
        let Some(scan) = self.scans.get_mut(shard as usize) else {
            return;
        };
        if scan.cursor.is_some_and(|c| c.next <= revision) {
            return;
        }
        scan.due.get_or_insert(reason);
    }

    /// The outcome of the request sent as `id`.
    pub fn handle_outcome(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        match self.out.remove(&id) {
            None => {}
            Some(Out::Purge(t)) => {
                self.purges_out -= 1;
                self.purge_outcome(now, t, &outcome);
            }
            Some(Out::Read(shard)) => self.read_outcome(now, shard, &outcome),
        }
    }

    fn purge_outcome(&mut self, now: Instant, t: Tombstone, outcome: &RequestOutcome) {
        let reason = match js::parse_api_reply(outcome) {
            // Purged (nothing, when the key had moved on): nothing left to do.
            Ok(Ok(_)) => return,
            Ok(Err(e)) => format!("JetStream refused the purge: {e:?}"),
            Err(e) => format!("{e:?}"),
        };
        self.missed(t.shard, t.revision, ScanReason::FailedPurge);
        self.pause(now);
        self.events
            .push_back(TombstoneSweepEvent::Failed { key: t.key, reason });
    }

    fn read_outcome(&mut self, now: Instant, shard: u32, outcome: &RequestOutcome) {
        let stream = self.shards.stream(shard);
        let prefix = format!("$KV.{}.", self.shards.bucket(shard));
        let found = parse_scan_read(outcome);
        let room = self.pending.len() < MAX_PENDING;
        let Some(scan) = self.scans.get_mut(shard as usize) else {
            return;
        };
        scan.reading = false;
        let Some(cursor) = &mut scan.cursor else {
            return;
        };
        match found {
            Ok(ReadFound::End) => {
                let Cursor { read, found, .. } = *cursor;
                scan.cursor = None;
                self.events.push_back(TombstoneSweepEvent::Scanned {
                    stream,
                    read,
                    found,
                });
            }
            Ok(ReadFound::Message {
                seq,
                subject,
                tombstone,
            }) => {
                let ours = subject.strip_prefix(&prefix).filter(|k| !k.is_empty());
                match ours.filter(|_| tombstone) {
                    // Read again once the queue has room.
                    Some(_) if !room => return,
                    Some(key) => {
                        cursor.found += 1;
                        self.pending.push_back(Tombstone {
                            shard,
                            key: key.to_string(),
                            subject: subject.clone(),
                            revision: seq,
                        });
                    }
                    None => {}
                }
                cursor.read += 1;
                cursor.next = seq.saturating_add(1).max(cursor.next);
            }
            Err(reason) => {
                self.pause(now);
                self.events
                    .push_back(TombstoneSweepEvent::ScanFailed { stream, reason });
            }
        }
    }

    fn pause(&mut self, now: Instant) {
        self.paused_until = Some(now + RETRY_AFTER);
    }

    /// The next request to send: purges first, up to [`MAX_IN_FLIGHT`], then one
    /// scan read per stream.
    /// Each goes under an id from its owner's `ids`: feed its outcome back with it.
    pub fn poll_transmit(&mut self, ids: &mut Ids<TransmitId>) -> Option<Transmit> {
        if self.purges_out < MAX_IN_FLIGHT
            && let Some(t) = self.pending.pop_front()
        {
            let request = js::api_request(
                format!("$JS.API.STREAM.PURGE.{}", self.shards.stream(t.shard)),
                &json!({ "filter": t.subject, "seq": t.revision.saturating_add(1) }),
                self.timeout,
            );
            self.purges_out += 1;
            return Some(self.send(ids, Out::Purge(t), request));
        }
        if self.paused_until.is_some() || self.pending.len() >= MAX_PENDING {
            return None;
        }
        for i in self.shards.indexes() {
            let scan = &mut self.scans[i as usize];
            if scan.cursor.is_none()
                && let Some(reason) = scan.due.take()
            {
                scan.cursor = Some(Cursor {
                    next: 1,
                    read: 0,
                    found: 0,
                });
                self.events.push_back(TombstoneSweepEvent::ScanStarted {
                    stream: self.shards.stream(i),
                    reason,
                });
            }
            let scan = &mut self.scans[i as usize];
            if let Some(cursor) = scan.cursor
                && !scan.reading
            {
                scan.reading = true;
                let request = scan_request(i, cursor.next, self.timeout, &self.shards);
                return Some(self.send(ids, Out::Read(i), request));
            }
        }
        None
    }

    fn send(&mut self, ids: &mut Ids<TransmitId>, out: Out, request: NatsRequest) -> Transmit {
        let id = ids.allocate();
        self.out.insert(id, out);
        Transmit::new(id, TransmitKind::Api, request)
    }

    /// When the scans may go on after a failure, while one is due or under way.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let scanning = self
            .scans
            .iter()
            .any(|s| s.due.is_some() || s.cursor.is_some());
        self.paused_until.filter(|_| scanning)
    }

    /// The time has come: the scans go on.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.paused_until.is_some_and(|at| at <= now) {
            self.paused_until = None;
        }
    }

    /// What happened since the last poll.
    pub fn poll_event(&mut self) -> Option<TombstoneSweepEvent> {
        self.events.pop_front()
    }

    /// Nothing waits, nothing is out, and no scan is due or under way.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty()
            && self.out.is_empty()
            && self.events.is_empty()
            && self
                .scans
                .iter()
                .all(|s| s.due.is_none() && s.cursor.is_none())
    }
}

/// Purges `key`'s messages below `revision + 1`: the tombstone at `revision`,
/// never a later record.
pub fn purge_request(key: &str, revision: u64, timeout: Duration) -> NatsRequest {
    purge_request_to_shard(key, revision, timeout, &ShardMap::SINGLE)
}

/// [`purge_request`] to the stream of the storage key's shard.
pub fn purge_request_to_shard(
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

/// A scan's read of stream `shard`: the first message at or after `seq` on the
/// stream's subjects.
pub fn scan_request(shard: u32, seq: u64, timeout: Duration, shards: &ShardMap) -> NatsRequest {
    js::api_request(
        format!("$JS.API.STREAM.MSG.GET.{}", shards.stream(shard)),
        &json!({ "seq": seq, "next_by_subj": shards.stream_subjects(shard) }),
        timeout,
    )
}

/// Reads a scan read's reply: the message and whether it is a tombstone, or the
/// stream's end; anything else is a failure, for the log.
fn parse_scan_read(outcome: &RequestOutcome) -> Result<ReadFound, String> {
    let reply = match js::parse_api_reply(outcome) {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) if e.err_code == js::ERR_NO_MESSAGE_FOUND => return Ok(ReadFound::End),
        Ok(Err(e)) => return Err(format!("JetStream refused the read: {e:?}")),
        Err(e) => return Err(format!("{e:?}")),
    };
    let message = reply
        .get("message")
        .ok_or("a message get reply without a message")?;
    let seq = message
        .get("seq")
        .and_then(|s| s.as_u64())
        .filter(|s| *s > 0)
        .ok_or("a stored message without a sequence")?;
    let subject = message
        .get("subject")
        .and_then(|s| s.as_str())
        .ok_or("a stored message without a subject")?
        .to_string();
    let headers = match message.get("hdrs").and_then(|h| h.as_str()) {
        Some(h) if !h.is_empty() => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(h)
                .map_err(|e| format!("stored headers are not base64: {e}"))?;
            js::parse_header_block(&raw)
        }
        _ => Vec::new(),
    };
    let marker = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case(HDR_MARKER_REASON));
    let deleted = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case(HDR_KV_OPERATION) && (v == "DEL" || v == "PURGE"));
    Ok(ReadFound::Message {
        seq,
        subject,
        tombstone: deleted && !marker,
    })
}
