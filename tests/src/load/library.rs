//! The holder library's holders in the load: a `Member` with an `Elector` per key,
//! or one `Shards` set over the keys, recorded from the library's own view.

use super::*;

/// A CLOCK_MONOTONIC instant as the history's nanoseconds.
fn nanos_of(at: Instant) -> Nanos {
    let (i, n) = (Instant::now(), now());
    match i.checked_duration_since(at) {
        Some(ago) => n.saturating_sub(ago.as_nanos() as u64),
        None => n + at.duration_since(i).as_nanos() as u64,
    }
}

/// What the library holder of one key has told its recorder so far.
#[derive(Default)]
struct LibraryKey {
    /// The send time of the oldest write whose outcome is unknown since the last
    /// answered one (as [`run_leases_md_holder`] keeps it).
    pending_since: Option<Nanos>,
    /// The last answered write: (revision, lower bound of its time).
    known: Option<(u64, Nanos)>,
    /// The tenure believed now: (its revision, from, deadline).
    belief: Option<(u64, Nanos, Nanos)>,
}

/// Turns the holder library's own view (its requests, its holder machines' events)
/// into history records: calls as answered, belief spans from `Elected` to the
/// step-down or the local deadline, whichever is first.
struct LibraryRecorder {
    holder: String,
    ttl_ms: u64,
    history: History,
    keys: Mutex<HashMap<String, LibraryKey>>,
}

impl LibraryRecorder {
    fn end_belief(&self, key: &str, k: &mut LibraryKey, at: Nanos) {
        if let Some((revision, from, deadline)) = k.belief.take() {
            self.history.push(Record::Belief(Belief {
                key: key.to_owned(),
                holder: self.holder.clone(),
                revision,
                from,
                until: at.min(deadline).max(from),
            }));
        }
    }

    /// Closes the beliefs still open (the campaign stopped).
    fn finish(&self) {
        let at = now();
        let mut keys = self.keys.lock().unwrap();
        for (key, k) in keys.iter_mut() {
            self.end_belief(key, k, at);
        }
    }
}

impl CampaignObserver for LibraryRecorder {
    fn request(&self, request: &ObservedRequest<'_>) {
        let ObservedRequest {
            key,
            endpoint,
            sent,
            outcome,
            answered,
            ..
        } = *request;
        let (sent, replied) = (nanos_of(sent), nanos_of(answered));
        let reply: Option<Value> = match outcome {
            RequestOutcome::Reply { payload, .. } => serde_json::from_slice(payload).ok(),
            _ => None,
        };
        let kind = reply
            .as_ref()
            .and_then(|v| v["kind"].as_str().map(str::to_owned));
        let why = || {
            kind.clone()
                .unwrap_or_else(|| format!("{outcome:?}").chars().take(60).collect())
        };
        let mut keys = self.keys.lock().unwrap();
        let k = keys.entry(key.to_owned()).or_default();
        let ok = reply.as_ref().filter(|_| kind.is_none());
        let refused = matches!(kind.as_deref(), Some("lost" | "fence_mismatch"));
        let (op, outcome) = match endpoint {
            Endpoint::Acquire => match ok {
                Some(v) if v["granted"] == true => {
                    let rev = v["revision"].as_u64().unwrap_or(0);
                    let lb = match k.known {
                        Some((known, lb)) if known == rev => lb,
                        _ => k.pending_since.map_or(sent, |p| p.min(sent)),
                    };
                    k.pending_since = None;
                    k.known = Some((rev, lb));
                    let ttl_ms = v["ttl_ms"].as_u64().unwrap_or(self.ttl_ms);
                    (
                        Op::Acquire,
                        Outcome::Granted {
                            revision: rev,
                            ttl_ms,
                            write_lb: lb,
                        },
                    )
                }
                Some(v) => (
                    Op::Acquire,
                    Outcome::Held {
                        holder: v["holder"].as_str().unwrap_or("").to_owned(),
                        revision: v["revision"].as_u64().unwrap_or(0),
                    },
                ),
                None => {
                    k.pending_since.get_or_insert(sent);
                    (Op::Acquire, Outcome::Unknown { why: why() })
                }
            },
            Endpoint::Renew => match ok {
                Some(v) => {
                    let rev = v["revision"].as_u64().unwrap_or(0);
                    k.known = Some((rev, sent));
                    k.pending_since = None;
                    let ttl_ms = v["ttl_ms"].as_u64().unwrap_or(self.ttl_ms);
                    (
                        Op::Renew,
                        Outcome::Renewed {
                            revision: rev,
                            ttl_ms,
                        },
                    )
                }
                None if refused => (Op::Renew, Outcome::Refused { kind: why() }),
                None => {
                    k.pending_since.get_or_insert(sent);
                    (Op::Renew, Outcome::Unknown { why: why() })
                }
            },
            Endpoint::Release => match ok {
                Some(v) => (
                    Op::Release,
                    Outcome::Released {
                        revision: v["revision"].as_u64().unwrap_or(0),
                    },
                ),
                None if refused => (Op::Release, Outcome::Refused { kind: why() }),
                None => (Op::Release, Outcome::Unknown { why: why() }),
            },
            Endpoint::Owner | Endpoint::Forward => return,
        };
        self.history.call(Call {
            key: key.to_owned(),
            caller: self.holder.clone(),
            op,
            sent,
            replied,
            outcome,
        });
    }

    fn event(&self, key: &str, event: &HolderEvent, at: Instant) {
        let at = nanos_of(at);
        let mut keys = self.keys.lock().unwrap();
        let k = keys.entry(key.to_owned()).or_default();
        match event {
            HolderEvent::Elected { fence, deadline } => {
                self.end_belief(key, k, at);
                k.belief = Some((*fence, at, nanos_of(*deadline)));
            }
            HolderEvent::Renewed {
                tenure, deadline, ..
            } => {
                if let Some((t, _, d)) = &mut k.belief
                    && t == tenure
                {
                    *d = nanos_of(*deadline);
                }
            }
            HolderEvent::SteppedDown { .. } => self.end_belief(key, k, at),
            _ => {}
        }
    }
}

/// A member of `cfg.holder` whose campaigns report to a recorder writing `history`.
fn recorded_member(
    client: Client,
    cfg: &HolderConfig,
    history: History,
) -> (Arc<LibraryRecorder>, Member) {
    let recorder = Arc::new(LibraryRecorder {
        holder: cfg.holder.clone(),
        ttl_ms: cfg.ttl_ms,
        history,
        keys: Mutex::default(),
    });
    let member = Member::new(client, cfg.holder.clone())
        .expect("a valid holder id")
        .with_observer(recorder.clone());
    (recorder, member)
}

/// Runs the holder library for one key until `stop`: a `Member` with an `Elector`;
/// while it leads (its `tenure()`), it writes to the store with the current fence
/// every `write_every`, checking the tenure before each write; now and then it
/// stops the elector (releasing) and elects again, as an application restarting
/// its campaign would.
pub async fn run_library_holder(
    client: Client,
    cfg: HolderConfig,
    store: StoreTarget,
    history: History,
    stop: Arc<AtomicBool>,
    observer: Arc<dyn Observer>,
) {
    let (recorder, member) = recorded_member(client, &cfg, history);
    let ttl = Duration::from_millis(cfg.ttl_ms);
    let elect = || member.elect(&cfg.key, ttl).expect("one campaign per key");
    let mut elector = elect();
    while !stop.load(Ordering::Relaxed) {
        if let Some(tenure) = elector.tenure() {
            if fastrand::f64() < cfg.release_chance {
                elector.stop().await;
                tokio::time::sleep(jitter(cfg.campaign_every)).await;
                elector = elect();
                continue;
            }
            observer.working(&cfg.key, tenure.fence);
            if !cfg.work.is_zero() {
                tokio::time::sleep(cfg.work).await;
            }
            let _ = store.write(&cfg.key, &cfg.holder, tenure.fence).await;
        }
        tokio::time::sleep(cfg.write_every).await;
    }
    elector.stop().await;
    recorder.finish();
}

/// Runs the holder library's shard set until `stop`: a `Member` with `Shards` over
/// the keys of `cfg.key` (comma-separated), holding at most half of them (rounded
/// up); for each shard it holds now (its `tenure`), it writes to the store with that
/// shard's fence every `write_every`, checking the tenure before each write; now and
/// then it stops the set (releasing every shard) and starts it again.
pub async fn run_library_shards(
    client: Client,
    cfg: HolderConfig,
    store: StoreTarget,
    history: History,
    stop: Arc<AtomicBool>,
    observer: Arc<dyn Observer>,
) {
    let (recorder, member) = recorded_member(client, &cfg, history);
    let ttl = Duration::from_millis(cfg.ttl_ms);
    let keys: Vec<&str> = cfg.key.split(',').collect();
    let max_held = keys.len().div_ceil(2);
    let start = || {
        member
            .shards(&keys, max_held, ttl)
            .expect("one campaign per key")
    };
    let mut shards = start();
    while !stop.load(Ordering::Relaxed) {
        for key in &keys {
            // The tenure is looked at again right before each write.
            let Some(tenure) = shards.tenure(key) else {
                continue;
            };
            if fastrand::f64() < cfg.release_chance / keys.len() as f64 {
                shards.stop().await;
                tokio::time::sleep(jitter(cfg.campaign_every)).await;
                shards = start();
                break;
            }
            observer.working(key, tenure.fence);
            if !cfg.work.is_zero() {
                tokio::time::sleep(cfg.work).await;
            }
            let _ = store.write(key, &cfg.holder, tenure.fence).await;
        }
        tokio::time::sleep(cfg.write_every).await;
    }
    shards.stop().await;
    recorder.finish();
}
