//! `dagnats-leases elect KEY`: leader election for a process of any language.
//!
//! - `elect KEY --holder ID` campaigns with the holder library ([`Member::elect`]:
//!   a tenure starts once a renew confirms the grant, and ends at the library's
//!   local deadline at the latest) and prints each change of ownership with its
//!   fence, one line each (`--json`: one JSON object per line);
//! - with `--http ADDR` it also serves, on every path, the state the application
//!   beside it may act on ([`dagnats_leases_core::holder::elect::leader_state`]): 200 and
//!   `{"leader": true, "fence": …, "valid_for_ms": …}` while this process leads,
//!   503 and `{"leader": false, …}` otherwise. Each answer is what the library
//!   believes at the instant asked, never more;
//! - `elect KEY --shards N` holds a share of the shards `KEY-0` to `KEY-<N-1>`
//!   instead ([`Member::balanced_shards`]), serving the ones owned
//!   ([`dagnats_leases_core::holder::elect::shards_state`]);
//! - `elect --observe KEY` campaigns for nothing and prints each change of leader
//!   ([`dagnats_leases_core::holder::elect::LeaderWatch`]: change events, resynchronised by
//!   owner reads).
//!
//! SIGTERM or SIGINT: the HTTP endpoint says "not leader" at once; the lease is
//! kept (renewed) until the latest deadline handed out to the application has
//! passed, then released, and the process exits 0 ([`Leadership`]: a release
//! before it would let the next leader in while the application may still act).
//! A second signal exits at once, releasing nothing. Every decision is the core's;
//! this module is IO (NATS, the HTTP listener, stdout, signals).

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::Client;
use dagnats_leases_core::holder::elect::{
    ACCEPT_RETRY, LeaderState, LeaderWatch, Leadership, OBSERVE_RESYNC, OwnerRead,
};
use dagnats_leases_core::subjects::changed_subject;
use dagnats_leases_core::wire::check_name;
use futures::StreamExt;
use futures::future::{BoxFuture, FutureExt};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;
use time::OffsetDateTime;

use crate::cli::StopSignals;
use crate::client::{LeaseClient, change_event};
use crate::clock;
use crate::exit::{EXIT_ERROR, EXIT_NO_SERVER, EXIT_OK, exit_code};
use crate::member::{Change, Elector, HeldView, Member, Ownership, Shards, TenureView};
use crate::report::fail;

/// The options of `elect`.
#[derive(Debug, Clone, clap::Args)]
pub struct ElectArgs {
    /// The lease key.
    pub key: String,
    /// Holder ID, unique to this process (default: `elect-` and random hex).
    #[arg(long, env = "DAGNATS_HOLDER")]
    pub holder: Option<String>,
    /// Time to live in milliseconds, or with a unit (`15s`).
    #[arg(long, env = "DAGNATS_TTL_MS", default_value = "15000", value_parser = crate::cli::parse_millis)]
    pub ttl_ms: u64,
    /// Time to live (`15s`, `1m`; a bare number is seconds): instead of --ttl-ms (it wins over it).
    #[arg(long, env = "DAGNATS_TTL", value_parser = crate::cli::parse_duration)]
    pub ttl: Option<Duration>,
    /// Candidate priority, 0 to 10 (higher preferred after a release or expiry).
    #[arg(long, env = "DAGNATS_PRIORITY")]
    pub priority: Option<u8>,
    /// Serve the state the application may act on over HTTP at this address
    /// (`127.0.0.1:8080`; port 0 picks one, named on stderr).
    #[arg(long, env = "DAGNATS_HTTP")]
    pub http: Option<SocketAddr>,
    /// Share the shards `KEY-0` to `KEY-<N-1>` evenly with every `elect` running
    /// the same KEY and N (a balanced shard set), instead of leading KEY itself.
    #[arg(long, env = "DAGNATS_SHARDS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub shards: Option<u16>,
    /// Campaign for nothing: print each change of the key's leader.
    #[arg(long, env = "DAGNATS_OBSERVE")]
    pub observe: bool,
}

/// Runs `elect`; returns the exit code. Changes go to `out`, messages to stderr.
pub async fn run(nats: Client, args: ElectArgs, json: bool, out: &mut (dyn Write + Send)) -> u8 {
    // A key no lease can have is refused before anything is sent (`watch`'s rule):
    // an observer would read its owner in vain for ever, and a subscription to it
    // could fail as if the server were gone.
    if let Err(e) = check_name("key", &args.key) {
        return fail(out, json, e.kind.as_str(), &e.error, EXIT_ERROR);
    }
    // Taken before anything is sent: a SIGTERM that follows the first acquire
    // (another process saw its event) is a stop, never the default action's kill.
    let signals = StopSignals::new();
    if args.observe {
        return observe(nats, &args.key, json, out, signals).await;
    }
    let holder = args
        .holder
        .clone()
        .unwrap_or_else(|| Member::unique_id("elect"));
    let mut member = match Member::new(nats, holder.clone()) {
        Ok(m) => m,
        Err(e) => return fail(out, json, e.kind().as_str(), &e.to_string(), exit_code(&e)),
    };
    if let Some(p) = args.priority {
        member = member.with_priority(p);
    }
    let ttl = args.ttl.unwrap_or(Duration::from_millis(args.ttl_ms));
    let started = match args.shards {
        None => member.elect(&args.key, ttl).map(Campaigner::One),
        Some(n) => {
            let keys: Vec<String> = (0..n).map(|i| format!("{}-{i}", args.key)).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            member
                .balanced_shards(&args.key, &keys, ttl)
                .map(Campaigner::Set)
        }
    };
    let mut campaign = match started {
        Ok(c) => c,
        Err(e) => return fail(out, json, e.kind().as_str(), &e.to_string(), exit_code(&e)),
    };
    let mut signals = signals;
    let view = Served {
        view: campaign.view(),
        leadership: Arc::new(Mutex::new(Leadership::new(&args.key, &holder))),
    };
    if let Some(addr) = args.http {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                let bound = listener.local_addr().map_or(addr, |a| a);
                eprintln!(
                    "dagnats-leases: serving {}'s leadership on http://{bound}/",
                    args.key
                );
                tokio::spawn(serve_http(listener, view.clone()));
            }
            Err(e) => {
                campaign.stop().await;
                let message = format!("cannot listen on {addr}: {e}");
                return fail(out, json, "listen", &message, EXIT_ERROR);
            }
        }
    }
    eprintln!("dagnats-leases: campaigning for {} as {holder}", args.key);
    let stepped_down = |key: &str, reason: &str| {
        if json {
            json!({
                "event": "stepped_down", "leader": false, "key": key,
                "holder": holder, "reason": reason,
            })
            .to_string()
        } else {
            format!("stepped down {key} as {holder}: {reason}")
        }
    };
    loop {
        tokio::select! {
            change = campaign.next() => {
                let Some(change) = change else {
                    let message = format!("the campaign for {} ended", args.key);
                    return fail(out, json, "connection", &message, EXIT_ERROR);
                };
                let line = match change.ownership {
                    Ownership::Elected { fence } => {
                        let state = view.key_state(&change.key);
                        if json {
                            let mut v = serde_json::to_value(&state).expect("states serialise");
                            v["event"] = json!("elected");
                            v["fence"] = json!(fence);
                            v.to_string()
                        } else {
                            format!(
                                "elected {} as {holder} fence {fence} (valid for {} ms)",
                                change.key, state.valid_for_ms
                            )
                        }
                    }
                    Ownership::SteppedDown { reason } => stepped_down(&change.key, &reason.to_string()),
                };
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
            signal = signals.recv() => {
                let held = view.held_keys();
                // Not leading from this instant; the lease is kept until the last
                // deadline handed out has passed (the core's rule), then released.
                let release_at = {
                    let mut leadership = view.lock();
                    leadership.stop();
                    leadership.release_at(clock::now())
                };
                for key in held {
                    let _ = writeln!(out, "{}", stepped_down(&key, "stopped"));
                }
                let _ = out.flush();
                if let Some(at) = release_at {
                    let wait = at.saturating_duration_since(clock::now());
                    eprintln!(
                        "dagnats-leases: {signal:?} received: releasing {} in {} ms, once the \
                         last deadline handed out has passed (a second signal exits at once)",
                        args.key,
                        wait.as_millis()
                    );
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        second = signals.recv() => {
                            eprintln!(
                                "dagnats-leases: {second:?} received: exiting; {} runs out by its TTL",
                                args.key
                            );
                            // At once, and no release may go out: no destructor runs.
                            std::process::exit(second.exit_code().into());
                        }
                    }
                } else {
                    eprintln!("dagnats-leases: {signal:?} received: releasing {}", args.key);
                }
                campaign.stop().await;
                return EXIT_OK;
            }
        }
    }
}

/// What `elect` campaigns with: one key, or a balanced shard set.
enum Campaigner {
    One(Elector),
    Set(Shards),
}

impl Campaigner {
    async fn next(&mut self) -> Option<Change> {
        match self {
            Self::One(e) => e.next().await,
            Self::Set(s) => s.next().await,
        }
    }

    fn view(&self) -> View {
        match self {
            Self::One(e) => View::One(e.tenure_view()),
            Self::Set(s) => View::Set(s.held_view()),
        }
    }

    async fn stop(self) {
        match self {
            Self::One(e) => e.stop().await,
            Self::Set(s) => s.stop().await,
        }
    }
}

/// How the HTTP handler reads the library: one key's tenure, or a set's.
#[derive(Clone)]
enum View {
    One(TenureView),
    Set(HeldView),
}

/// What the HTTP handler reads: the library's tenures, and what was handed out.
#[derive(Clone)]
struct Served {
    view: View,
    leadership: Arc<Mutex<Leadership>>,
}

impl Served {
    fn lock(&self) -> MutexGuard<'_, Leadership> {
        self.leadership.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state at this instant as the HTTP body says it (status, JSON),
    /// remembered as handed out: under the lock (so that a stop cannot fall between
    /// the read and the record), the wall clock read first, then the library's.
    fn answer(&self) -> (u16, Vec<u8>) {
        let mut leadership = self.lock();
        let wall = OffsetDateTime::now_utc();
        let (status, body) = match &self.view {
            View::One(view) => {
                let (now, tenure) = view.read();
                let state = leadership.state(tenure, now, wall);
                (state.http_status(), serde_json::to_vec(&state))
            }
            View::Set(view) => {
                let (now, held) = view.read();
                let state = leadership.shards_state(&held, now, wall);
                (state.http_status(), serde_json::to_vec(&state))
            }
        };
        (status, body.expect("states serialise"))
    }

    /// One key's state (a shard's, in a set), remembered as handed out.
    fn key_state(&self, key: &str) -> LeaderState {
        let mut leadership = self.lock();
        let wall = OffsetDateTime::now_utc();
        match &self.view {
            View::One(view) => {
                let (now, tenure) = view.read();
                leadership.state(tenure, now, wall)
            }
            View::Set(view) => {
                let (now, mut held) = view.read();
                held.retain(|k, _| k == key);
                let state = leadership.shards_state(&held, now, wall);
                let shard = state.shards.into_iter().next();
                LeaderState {
                    leader: shard.is_some(),
                    key: key.to_string(),
                    holder: state.holder,
                    fence: shard.as_ref().map(|s| s.fence),
                    revision: shard.as_ref().map(|s| s.revision),
                    valid_for_ms: shard.as_ref().map_or(0, |s| s.valid_for_ms),
                    deadline: shard.map(|s| s.deadline),
                    now: state.now,
                }
            }
        }
    }

    /// The keys the library says this process owns now.
    fn held_keys(&self) -> Vec<String> {
        match &self.view {
            View::One(view) => match view.read() {
                (_, Some(_)) => vec![self.lock().key().to_string()],
                (_, None) => Vec::new(),
            },
            View::Set(view) => view.read().1.into_keys().collect(),
        }
    }
}

/// Answers every request on `listener` with the current state, one task per
/// connection (HTTP/1.1, keep-alive), until the process exits.
async fn serve_http(listener: tokio::net::TcpListener, served: Served) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                eprintln!("dagnats-leases: cannot accept a connection: {e}");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let served = served.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_request: Request<_>| {
                let (status, body) = served.answer();
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .header("cache-control", "no-store")
                    .body(Full::new(Bytes::from(body)))
                    .expect("a fixed response is well formed");
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// `elect --observe`: prints each change of the key's leader until a signal.
async fn observe(
    nats: Client,
    key: &str,
    json: bool,
    out: &mut (dyn Write + Send),
    mut signals: StopSignals,
) -> u8 {
    let leases = LeaseClient::new(nats.clone());
    // Subscribed before the first read, so that no change falls between the two.
    let mut events = match nats.subscribe(changed_subject(key)).await {
        Ok(s) => s,
        Err(e) => {
            let message = format!("cannot subscribe: {e}");
            return fail(out, json, "connection", &message, EXIT_NO_SERVER);
        }
    };
    if let Err(e) = nats.flush().await {
        let message = format!("cannot subscribe: {e}");
        return fail(out, json, "connection", &message, EXIT_NO_SERVER);
    }
    eprintln!("dagnats-leases: observing {key}");
    let mut watch = LeaderWatch::new(key, OBSERVE_RESYNC, clock::now());
    let mut reading: Option<BoxFuture<'static, OwnerRead>> = None;
    loop {
        if watch.poll_read() {
            let leases = leases.clone();
            let key = key.to_string();
            reading = Some(
                async move {
                    match leases.owner(&key).await {
                        Ok(Some(lease)) => OwnerRead::Held {
                            holder: lease.holder,
                            revision: lease.revision,
                        },
                        Ok(None) => OwnerRead::Free,
                        Err(e) => {
                            eprintln!("dagnats-leases: cannot read the owner of {key}: {e}");
                            OwnerRead::Failed
                        }
                    }
                }
                .boxed(),
            );
        }
        while let Some(change) = watch.poll_event() {
            let line = if json {
                serde_json::to_string(&change).expect("changes serialise")
            } else {
                match &change.leader {
                    Some(h) => format!("leader {} {h} (revision {})", change.key, change.revision),
                    None => format!("no leader {}", change.key),
                }
            };
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        let wake = watch.poll_timeout();
        tokio::select! {
            read = async { reading.as_mut().expect("guarded by the condition").await },
                if reading.is_some() => {
                reading = None;
                watch.handle_read(clock::now(), read);
            }
            message = events.next() => match message {
                Some(message) => watch.handle_change(clock::now(), &change_event(&message)),
                None => {
                    let message = format!("the subscription to {key}'s changes ended");
                    return fail(out, json, "connection", &message, EXIT_ERROR);
                }
            },
            () = tokio::time::sleep(wake.saturating_duration_since(clock::now())) => {
                watch.handle_timeout(clock::now());
            }
            _ = signals.recv() => return EXIT_OK,
        }
    }
}
