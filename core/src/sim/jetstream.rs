//! The simulated JetStream KV: stored messages, revisions, per-message TTLs and
//! their late expiry, `MaxAge` markers, and the deposed-leader stream. Re-exported
//! from [`crate::sim`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use base64::Engine as _;
use serde_json::json;
use time::OffsetDateTime;

use crate::io::{NatsRequest, RequestOutcome};
use crate::record::{LeaseEvent, LeaseRecord};
use crate::service::coalesce::{HDR_BATCH_COMMIT, HDR_BATCH_ID, HDR_BATCH_SEQUENCE};
use crate::subjects::{
    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
    HDR_KV_OPERATION, HDR_LEASE_EVENT, HDR_MARKER_REASON, HDR_TTL, STREAM,
};

/// The kind of a stored message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgKind {
    /// A value.
    Value,
    /// A `KV-Operation: DEL` tombstone.
    Tombstone,
    /// The server's expiry marker.
    Marker,
}

/// A message the simulator stored, kept in its log forever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimMsg {
    /// Stream sequence: the revision.
    pub seq: u64,
    /// The lease key.
    pub key: String,
    /// What it is.
    pub kind: MsgKind,
    /// Headers as stored.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub data: Vec<u8>,
    /// Virtual store time, ms.
    pub time_ms: u64,
    /// Per-message TTL, ms.
    pub ttl_ms: Option<u64>,
    /// How late after its TTL the server removes it (0 to [`MAX_LATE_EXPIRY_MS`]).
    pub late_ms: u64,
}

/// The most a real nats-server was seen to expire a message after its TTL: it
/// checks ages on a timer with a 250 ms floor, in batches (`nats-facts.md`).
pub const MAX_LATE_EXPIRY_MS: u64 = 325;

impl SimMsg {
    /// The lease record this message holds, if it is a value that parses.
    pub fn record(&self) -> Option<LeaseRecord> {
        (self.kind == MsgKind::Value)
            .then(|| LeaseRecord::parse(&self.data).ok())
            .flatten()
    }

    /// When its TTL runs out, ms: the end of the lease it holds.
    pub fn expires_ms(&self) -> Option<u64> {
        self.ttl_ms.map(|t| self.time_ms + t)
    }

    /// When the server actually removes it (and marks the expiry), ms: up to
    /// [`MAX_LATE_EXPIRY_MS`] after its TTL, never before. In between it is
    /// expired but not yet marked: reads still return it, and a write expecting
    /// its revision still lands.
    pub fn removed_ms(&self) -> Option<u64> {
        self.expires_ms().map(|end| end + self.late_ms)
    }
}

/// The simulated `KV_leases` stream.
#[derive(Debug, Clone)]
pub struct SimJetStream {
    /// The virtual clock, ms since the start.
    pub now_ms: u64,
    /// Wall time at `now_ms == 0`.
    pub epoch: OffsetDateTime,
    last_seq: u64,
    current: BTreeMap<String, SimMsg>,
    /// Every message ever stored, in sequence order.
    pub log: Vec<SimMsg>,
    /// A deposed leader: answers from its frozen state, commits nothing.
    deposed: bool,
    /// Seeds each message's late expiry.
    seed: u64,
    /// Keys whose expiry marker is already due for a message that a write replaced
    /// after its TTL ran out: the marker (`Nats-Rollup: sub`) still comes, at this
    /// time, and removes whatever the key holds then.
    doomed: BTreeMap<String, u64>,
    /// Reads answered with a message whose TTL had run out, not yet marked.
    pub expired_unmarked_reads: std::cell::Cell<u64>,
    /// Whether that marker is modelled (off by default: see [`SimJetStream::with_rollup_wipe`]).
    rollup_wipes_late_writes: bool,
    /// Whether the stream takes atomic batches (`allow_atomic`, 2.12+).
    allow_atomic: bool,
    /// Open atomic batches: their messages so far.
    batches: BTreeMap<String, Vec<NatsRequest>>,
    /// Atomic batches stored.
    pub batches_committed: u64,
}

/// The most messages nats-server takes in one atomic batch.
pub const SIM_MAX_BATCH: u64 = 1000;
/// The most atomic batches open at once on one stream.
pub const SIM_MAX_OPEN_BATCHES: usize = 50;

/// A publish that passed its checks, ready to store.
struct Prepared {
    key: String,
    kind: MsgKind,
    headers: Vec<(String, String)>,
    data: Vec<u8>,
    ttl_ms: Option<u64>,
}

impl Default for SimJetStream {
    fn default() -> Self {
        Self::new()
    }
}

impl SimJetStream {
    /// The last sequence stored (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// An empty stream at time 0.
    pub fn new() -> Self {
        Self {
            now_ms: 0,
            epoch: OffsetDateTime::from_unix_timestamp(1_790_000_000).expect("valid epoch"),
            last_seq: 0,
            current: BTreeMap::new(),
            log: Vec::new(),
            deposed: false,
            seed: 0x6c8e_9cf5_7093_2bd5,
            doomed: BTreeMap::new(),
            rollup_wipes_late_writes: true,
            expired_unmarked_reads: std::cell::Cell::new(0),
            allow_atomic: true,
            batches: BTreeMap::new(),
            batches_committed: 0,
        }
    }

    /// Whether the stream takes atomic batches (on by default; off is a server
    /// before 2.12 or a stream without `allow_atomic`).
    pub fn with_atomic(mut self, on: bool) -> Self {
        self.allow_atomic = on;
        self
    }

    /// Whether to model what was seen in a cluster (README, Fault tests): a write
    /// that lands on a message after its TTL ran out, before the server marked the
    /// expiry, is acknowledged and then wiped by the marker (`Nats-Rollup: sub`).
    /// On by default. The holder worlds failed with it (a renewal landing late, then
    /// confirmed, wiped under a believing holder) until the service answered such a
    /// renewal `lost` and holders learned to wait the marker out.
    pub fn with_rollup_wipe(mut self, on: bool) -> Self {
        self.rollup_wipes_late_writes = on;
        self
    }

    /// The same empty stream with another seed for the late expiries.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// How late message `seq` expires: seeded, 0 to [`MAX_LATE_EXPIRY_MS`] ms.
    fn late_ms(&self, seq: u64) -> u64 {
        // splitmix64 of the seed and the sequence.
        let mut z = self.seed ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % (MAX_LATE_EXPIRY_MS + 1)
    }

    /// The lease a key holds now by its TTL: a live record whose TTL has not run
    /// out (a message expired but not yet marked is still [`SimJetStream::live`]).
    pub fn leased(&self, key: &str) -> Option<(LeaseRecord, u64)> {
        let msg = self.current.get(key)?;
        if msg.expires_ms().is_some_and(|end| end <= self.now_ms) {
            return None;
        }
        Some((msg.record()?, msg.seq))
    }

    /// A deposed leader that still believes it leads, frozen at this state.
    pub fn deposed(&self) -> Self {
        Self {
            deposed: true,
            ..self.clone()
        }
    }

    /// The wall time now.
    pub fn wall(&self) -> OffsetDateTime {
        self.epoch + Duration::from_millis(self.now_ms)
    }

    /// The last message of a key, if any.
    pub fn current(&self, key: &str) -> Option<&SimMsg> {
        self.current.get(key)
    }

    /// The live lease of a key: its record and revision.
    pub fn live(&self, key: &str) -> Option<(LeaseRecord, u64)> {
        let msg = self.current.get(key)?;
        Some((msg.record()?, msg.seq))
    }

    /// Moves the clock on, expiring what is due in time order, each message up to
    /// [`MAX_LATE_EXPIRY_MS`] after its TTL.
    pub fn advance(&mut self, ms: u64) {
        let until = self.now_ms + ms;
        loop {
            let due = self
                .current
                .values()
                .filter_map(|m| m.removed_ms().map(|at| (at, m.key.clone())))
                .chain(self.doomed.iter().map(|(k, at)| (*at, k.clone())))
                .filter(|(at, _)| *at <= until)
                .min();
            let Some((at, key)) = due else { break };
            self.now_ms = self.now_ms.max(at);
            if self.doomed.get(&key) == Some(&at) {
                // The marker of a message replaced after its end: it rolls up
                // whatever the key holds now.
                self.doomed.remove(&key);
                if self
                    .current
                    .get(&key)
                    .is_some_and(|m| m.kind != MsgKind::Marker)
                {
                    self.mark(key);
                }
                continue;
            }
            let msg = self.current.remove(&key).expect("due message exists");
            if msg.kind != MsgKind::Marker {
                self.mark(key);
            }
        }
        self.now_ms = until;
    }

    fn mark(&mut self, key: String) {
        self.store(
            key,
            MsgKind::Marker,
            vec![(HDR_MARKER_REASON.to_string(), "MaxAge".to_string())],
            Vec::new(),
            Some(1000),
        );
    }

    fn store(
        &mut self,
        key: String,
        kind: MsgKind,
        headers: Vec<(String, String)>,
        data: Vec<u8>,
        ttl_ms: Option<u64>,
    ) -> u64 {
        if let Some(old) = self.current.get(&key)
            && old.kind != MsgKind::Marker
            && old.expires_ms().is_some_and(|end| end <= self.now_ms)
            && let Some(at) = old.removed_ms()
            && self.rollup_wipes_late_writes
        {
            self.doomed.entry(key.clone()).or_insert(at);
        }
        self.last_seq += 1;
        let msg = SimMsg {
            seq: self.last_seq,
            key: key.clone(),
            kind,
            headers,
            data,
            time_ms: self.now_ms,
            ttl_ms,
            late_ms: self.late_ms(self.last_seq),
        };
        self.log.push(msg.clone());
        self.current.insert(key, msg);
        self.last_seq
    }

    /// The message stored at `seq`, from the log.
    pub fn at(&self, seq: u64) -> Option<&SimMsg> {
        // The log is in sequence order.
        let i = self.log.binary_search_by_key(&seq, |m| m.seq).ok()?;
        self.log.get(i)
    }

    /// Answers a request as nats-server would.
    pub fn handle(&mut self, req: &NatsRequest) -> RequestOutcome {
        if let Some((_, id)) = req
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(HDR_BATCH_ID))
        {
            let id = id.clone();
            return self.batch_message(&id, req);
        }
        if let Some(key) = kv_key(&req.subject) {
            return self.publish(key, req);
        }
        if req.subject == format!("$JS.API.STREAM.MSG.GET.{STREAM}") {
            return self.msg_get(req);
        }
        RequestOutcome::NoResponders
    }

    fn publish(&mut self, key: &str, req: &NatsRequest) -> RequestOutcome {
        match self.check(key, req, &BTreeSet::new()) {
            Err(answer) => answer,
            // Proposed, but no quorum will ever commit it.
            Ok(_) if self.deposed => RequestOutcome::TimedOut,
            Ok(p) => {
                let seq = self.store(p.key, p.kind, p.headers, p.data, p.ttl_ms);
                RequestOutcome::reply(json!({"stream": STREAM, "seq": seq}).to_string())
            }
        }
    }

    /// The checks a publish passes before it is stored, against the stream as it
    /// is; `written` holds the subjects an atomic batch wrote before this message.
    fn check(
        &self,
        key: &str,
        req: &NatsRequest,
        written: &BTreeSet<String>,
    ) -> Result<Prepared, RequestOutcome> {
        let header = |name: &str| {
            req.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        // The checked subject is the published one unless the header names another.
        let checked_subject =
            header(HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT).unwrap_or(&req.subject);
        let checked = match header(HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT) {
            None => Some(key),
            Some(subject) => kv_key(subject),
        };
        match (header(HDR_EXPECTED_LAST_SUBJECT_SEQUENCE), checked) {
            (None, _) if header(HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT).is_some() => {
                return Err(api_error(
                    400,
                    10193,
                    "missing sequence for expected last sequence per subject",
                ));
            }
            (None, _) => {}
            // A subject this batch already wrote: the server cannot check it.
            (Some(_), _) if written.contains(checked_subject) => {
                return Err(api_error(400, 10164, "wrong last sequence"));
            }
            (Some(_), None) => return Err(api_error(400, 10071, "wrong last sequence: 0")),
            (Some(expected), Some(checked)) => {
                let last = self.current.get(checked).map_or(0, |m| m.seq);
                if expected.parse::<u64>().ok() != Some(last) {
                    return Err(api_error(
                        400,
                        10071,
                        &format!("wrong last sequence: {last}"),
                    ));
                }
            }
        }
        let ttl_ms = match header(HDR_TTL) {
            None => None,
            Some(v) => match v.strip_suffix('s').and_then(|s| s.parse::<u64>().ok()) {
                Some(secs) if secs >= 1 => Some(secs * 1000),
                _ => return Err(api_error(400, 10165, "invalid per-message TTL")),
            },
        };
        let kind = match header(HDR_KV_OPERATION) {
            Some("DEL") | Some("PURGE") => MsgKind::Tombstone,
            _ => MsgKind::Value,
        };
        let headers = req
            .headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.clone()))
            .collect();
        Ok(Prepared {
            key: key.to_string(),
            kind,
            headers,
            data: req.payload.clone(),
            ttl_ms,
        })
    }

    /// A publish without a reply subject (an atomic batch's messages before its
    /// commit): handled as [`SimJetStream::handle`] does, the answer dropped.
    pub fn handle_publish(&mut self, req: &NatsRequest) {
        let _ = self.handle(req);
    }

    /// Atomic batches open on the stream now.
    pub fn open_batches(&self) -> usize {
        self.batches.len()
    }

    /// One message of an ADR-50 atomic batch, as nats-server 2.12+ answers it:
    /// staged until the commit, then all checked against the stream as it was
    /// before the batch and stored together, or none.
    fn batch_message(&mut self, id: &str, req: &NatsRequest) -> RequestOutcome {
        let header = |name: &str| {
            req.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        if !self.allow_atomic {
            return api_error(400, 10174, "atomic publish is disabled");
        }
        if id.len() > 64 {
            return api_error(400, 10179, "atomic publish batch ID is invalid");
        }
        let Some(seq) = header(HDR_BATCH_SEQUENCE).and_then(|v| v.parse::<u64>().ok()) else {
            return api_error(400, 10175, "atomic publish sequence is missing");
        };
        let commit = header(HDR_BATCH_COMMIT);
        let incomplete = || api_error(400, 10176, "atomic publish batch is incomplete");
        let too_large = || api_error(400, 10199, "atomic publish batch is too large: 1000");
        if !self.batches.contains_key(id) {
            if seq != 1 {
                return if seq > SIM_MAX_BATCH {
                    too_large()
                } else {
                    incomplete()
                };
            }
            if self.batches.len() >= SIM_MAX_OPEN_BATCHES {
                return api_error(429, 10210, "atomic publish too many inflight");
            }
            self.batches.insert(id.to_string(), Vec::new());
        }
        if commit.is_some_and(|c| c != "1") {
            self.batches.remove(id);
            return api_error(400, 10200, "atomic publish batch commit is invalid");
        }
        let staged = self.batches.get_mut(id).expect("opened above");
        if staged.len() as u64 + 1 != seq {
            self.batches.remove(id);
            return incomplete();
        }
        if seq > SIM_MAX_BATCH {
            self.batches.remove(id);
            return too_large();
        }
        staged.push(req.clone());
        if commit.is_none() {
            return RequestOutcome::reply(Vec::new());
        }
        let staged = self.batches.remove(id).expect("staged above");
        let mut written = BTreeSet::new();
        let mut prepared = Vec::with_capacity(staged.len());
        for m in &staged {
            let Some(key) = kv_key(&m.subject) else {
                return incomplete();
            };
            match self.check(key, m, &written) {
                Ok(p) => prepared.push(p),
                Err(answer) => return answer,
            }
            written.insert(m.subject.clone());
        }
        if self.deposed {
            return RequestOutcome::TimedOut;
        }
        let n = prepared.len();
        let mut last = 0;
        for p in prepared {
            last = self.store(p.key, p.kind, p.headers, p.data, p.ttl_ms);
        }
        self.batches_committed += 1;
        RequestOutcome::reply(
            json!({"stream": STREAM, "seq": last, "batch": id, "count": n}).to_string(),
        )
    }

    fn msg_get(&self, req: &NatsRequest) -> RequestOutcome {
        let body: serde_json::Value = serde_json::from_slice(&req.payload).unwrap_or_default();
        if let Some(filter) = body["next_by_subj"].as_str() {
            // A scan: the first message at or after `seq`; the simulator keeps the
            // one stream's subjects only.
            if filter != format!("$KV.{}.>", crate::subjects::BUCKET) {
                return api_error(400, 10003, "bad request");
            }
            let from = body["seq"].as_u64().unwrap_or(0);
            return match self
                .current
                .values()
                .filter(|m| m.seq >= from)
                .min_by_key(|m| m.seq)
            {
                None => api_error(404, 10037, "no message found"),
                Some(m) => RequestOutcome::reply(stored_message_json(self.epoch, m)),
            };
        }
        let subject = body["last_by_subj"].as_str().unwrap_or_default();
        let Some(key) = kv_key(subject) else {
            return api_error(400, 10003, "bad request");
        };
        match self.current.get(key) {
            None => api_error(404, 10037, "no message found"),
            Some(m) => {
                if m.kind != MsgKind::Marker && m.expires_ms().is_some_and(|end| end <= self.now_ms)
                {
                    let n = &self.expired_unmarked_reads;
                    n.set(n.get() + 1);
                }
                RequestOutcome::reply(stored_message_json(self.epoch, m))
            }
        }
    }
}

/// The MSG.GET reply body for a stored message, as nats-server shapes it.
pub fn stored_message_json(epoch: OffsetDateTime, m: &SimMsg) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut block = String::from("NATS/1.0\r\n");
    for (n, v) in &m.headers {
        block.push_str(&format!("{n}: {v}\r\n"));
    }
    block.push_str("\r\n");
    let time = crate::record::format_time(epoch + Duration::from_millis(m.time_ms));
    json!({
        "type": "io.nats.jetstream.api.v1.stream_msg_get_response",
        "message": {
            "subject": crate::subjects::kv_subject(&m.key),
            "seq": m.seq,
            "hdrs": b64.encode(block.as_bytes()),
            "data": b64.encode(&m.data),
            "time": time,
        }
    })
    .to_string()
}

/// A JetStream API error reply.
pub fn api_error(code: u64, err_code: u64, description: &str) -> RequestOutcome {
    RequestOutcome::reply(
        json!({"error": {"code": code, "err_code": err_code, "description": description}})
            .to_string(),
    )
}

/// The header a write carried, from the simulator's log.
pub fn logged_event(m: &SimMsg) -> Option<LeaseEvent> {
    m.headers
        .iter()
        .find(|(n, _)| n == HDR_LEASE_EVENT)
        .and_then(|(_, v)| LeaseEvent::parse(v))
}

/// The key of a KV subject `$KV.leases.<key>...`, built from [`crate::subjects::BUCKET`].
fn kv_key(subject: &str) -> Option<&str> {
    subject
        .strip_prefix("$KV.")?
        .strip_prefix(crate::subjects::BUCKET)?
        .strip_prefix('.')
}
