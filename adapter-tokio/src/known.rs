//! The service's [`KnownLeases`]: what it knows of each key's last revision, shared
//! by its calls and fed by two sources, the calls themselves (their reads and their
//! own writes, [`Call::poll_learnt`]) and the change events the server republishes
//! (`dagnats.lease.changed.*`, [`KnownCache::watch`]). With it a renew or release
//! of a revision the service knows is one conditional write and no read. What to do
//! with a known fact is the core's ([`dagnats_leases_core::known`]); this only
//! holds the map and feeds it.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use async_nats::Client;
use dagnats_leases_core::known::KnownLeases;
use dagnats_leases_core::subjects::TENANT_CHANGED_SUBJECTS;
use dagnats_leases_core::subjects::changed_subject;
use dagnats_leases_core::tenant::{Caller, Tenancy};
use dagnats_leases_core::wire::Endpoint;
use dagnats_leases_core::{Call, CallConfig};
use futures::StreamExt;
use time::OffsetDateTime;

/// The service's [`KnownLeases`], shared by its calls (a lock held only to look a
/// key up or to learn one fact, never across an await).
#[derive(Debug, Clone)]
pub struct KnownCache(Arc<Mutex<KnownLeases>>);

impl KnownCache {
    /// A map of at most `capacity` keys (0: the service knows nothing and reads
    /// before every renew and release, as it did before the map).
    pub fn new(capacity: usize) -> Self {
        Self(Arc::new(Mutex::new(KnownLeases::new(capacity))))
    }

    fn lock(&self) -> MutexGuard<'_, KnownLeases> {
        // A panic while learning leaves a map of true facts: keep using it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a call with what is known of its key ([`Call::with_known`]).
    pub fn start_call(
        &self,
        config: CallConfig,
        scope: Option<Caller>,
        now: Instant,
        wall: OffsetDateTime,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Call {
        Call::new_scoped(config, scope, Some(&self.lock()), now, wall, endpoint, body)
    }

    /// Learns what `call` learnt since it was last asked.
    pub fn learn_from(&self, call: &mut Call) {
        if let Some((key, fact)) = call.poll_learnt() {
            self.lock().learn(&key, fact);
        }
    }

    /// Forgets every key ([`KnownLeases::clear`]).
    pub fn forget(&self) {
        self.lock().clear();
    }

    /// How many keys are known.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no key is known.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Subscribes to every key's change events and learns from each, for as long
    /// as it is polled; never completes. Events are at-most-once and a slow
    /// subscriber's are dropped past async-nats' buffer: a missed event only leaves
    /// a key unknown or known at an older revision, which costs a read (or a
    /// refused write, then a read), never a wrong answer. A failed subscribe leaves
    /// the map fed by the calls alone.
    pub async fn watch(self, client: Client, tenancy: Tenancy) {
        let subject = match tenancy {
            Tenancy::Single => changed_subject("*"),
            Tenancy::Accounts => TENANT_CHANGED_SUBJECTS.to_string(),
        };
        match client.subscribe(subject).await {
            Ok(mut events) => {
                while let Some(m) = events.next().await {
                    let headers = m.headers.as_ref();
                    self.lock().handle_change(
                        m.subject.as_str(),
                        |name| headers.and_then(|h| h.get(name)).map(|v| v.as_str()),
                        &m.payload,
                    );
                }
            }
            Err(e) => {
                tracing::warn!("change events not watched ({e}): renew and release read first")
            }
        }
        std::future::pending::<()>().await
    }
}
