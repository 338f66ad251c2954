//! The operator commands of the `dagnats-leases` binary: acquire, renew, release,
//! owner, forward, watch and list. Human-readable lines by default, one JSON object
//! per line with `--json`.
//!
//! Exit codes: 0 done; 3 the lease is not yours or not held (`lost`, `not_held`,
//! acquire not granted, owner of a free key, `lock --wait` ended without the lease);
//! 4 `fence_mismatch`; 5 `lock`: the lease was lost while the command ran; 6 `lock`:
//! `--grace` over half the TTL; 1 any other error; 2 nothing answers (no NATS
//! server, no lease service) or bad arguments. `lock` otherwise exits with its
//! command's code. With `--json` every outcome is one JSON object on stdout, an
//! error as ``{"error": sentence, "kind": snake_case}``.

use std::io::Write;
use std::time::Duration;

use async_nats::Client;
use async_nats::ServerError;
use base64::Engine as _;
use dagnats_leases_core::change::ChangeEvent;
use dagnats_leases_core::io::FLUSH_BOUND;
use dagnats_leases_core::shard::{BucketStreams, META_SHARDS, ShardMap};
use dagnats_leases_core::subjects::{STREAM, changed_subject};
use dagnats_leases_core::wire::Lease;
use dagnats_leases_core::wire::check_name;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::client::{LeaseClient, LeaseError};
use crate::connect::ConnectOptions;
use crate::report::fail;

pub use crate::exit::{
    EXIT_ERROR, EXIT_FENCE_MISMATCH, EXIT_NO_SERVER, EXIT_NOT_HELD, EXIT_OK, exit_code,
};

/// What every operator command takes: how to reach NATS, and the output format.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// How to reach NATS.
    #[command(flatten)]
    pub connect: ConnectOptions,
    /// One JSON object per line instead of readable text.
    #[arg(long, env = "DAGNATS_JSON")]
    pub json: bool,
}

/// A lease named under its fence, as renew and release take it.
#[derive(Debug, Clone, clap::Args)]
pub struct FencedLease {
    /// The lease key.
    pub key: String,
    /// Your holder ID.
    #[arg(long, env = "DAGNATS_HOLDER")]
    pub holder: String,
    /// The fence from your last reply.
    #[arg(long, env = "DAGNATS_REVISION")]
    pub revision: u64,
}

/// One operator command.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Op {
    /// Ask for a lease: prints it when granted, the current holder when not (exit 3).
    Acquire {
        /// Connection and output options.
        #[command(flatten)]
        common: Common,
        /// The lease key.
        key: String,
        /// Your holder ID.
        #[arg(long, env = "DAGNATS_HOLDER")]
        holder: String,
        /// Time to live, whole seconds, in milliseconds (`15000`) or with a unit
        /// (`15s`).
        #[arg(long, env = "DAGNATS_TTL_MS", default_value = "15000", value_parser = crate::cli::parse_millis)]
        ttl_ms: u64,
        /// Time to live (`15s`, `1m`; a bare number is seconds): instead of --ttl-ms (it wins over it).
        #[arg(long, env = "DAGNATS_TTL", value_parser = crate::cli::parse_duration)]
        ttl: Option<Duration>,
        /// Wait up to this long while another holder has it (`500ms`, `5s`, `2m`;
        /// a bare number is seconds), trying again when it is released or
        /// expires; `0` tries once.
        #[arg(long, env = "DAGNATS_WAIT", value_parser = crate::cli::parse_duration)]
        wait: Option<Duration>,
    },
    /// Extend a lease under its fence.
    Renew {
        /// Connection and output options.
        #[command(flatten)]
        common: Common,
        /// The lease and its fence.
        #[command(flatten)]
        lease: FencedLease,
        /// New time to live in milliseconds or with a unit (default: the lease's own).
        #[arg(long, env = "DAGNATS_TTL_MS", value_parser = crate::cli::parse_millis)]
        ttl_ms: Option<u64>,
        /// New time to live (`15s`; a bare number is seconds): instead of --ttl-ms (it wins over it).
        #[arg(long, env = "DAGNATS_TTL", value_parser = crate::cli::parse_duration)]
        ttl: Option<Duration>,
    },
    /// Free a lease under its fence.
    Release {
        /// Connection and output options.
        #[command(flatten)]
        common: Common,
        /// The lease and its fence.
        #[command(flatten)]
        lease: FencedLease,
    },
    /// Who holds a key (exit 3 when nobody does).
    Owner {
        /// Connection and output options.
        #[command(flatten)]
        common: Common,
        /// The lease key.
        key: String,
    },
    /// Send a request to whoever holds a key and print its reply.
    Forward {
        /// Connection and output options.
        #[command(flatten)]
        common: Common,
        /// The lease key.
        key: String,
        /// The request body.
        #[arg(long, env = "DAGNATS_PAYLOAD", default_value = "")]
        payload: String,
        /// Bound on the whole call, 100 to 30000 ms (or with a unit: `5s`).
        #[arg(long, env = "DAGNATS_TIMEOUT_MS", default_value = "5000", value_parser = crate::cli::parse_millis)]
        timeout_ms: u64,
    },
    /// Print change events, one line each (an expiry shows as `expired`).
    Watch {
        /// Connection and output options.
        #[command(flatten)]
        common: Common,
        /// A key, or every key when left out.
        key: Option<String>,
        /// Stop after this many events.
        #[arg(long, env = "DAGNATS_COUNT")]
        count: Option<u64>,
    },
    /// Run a command while holding a lease: SIGTERM, then SIGKILL after --grace,
    /// when the lease is lost (exit 5); the command's own exit code otherwise.
    Lock {
        /// Connection and output options.
        #[command(flatten)]
        common: Common,
        /// The lease, the wait and the command.
        #[command(flatten)]
        args: crate::lock::LockArgs,
    },
    /// Campaign for leadership of a key and print each change with its fence;
    /// `--http` serves the application the state it may act on; `--observe`
    /// prints the key's leader changes instead.
    Elect {
        /// Connection and output options.
        #[command(flatten)]
        common: Common,
        /// The key, the holder and the endpoint.
        #[command(flatten)]
        args: crate::elect::ElectArgs,
    },
    /// List the held leases in the bucket.
    List {
        /// Connection and output options.
        #[command(flatten)]
        common: Common,
    },
}

impl Op {
    /// The connection and output options of this command.
    pub fn common(&self) -> &Common {
        match self {
            Self::Acquire { common, .. }
            | Self::Renew { common, .. }
            | Self::Release { common, .. }
            | Self::Owner { common, .. }
            | Self::Forward { common, .. }
            | Self::Watch { common, .. }
            | Self::Lock { common, .. }
            | Self::Elect { common, .. }
            | Self::List { common } => common,
        }
    }
}

/// Connects as `op` says and runs it; returns the exit code. Output goes to `out`
/// (errors too with `--json`), readable errors to stderr.
pub async fn operate(op: Op, out: &mut (dyn Write + Send)) -> u8 {
    let json = op.common().json;
    let connect = op.common().connect.clone();
    let (errors_tx, errors) = tokio::sync::mpsc::unbounded_channel();
    let client = match connect.connect_reporting(Some(errors_tx)).await {
        Ok(c) => c,
        Err(e) => {
            let message = format!("cannot connect to {}: {e}", connect.nats_url);
            return fail(out, json, "no_server", &message, EXIT_NO_SERVER);
        }
    };
    // `lock` passes its command's code on: never rewritten here.
    let is_lock = matches!(op, Op::Lock { .. });
    let code = run_reporting(client.clone(), errors, op, out).await;
    // A call that failed while the connection was down failed for want of a server.
    let lost = client.connection_state() != async_nats::connection::State::Connected;
    // What the command published goes out; a server gone does not hold the exit.
    let _ = tokio::time::timeout(FLUSH_BOUND, client.flush()).await;
    if code == EXIT_ERROR && lost && !is_lock {
        if !json {
            eprintln!("dagnats-leases: the connection to NATS was lost");
        }
        return EXIT_NO_SERVER;
    }
    code
}

/// Runs `op` on a connection made without an error report (see [`operate`]).
pub async fn run(nats: Client, op: Op, out: &mut (dyn Write + Send)) -> u8 {
    let (_keep, errors) = tokio::sync::mpsc::unbounded_channel();
    run_reporting(nats, errors, op, out).await
}

/// Runs `op` and returns the exit code; `errors` are the server's errors on the
/// connection (a refused subscribe or publish ends `watch` and `list` at once).
pub async fn run_reporting(
    nats: Client,
    errors: UnboundedReceiver<ServerError>,
    op: Op,
    out: &mut (dyn Write + Send),
) -> u8 {
    let json = op.common().json;
    let leases = LeaseClient::new(nats.clone());
    let result = match op {
        Op::Acquire {
            key,
            holder,
            ttl_ms,
            ttl,
            wait,
            ..
        } => match acquire_for(&leases, &key, &holder, ttl_ms, ttl, wait).await {
            Ok(r) => {
                let line = if json {
                    serde_json::to_string(&r).expect("replies serialise")
                } else if r.granted {
                    format!("granted {}", describe(&r.lease))
                } else {
                    format!("not granted: {}", describe(&r.lease))
                };
                let _ = writeln!(out, "{line}");
                Ok(if r.granted { EXIT_OK } else { EXIT_NOT_HELD })
            }
            Err(e) => Err(e),
        },
        Op::Renew {
            lease, ttl_ms, ttl, ..
        } => leases
            .renew(
                &lease.key,
                &lease.holder,
                lease.revision,
                ttl.or(ttl_ms.map(Duration::from_millis)),
            )
            .await
            .map(|l| print_lease(out, json, "renewed", &l)),
        Op::Release { lease, .. } => leases
            .release(&lease.key, &lease.holder, lease.revision)
            .await
            .map(|r| {
                let line = if json {
                    serde_json::to_string(&r).expect("replies serialise")
                } else {
                    format!("released {} (revision {})", r.key, r.revision)
                };
                let _ = writeln!(out, "{line}");
                EXIT_OK
            }),
        Op::Owner { key, .. } => leases.owner(&key).await.map(|lease| match lease {
            Some(l) => print_lease(out, json, "held", &l),
            None => {
                let line = if json {
                    json!({"held": false, "key": key}).to_string()
                } else {
                    format!("{key} is not held")
                };
                let _ = writeln!(out, "{line}");
                EXIT_NOT_HELD
            }
        }),
        Op::Forward {
            key,
            payload,
            timeout_ms,
            ..
        } => leases
            .forward(&key, payload.as_bytes(), Duration::from_millis(timeout_ms))
            .await
            .map(|f| {
                let line = if json {
                    json!({
                        "payload": base64::engine::general_purpose::STANDARD.encode(&f.payload),
                        "key": key, "holder": f.holder, "revision": f.revision,
                    })
                    .to_string()
                } else {
                    String::from_utf8_lossy(&f.payload).into_owned()
                };
                let _ = writeln!(out, "{line}");
                EXIT_OK
            }),
        Op::Watch { key, count, .. } => {
            return watch(&nats, errors, key, count, json, out).await;
        }
        Op::List { .. } => return list(&nats, errors, &leases, json, out).await,
        Op::Lock { args, .. } => return crate::lock::run(nats, args, json).await,
        Op::Elect { args, .. } => return crate::elect::run(nats, args, json, out).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => report(&e, json, out),
    }
}

/// `acquire`, with `--wait` through the library's waiting acquire, saying on
/// stderr whom it waits on.
async fn acquire_for(
    leases: &LeaseClient,
    key: &str,
    holder: &str,
    ttl_ms: u64,
    ttl: Option<Duration>,
    wait: Option<Duration>,
) -> Result<dagnats_leases_core::wire::AcquireReply, LeaseError> {
    let ttl = ttl.unwrap_or(Duration::from_millis(ttl_ms));
    let Some(wait) = wait else {
        return leases.acquire(key, holder, ttl).await;
    };
    let mut say = |r: &dagnats_leases_core::wire::AcquireReply| {
        eprintln!(
            "dagnats-leases: waiting for {} (held by {})",
            r.lease.key, r.lease.holder
        )
    };
    leases
        .acquire_waiting_noting(key, holder, ttl, wait, &mut say)
        .await
}

fn describe(l: &Lease) -> String {
    format!(
        "{} to {} (revision {}, acquired {}, expires {})",
        l.key, l.holder, l.revision, l.acquired_at, l.expires_at
    )
}

fn print_lease(out: &mut (dyn Write + Send), json: bool, verb: &str, l: &Lease) -> u8 {
    let line = if json {
        serde_json::to_string(l).expect("leases serialise")
    } else {
        format!("{verb} {}", describe(l))
    };
    let _ = writeln!(out, "{line}");
    EXIT_OK
}

/// Prints a failed call (stderr for humans, the error reply on stdout for `--json`).
fn report(e: &LeaseError, json: bool, out: &mut (dyn Write + Send)) -> u8 {
    if json {
        let value = match e.reply() {
            Some(reply) => serde_json::to_value(reply).expect("replies serialise"),
            None => json!({"error": e.to_string(), "kind": e.kind().as_str()}),
        };
        let _ = writeln!(out, "{value}");
    } else {
        eprintln!("dagnats-leases: {e}");
    }
    exit_code(e)
}

/// The server's error for a subscribe or publish it refused (a permissions
/// violation), as a sentence, or `None` for any other error.
fn denial(e: &ServerError, what: &str) -> Option<String> {
    let text = e.to_string();
    text.to_ascii_lowercase()
        .contains(&format!("permissions violation for {what}"))
        .then_some(text)
}

/// The next permissions violation of `what` (`subscription`, `publish`) the server
/// reports on the connection; pending for ever without one.
async fn next_denial(errors: &mut UnboundedReceiver<ServerError>, what: &str) -> String {
    while let Some(e) = errors.recv().await {
        if let Some(text) = denial(&e, what) {
            return text;
        }
    }
    std::future::pending().await
}

async fn watch(
    nats: &Client,
    mut errors: UnboundedReceiver<ServerError>,
    key: Option<String>,
    count: Option<u64>,
    json: bool,
    out: &mut (dyn Write + Send),
) -> u8 {
    // A key no lease can have is refused before anything is sent: a subscription
    // to it would wait for ever.
    if let Some(Err(e)) = key.as_deref().map(|k| check_name("key", k)) {
        return fail(out, json, e.kind.as_str(), &e.error, EXIT_ERROR);
    }
    let subject = changed_subject(key.as_deref().unwrap_or("*"));
    let mut sub = match nats.subscribe(subject.clone()).await {
        Ok(s) => s,
        Err(e) => {
            let message = format!("cannot subscribe to {subject}: {e}");
            return fail(out, json, "connection", &message, EXIT_NO_SERVER);
        }
    };
    // Bounded: a server gone between the connect and here does not hold the start.
    let _ = tokio::time::timeout(FLUSH_BOUND, nats.flush()).await;
    // Tell a script the subscription is live (stderr, so stdout stays events only).
    eprintln!("watching {subject}");
    let mut seen = 0;
    while count.is_none_or(|c| seen < c) {
        let message = tokio::select! {
            message = sub.next() => message,
            // The server refused the subscription: no event would ever come.
            denied = next_denial(&mut errors, "subscription") => {
                let message = format!(
                    "the server refused the subscription to {subject} ({denied}): \
                     the user needs subscribe permission on it (docs/security.md)"
                );
                return fail(out, json, "permission", &message, EXIT_ERROR);
            }
        };
        let Some(message) = message else {
            break;
        };
        // Every subject subscribed to names a key (`changed.<key>`, or `changed.*`).
        let Some(key) = ChangeEvent::key_of(message.subject.as_str()) else {
            continue;
        };
        seen += 1;
        let change = crate::client::change_event(&message);
        let (event, revision, holder) = (change.kind.as_str(), change.revision, change.holder);
        let line = if json {
            json!({"key": key, "event": event, "revision": revision, "holder": holder}).to_string()
        } else {
            match holder {
                Some(h) => format!("{revision} {key} {event} {h}"),
                None => format!("{revision} {key} {event}"),
            }
        };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
    EXIT_OK
}

/// Why `list` could not list.
enum ListFailure {
    /// A lease call failed.
    Call(LeaseError),
    /// Anything else: its kind and sentence.
    Other(&'static str, String),
}

/// Lists the held leases: the keys from the bucket's streams' subjects, then each
/// key's last record read from the streams in one pass (an ordered consumer per
/// stream), or, where the user may not read the streams, each key's holder through
/// the service (`owner`, several at once). A refused stream info request (a user
/// allowed `owner` only) ends it at once, saying so.
async fn list(
    nats: &Client,
    mut errors: UnboundedReceiver<ServerError>,
    leases: &LeaseClient,
    json: bool,
    out: &mut (dyn Write + Send),
) -> u8 {
    let held = match held_leases(nats, &mut errors, leases).await {
        Ok(held) => held,
        Err(ListFailure::Call(e)) => return report(&e, json, out),
        Err(ListFailure::Other(kind, message)) => {
            return fail(out, json, kind, &message, EXIT_ERROR);
        }
    };
    for l in &held {
        let line = if json {
            serde_json::to_string(l).expect("leases serialise")
        } else {
            describe(l)
        };
        let _ = writeln!(out, "{line}");
    }
    if !json {
        let _ = writeln!(out, "{} held", held.len());
    }
    EXIT_OK
}

/// What `list` says when the server refuses its stream info request.
fn list_denied(denied: String) -> ListFailure {
    ListFailure::Other(
        "permission",
        format!(
            "the server refused a JetStream request ({denied}): list reads the \
             bucket's stream info ($JS.API.STREAM.INFO.{STREAM}, and \
             {STREAM}_<N> when sharded); give the user publish on those \
             subjects (docs/security.md), or ask for one key with `owner KEY`"
        ),
    )
}

async fn held_leases(
    nats: &Client,
    errors: &mut UnboundedReceiver<ServerError>,
    leases: &LeaseClient,
) -> Result<Vec<Lease>, ListFailure> {
    let js = async_nats::jetstream::new(nats.clone());
    let (shards, streams) = tokio::select! {
        found = bucket_keys(&js) => found?,
        denied = next_denial(errors, "publish") => return Err(list_denied(denied)),
    };
    // Every key's last record in one pass per stream; a user who may not make a
    // consumer (or any other failure of it) falls back to the owner calls.
    let read = tokio::select! {
        read = read_leases(&shards, &streams) => read.ok(),
        _ = next_denial(errors, "publish") => None,
    };
    if let Some(held) = read {
        return Ok(held);
    }
    let keys: Vec<String> = streams.into_iter().flat_map(|(_, keys)| keys).collect();
    tokio::select! {
        held = owners(leases, keys) => held,
        denied = next_denial(errors, "publish") => Err(list_denied(denied)),
    }
}

/// The bucket's layout, and each stream with its lease keys (sorted).
async fn bucket_keys(
    js: &async_nats::jetstream::Context,
) -> Result<
    (
        ShardMap,
        Vec<(async_nats::jetstream::stream::Stream, Vec<String>)>,
    ),
    ListFailure,
> {
    // Ask what the bucket's streams say of its layout; the core reads it.
    let single = js.get_stream(STREAM).await;
    let shard_zero = match &single {
        Ok(_) => None,
        Err(_) => js.get_stream(ShardMap::first_sharded_stream()).await.ok(),
    };
    let found = match (&single, &shard_zero) {
        (Ok(_), _) => BucketStreams::OneStream,
        (Err(e), None) if no_responders(e) => BucketStreams::NoJetStream,
        (Err(_), Some(stream)) => BucketStreams::ShardZero {
            shards: stream
                .cached_info()
                .config
                .metadata
                .get(META_SHARDS)
                .map(String::as_str),
        },
        (Err(_), None) => BucketStreams::Neither,
    };
    let shards = match ShardMap::of_bucket(found) {
        Ok(map) => map,
        Err(why) => {
            let message = match single {
                Err(e) if found == BucketStreams::Neither => format!("{why} ({STREAM}: {e})"),
                _ => why.to_string(),
            };
            let kind = match found {
                BucketStreams::NoJetStream => "no_jetstream",
                _ => "no_bucket",
            };
            return Err(ListFailure::Other(kind, message));
        }
    };
    let mut streams = Vec::new();
    for i in shards.indexes() {
        let stream = js.get_stream(shards.stream(i)).await.map_err(|e| {
            ListFailure::Other("no_bucket", format!("no stream {}: {e}", shards.stream(i)))
        })?;
        let cannot = |e: &dyn std::fmt::Display| {
            ListFailure::Other("connection", format!("cannot list keys: {e}"))
        };
        // Lease keys only: `$KV.<bucket>.<key>.read` holds read confirmations.
        let mut keys = Vec::new();
        let mut info = stream
            .info_with_subjects(shards.lease_subjects(i))
            .await
            .map_err(|e| cannot(&e))?;
        while let Some(page) = info.next().await {
            let (subject, _) = page.map_err(|e| cannot(&e))?;
            if let Some(key) = shards.lease_key_of(i, &subject) {
                keys.push(key.to_string());
            }
        }
        keys.sort();
        streams.push((stream, keys));
    }
    Ok((shards, streams))
}

/// Whether a stream info request had no responders (async-nats' `NoResponders`
/// under `Request`): no server of the account answers the JetStream API.
fn no_responders(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    use async_nats::jetstream::context::{RequestError, RequestErrorKind};
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<RequestError>())
        .is_some_and(|r| r.kind() == RequestErrorKind::NoResponders)
}

/// How long `list` waits for the next record of a stream before it falls back to
/// the owner calls.
const LIST_READ_BOUND: Duration = Duration::from_secs(5);

/// Reads every key's last message from each stream (an ordered consumer delivering
/// the last message per lease subject) and keeps the held ones, by key.
async fn read_leases(
    shards: &ShardMap,
    streams: &[(async_nats::jetstream::stream::Stream, Vec<String>)],
) -> Result<Vec<Lease>, String> {
    use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
    let mut held = Vec::new();
    for (i, (stream, keys)) in shards.indexes().zip(streams) {
        if keys.is_empty() {
            continue;
        }
        let consumer = stream
            .create_consumer(OrderedConfig {
                filter_subject: shards.lease_subjects(i),
                deliver_policy: DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
        // One message per key listed; more keys may have come since.
        let mut seen = 0;
        while seen < keys.len() {
            let message = tokio::time::timeout(LIST_READ_BOUND, messages.next())
                .await
                .map_err(|_| "no record within the bound".to_string())?
                .ok_or("the consumer ended")?
                .map_err(|e| e.to_string())?;
            seen += 1;
            let info = message.info().map_err(|e| e.to_string())?;
            let (seq, pending, stored_at) = (info.stream_sequence, info.pending, info.published);
            let headers = message.headers.as_ref();
            let state = dagnats_leases_core::js::KeyState::of_message(
                seq,
                |name| headers.and_then(|h| h.get(name)).map(|v| v.as_str()),
                &message.payload,
                stored_at,
            );
            if let Some(lease) = shards
                .lease_key_of(i, message.subject.as_str())
                .and_then(|key| state.lease(key))
            {
                held.push(lease);
            }
            if pending == 0 {
                break;
            }
        }
    }
    held.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(held)
}

/// How many `owner` calls `list` has out at once.
const LIST_CALLS_IN_FLIGHT: usize = 16;

/// Each key's holder through the service (`owner`), several at once, in order.
async fn owners(leases: &LeaseClient, keys: Vec<String>) -> Result<Vec<Lease>, ListFailure> {
    let mut calls = futures::stream::iter(keys)
        .map(|key| async move { leases.owner(&key).await })
        .buffered(LIST_CALLS_IN_FLIGHT);
    let mut held = Vec::new();
    while let Some(answer) = calls.next().await {
        if let Some(lease) = answer.map_err(ListFailure::Call)? {
            held.push(lease);
        }
    }
    held.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(held)
}
