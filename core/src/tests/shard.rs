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

/// The layout guard subject is inside the one-stream layout's `$KV.leases.>` (so
/// the server refuses one layout beside the other) and its token is no key or
/// account name (so nothing is ever written to it).
#[test]
fn the_layout_guard_subject_overlaps_the_one_stream_layout_and_is_no_key() {
    use crate::shard::LAYOUT_GUARD_SUBJECT;
    let token = LAYOUT_GUARD_SUBJECT
        .strip_prefix("$KV.leases.")
        .expect("inside $KV.leases.>");
    assert!(!token.contains('.'), "one token");
    assert!(crate::wire::check_name("key", token).is_err());
    let three = crate::shard::ShardMap::new(3).unwrap();
    assert!(
        three
            .stream_subject_list(0)
            .contains(&LAYOUT_GUARD_SUBJECT.to_string())
    );
    assert_eq!(
        three.stream_subject_list(1),
        vec!["$KV.leases_1.>".to_string()]
    );
    assert_eq!(
        crate::shard::ShardMap::SINGLE.stream_subject_list(0),
        vec!["$KV.leases.>".to_string()]
    );
}

/// A bucket is one stream when `KV_leases` exists; otherwise it has the count
/// shard 0 records, which must be one a sharded layout can have (one shard is
/// `KV_leases`); no stream, or no valid count, is an error naming what is missing.
#[test]
fn a_buckets_layout_is_one_stream_if_kv_leases_exists_else_the_count_shard_0_records() {
    use crate::shard::BucketStreams::{Neither, NoJetStream, OneStream, ShardZero};
    assert_eq!(ShardMap::first_sharded_stream(), "KV_leases_0");
    assert_eq!(
        ShardMap::first_sharded_stream(),
        ShardMap::new(2).unwrap().stream(0)
    );
    let table = [
        ("KV_leases exists", OneStream, Ok(ShardMap::SINGLE)),
        (
            "shard 0 records three",
            ShardZero { shards: Some("3") },
            Ok(ShardMap::new(3).unwrap()),
        ),
        (
            "shard 0 records the most",
            ShardZero { shards: Some("64") },
            Ok(ShardMap::new(MAX_SHARDS).unwrap()),
        ),
        (
            "shard 0 records one: no sharded layout has one",
            ShardZero { shards: Some("1") },
            Err("\"1\""),
        ),
        (
            "shard 0 records none",
            ShardZero { shards: None },
            Err("it has none"),
        ),
        (
            "shard 0 records zero",
            ShardZero { shards: Some("0") },
            Err("\"0\""),
        ),
        (
            "past the bound",
            ShardZero { shards: Some("65") },
            Err("\"65\""),
        ),
        (
            "not a number",
            ShardZero {
                shards: Some("three"),
            },
            Err("\"three\""),
        ),
        ("no stream at all", Neither, Err("no leases bucket")),
        (
            "no JetStream to ask: not said to be a missing bucket",
            NoJetStream,
            Err("no JetStream"),
        ),
    ];
    for (name, found, want) in table {
        let got = ShardMap::of_bucket(found);
        match (&got, want) {
            (Ok(map), Ok(want)) => assert_eq!(*map, want, "{name}"),
            (Err(why), Err(says)) => {
                assert!(why.contains(says), "{name}: {why}");
                if matches!(found, ShardZero { .. }) {
                    assert!(
                        why.contains("KV_leases_0") && why.contains("dagnats_shards"),
                        "{name}: {why}"
                    );
                }
            }
            (got, want) => panic!("{name}: {got:?}, wanted {want:?}"),
        }
    }
}

/// Listing keys reads lease subjects only: a read confirmation, another shard's
/// key or another bucket's is no lease key of shard `i`.
#[test]
fn only_a_one_token_subject_of_the_shards_own_bucket_is_a_lease_key() {
    let one = ShardMap::SINGLE;
    assert_eq!(one.lease_key_of(0, &kv_subject("job")), Some("job"));
    assert_eq!(one.lease_key_of(0, &confirm_subject("job")), None);
    for other in [
        "$KV.leases.",
        "$KV.leases_0.job",
        "$KV.other.job",
        "$KV.leasesX.job",
        "dagnats.lease.changed.job",
        "",
    ] {
        assert_eq!(one.lease_key_of(0, other), None, "{other}");
    }
    let three = ShardMap::new(3).unwrap();
    assert_eq!(three.lease_key_of(1, "$KV.leases_1.job"), Some("job"));
    assert_eq!(three.lease_key_of(1, "$KV.leases_1.job.read"), None);
    assert_eq!(three.lease_key_of(1, "$KV.leases_2.job"), None);
    assert_eq!(three.lease_key_of(1, "$KV.leases.job"), None);
}
