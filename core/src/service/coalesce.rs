//! The write coalescer: JetStream writes that arrive while one is in flight gather
//! and go as one ADR-50 atomic batch when it returns.
//!
//! A write alone goes out at once as a plain publish, so there is no added wait at
//! one write in flight. A batch is all or nothing on the server: one failed
//! expected-sequence check fails every message in it, so a batch answered with an
//! error is retried as single writes and each write gets the outcome it would have
//! had alone. Without atomic batches on the stream (nats-server before 2.12, or
//! `allow_atomic` off) every write goes single, at once.
//!
//! # The batch on the wire (ADR-50, nats-server `server/stream.go`)
//!
//! Every message of a batch carries `Nats-Batch-Id` (at most 64 characters) and
//! `Nats-Batch-Sequence` (1, 2, …, with no gap); the last one also carries
//! `Nats-Batch-Commit: 1`. Each message is a publish to its own subject. Only the
//! commit gets a PubAck, with `seq` the last message's sequence and `count` the
//! batch size; message `i` of `n` is stored at `seq - n + i`. The earlier messages
//! are sent without a reply subject (the server answers them only if one is set),
//! so a batch's [`Transmit`] is `publish` (fire and forget, in order) then `request`. Any
//! failure of the batch (a wrong expected sequence: 10071, or 10164 for a subject
//! already in the batch or in flight; an incomplete batch: 10176; too many open
//! batches: 10210; atomic publish disabled: 10174) comes back on the commit's reply
//! and nothing of the batch is stored.
//!
//! # Rules
//!
//! - A write goes out at once as a plain publish while fewer than `single_window`
//!   first-time singles are out: at low load nothing waits and nothing is batched.
//! - Past that, writes queue. The queue goes out as a batch of at most `max_batch`
//!   writes once it holds `min_batch` (and fewer than `max_in_flight` batches are
//!   out); a shorter queue waits for a single to come back, and then its front goes
//!   single. Measured on nats-server 2.15.1 with `sync_interval: always`, an R1
//!   batch commit takes about 10 ms and 5 fsyncs whatever its size, against 0.3 ms
//!   and one fsync for a single publish, so only a batch of many pays.
//! - A batch holds at most one write per checked subject (the published one, or
//!   the one `Nats-Expected-Last-Subject-Sequence-Subject` names): the server fails
//!   a batch that checks a subject already written in it (10164). A write whose
//!   subject is taken waits for the next batch, in arrival order.
//! - Nor does a batch take a write to or checking a subject that a write out (a
//!   single or a batch not yet answered) also touches: a replicated stream refuses
//!   a check on a subject whose last write is still in process (10071, nats-server
//!   `checkMsgHeadersPreClusteredProposal`), and one refusal fails every write of
//!   the batch. Such a write waits in the queue until that subject is back.
//! - A batch answered with a JetStream error is retried as singles at once (outside
//!   the windows); 10174 also turns batches off for good.
//! - A batch whose commit gets no reply (timed out, no responders, failed) may or
//!   may not have been stored: every write in it gets that same outcome, as a
//!   single write would, and none is retried.
//!
//! The machine reads no clock and sets no timer: each write's deadline belongs to
//! the call that asked for it; a send's timeout is the shortest of its writes'.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Instant;

use serde::Deserialize;

use crate::io::{NatsRequest, RequestOutcome, Transmit, TransmitId, TransmitKind};
use crate::outbox::Ids;

use crate::shard::ShardMap;
use crate::subjects::HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT;

/// ADR-50's batch id header.
pub const HDR_BATCH_ID: &str = "Nats-Batch-Id";
/// ADR-50's batch sequence header (1-based, no gaps).
pub const HDR_BATCH_SEQUENCE: &str = "Nats-Batch-Sequence";
/// ADR-50's commit header, `1` on the last message.
pub const HDR_BATCH_COMMIT: &str = "Nats-Batch-Commit";
/// The server's limit on messages in one atomic batch.
pub const SERVER_MAX_BATCH: usize = 1000;
/// The server's limit on open atomic batches per stream.
pub const SERVER_MAX_OPEN_BATCHES: usize = 50;
/// JetStream's error code for atomic publish disabled on the stream.
pub const ERR_ATOMIC_DISABLED: u64 = 10174;

/// The default bound on writes in one batch. An R1 batch costs the stream's one
/// goroutine a fixed 2.6 ms or so (a staging store of its own, created and deleted)
/// whatever its size, so a stream's write throughput grows with the batch: with
/// batches of at most 64 one stream held 75,000 leases and with 256 it held
/// 150,000 (docs/benchmarks.md, capacity). The server takes 1,000, but one wrong
/// expected sequence fails the whole batch and costs a retry of every write in it
/// as singles, and that cost grows with the batch too.
pub const DEFAULT_MAX_BATCH: usize = 256;

/// The default number of first-time singles out at once before writes gather, on
/// a single-replica stream: at 16 calls in flight or fewer every write goes alone,
/// at once.
pub const DEFAULT_SINGLE_WINDOW: usize = 16;
/// The default single window on a replicated stream. There the Raft log already
/// groups queued writes, so batches cost throughput at 64 writes in flight (0.74
/// to 0.94 of singles with a window of 16) but save the servers' CPU at capacity
/// (three nodes held 150,000 leases with batches, 100,000 without; a window of 256
/// started them too late: docs/benchmarks.md). At 64 calls in flight or fewer
/// every write goes alone, at once.
pub const DEFAULT_REPLICATED_SINGLE_WINDOW: usize = 64;

/// The single window for a stream of `replicas` (as startup finds it): the
/// operator's `batch_after` where given, else [`DEFAULT_SINGLE_WINDOW`] on one
/// replica and [`DEFAULT_REPLICATED_SINGLE_WINDOW`] on more.
pub fn single_window(batch_after: Option<usize>, replicas: usize) -> usize {
    batch_after.unwrap_or(if replicas <= 1 {
        DEFAULT_SINGLE_WINDOW
    } else {
        DEFAULT_REPLICATED_SINGLE_WINDOW
    })
}

/// The default smallest batch: an R1 batch costs 5 fsyncs (the batch probe), so one
/// of fewer writes than this saves nothing over singles.
pub const DEFAULT_MIN_BATCH: usize = 16;
/// The default number of batches out at once: enough that the stream's goroutine
/// has the next batch while an ack travels back (4 held 75,000 leases with batches
/// of 64 and none of 100,000; 8 with batches of 256 held 150,000), far under the
/// server's 50 open batches a stream. At 256 writes in flight 8 renewed 0.84 to
/// 0.88 as fast as 4 batches of 64 had, where 4 of 256 renewed 1.03 (one run each,
/// docs/benchmarks.md): 4 against 8 at capacity is still to be measured.
pub const DEFAULT_BATCHES_IN_FLIGHT: usize = 8;

/// Whether a service sends its writes through the coalescer (`serve
/// --coalesce-writes`): `auto` (the default), always, or never. `auto` is on
/// wherever the stream takes atomic batches, with the single window of its
/// replicas ([`single_window`]): the advised server runs `sync_interval: always`
/// (docs/operations.md), where batches are what let one stream, and three nodes,
/// hold as many leases as etcd (docs/benchmarks.md). A server on the lazy default
/// sync (against the advice) should be given `false`: there batches cut write
/// throughput at 64 in flight to a third.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CoalesceWrites {
    /// The service's choice, as [`coalesce_on`] makes it: today on wherever the
    /// stream takes atomic batches, as `On`.
    #[default]
    Auto,
    /// On whenever the stream takes atomic batches.
    On,
    /// Every write alone, straight.
    Off,
}

impl std::str::FromStr for CoalesceWrites {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "true" | "on" => Ok(Self::On),
            "false" | "off" => Ok(Self::Off),
            _ => Err(format!(
                "--coalesce-writes: `{s}` is not one of auto, true (on), false (off)"
            )),
        }
    }
}

/// Whether writes go through the coalescer, on a stream that does (`atomic`) or
/// does not take atomic batches.
///
/// `Auto` is on, with the window its replicas get ([`single_window`]). Measured
/// with `scripts/bench` (docs/benchmarks.md): on one server with `sync_interval:
/// always` every write is its own fsync, and with 256 writes in flight batches
/// lifted acquire, renew and release 1.8 to 2.5 times; with 16 or 64 in flight the
/// window keeps most writes single, so nothing is lost there. On three nodes the
/// Raft log already groups queued writes, and with 256 in flight batches cost
/// acquire and release 0.85 and 0.60 of singles (renew 0.99), but at capacity they
/// held 150,000 leases where singles held 100,000 and then stalled; the wider
/// window there keeps every write single up to 64 in flight.
pub fn coalesce_on(setting: CoalesceWrites, atomic: bool) -> bool {
    atomic
        && match setting {
            CoalesceWrites::On | CoalesceWrites::Auto => true,
            CoalesceWrites::Off => false,
        }
}

/// How the coalescer batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoalescerConfig {
    /// Whether the stream takes atomic batches (2.12+ with `allow_atomic`).
    pub atomic: bool,
    /// At most this many writes per batch (clamped to 1..=[`SERVER_MAX_BATCH`]).
    pub max_batch: usize,
    /// At most this many batches out at once (clamped to
    /// 1..=[`SERVER_MAX_OPEN_BATCHES`]).
    pub max_in_flight: usize,
    /// First-time singles out at once before writes start to gather (at least 1).
    pub single_window: usize,
    /// A queue goes out as a batch once it holds this many writes (clamped to
    /// 2..=`max_batch`); a shorter one waits for a single to come back.
    pub min_batch: usize,
    /// Batch ids are this prefix and a counter: make it unique per process (the
    /// server keys open batches by id, per stream). At most 44 characters.
    pub batch_id_prefix: String,
}

impl CoalescerConfig {
    /// Batches on, with the defaults ([`DEFAULT_MAX_BATCH`],
    /// [`DEFAULT_BATCHES_IN_FLIGHT`], [`DEFAULT_SINGLE_WINDOW`], [`DEFAULT_MIN_BATCH`]).
    pub fn atomic(batch_id_prefix: impl Into<String>) -> Self {
        Self {
            atomic: true,
            max_batch: DEFAULT_MAX_BATCH,
            max_in_flight: DEFAULT_BATCHES_IN_FLIGHT,
            single_window: DEFAULT_SINGLE_WINDOW,
            min_batch: DEFAULT_MIN_BATCH,
            batch_id_prefix: batch_id_prefix.into(),
        }
    }

    /// Every write single, at once.
    pub fn single() -> Self {
        Self {
            atomic: false,
            max_batch: 1,
            max_in_flight: 1,
            single_window: 1,
            min_batch: 2,
            batch_id_prefix: String::new(),
        }
    }
}

/// What [`Coalescer::pending`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritesPending {
    /// Writes queued, not sent yet.
    pub queued: usize,
    /// Sends out (a single write or a batch each), waiting for their outcome.
    pub sent: usize,
}

/// What [`Coalescer::batch_counts`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchCounts {
    /// Batches sent.
    pub sent: u64,
    /// Batches answered with an error (their writes retried as singles).
    pub failed: u64,
}

/// What the coalescer reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoalescerEvent {
    /// This write is finished: feed `outcome` to the call that asked for it, as
    /// the outcome of its own request.
    Outcome {
        /// The write: the id its owner gave the call's request.
        write: TransmitId,
        /// What a single write would have been answered.
        outcome: RequestOutcome,
    },
}

#[derive(Debug, Clone)]
struct Write {
    id: TransmitId,
    request: NatsRequest,
}

impl Write {
    fn checked_subject(&self) -> &str {
        self.request
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT))
            .map_or(self.request.subject.as_str(), |(_, v)| v.as_str())
    }

    /// The subjects it publishes to and checks (one, or two for a read
    /// confirmation).
    fn subjects(&self) -> impl Iterator<Item = &str> {
        let published = self.request.subject.as_str();
        let checked = self.checked_subject();
        std::iter::once(published).chain((checked != published).then_some(checked))
    }
}

#[derive(Debug)]
enum Flight {
    /// A first-time single write (counts against `single_window`).
    Single(Write),
    /// A single write retried after its batch failed (outside the windows).
    Retry(Write),
    /// A batch.
    Batch(Vec<Write>),
}

/// The coalescer. See the module docs for its rules.
#[derive(Debug)]
pub struct Coalescer {
    config: CoalescerConfig,
    queue: VecDeque<Write>,
    in_flight: BTreeMap<TransmitId, Flight>,
    /// First-time singles out (not retries).
    singles: usize,
    /// Batches out.
    batches: usize,
    next_batch: u64,
    /// Sends decided and not yet handed out (their id comes from the owner).
    unsent: VecDeque<(Transmit, Flight)>,
    events: VecDeque<CoalescerEvent>,
    batches_sent: u64,
    batches_failed: u64,
    /// Writes cancelled while out in a batch: if the batch fails they are not
    /// sent again alone (their call gave up and was answered).
    cancelled: HashSet<TransmitId>,
    /// How many writes out (sent or about to be) publish to or check each
    /// subject: a batch takes no write of these ([`Coalescer::take_batch`]).
    out_subjects: HashMap<String, usize>,
}

impl Coalescer {
    /// A coalescer with nothing in flight.
    pub fn new(mut config: CoalescerConfig, _now: Instant) -> Self {
        config.max_batch = config.max_batch.clamp(1, SERVER_MAX_BATCH);
        config.max_in_flight = config.max_in_flight.clamp(1, SERVER_MAX_OPEN_BATCHES);
        config.single_window = config.single_window.max(1);
        if config.max_batch == 1 {
            config.atomic = false;
        }
        config.min_batch = config
            .min_batch
            .clamp(2.min(config.max_batch), config.max_batch);
        Self {
            config,
            queue: VecDeque::new(),
            in_flight: BTreeMap::new(),
            singles: 0,
            batches: 0,
            next_batch: 0,
            unsent: VecDeque::new(),
            events: VecDeque::new(),
            batches_sent: 0,
            batches_failed: 0,
            cancelled: HashSet::new(),
            out_subjects: HashMap::new(),
        }
    }

    /// Whether batches are on (turned off for good by a 10174 answer).
    pub fn atomic(&self) -> bool {
        self.config.atomic
    }

    /// Batches sent and batches answered with an error (retried as singles).
    pub fn batch_counts(&self) -> BatchCounts {
        BatchCounts {
            sent: self.batches_sent,
            failed: self.batches_failed,
        }
    }

    /// A write to send: a JetStream publish as the call built it.
    /// `id` is the id its owner gave the call's request: the write's result
    /// comes back with it ([`CoalescerEvent::Outcome`]).
    pub fn handle_write(&mut self, _now: Instant, id: TransmitId, request: NatsRequest) {
        self.queue.push_back(Write { id, request });
        self.dispatch();
    }

    /// The caller of a write gave up on it (its call timed out or was cut off):
    /// dropped if it has not gone out yet, and then no result comes for it; once
    /// sent it runs its course and its result comes as usual.
    pub fn handle_cancel(&mut self, _now: Instant, id: TransmitId) {
        let queued = self.queue.len();
        self.queue.retain(|w| w.id != id);
        let out_in_a_batch = self
            .in_flight
            .values()
            .chain(self.unsent.iter().map(|(_, f)| f))
            .any(|f| match f {
                Flight::Batch(writes) => writes.iter().any(|w| w.id == id),
                _ => false,
            });
        if self.queue.len() == queued && out_in_a_batch {
            self.cancelled.insert(id);
        }
    }

    /// The outcome of a transmit's `request`.
    pub fn handle_outcome(&mut self, _now: Instant, id: TransmitId, outcome: RequestOutcome) {
        let Some(flight) = self.in_flight.remove(&id) else {
            return;
        };
        match flight {
            Flight::Single(w) => {
                self.singles -= 1;
                self.back(&w);
                self.hand_back(w.id, outcome);
            }
            Flight::Retry(w) => {
                self.back(&w);
                self.hand_back(w.id, outcome);
            }
            Flight::Batch(writes) => {
                self.batches -= 1;
                for w in &writes {
                    self.back(w);
                }
                self.batch_outcome(writes, outcome);
            }
        }
        self.dispatch();
    }

    /// The next send: a single write, or a batch (its messages before the commit
    /// in `publish`, the commit as `request`), under an id from its owner's `ids`:
    /// feed its outcome back with it. Drain after every input.
    pub fn poll_transmit(&mut self, ids: &mut Ids<TransmitId>) -> Option<Transmit> {
        let (mut transmit, flight) = self.unsent.pop_front()?;
        transmit.id = ids.allocate();
        self.in_flight.insert(transmit.id, flight);
        Some(transmit)
    }

    /// The next write finished. Drain after every input.
    pub fn poll_event(&mut self) -> Option<CoalescerEvent> {
        self.events.pop_front()
    }

    /// Nothing queued, nothing in flight, nothing to poll.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
            && self.in_flight.is_empty()
            && self.unsent.is_empty()
            && self.events.is_empty()
    }

    /// The writes a send in flight carries, in order (empty once answered).
    pub fn writes_of(&self, send: TransmitId) -> Vec<TransmitId> {
        match self.in_flight.get(&send) {
            None => Vec::new(),
            Some(Flight::Single(w) | Flight::Retry(w)) => vec![w.id],
            Some(Flight::Batch(ws)) => ws.iter().map(|w| w.id).collect(),
        }
    }

    /// Writes waiting and sends out.
    pub fn pending(&self) -> WritesPending {
        WritesPending {
            queued: self.queue.len(),
            sent: self.in_flight.len() + self.unsent.len(),
        }
    }

    fn hand_back(&mut self, write: TransmitId, outcome: RequestOutcome) {
        self.cancelled.remove(&write);
        self.events
            .push_back(CoalescerEvent::Outcome { write, outcome });
    }

    fn dispatch(&mut self) {
        if !self.config.atomic {
            // Everything single, at once.
            while let Some(w) = self.queue.pop_front() {
                self.send_single(w, false);
            }
            return;
        }
        loop {
            if self.singles < self.config.single_window {
                let Some(w) = self.queue.pop_front() else {
                    return;
                };
                self.send_single(w, false);
            } else if self.batches < self.config.max_in_flight
                && self.first_stream_queued() >= self.config.min_batch
            {
                let batch = self.take_batch();
                if batch.len() < 2 {
                    // Every queued write checks one subject: they go single, one
                    // after another, as singles come back (one is out: the window
                    // is full).
                    for w in batch.into_iter().rev() {
                        self.queue.push_front(w);
                    }
                    return;
                }
                self.send_batch(batch);
            } else {
                return;
            }
        }
    }

    /// How many queued writes go to the stream of the first one, up to `min_batch`:
    /// a batch is that stream's alone, so on a sharded bucket `min_batch` counts
    /// them, not the whole queue (all of it with one shard).
    fn first_stream_queued(&self) -> usize {
        let Some(first) = self.queue.front() else {
            return 0;
        };
        let stream = ShardMap::bucket_of_subject(&first.request.subject);
        self.queue
            .iter()
            .filter(|w| ShardMap::bucket_of_subject(&w.request.subject) == stream)
            // Counting stops at `min_batch`: all that is asked is whether one is there.
            .take(self.config.min_batch)
            .count()
    }

    /// A write goes out: its subjects count as out until it comes back.
    fn out(&mut self, w: &Write) {
        for subject in w.subjects() {
            *self.out_subjects.entry(subject.to_string()).or_default() += 1;
        }
    }

    /// A write came back.
    fn back(&mut self, w: &Write) {
        for subject in w.subjects() {
            if let Some(n) = self.out_subjects.get_mut(subject) {
                *n -= 1;
                if *n == 0 {
                    self.out_subjects.remove(subject);
                }
            }
        }
    }

    /// Up to `max_batch` writes from the queue, at most one per checked subject,
    /// in arrival order; the rest stay queued in order. A write to or checking a
    /// subject some write out also touches waits: a replicated stream refuses a
    /// check on a subject with a write still in process (10071), and one refusal
    /// fails the whole batch.
    fn take_batch(&mut self) -> Vec<Write> {
        // Which queued writes go, chosen by index first (sets of the subjects taken,
        // so a long queue costs one pass, not a comparison with every write taken).
        let mut chosen = vec![false; self.queue.len()];
        {
            let mut checked: HashSet<&str> = HashSet::new();
            let mut published: HashSet<&str> = HashSet::new();
            // An atomic batch is one stream's: a sharded bucket's writes to another
            // shard wait for a batch of their own.
            let stream = self
                .queue
                .front()
                .map(|w| ShardMap::bucket_of_subject(&w.request.subject));
            let mut taken = 0;
            for (i, w) in self.queue.iter().enumerate() {
                if taken == self.config.max_batch {
                    break;
                }
                let subject = w.request.subject.as_str();
                if Some(ShardMap::bucket_of_subject(subject)) != stream
                    || checked.contains(w.checked_subject())
                    || published.contains(subject)
                    || w.subjects().any(|s| self.out_subjects.contains_key(s))
                {
                    continue;
                }
                checked.insert(w.checked_subject());
                published.insert(subject);
                chosen[i] = true;
                taken += 1;
            }
        }
        let mut batch = Vec::new();
        let mut rest = VecDeque::with_capacity(self.queue.len());
        for (w, go) in self.queue.drain(..).zip(chosen) {
            if go {
                batch.push(w);
            } else {
                rest.push_back(w);
            }
        }
        self.queue = rest;
        batch
    }

    fn send_single(&mut self, w: Write, retry: bool) {
        self.out(&w);
        let transmit = Transmit::new(TransmitId::UNSENT, TransmitKind::Write, w.request.clone());
        let flight = if retry {
            Flight::Retry(w)
        } else {
            self.singles += 1;
            Flight::Single(w)
        };
        self.unsent.push_back((transmit, flight));
    }

    fn send_batch(&mut self, batch: Vec<Write>) {
        for w in &batch {
            self.out(w);
        }
        self.next_batch += 1;
        self.batches_sent += 1;
        let batch_id = format!("{}{}", self.config.batch_id_prefix, self.next_batch);
        let n = batch.len();
        let timeout = batch
            .iter()
            .map(|w| w.request.timeout)
            .min()
            .expect("a batch is not empty");
        let mut messages: Vec<NatsRequest> = batch
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let mut r = w.request.clone();
                r.headers.push((HDR_BATCH_ID, batch_id.clone()));
                r.headers.push((HDR_BATCH_SEQUENCE, (i + 1).to_string()));
                if i + 1 == n {
                    r.headers.push((HDR_BATCH_COMMIT, "1".to_string()));
                }
                r.timeout = timeout;
                r
            })
            .collect();
        let request = messages.pop().expect("a batch is not empty");
        self.batches += 1;
        let transmit = Transmit {
            id: TransmitId::UNSENT,
            kind: TransmitKind::Write,
            publish: messages,
            request,
        };
        self.unsent.push_back((transmit, Flight::Batch(batch)));
    }

    fn batch_outcome(&mut self, writes: Vec<Write>, outcome: RequestOutcome) {
        let RequestOutcome::Reply { payload, .. } = &outcome else {
            // Stored or not, nobody knows: as a single write would have been told.
            for w in writes {
                self.hand_back(w.id, outcome.clone());
            }
            return;
        };
        #[derive(Deserialize)]
        struct BatchAck {
            #[serde(default)]
            stream: Option<String>,
            #[serde(default)]
            seq: Option<u64>,
            #[serde(default)]
            count: Option<u64>,
            #[serde(default)]
            error: Option<crate::js::ApiError>,
        }
        let ack: Option<BatchAck> = serde_json::from_slice(payload).ok();
        let n = writes.len() as u64;
        match ack {
            Some(BatchAck {
                error: Some(err), ..
            }) => {
                // Nothing of the batch is stored: each write goes again alone.
                self.batches_failed += 1;
                if err.err_code == ERR_ATOMIC_DISABLED {
                    self.config.atomic = false;
                }
                for w in writes {
                    if self.cancelled.remove(&w.id) {
                        // Its call gave up: finished unsent, never out again.
                        self.hand_back(w.id, RequestOutcome::TimedOut);
                    } else {
                        self.send_single(w, true);
                    }
                }
            }
            Some(BatchAck {
                stream,
                seq: Some(last),
                count,
                error: None,
            }) if count.unwrap_or(n) == n && last >= n => {
                let stream = stream.unwrap_or_default();
                for (i, w) in writes.into_iter().enumerate() {
                    let seq = last - n + 1 + i as u64;
                    let body = serde_json::json!({"stream": stream, "seq": seq}).to_string();
                    self.hand_back(w.id, RequestOutcome::reply(body));
                }
            }
            _ => {
                // An ack this machine cannot read: the batch may be stored, so no
                // retry, and no write may take the ack's sequence as its own.
                for w in writes {
                    self.hand_back(
                        w.id,
                        RequestOutcome::Failed("unreadable atomic batch ack".to_string()),
                    );
                }
            }
        }
    }
}
