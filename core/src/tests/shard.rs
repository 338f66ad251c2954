//! The shard map: a fixed hash, names per shard, one shard is today's layout.

use crate::shard::{MAX_SHARDS, ShardMap, fnv1a64};
use crate::subjects::{
    LEASE_SUBJECTS, STREAM, STREAM_SUBJECTS, TENANT_LEASE_SUBJECTS, confirm_subject, kv_subject,
};

/// FNV-1a 64's published test vectors: the shard of a key cannot drift with a
/// Rust version or a platform.
#[test]
fn fnv1a64_matches_the_published_vectors() {
    for (input, hash) in [
        ("", 0xcbf2_9ce4_8422_2325u64),
        ("a", 0xaf63_dc4c_8601_ec8c),
        ("foobar", 0x8594_4171_f739_67e8),
    ] {
        assert_eq!(fnv1a64(input.as_bytes()), hash, "{input:?}");
    }
}

/// One shard is today's layout, name for name.
#[test]
fn one_shard_is_the_single_bucket() {
    let one = ShardMap::SINGLE;
    assert_eq!(ShardMap::new(1), Ok(one));
    assert_eq!(ShardMap::default(), one);
    for key in ["job", "TA.job", "a-b_c"] {
        assert_eq!(one.shard_of(key), 0);
        assert_eq!(one.kv_subject(key), kv_subject(key));
        assert_eq!(one.confirm_subject(key), confirm_subject(key));
        assert_eq!(one.stream_of(key), STREAM);
    }
    assert_eq!(one.stream_subjects(0), STREAM_SUBJECTS);
    assert_eq!(one.lease_subjects(0), LEASE_SUBJECTS);
    assert_eq!(one.tenant_lease_subjects(0), TENANT_LEASE_SUBJECTS);
}

/// With several shards every name carries the shard of the key, and the shard is
/// the hash of the storage key modulo the count.
#[test]
fn several_shards_name_the_keys_shard() {
    let three = ShardMap::new(3).unwrap();
    for key in ["job", "TA.job", "TB.job", "k-0", "k-1", "k-2", "k-3"] {
        let i = three.shard_of(key);
        assert_eq!(u64::from(i), fnv1a64(key.as_bytes()) % 3, "{key}");
        assert_eq!(three.kv_subject(key), format!("$KV.leases_{i}.{key}"));
        assert_eq!(
            three.confirm_subject(key),
            format!("$KV.leases_{i}.{key}.read")
        );
        assert_eq!(three.stream_of(key), format!("KV_leases_{i}"));
        assert_eq!(
            three.api_subject("STREAM.PURGE", key),
            format!("$JS.API.STREAM.PURGE.KV_leases_{i}")
        );
        assert_eq!(
            ShardMap::bucket_of_subject(&three.kv_subject(key)),
            Some(format!("leases_{i}").as_str())
        );
    }
    assert_eq!(three.stream_subjects(2), "$KV.leases_2.>");
    assert_eq!(three.lease_subjects(1), "$KV.leases_1.*");
    assert_eq!(three.tenant_lease_subjects(0), "$KV.leases_0.*.*");
    assert_eq!(three.indexes().collect::<Vec<_>>(), [0, 1, 2]);
}

/// Keys spread: a hundred keys over four shards leave none empty.
#[test]
fn keys_spread_over_every_shard() {
    let four = ShardMap::new(4).unwrap();
    let mut seen = [0usize; 4];
    for n in 0..100 {
        seen[four.shard_of(&format!("key-{n}")) as usize] += 1;
    }
    assert!(seen.iter().all(|&c| c > 0), "{seen:?}");
}

/// A count of 0 or past the bound is refused with a sentence naming `--shards`.
#[test]
fn a_bad_count_is_refused() {
    for bad in [0, MAX_SHARDS + 1] {
        let e = ShardMap::new(bad).unwrap_err();
        assert!(e.contains("--shards"), "{e}");
    }
    assert!(ShardMap::new(MAX_SHARDS).is_ok());
}
