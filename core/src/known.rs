//! What the service knows of each key's last revision without reading it, so that
//! renew and release can go straight to their conditional write, and owner on a
//! replicated bucket straight to its read confirmation.
//!
//! A stream sequence is never reused and the message stored at it never changes, so
//! a fact "revision `R` of key `k` holds this record, stored then" stays true for
//! ever; only whether `R` is still the key's *last* revision can change, and a
//! conditional write (or confirmation) expecting `R` is what proves that. The facts
//! come from the service's own writes (it knows what it wrote at the sequence the ack
//! names, and the instant before it sent it), from its leader reads, and from the
//! change events the server republishes (the record, `Nats-Sequence` and
//! `Nats-Time-Stamp`, the server's store time). See docs/architecture.md, "One
//! request per renew and release", for why a call may act on them.
//!
//! [`KnownLeases`] is a bounded map, key to the newest fact seen: an older
//! revision never replaces a newer one, and past its capacity the key learnt
//! longest ago is forgotten (a key not known costs the read it always cost, nothing else).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use crate::record::{LeaseRecord, parse_time};
use crate::subjects::{
    HDR_KV_OPERATION, HDR_MARKER_REASON, HDR_SEQUENCE, HDR_TIME_STAMP, changed_subject,
};

/// How many keys the service remembers by default: one entry is a few hundred bytes.
pub const DEFAULT_KNOWN_CAPACITY: usize = 200_000;

/// When a known revision was stored, as far as the service can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    /// The server's store time (a change event's `Nats-Time-Stamp`, a leader
    /// read's `time`): on the same clock as the server's expiry.
    pub server: Option<OffsetDateTime>,
    /// An instant of the service's own monotonic clock taken before it sent the
    /// write that stored this revision: the revision was stored after it, so its
    /// TTL ends after `sent_before + ttl`, whatever the server's clock says.
    pub sent_before: Option<Instant>,
}

impl Stamp {
    /// Both stamps where either side has them (the first's win).
    fn merge(self, other: Self) -> Self {
        Self {
            server: self.server.or(other.server),
            sent_before: self.sent_before.or(other.sent_before),
        }
    }

    /// Whether a lease of `ttl_ms` stored at this stamp has at most `guard` left at
    /// `now` (monotonic) and `wall` (the service's wall clock), by either stamp. A
    /// stamp with neither time cannot say: it counts as at its end.
    pub fn at_end(&self, ttl_ms: u64, guard: Duration, now: Instant, wall: OffsetDateTime) -> bool {
        let ttl = Duration::from_millis(ttl_ms);
        let by_server = self.server.is_some_and(|s| wall + guard >= s + ttl);
        let by_sent = self.sent_before.is_some_and(|s| now + guard >= s + ttl);
        by_server || by_sent || (self.server.is_none() && self.sent_before.is_none())
    }
}

/// What a key's known revision holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KnownState {
    /// A lease record.
    Held {
        /// The record stored at this revision.
        record: LeaseRecord,
        /// When it was stored.
        stamp: Stamp,
    },
    /// An expiry marker, a tombstone or a purge: nobody holds the key.
    Free,
    /// Something the calls do not act on (a value that is not a lease record):
    /// they read the key as they would without knowing anything.
    Other,
}

/// The newest revision the service knows of a key, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    /// The stream sequence of the message.
    pub revision: u64,
    /// What that message holds.
    pub state: KnownState,
}

/// A bounded map from key to the newest [`Known`] fact about it.
#[derive(Debug)]
pub struct KnownLeases {
    map: HashMap<String, Known>,
    /// Keys in the order they were first learnt: the front is forgotten first.
    order: VecDeque<String>,
    capacity: usize,
}

impl KnownLeases {
    /// An empty map remembering at most `capacity` keys (0: remembers nothing).
    pub fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// What is known of `key`, if anything.
    pub fn get(&self, key: &str) -> Option<&Known> {
        self.map.get(key)
    }

    /// Forgets every key: the stream is not the one the facts were about.
    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }

    /// How many keys are known.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is known.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Learns a fact about `key`. A revision older than the one known is ignored;
    /// the same revision adds the stamps the known fact lacks; a newer one replaces.
    ///
    /// Two facts about one revision that disagree (another record, held against
    /// free) make it [`KnownState::Other`]: the calls read it again. A stream
    /// message never changes, so a disagreement means one source lied (a change
    /// event published by a client, not by the server's republish) or the stream
    /// was made anew; the service then trusts neither.
    pub fn learn(&mut self, key: &str, fact: Known) {
        if self.capacity == 0 || fact.revision == 0 {
            return;
        }
        if let Some(known) = self.map.get_mut(key) {
            if fact.revision < known.revision {
                return;
            }
            if fact.revision == known.revision {
                match (&mut known.state, &fact.state) {
                    (
                        KnownState::Held { record, stamp },
                        KnownState::Held {
                            record: new_record,
                            stamp: new_stamp,
                        },
                    ) if record == new_record => *stamp = stamp.merge(*new_stamp),
                    (KnownState::Free, KnownState::Free) | (KnownState::Other, _) => {}
                    _ => known.state = KnownState::Other,
                }
                return;
            }
            *known = fact;
            return;
        }
        while self.map.len() >= self.capacity {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        self.order.push_back(key.to_string());
        self.map.insert(key.to_string(), fact);
    }

    /// Learns from a change event on `subject` (`dagnats.lease.changed.<key>`), its
    /// headers looked up by name through `header`, and its body. An event without a
    /// `Nats-Sequence` teaches nothing.
    pub fn handle_change<'a>(
        &mut self,
        subject: &str,
        header: impl Fn(&str) -> Option<&'a str>,
        payload: &[u8],
    ) {
        // `<key>`, or with tenancy `<account>.<key>`: the key as stored.
        let Some(key) = subject
            .strip_prefix(changed_subject("").as_str())
            .filter(|k| {
                let tokens: Vec<&str> = k.split('.').collect();
                tokens.len() <= 2 && tokens.iter().all(|t| !t.is_empty())
            })
        else {
            return;
        };
        if let Some(fact) = fact_of_change(header, payload) {
            self.learn(key, fact);
        }
    }
}

/// The fact a change event states: the revision (`Nats-Sequence`) and what it holds.
pub fn fact_of_change<'a>(
    header: impl Fn(&str) -> Option<&'a str>,
    payload: &[u8],
) -> Option<Known> {
    let revision: u64 = header(HDR_SEQUENCE)?.trim().parse().ok()?;
    let free = header(HDR_MARKER_REASON).is_some()
        || header(HDR_KV_OPERATION).is_some_and(|v| v == "DEL" || v == "PURGE");
    let state = if free {
        KnownState::Free
    } else {
        match LeaseRecord::parse(payload) {
            Ok(record) => KnownState::Held {
                record,
                stamp: Stamp {
                    server: header(HDR_TIME_STAMP).and_then(|t| parse_time(t.trim())),
                    sent_before: None,
                },
            },
            Err(_) => KnownState::Other,
        }
    };
    Some(Known { revision, state })
}
