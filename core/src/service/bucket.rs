//! The bucket as the service makes it: the options the operator chose, each
//! shard's stream config and republish, the fields startup makes right on a
//! stream that exists, and how the server's version and stream info are read.
//! [`Startup`](super::startup::Startup) is the machine that ensures it.

use std::time::Duration;

use serde_json::{Value, json};

use crate::io::{NatsRequest, RequestOutcome};
use crate::js;
use crate::shard::{META_SHARD, META_SHARDS, ShardMap};
use crate::subjects::{REPUBLISH_DEST, TENANT_REPUBLISH_DEST};
use crate::tenant::Tenancy;

#[cfg(doc)]
use crate::shard::LAYOUT_GUARD_SUBJECT;

/// The first nats-server version with per-message TTL.
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 11);
/// The first nats-server version with ADR-50 atomic batches (`allow_atomic`).
pub const ATOMIC_SERVER_VERSION: (u64, u64) = (2, 12);
/// `subject_delete_marker_ttl` of the bucket: how long an expiry marker stays (1 s, in ns).
pub const MARKER_TTL_NS: u64 = 1_000_000_000;

/// What the operator chose for the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketOptions {
    /// Stream replicas; `None` creates with 1 and leaves an existing stream's alone.
    pub replicas: Option<usize>,
    /// One namespace, or one per tenant account: the republish follows it. A
    /// stream has one republish, so a bucket serves one layout at a time.
    pub tenancy: Tenancy,
    /// How many streams keys are spread over (`--shards`); one is today's layout.
    pub shards: ShardMap,
}

/// The stream config the bucket is created with (contract.md, "Server and bucket").
pub fn stream_config(replicas: usize) -> Value {
    shard_stream_config(&ShardMap::SINGLE, 0, replicas)
}

/// The config of shard `i`'s stream: with one shard exactly [`stream_config`];
/// with more, its own name and subjects, and `metadata` recording the shard count
/// and the shard's index, so that a service started with another count refuses.
/// Shard 0 of a sharded layout also stores [`LAYOUT_GUARD_SUBJECT`], so that the
/// server refuses to create the one-stream layout beside it, and the other way round.
pub fn shard_stream_config(shards: &ShardMap, i: u32, replicas: usize) -> Value {
    let mut config = json!({
        "name": shards.stream(i),
        "subjects": shards.stream_subject_list(i),
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": 0,
        "max_msgs_per_subject": 1,
        "max_msg_size": -1,
        "storage": "file",
        "discard": "new",
        "num_replicas": replicas,
        "duplicate_window": 120_000_000_000u64,
        "allow_rollup_hdrs": true,
        "deny_delete": true,
        "deny_purge": false,
        "allow_direct": false,
        "mirror_direct": false,
        "allow_msg_ttl": true,
        "subject_delete_marker_ttl": MARKER_TTL_NS,
        "republish": shard_republish(shards, i, Tenancy::Single),
    });
    if !shards.is_single() {
        config["metadata"] = json!({
            META_SHARDS: shards.count().to_string(),
            META_SHARD: i.to_string(),
        });
    }
    config
}

/// [`stream_config`], with `allow_atomic: true` when the server takes atomic
/// batches (2.12+): the write coalescer sends its batches only then.
pub fn stream_config_with_atomic(replicas: usize, atomic: bool) -> Value {
    let mut config = stream_config(replicas);
    if atomic {
        config["allow_atomic"] = json!(true);
    }
    config
}

/// RePublish of the lease keys only: read confirmations and their markers are
/// stream messages too, and must never become change events.
fn republish() -> Value {
    shard_republish(&ShardMap::SINGLE, 0, Tenancy::Single)
}

/// The republish of shard `i`'s lease keys: every shard goes out on the same
/// client subjects (nats-server takes one RePublish destination on many streams).
pub fn shard_republish(shards: &ShardMap, i: u32, tenancy: Tenancy) -> Value {
    match tenancy {
        Tenancy::Single => json!({ "src": shards.lease_subjects(i), "dest": REPUBLISH_DEST }),
        Tenancy::Accounts => json!({
            "src": shards.tenant_lease_subjects(i),
            "dest": TENANT_REPUBLISH_DEST,
        }),
    }
}

/// The republish of a layout: a tenant's key `$KV.leases.<account>.<key>` goes
/// out on `dagnats.lease.changed.<account>.<key>`, which the tenant imports as
/// `dagnats.lease.changed.<key>` (`account_token_position` keeps it to its own).
pub fn one_stream_republish(tenancy: Tenancy) -> Value {
    shard_republish(&ShardMap::SINGLE, 0, tenancy)
}

/// The fields startup makes right on an existing stream, and their wanted values.
pub(super) fn managed_fields() -> Vec<(&'static str, Value)> {
    vec![
        ("max_msgs_per_subject", json!(1)),
        ("allow_rollup_hdrs", json!(true)),
        ("allow_direct", json!(false)),
        ("allow_msg_ttl", json!(true)),
        ("subject_delete_marker_ttl", json!(MARKER_TTL_NS)),
        // Was `$KV.leases.>` before read confirmations: an older bucket migrates.
        ("republish", republish()),
    ]
}

/// `$JS.API.STREAM.INFO.<stream>`: asked at startup, and again while serving for
/// the replicas.
pub fn stream_info_request(stream: &str, timeout: Duration) -> NatsRequest {
    js::api_request(format!("$JS.API.STREAM.INFO.{stream}"), &json!({}), timeout)
}

/// The stream's replicas from a reply to [`stream_info_request`]; `None` when the
/// reply does not tell (an error, or JetStream unavailable): keep what was known.
pub fn replicas_from_reply(outcome: &RequestOutcome) -> Option<usize> {
    match js::parse_api_reply(outcome) {
        Ok(Ok(info)) => configured_replicas(&info),
        _ => None,
    }
}

pub(super) fn configured_replicas(info: &Value) -> Option<usize> {
    let n = info.get("config")?.get("num_replicas")?.as_u64()?;
    usize::try_from(n).ok().map(|n| n.max(1))
}

/// Parses `2.14.0`, `v2.11.0-RC.1` and the like into (major, minor).
pub fn parse_version(version: &str) -> Option<(u64, u64)> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}
