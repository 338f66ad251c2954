//! The sharded bucket (`serve --shards N`): which stream holds a key, and the names
//! of each shard's bucket, stream and subjects.
//!
//! With one shard (the default) the layout is the one the service always had:
//! bucket `leases`, stream `KV_leases`, keys at `$KV.leases.<key>`. With `N > 1`
//! there are `N` buckets `leases_0 .. leases_{N-1}` (streams `KV_leases_<i>`, keys
//! at `$KV.leases_<i>.<key>`); none of them is `leases`, so the two layouts never
//! share a stream and a service started with the other count finds the other
//! layout's streams and refuses ([`crate::service::startup`]).
//!
//! The shard of a key is FNV-1a (64-bit) of the *storage* key's bytes (tenancy's
//! `<account>.<key>`), modulo `N`. FNV-1a is fixed by its definition (offset basis
//! and prime), so the shard of a key is the same on every platform, Rust version
//! and build, unlike std's `DefaultHasher`, whose algorithm is not promised. The
//! `fnv` crate computes it; a table test pins the published test vectors, so a
//! change of the crate that moved keys between shards would fail it.
//!
//! Every shard's stream republishes its lease keys to the same client subjects
//! (`dagnats.lease.changed.<key>`): a client sees one bucket.

use crate::subjects::{BUCKET, CONFIRM_TOKEN};

/// The most shards a service takes: each one is a stream (with its own leader,
/// Raft group and files on a cluster), so a count past this is surely a typo.
pub const MAX_SHARDS: u32 = 64;
/// Stream metadata key: how many shards the stream's layout has.
pub const META_SHARDS: &str = "dagnats_shards";
/// Stream metadata key: which shard the stream is.
pub const META_SHARD: &str = "dagnats_shard";

/// The one subject inside `$KV.leases.>` that shard 0 of a sharded layout also
/// stores: `~` is in no key or account name (`[A-Za-z0-9_-]`), so nothing is ever
/// written to it, but it overlaps the one-stream layout's `$KV.leases.>`. The
/// server refuses a stream whose subjects overlap another's (JetStream 10065), so
/// whichever layout is created second fails, even when two services race.
pub const LAYOUT_GUARD_SUBJECT: &str = "$KV.leases.~sharded";

/// FNV-1a, 64-bit, of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(bytes);
    hasher.finish()
}

/// What a bucket's streams say of its layout, as a tool that did not start the
/// service finds them (`list`): ask for `KV_leases` first, then, if it is not
/// there, for shard 0 of a sharded layout ([`ShardMap::first_sharded_stream`]),
/// and hand the answers to [`ShardMap::of_bucket`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketStreams<'a> {
    /// `KV_leases` exists: the one-stream layout.
    OneStream,
    /// `KV_leases` does not exist and shard 0 does, its [`META_SHARDS`] metadata
    /// this value (`None`: it has none).
    ShardZero {
        /// The value of [`META_SHARDS`] in shard 0's metadata.
        shards: Option<&'a str>,
    },
    /// Neither exists: there is no leases bucket.
    Neither,
    /// Nothing answered the JetStream API (no responders): JetStream is off, so
    /// there can be no bucket, and saying "no bucket" would mislead.
    NoJetStream,
}

/// How keys are spread over streams. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShardMap {
    count: u32,
}

impl Default for ShardMap {
    fn default() -> Self {
        Self::SINGLE
    }
}

impl ShardMap {
    /// One shard: bucket `leases`, today's layout.
    pub const SINGLE: Self = Self { count: 1 };

    /// `count` shards, or the error to show (naming `--shards`) when it is 0 or
    /// more than [`MAX_SHARDS`].
    pub fn new(count: u32) -> Result<Self, String> {
        if count == 0 || count > MAX_SHARDS {
            return Err(format!(
                "--shards must be between 1 and {MAX_SHARDS}, got {count}"
            ));
        }
        Ok(Self { count })
    }

    /// Shard 0 of every sharded layout, `KV_leases_0`: the stream whose metadata
    /// records the shard count, and whose existence says a bucket is sharded.
    pub fn first_sharded_stream() -> String {
        format!("KV_{BUCKET}_0")
    }

    /// The layout of a bucket as its streams say ([`BucketStreams`]): one stream
    /// when `KV_leases` exists; else as many shards as shard 0's [`META_SHARDS`]
    /// records, which must be a count a sharded layout can have (2 to
    /// [`MAX_SHARDS`]: one shard is `KV_leases`, never `KV_leases_0`). The error
    /// is the sentence to show.
    pub fn of_bucket(found: BucketStreams<'_>) -> Result<Self, String> {
        match found {
            BucketStreams::OneStream => Ok(Self::SINGLE),
            BucketStreams::NoJetStream => Err(format!(
                "no JetStream: nothing answered $JS.API.STREAM.INFO.KV_{BUCKET} (no \
                 responders), so no server of this account runs JetStream (nats-server \
                 needs -js, or a jetstream block)"
            )),
            BucketStreams::Neither => Err(format!(
                "no leases bucket: neither stream KV_{BUCKET} nor {} exists",
                Self::first_sharded_stream()
            )),
            BucketStreams::ShardZero { shards } => shards
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| (2..=MAX_SHARDS).contains(n))
                .map(|count| Self { count })
                .ok_or_else(|| {
                    format!(
                        "{} has no valid {META_SHARDS} in its metadata (a count from 2 to \
                         {MAX_SHARDS}; it has {})",
                        Self::first_sharded_stream(),
                        shards.map_or_else(|| "none".to_string(), |n| format!("{n:?}"))
                    )
                }),
        }
    }

    /// How many shards.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether this is the one-stream layout.
    pub fn is_single(&self) -> bool {
        self.count == 1
    }

    /// The shards' indexes, `0 .. count`.
    pub fn indexes(&self) -> std::ops::Range<u32> {
        0..self.count
    }

    /// The shard of a storage key (`<key>`, or tenancy's `<account>.<key>`).
    pub fn shard_of(&self, storage_key: &str) -> u32 {
        if self.count == 1 {
            return 0;
        }
        (fnv1a64(storage_key.as_bytes()) % u64::from(self.count)) as u32
    }

    /// The bucket of shard `i`: `leases` with one shard, `leases_<i>` with more.
    pub fn bucket(&self, i: u32) -> String {
        if self.count == 1 {
            BUCKET.to_string()
        } else {
            format!("{BUCKET}_{i}")
        }
    }

    /// The stream of shard `i`: `KV_<bucket>`.
    pub fn stream(&self, i: u32) -> String {
        format!("KV_{}", self.bucket(i))
    }

    /// The stream that holds `storage_key`.
    pub fn stream_of(&self, storage_key: &str) -> String {
        self.stream(self.shard_of(storage_key))
    }

    /// What shard `i`'s stream stores: `$KV.<bucket>.>` (keys and read confirmations).
    pub fn stream_subjects(&self, i: u32) -> String {
        format!("$KV.{}.>", self.bucket(i))
    }

    /// Every subject shard `i`'s stream stores: [`ShardMap::stream_subjects`], and
    /// for shard 0 of a sharded layout also [`LAYOUT_GUARD_SUBJECT`].
    pub fn stream_subject_list(&self, i: u32) -> Vec<String> {
        let mut subjects = vec![self.stream_subjects(i)];
        if i == 0 && !self.is_single() {
            subjects.push(LAYOUT_GUARD_SUBJECT.to_string());
        }
        subjects
    }

    /// Shard `i`'s lease keys alone: `$KV.<bucket>.*`.
    pub fn lease_subjects(&self, i: u32) -> String {
        format!("$KV.{}.*", self.bucket(i))
    }

    /// Tenancy: shard `i`'s lease keys of every tenant, `$KV.<bucket>.*.*`.
    pub fn tenant_lease_subjects(&self, i: u32) -> String {
        format!("$KV.{}.*.*", self.bucket(i))
    }

    /// The KV subject of a storage key, in its shard: `$KV.<bucket>.<key>`.
    pub fn kv_subject(&self, storage_key: &str) -> String {
        format!(
            "$KV.{}.{storage_key}",
            self.bucket(self.shard_of(storage_key))
        )
    }

    /// Where a read of a storage key is confirmed: `$KV.<bucket>.<key>.read`, in
    /// the key's own shard (a conditional write checks a subject of its own stream).
    pub fn confirm_subject(&self, storage_key: &str) -> String {
        format!("{}.{CONFIRM_TOKEN}", self.kv_subject(storage_key))
    }

    /// The JetStream API subject `$JS.API.<verb>.<stream of storage_key>`, e.g.
    /// `STREAM.PURGE` or `STREAM.MSG.GET`.
    pub fn api_subject(&self, verb: &str, storage_key: &str) -> String {
        format!("$JS.API.{verb}.{}", self.stream_of(storage_key))
    }

    /// The lease key shard `i`'s subject names: `<key>` of `$KV.<bucket>.<key>`.
    /// `None` for any other subject: a read confirmation (`$KV.<bucket>.<key>.read`,
    /// two tokens after the bucket) or another shard's subject is no lease of `i`.
    pub fn lease_key_of<'a>(&self, i: u32, subject: &'a str) -> Option<&'a str> {
        subject
            .strip_prefix("$KV.")?
            .strip_prefix(self.bucket(i).as_str())?
            .strip_prefix('.')
            .filter(|k| !k.is_empty() && !k.contains('.'))
    }

    /// The bucket token of a KV subject (`$KV.<bucket>.…`), if it is one: the
    /// coalescer never puts two streams' writes in one atomic batch.
    pub fn bucket_of_subject(subject: &str) -> Option<&str> {
        subject.strip_prefix("$KV.")?.split('.').next()
    }
}
