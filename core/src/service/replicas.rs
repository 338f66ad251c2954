//! The service's replicas re-check: every [`REPLICAS_RECHECK`] it asks the leases
//! stream's config again, and says when read confirmation must turn on or off (on
//! while the stream has more than one replica: with one there is no other leader
//! whose stale state a read could return).
//!
//! The same answer tells whether the stream is still the one the service has been
//! serving: its `created` time. A stream deleted and made anew reuses sequences,
//! so what the service knew of its keys' revisions ([`crate::known`]) is then
//! forgotten ([`ReplicasCheckEvent::StreamReplaced`]).
//!
//! On a sharded bucket ([`crate::shard`]) each period asks every shard's stream,
//! one after another: reads are confirmed while any has more than one replica,
//! and any stream made anew says [`ReplicasCheckEvent::StreamReplaced`] (the service
//! then forgets every known revision: more than needed, never less).
//!
//! Fences never repeat: each stream's highest last sequence seen is kept. A stream
//! whose last sequence is below it at two looks in a row (restored from a backup
//! under the service; one look may be a new stream leader still applying its
//! log), or made anew without a `first_seq` above it, would hand out fences
//! already used:
//! [`ReplicasCheckEvent::Rewound`] says so, and the service refuses the bucket. A
//! stream made anew whose `first_seq` is above every sequence seen (the documented
//! restore) is only [`ReplicasCheckEvent::StreamReplaced`].
//!
//! A request unanswered within its timeout, or answered without the replicas (an
//! error, JetStream unavailable), keeps what was known, and makes the bucket
//! unreachable until an answer comes ([`ReplicasCheckEvent::Reachable`], for
//! readiness); the next check comes a period after the last one was sent, so at
//! most one is in flight.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::io::{RequestOutcome, Transmit, TransmitId, TransmitKind};
use crate::js;
use crate::outbox::Ids;
use crate::service::bucket::{replicas_from_reply, stream_info_request};
use crate::shard::ShardMap;

/// How often a running service asks the stream's replicas again, to turn read
/// confirmation on or off when an operator changes them.
pub const REPLICAS_RECHECK: Duration = Duration::from_secs(10);

/// What the re-check reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicasCheckEvent {
    /// The stream is gone or was made anew (another `created` time): forget what
    /// was known of its keys' revisions.
    StreamReplaced,
    /// The stream's sequence went back under the service: its last sequence is
    /// below the highest it had, or it was made anew from a sequence at or below
    /// it. Serving it would hand out fences already used. The sentence says which.
    Rewound(String),
    /// A stream's highest last sequence seen grew: every fence handed out on it
    /// so far is at most this (a gauge; the restore procedure starts above it).
    Sequence {
        /// The stream.
        stream: String,
        /// Its highest last sequence seen.
        last_seq: u64,
    },
    /// Whether the last look at the streams got an answer (`Ok`) or why not:
    /// said when it changes.
    Reachable(Result<(), String>),
    /// The stream's replicas changed across one: confirm reads from now on, or stop.
    ConfirmReads {
        /// The stream's replicas as the server returned them.
        replicas: usize,
        /// Whether calls confirm their reads now.
        on: bool,
    },
}

/// Asks the stream's replicas now and then. See the [module docs](self).
#[derive(Debug)]
pub struct ReplicasCheck {
    every: Duration,
    timeout: Duration,
    next_at: Instant,
    /// The check in flight (its owner times it out and says so with
    /// [`RequestOutcome::TimedOut`]).
    waiting: Option<TransmitId>,
    confirm_reads: bool,
    /// Each shard's stream, its `created` time as last seen, and its replicas.
    streams: Vec<(String, Option<String>, usize)>,
    /// Each shard's stream's highest last sequence seen.
    high: Vec<u64>,
    /// The highest last sequence of the stream asked, when it was asked: its
    /// answer's last sequence cannot be below it unless the stream went back.
    floor: u64,
    /// Whether the last look got an answer, as last said.
    reachable: Result<(), String>,
    /// Each shard's stream: whether its last look found its last sequence below
    /// the highest seen. Twice in a row is a rewind; once may be a new stream
    /// leader still applying its log.
    below: Vec<bool>,
    /// Each shard's stream's last answer: reachable or why not.
    shard_reachable: Vec<Result<(), String>>,
    /// The shard asked next in this round.
    cursor: usize,
    transmits: VecDeque<Transmit>,
    events: VecDeque<ReplicasCheckEvent>,
}

impl ReplicasCheck {
    /// Checks every `every` from `now`, each request bounded by `timeout` (its
    /// owner times it out and feeds back [`RequestOutcome::TimedOut`]), starting
    /// from the `replicas` startup found.
    pub fn new(every: Duration, timeout: Duration, replicas: usize, now: Instant) -> Self {
        Self {
            every,
            timeout,
            next_at: now + every,
            waiting: None,
            confirm_reads: replicas > 1,
            streams: vec![(ShardMap::SINGLE.stream(0), None, replicas)],
            high: vec![0],
            below: vec![false],
            floor: 0,
            reachable: Ok(()),
            shard_reachable: vec![Ok(())],
            cursor: 0,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The same check over every shard's stream of `shards`.
    pub fn with_shards(self, shards: ShardMap) -> Self {
        let replicas = self.streams.first().map_or(1, |s| s.2);
        Self {
            streams: shards
                .indexes()
                .map(|i| (shards.stream(i), None, replicas))
                .collect(),
            high: vec![0; shards.count() as usize],
            below: vec![false; shards.count() as usize],
            shard_reachable: vec![Ok(()); shards.count() as usize],
            cursor: 0,
            ..self
        }
    }

    /// What startup saw of each shard's stream, by index ([`crate::service::startup::Startup::seen`]):
    /// its `created` time and last sequence are the first the check compares
    /// with, so a stream rewound before the first period is caught too.
    pub fn with_seen(mut self, seen: &[(Option<String>, u64)]) -> Self {
        for (i, (created, last_seq)) in seen.iter().enumerate().take(self.streams.len()) {
            self.streams[i].1.clone_from(created);
            self.high[i] = *last_seq;
            if *last_seq > 0 {
                self.events.push_back(ReplicasCheckEvent::Sequence {
                    stream: self.streams[i].0.clone(),
                    last_seq: *last_seq,
                });
            }
        }
        self
    }

    /// Whether calls confirm their reads, as far as the last answer said.
    pub fn confirm_reads(&self) -> bool {
        self.confirm_reads
    }

    /// A check due is sent (one in flight is timed out by the owner, which feeds
    /// back [`RequestOutcome::TimedOut`]).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.waiting.is_none() && now >= self.next_at {
            self.next_at = now + self.every;
            self.cursor = 0;
            self.ask();
        }
    }

    /// Asks again at once (or as soon as the check in flight is answered): the
    /// connection came back, and readiness waits on the bucket's answer.
    pub fn check_soon(&mut self, now: Instant) {
        self.next_at = self.next_at.min(now);
    }

    /// Asks the stream at the cursor.
    fn ask(&mut self) {
        self.floor = self.high[self.cursor];
        let id = TransmitId::UNSENT;
        self.waiting = Some(id);
        let request = stream_info_request(&self.streams[self.cursor].0, self.timeout);
        self.transmits
            .push_back(Transmit::new(id, TransmitKind::Api, request));
    }

    /// The answer to a check: an event when the replicas cross one.
    pub fn handle_outcome(&mut self, _now: Instant, id: TransmitId, outcome: RequestOutcome) {
        if self.waiting != Some(id) {
            return;
        }
        self.waiting = None;
        let asked = self.cursor;
        self.cursor += 1;
        if self.cursor < self.streams.len() {
            self.ask();
        } else {
            self.cursor = 0;
        }
        let stream = self.streams[asked].0.clone();
        let known = &mut self.streams[asked].1;
        let floor = self.floor;
        let reachable = match js::parse_api_reply(&outcome) {
            Ok(Ok(info)) => {
                let created = info
                    .get("created")
                    .and_then(|c| c.as_str())
                    .map(str::to_string);
                let number = |section: &str, field: &str| {
                    info.get(section)
                        .and_then(|s| s.get(field))
                        .and_then(serde_json::Value::as_u64)
                };
                let last = number("state", "last_seq");
                let first = number("config", "first_seq").unwrap_or(1);
                let replaced = created.is_some() && known.is_some() && created != *known;
                if created.is_some() {
                    *known = created;
                }
                let below = last.is_some_and(|last| last < floor);
                if replaced && first <= floor {
                    self.events.push_back(ReplicasCheckEvent::Rewound(format!(
                        "stream {stream} was made anew with first_seq {first}, at or below \
                         {floor} seen before: its sequences, so its fences, start again"
                    )));
                } else if replaced {
                    self.events.push_back(ReplicasCheckEvent::StreamReplaced);
                } else if below && self.below[asked] {
                    // Twice in a row: not a new stream leader still applying its log.
                    let last = last.unwrap_or_default();
                    self.events.push_back(ReplicasCheckEvent::Rewound(format!(
                        "stream {stream}'s last sequence is {last}, below {floor} seen before: \
                         it went back (restored from a backup, or made anew), and serving it \
                         would hand out fences already used"
                    )));
                }
                self.below[asked] = below && !replaced;
                if let Some(last) = last
                    && last > self.high[asked]
                {
                    self.high[asked] = last;
                    self.events.push_back(ReplicasCheckEvent::Sequence {
                        stream: stream.clone(),
                        last_seq: last,
                    });
                }
                Ok(())
            }
            Ok(Err(e)) if e.err_code == js::ERR_STREAM_NOT_FOUND => {
                if known.as_deref().is_some_and(|k| !k.is_empty()) {
                    // Kept as seen: a stream made again later is judged
                    // against the fences it had.
                    *known = Some(String::new());
                    self.events.push_back(ReplicasCheckEvent::StreamReplaced);
                }
                Err(format!("stream {stream} not found"))
            }
            Ok(Err(e)) => Err(format!(
                "stream {stream}: JetStream error {} ({}): {}",
                e.err_code, e.code, e.description
            )),
            Err(failure) => Err(format!("stream {stream}: {}", failure.detail)),
        };
        // One shard unreachable makes the bucket so.
        self.shard_reachable[asked] = reachable;
        let reachable = self
            .shard_reachable
            .iter()
            .find(|r| r.is_err())
            .cloned()
            .unwrap_or(Ok(()));
        if reachable != self.reachable {
            self.reachable = reachable.clone();
            self.events
                .push_back(ReplicasCheckEvent::Reachable(reachable));
        }
        let Some(replicas) = replicas_from_reply(&outcome) else {
            return;
        };
        self.streams[asked].2 = replicas;
        let replicas = self.streams.iter().map(|s| s.2).max().unwrap_or(replicas);
        let on = replicas > 1;
        if on != self.confirm_reads {
            self.confirm_reads = on;
            self.events
                .push_back(ReplicasCheckEvent::ConfirmReads { replicas, on });
        }
    }

    /// The next stream-info request to send.
    /// It goes under an id from its owner's `ids`: feed its outcome back with it.
    pub fn poll_transmit(&mut self, ids: &mut Ids<TransmitId>) -> Option<Transmit> {
        let mut transmit = self.transmits.pop_front()?;
        transmit.id = ids.allocate();
        if let Some(waited) = &mut self.waiting {
            *waited = transmit.id;
        }
        Some(transmit)
    }

    /// The next change of read confirmation.
    pub fn poll_event(&mut self) -> Option<ReplicasCheckEvent> {
        self.events.pop_front()
    }

    /// The next check, while none is in flight (one in flight is timed out by
    /// the owner).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.waiting.is_none().then_some(self.next_at)
    }
}
