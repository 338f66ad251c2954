//! What every machine with things out keeps the same way: ids it allocates
//! itself ([`Ids`]), one deadline set per kind of thing out ([`Due`], in the manner
//! of quinn-proto's timer table: insert, remove, the next instant, the ones due),
//! its requests out by id with whom each belongs to ([`Requests`]), whose
//! give-up ([`Requests::pop_timed_out`]) hands back a request out past its
//! deadline so that its owner tells the adapter to drop it and its part that it
//! timed out, and the commands handed to the client until it reports them done
//! ([`Handoff`], each given up at [`HANDOFF_BOUND`]).
//!
//! A ground layer: it knows nothing of the service or the holders, which build
//! their own outboxes and hand-offs from it.

use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::time::Instant;

use crate::io::{HANDOFF_BOUND, TransmitId};

/// An id a machine allocates itself, one space per kind ([`Ids`]).
pub trait Id: Copy + Ord {
    /// The id numbered `n`.
    fn from_raw(n: u64) -> Self;
}

impl Id for TransmitId {
    fn from_raw(n: u64) -> Self {
        Self(n)
    }
}

/// Names one call the service runs: allocated by the service, the key of its
/// deadline and of its requests' routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(pub u64);

impl Id for CallId {
    fn from_raw(n: u64) -> Self {
        Self(n)
    }
}

/// Allocates the ids of one space, in order, never one twice.
#[derive(Debug)]
pub struct Ids<K> {
    next: u64,
    kind: PhantomData<K>,
}

impl<K: Id> Ids<K> {
    /// Ids from `first` on.
    pub fn starting_from(first: u64) -> Self {
        Self {
            next: first,
            kind: PhantomData,
        }
    }

    /// A new id.
    pub fn allocate(&mut self) -> K {
        let id = K::from_raw(self.next);
        self.next += 1;
        id
    }
}

impl<K: Id> Default for Ids<K> {
    fn default() -> Self {
        Self::starting_from(0)
    }
}

/// A deadline set: at most one instant per key, the earliest first. A key due at
/// the same instant as another comes in the keys' order.
#[derive(Debug, Clone)]
pub struct Due<K> {
    at: BTreeMap<K, Instant>,
    order: BTreeSet<(Instant, K)>,
}

impl<K> Default for Due<K> {
    fn default() -> Self {
        Self {
            at: BTreeMap::new(),
            order: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Clone> Due<K> {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// `key` is due at `at`, replacing the instant it had (returned).
    pub fn insert(&mut self, key: K, at: Instant) -> Option<Instant> {
        let old = self.at.insert(key.clone(), at);
        if let Some(old) = old {
            self.order.remove(&(old, key.clone()));
        }
        self.order.insert((at, key));
        old
    }

    /// `key` is due at `at`, or at no instant (`None`: it leaves the set).
    pub fn set(&mut self, key: K, at: Option<Instant>) {
        match at {
            Some(at) => {
                self.insert(key, at);
            }
            None => {
                self.remove(&key);
            }
        }
    }

    /// `key` leaves the set; the instant it had.
    pub fn remove(&mut self, key: &K) -> Option<Instant> {
        let at = self.at.remove(key)?;
        self.order.remove(&(at, key.clone()));
        Some(at)
    }

    /// The instant `key` is due at.
    pub fn get(&self, key: &K) -> Option<Instant> {
        self.at.get(key).copied()
    }

    /// Whether `key` is in the set.
    pub fn contains(&self, key: &K) -> bool {
        self.at.contains_key(key)
    }

    /// The earliest instant of the set: when its owner wakes next.
    pub fn next(&self) -> Option<Instant> {
        self.order.first().map(|(at, _)| *at)
    }

    /// Takes the earliest key due at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<K> {
        let (at, _) = self.order.first()?;
        if *at > now {
            return None;
        }
        let (_, key) = self.order.pop_first()?;
        self.at.remove(&key);
        Some(key)
    }

    /// The keys due at or before `now`, earliest first, left in the set.
    pub fn due(&self, now: Instant) -> impl Iterator<Item = &K> {
        self.order
            .iter()
            .take_while(move |(at, _)| *at <= now)
            .map(|(_, key)| key)
    }

    /// How many keys the set holds.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

/// Requests out, by the id they were sent with: whom each belongs to (`R`, the
/// route its outcome goes back by) and, for those this machine times out, its
/// deadline. An outcome takes its request's route ([`Requests::take`]); one past
/// its deadline is given up ([`Requests::pop_timed_out`]).
#[derive(Debug)]
pub struct Requests<K, R> {
    routes: BTreeMap<K, R>,
    due: Due<K>,
}

impl<K, R> Default for Requests<K, R> {
    fn default() -> Self {
        Self {
            routes: BTreeMap::new(),
            due: Due::default(),
        }
    }
}

impl<K: Ord + Clone, R> Requests<K, R> {
    /// No request out.
    pub fn new() -> Self {
        Self::default()
    }

    /// Request `id` is out for `route`, timed out here at `due` (`None`: its
    /// part keeps the deadline).
    pub fn insert(&mut self, id: K, route: R, due: Option<Instant>) {
        self.due.set(id.clone(), due);
        self.routes.insert(id, route);
    }

    /// Takes request `id`'s route (answered, cancelled): it is out no more.
    pub fn take(&mut self, id: &K) -> Option<R> {
        self.due.remove(id);
        self.routes.remove(id)
    }

    /// Request `id`'s route, if it is out.
    pub fn get(&self, id: &K) -> Option<&R> {
        self.routes.get(id)
    }

    /// Whether request `id` is out.
    pub fn contains(&self, id: &K) -> bool {
        self.routes.contains_key(id)
    }

    /// The give-up: takes the first request out past its deadline at `now`, with
    /// its route. Its owner tells the adapter to drop it (its cancel) and its
    /// part that it timed out.
    pub fn pop_timed_out(&mut self, now: Instant) -> Option<(K, R)> {
        let id = self.due.pop_due(now)?;
        let route = self.routes.remove(&id)?;
        Some((id, route))
    }

    /// The earliest deadline of a request out.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.next()
    }

    /// The ids timed out at `now`, earliest first, left out.
    pub fn timed_out(&self, now: Instant) -> impl Iterator<Item = &K> {
        self.due.due(now)
    }

    /// How many requests are out.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether no request is out.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

/// Commands handed to the client (a reply, a subscribe) and not yet reported done,
/// each given up [`HANDOFF_BOUND`] after it was handed over: a client reconnecting
/// to a server that is gone takes no command, and no loop waits on it.
#[derive(Debug)]
pub struct Handoff<K> {
    due: Due<K>,
}

impl<K> Default for Handoff<K> {
    fn default() -> Self {
        Self {
            due: Due::default(),
        }
    }
}

impl<K: Ord + Clone> Handoff<K> {
    /// Nothing handed over.
    pub fn new() -> Self {
        Self::default()
    }

    /// `key` is handed to the client at `now`; one handed again starts its bound
    /// anew.
    pub fn hand(&mut self, now: Instant, key: K) {
        self.due.insert(key, now + HANDOFF_BOUND);
    }

    /// Forgets `key`: the client reported it done, or it is no longer wanted, so it
    /// is never given up. Whether it was still handed over.
    pub fn forget(&mut self, key: &K) -> bool {
        self.due.remove(key).is_some()
    }

    /// Takes the first command the client has not taken by `now`: its owner
    /// tells the adapter to drop it.
    pub fn pop_given_up(&mut self, now: Instant) -> Option<K> {
        self.due.pop_due(now)
    }

    /// When the first command still handed over is given up.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.next()
    }

    /// Whether no command is still handed over.
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }
}
