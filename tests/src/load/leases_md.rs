//! The client written from leases.md alone: one task per (holder, key) following
//! the contract's holder rules with nothing but JSON requests to `api.leases.*`.

use super::*;

/// Runs one client written from leases.md alone until `stop`, then releases what it
/// holds, telling `observer` when it is between check and write.
pub async fn run_leases_md_holder(
    client: Client,
    cfg: HolderConfig,
    store: StoreTarget,
    history: History,
    stop: Arc<AtomicBool>,
    observer: Arc<dyn Observer>,
) {
    let ttl = ms(cfg.ttl_ms);
    let key = cfg.key.clone();
    let holder = cfg.holder.clone();
    let record = |op: Op, sent: Nanos, outcome: Outcome| {
        history.call(Call {
            key: key.clone(),
            caller: holder.clone(),
            op,
            sent,
            replied: now(),
            outcome,
        });
    };
    // The send time of the oldest write whose outcome is unknown since the last answered one.
    let mut pending_since: Option<Nanos> = None;
    // The last answered write: (revision, lower bound of its time).
    let mut known: Option<(u64, Nanos)> = None;
    let mut backoff = Duration::from_millis(50);
    while !stop.load(Ordering::Relaxed) {
        // Candidate.
        let sent = now();
        let body = json!({"key": key, "holder": holder, "ttl_ms": cfg.ttl_ms});
        let (fence, mut deadline, from) =
            match call(&client, "acquire", &body, REQUEST_TIMEOUT).await {
                Reply::Ok(v) if v["granted"] == true => {
                    let rev = v["revision"].as_u64().expect("revision");
                    let lb = match known {
                        Some((k, lb)) if k == rev => lb,
                        _ => pending_since.map_or(sent, |p| p.min(sent)),
                    };
                    pending_since = None;
                    known = Some((rev, lb));
                    record(
                        Op::Acquire,
                        sent,
                        Outcome::Granted {
                            revision: rev,
                            ttl_ms: cfg.ttl_ms,
                            write_lb: lb,
                        },
                    );
                    backoff = Duration::from_millis(50);
                    (rev, lb + ttl, now())
                }
                Reply::Ok(v) => {
                    record(
                        Op::Acquire,
                        sent,
                        Outcome::Held {
                            holder: v["holder"].as_str().unwrap_or("").to_owned(),
                            revision: v["revision"].as_u64().unwrap_or(0),
                        },
                    );
                    tokio::time::sleep(jitter(cfg.campaign_every)).await;
                    continue;
                }
                Reply::Err(kind, error) => {
                    assert!(
                        kind == "unavailable" || kind == "internal",
                        "acquire {key} by {holder}: {kind}: {error}"
                    );
                    pending_since.get_or_insert(sent);
                    record(Op::Acquire, sent, Outcome::Unknown { why: kind });
                    tokio::time::sleep(jitter(backoff)).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
                Reply::NoReply(why) => {
                    pending_since.get_or_insert(sent);
                    record(Op::Acquire, sent, Outcome::Unknown { why });
                    tokio::time::sleep(jitter(backoff)).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
        // Owner (while the deadline holds).
        let tenure = fence;
        let mut fence = fence;
        let mut last_write_send = deadline - ttl;
        let mut next_write = now();
        let until;
        loop {
            let t = now();
            if t >= deadline {
                until = deadline;
                break;
            }
            if stop.load(Ordering::Relaxed) || fastrand::f64() < cfg.release_chance {
                let sent = now();
                until = sent;
                let body = json!({"key": key, "holder": holder, "revision": fence});
                let outcome = match call(&client, "release", &body, REQUEST_TIMEOUT).await {
                    Reply::Ok(v) => Outcome::Released {
                        revision: v["revision"].as_u64().expect("revision"),
                    },
                    Reply::Err(kind, _) if kind == "lost" || kind == "fence_mismatch" => {
                        Outcome::Refused { kind }
                    }
                    Reply::Err(why, _) | Reply::NoReply(why) => Outcome::Unknown { why },
                };
                record(Op::Release, sent, outcome);
                // `known` stays: if this release did not act, a later acquire is
                // granted idempotently on the lease that write set.
                break;
            }
            let renew_at = last_write_send + ttl / 3;
            if t >= renew_at {
                let sent = now();
                let body =
                    json!({"key": key, "holder": holder, "revision": fence, "ttl_ms": cfg.ttl_ms});
                match call(&client, "renew", &body, REQUEST_TIMEOUT).await {
                    Reply::Ok(v) => {
                        let rev = v["revision"].as_u64().expect("revision");
                        record(
                            Op::Renew,
                            sent,
                            Outcome::Renewed {
                                revision: rev,
                                ttl_ms: cfg.ttl_ms,
                            },
                        );
                        known = Some((rev, sent));
                        pending_since = None;
                        // Answered after the deadline: not reached in time (leases.md),
                        // and a renewal landing after the server's expiry check is
                        // wiped by its marker. Step down.
                        if now() >= deadline {
                            until = deadline;
                            break;
                        }
                        fence = rev;
                        deadline = sent + ttl;
                        last_write_send = sent;
                    }
                    Reply::Err(kind, _) if kind == "lost" || kind == "fence_mismatch" => {
                        record(Op::Renew, sent, Outcome::Refused { kind });
                        until = now().min(deadline);
                        break;
                    }
                    Reply::Err(why, _) | Reply::NoReply(why) => {
                        pending_since.get_or_insert(sent);
                        record(Op::Renew, sent, Outcome::Unknown { why });
                        // Retry soon, while the deadline holds.
                        last_write_send = now().saturating_sub(ttl / 3) + ms(100);
                    }
                }
                continue;
            }
            if t >= next_write {
                observer.working(&key, fence);
                if !cfg.work.is_zero() {
                    tokio::time::sleep(cfg.work).await;
                }
                let _ = store.write(&key, &holder, fence).await;
                next_write = now() + cfg.write_every.as_nanos() as u64;
                continue;
            }
            sleep_until(next_write.min(renew_at).min(deadline)).await;
        }
        history.push(Record::Belief(Belief {
            key: key.clone(),
            holder: holder.clone(),
            revision: tenure,
            from,
            until: until.max(from),
        }));
        tokio::time::sleep(jitter(cfg.campaign_every)).await;
    }
}
