//! The operator commands of the `dagnats-leases` binary: acquire, renew, release,
//! owner, forward, watch and list. Human-readable lines by default, one JSON object
//! per line with `--json`.
//!
//! Exit codes: 0 done; 3 the lease is not yours or not held (`lost`, `not_held`,
//! acquire not granted, owner of a free key, `lock --wait` ended without the lease);
//! 4 `fence_mismatch`; 5 `lock`: the lease was lost while the command ran; 1 any
//! other error; 2 no NATS server (or bad arguments). `lock` otherwise exits with its
//! command's code.

use std::io::Write;
use std::time::Duration;

use async_nats::Client;
use base64::Engine as _;
use dagnats_leases_core::change::ChangeEvent;
use dagnats_leases_core::shard::{BucketStreams, META_SHARDS, ShardMap};
use dagnats_leases_core::shutdown::FLUSH_BOUND;
use dagnats_leases_core::subjects::{STREAM, changed_subject};
use dagnats_leases_core::wire::Lease;
use futures::StreamExt;
use serde_json::json;

use crate::client::{LeaseClient, LeaseError};
use crate::connect::ConnectOptions;

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
    #[arg(long)]
    pub json: bool,
}

/// A lease named under its fence, as renew and release take it.
#[derive(Debug, Clone, clap::Args)]
pub struct FencedLease {
    /// The lease key.
    pub key: String,
    /// Your holder ID.
    #[arg(long)]
    pub holder: String,
    /// The fence from your last reply.
    #[arg(long)]
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
        #[arg(long)]
        holder: String,
        /// Time to live, whole seconds in milliseconds.
        #[arg(long, default_value_t = 15_000)]
        ttl_ms: u64,
        /// Wait up to this long while another holder has it (`500ms`, `5s`, `2m`),
        /// trying again when it is released or expires; `0` tries once.
        #[arg(long, value_parser = crate::lock::parse_duration)]
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
        /// New time to live (default: the lease's own).
        #[arg(long)]
        ttl_ms: Option<u64>,
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
        #[arg(long, default_value = "")]
        payload: String,
        /// Bound on the whole call, 100 to 30000 ms.
        #[arg(long, default_value_t = 5000)]
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
        #[arg(long)]
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

/// Runs `op` and returns the exit code; output goes to `out`, errors to stderr.
pub async fn run(nats: Client, op: Op, out: &mut (dyn Write + Send)) -> u8 {
    let json = op.common().json;
    let leases = LeaseClient::new(nats.clone());
    let result = match op {
        Op::Acquire {
            key,
            holder,
            ttl_ms,
            wait,
            ..
        } => match acquire_for(&leases, &key, &holder, ttl_ms, wait).await {
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
        Op::Renew { lease, ttl_ms, .. } => leases
            .renew(
                &lease.key,
                &lease.holder,
                lease.revision,
                ttl_ms.map(Duration::from_millis),
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
        Op::Watch { key, count, .. } => return watch(&nats, key, count, json, out).await,
        Op::List { .. } => return list(&nats, &leases, json, out).await,
        Op::Lock { args, .. } => return crate::lock::run(nats, args).await,
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
    wait: Option<Duration>,
) -> Result<dagnats_leases_core::wire::AcquireReply, LeaseError> {
    let ttl = Duration::from_millis(ttl_ms);
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
            None => json!({"error": e.to_string(), "kind": format!("{:?}", e.kind())}),
        };
        let _ = writeln!(out, "{value}");
    } else {
        eprintln!("dagnats-leases: {e}");
    }
    exit_code(e)
}

async fn watch(
    nats: &Client,
    key: Option<String>,
    count: Option<u64>,
    json: bool,
    out: &mut (dyn Write + Send),
) -> u8 {
    let subject = changed_subject(key.as_deref().unwrap_or("*"));
    let mut sub = match nats.subscribe(subject.clone()).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dagnats-leases: cannot subscribe: {e}");
            return EXIT_NO_SERVER;
        }
    };
    // Bounded: a server gone between the connect and here does not hold the start.
    let _ = tokio::time::timeout(FLUSH_BOUND, nats.flush()).await;
    // Tell a script the subscription is live (stderr, so stdout stays events only).
    eprintln!("watching {subject}");
    let mut seen = 0;
    while count.is_none_or(|c| seen < c) {
        let Some(message) = sub.next().await else {
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

async fn list(nats: &Client, leases: &LeaseClient, json: bool, out: &mut (dyn Write + Send)) -> u8 {
    let js = async_nats::jetstream::new(nats.clone());
    // Ask what the bucket's streams say of its layout; the core reads it.
    let single = js.get_stream(STREAM).await;
    let shard_zero = match &single {
        Ok(_) => None,
        Err(_) => js.get_stream(ShardMap::first_sharded_stream()).await.ok(),
    };
    let found = match (&single, &shard_zero) {
        (Ok(_), _) => BucketStreams::OneStream,
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
            match single {
                Err(e) if found == BucketStreams::Neither => {
                    eprintln!("dagnats-leases: {why} ({STREAM}: {e})")
                }
                _ => eprintln!("dagnats-leases: {why}"),
            }
            return EXIT_ERROR;
        }
    };
    let mut keys: Vec<String> = Vec::new();
    for i in shards.indexes() {
        let stream = match js.get_stream(shards.stream(i)).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("dagnats-leases: no stream {}: {e}", shards.stream(i));
                return EXIT_ERROR;
            }
        };
        // Lease keys only: `$KV.<bucket>.<key>.read` holds read confirmations.
        let subjects = match stream.info_with_subjects(shards.lease_subjects(i)).await {
            Ok(mut info) => {
                let mut all = Vec::new();
                while let Some(page) = info.next().await {
                    match page {
                        Ok((subject, _)) => all.push(subject),
                        Err(e) => {
                            eprintln!("dagnats-leases: cannot list keys: {e}");
                            return EXIT_ERROR;
                        }
                    }
                }
                all
            }
            Err(e) => {
                eprintln!("dagnats-leases: cannot list keys: {e}");
                return EXIT_ERROR;
            }
        };
        keys.extend(
            subjects
                .iter()
                .filter_map(|s| shards.lease_key_of(i, s).map(str::to_string)),
        );
    }
    keys.sort();
    let mut held = 0;
    for key in keys {
        // Each through the stream leader, as every call is.
        match leases.owner(&key).await {
            Ok(Some(l)) => {
                held += 1;
                let line = if json {
                    serde_json::to_string(&l).expect("leases serialise")
                } else {
                    describe(&l)
                };
                let _ = writeln!(out, "{line}");
            }
            Ok(None) => {}
            Err(e) => return report(&e, json, out),
        }
    }
    if !json {
        let _ = writeln!(out, "{held} held");
    }
    EXIT_OK
}
