//! Startup: the bucket is ensured, or the service settles on `unsupported` mode.

use super::support::owner_ids;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::io::{Mode, NatsRequest, RequestOutcome, TransmitId, TransmitKind};
use crate::service::bucket::{BucketOptions, stream_config, stream_config_with_atomic};
use crate::service::startup::{STARTUP_RETRY, Startup, StartupEvent};
use crate::sim::api_error;

const T: Duration = Duration::from_secs(5);

fn next_request(s: &mut Startup) -> (TransmitId, NatsRequest) {
    logged_request(s).1
}

/// The log lines before the next request, and the request.
fn logged_request(s: &mut Startup) -> (Vec<String>, (TransmitId, NatsRequest)) {
    let mut logs = Vec::new();
    while let Some(e) = s.poll_event() {
        match e {
            StartupEvent::Log(l) => logs.push(l),
            StartupEvent::Serve(m) => panic!("done early: {m:?}"),
            StartupEvent::StartRefused(r) => panic!("refused: {r}"),
        }
    }
    let t = s
        .poll_transmit(&mut owner_ids())
        .expect("startup wants something");
    assert_eq!(t.kind, TransmitKind::Api);
    (logs, (t.id, t.request))
}

/// Startup's end. A bucket found (not created) is followed by the question whether
/// the other layout's first stream exists too; it is answered "not found" here.
fn served_mode(s: &mut Startup) -> (Mode, Vec<String>) {
    if let Some(t) = s.poll_transmit(&mut owner_ids()) {
        let layout = [
            "$JS.API.STREAM.INFO.KV_leases_0",
            "$JS.API.STREAM.INFO.KV_leases",
        ];
        assert!(
            layout.contains(&t.request.subject.as_str()),
            "unexpected request {}",
            t.request.subject
        );
        s.handle_outcome(
            Instant::now(),
            t.id,
            api_error(404, 10059, "stream not found"),
        );
    }
    if let Some(t) = s.poll_transmit(&mut owner_ids()) {
        panic!("unexpected request {}", t.request.subject);
    }
    let mut logs = Vec::new();
    loop {
        match s.poll_event().expect("startup should be done") {
            StartupEvent::Log(l) => logs.push(l),
            StartupEvent::Serve(m) => {
                assert!(s.is_done());
                return (m, logs);
            }
            StartupEvent::StartRefused(r) => panic!("refused: {r}"),
        }
    }
}

/// Answers the stream info asked as `id` with "not found", then the question
/// startup asks before it creates anything (does the other layout's first stream,
/// `KV_leases_0`, exist?) with "not found" too: a create comes next.
fn absent(s: &mut Startup, id: TransmitId) {
    s.handle_outcome(
        Instant::now(),
        id,
        api_error(404, 10059, "stream not found"),
    );
    other_layout_absent(s, "KV_leases_0");
}

/// Answers startup's question whether the other layout's first stream, `stream`,
/// exists: "not found".
fn other_layout_absent(s: &mut Startup, stream: &str) {
    let (id, r) = next_request(s);
    assert_eq!(
        r.subject,
        format!("$JS.API.STREAM.INFO.{stream}"),
        "the other layout"
    );
    s.handle_outcome(
        Instant::now(),
        id,
        api_error(404, 10059, "stream not found"),
    );
}

fn info(config: Value) -> RequestOutcome {
    RequestOutcome::reply(json!({"config": config, "state": {}}).to_string())
}

#[test]
fn a_server_older_than_2_11_is_unsupported_and_nothing_is_created() {
    for v in ["2.9.10", "2.10.24", "v2.10.0", "garbage"] {
        let mut s = Startup::new(BucketOptions::default(), v, T, Instant::now());
        assert_eq!(served_mode(&mut s).0, Mode::Unsupported, "{v}");
    }
}

#[test]
fn a_missing_bucket_is_created_with_the_contract_config() {
    let mut s = Startup::new(BucketOptions::default(), "2.14.0", T, Instant::now());
    let (id, r) = next_request(&mut s);
    assert_eq!(r.subject, "$JS.API.STREAM.INFO.KV_leases");
    absent(&mut s, id);
    let (id, r) = next_request(&mut s);
    assert_eq!(r.subject, "$JS.API.STREAM.CREATE.KV_leases");
    let config: Value = serde_json::from_slice(&r.payload).unwrap();
    assert_eq!(config["max_msgs_per_subject"], 1);
    assert_eq!(config["allow_msg_ttl"], true);
    assert_eq!(config["subject_delete_marker_ttl"], 1_000_000_000u64);
    assert_eq!(config["allow_direct"], false);
    assert_eq!(config["storage"], "file");
    assert_eq!(config["num_replicas"], 1);
    assert_eq!(
        config["republish"],
        json!({"src": "$KV.leases.*", "dest": "dagnats.lease.changed.{{wildcard(1)}}"})
    );
    s.handle_outcome(Instant::now(), id, info(config));
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
}

#[test]
fn a_create_the_server_accepts_but_whose_config_lacks_allow_msg_ttl_is_unsupported() {
    // What a 2.9 server does: accepts the create and drops the fields it does not know.
    let mut s = Startup::new(BucketOptions::default(), "2.11.0", T, Instant::now());
    let (id, _) = next_request(&mut s);
    absent(&mut s, id);
    let (id, r) = next_request(&mut s);
    let mut config: Value = serde_json::from_slice(&r.payload).unwrap();
    config.as_object_mut().unwrap().remove("allow_msg_ttl");
    config
        .as_object_mut()
        .unwrap()
        .remove("subject_delete_marker_ttl");
    s.handle_outcome(Instant::now(), id, info(config));
    assert_eq!(served_mode(&mut s).0, Mode::Unsupported);
}

#[test]
fn an_existing_bucket_without_per_message_ttl_is_updated_and_the_difference_logged() {
    let mut s = Startup::new(BucketOptions::default(), "2.14.0", T, Instant::now());
    let (id, _) = next_request(&mut s);
    let mut old = stream_config(3);
    old["allow_msg_ttl"] = json!(false);
    old["custom"] = json!("kept");
    s.handle_outcome(Instant::now(), id, info(old));
    let (logs, (id, r)) = logged_request(&mut s);
    assert!(logs.iter().any(|l| l.contains("allow_msg_ttl")), "{logs:?}");
    assert_eq!(r.subject, "$JS.API.STREAM.UPDATE.KV_leases");
    let sent: Value = serde_json::from_slice(&r.payload).unwrap();
    assert_eq!(sent["allow_msg_ttl"], true);
    assert_eq!(sent["num_replicas"], 3, "replicas left to the operator");
    assert_eq!(sent["custom"], "kept");
    s.handle_outcome(Instant::now(), id, info(sent));
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
}

#[test]
fn an_existing_bucket_that_matches_is_used_as_it_is() {
    let mut s = Startup::new(BucketOptions::default(), "2.14.0", T, Instant::now());
    let (id, _) = next_request(&mut s);
    s.handle_outcome(Instant::now(), id, info(stream_config_with_atomic(1, true)));
    assert_eq!(served_mode(&mut s), (Mode::Ready, vec![]));
}

#[test]
fn no_stream_leader_during_startup_is_retried_never_unsupported() {
    let mut s = Startup::new(BucketOptions::default(), "2.14.0", T, Instant::now());
    let (id, _) = next_request(&mut s);
    let t0 = Instant::now();
    s.handle_outcome(t0, id, RequestOutcome::NoResponders);
    assert!(s.poll_transmit(&mut owner_ids()).is_none());
    while let Some(e) = s.poll_event() {
        assert!(matches!(e, StartupEvent::Log(_)), "{e:?}");
    }
    assert_eq!(s.poll_timeout(), Some(t0 + STARTUP_RETRY));
    s.handle_timeout(t0 + STARTUP_RETRY);
    let (id, r) = next_request(&mut s);
    assert_eq!(r.subject, "$JS.API.STREAM.INFO.KV_leases");
    s.handle_outcome(t0, id, info(stream_config_with_atomic(1, true)));
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
}

#[test]
fn a_create_racing_another_instance_reads_the_config_again() {
    let mut s = Startup::new(
        BucketOptions {
            replicas: Some(1),
            ..BucketOptions::default()
        },
        "2.14.0",
        T,
        Instant::now(),
    );
    let (id, _) = next_request(&mut s);
    absent(&mut s, id);
    let (id, _) = next_request(&mut s);
    s.handle_outcome(
        Instant::now(),
        id,
        api_error(400, 10058, "stream name already in use"),
    );
    let (id, r) = next_request(&mut s);
    assert_eq!(r.subject, "$JS.API.STREAM.INFO.KV_leases");
    s.handle_outcome(Instant::now(), id, info(stream_config_with_atomic(1, true)));
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
}

#[test]
fn a_bucket_from_before_read_confirmation_migrates_its_republish_source() {
    let mut s = Startup::new(BucketOptions::default(), "2.14.0", T, Instant::now());
    let (id, _) = next_request(&mut s);
    let mut old = stream_config(3);
    old["republish"] = json!({"src": "$KV.leases.>", "dest": "dagnats.lease.changed.>"});
    s.handle_outcome(Instant::now(), id, info(old));
    let (logs, (id, r)) = logged_request(&mut s);
    assert!(
        logs.iter()
            .any(|l| l.contains("republish") && l.contains("$KV.leases.>")),
        "{logs:?}"
    );
    assert_eq!(r.subject, "$JS.API.STREAM.UPDATE.KV_leases");
    let sent: Value = serde_json::from_slice(&r.payload).unwrap();
    assert_eq!(sent["republish"]["src"], "$KV.leases.*");
    assert_eq!(
        sent["republish"]["dest"],
        "dagnats.lease.changed.{{wildcard(1)}}"
    );
    s.handle_outcome(Instant::now(), id, info(sent));
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
    assert_eq!(s.replicas(), 3, "replicas as the server returned them");
}

#[test]
fn replicas_are_read_from_the_servers_config() {
    let mut s = Startup::new(BucketOptions::default(), "2.14.0", T, Instant::now());
    let (id, _) = next_request(&mut s);
    s.handle_outcome(Instant::now(), id, info(stream_config_with_atomic(1, true)));
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
    assert_eq!(s.replicas(), 1);
    use crate::service::bucket::replicas_from_reply;
    assert_eq!(
        replicas_from_reply(&info(stream_config_with_atomic(3, true))),
        Some(3)
    );
    assert_eq!(replicas_from_reply(&RequestOutcome::TimedOut), None);
    assert_eq!(
        replicas_from_reply(&api_error(503, 10008, "unavailable")),
        None
    );
}

/// While the bucket is ensured, calls are served in `Starting` mode (they reply
/// `unavailable`), through JetStream outages and retries, until startup settles.
#[test]
fn calls_are_served_unavailable_until_startup_settles() {
    use crate::call::{Call, CallConfig, CallRequest};
    use crate::wire::{Endpoint, ErrorKind};
    let served = |s: &Startup| {
        let config = CallConfig {
            mode: s.mode(),
            ..CallConfig::ready(1 << 20)
        };
        let body = br#"{"key":"k","holder":"h","ttl_ms":1000}"#;
        let mut call = Call::new(
            config,
            Endpoint::Acquire,
            body,
            time::OffsetDateTime::now_utc(),
            Instant::now(),
        );
        match call.poll_request(&mut owner_ids()) {
            None => crate::tests::support::reply_of(&mut call)
                .expect("a reply")
                .error_kind(),
            Some(CallRequest::KvWrite(_)) => None,
            other => panic!("{other:?}"),
        }
    };
    let mut s = Startup::new(BucketOptions::default(), "2.14.0", T, Instant::now());
    assert_eq!(s.mode(), Mode::Starting);
    assert_eq!(served(&s), Some(ErrorKind::Unavailable));
    let (id, _) = next_request(&mut s);
    let t0 = Instant::now();
    s.handle_outcome(t0, id, RequestOutcome::NoResponders);
    assert_eq!(s.mode(), Mode::Starting, "JetStream not there yet");
    assert_eq!(served(&s), Some(ErrorKind::Unavailable));
    s.handle_timeout(t0 + STARTUP_RETRY);
    let (id, _) = next_request(&mut s);
    absent(&mut s, id);
    let (id, _) = next_request(&mut s);
    assert_eq!(s.mode(), Mode::Starting, "creating the bucket");
    s.handle_outcome(t0, id, info(stream_config_with_atomic(1, true)));
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
    assert_eq!(s.mode(), Mode::Ready);
    assert_eq!(served(&s), None, "a ready service writes the lease");
    let old = Startup::new(BucketOptions::default(), "2.9.10", T, Instant::now());
    assert_eq!(old.mode(), Mode::Unsupported);
}

#[test]
fn a_request_its_owner_timed_out_is_asked_again() {
    let t0 = Instant::now();
    let mut s = Startup::new(BucketOptions::default(), "2.14.0", T, t0);
    let (id, r) = next_request(&mut s);
    assert_eq!(r.subject, "$JS.API.STREAM.INFO.KV_leases");
    assert_eq!(r.timeout, T, "its owner times it out at T");
    assert_eq!(s.poll_timeout(), None, "no deadline of its own");
    // At T the owner (the service's give-up) says it timed out: startup says so
    // and waits to retry.
    s.handle_outcome(t0 + T, id, RequestOutcome::TimedOut);
    assert!(s.poll_transmit(&mut owner_ids()).is_none());
    let log = match s.poll_event() {
        Some(StartupEvent::Log(l)) => l,
        other => panic!("expected a log line, got {other:?}"),
    };
    assert!(log.contains("not ready"), "{log}");
    assert_eq!(s.poll_timeout(), Some(t0 + T + STARTUP_RETRY));
    // A late answer to the timed-out request is ignored.
    s.handle_outcome(t0 + T, id, info(stream_config_with_atomic(1, true)));
    assert!(s.poll_transmit(&mut owner_ids()).is_none() && s.poll_event().is_none());
    s.handle_timeout(t0 + T + STARTUP_RETRY);
    let (_, again) = next_request(&mut s);
    assert_eq!(again.subject, "$JS.API.STREAM.INFO.KV_leases");
}

#[test]
fn allow_atomic_is_set_from_2_12_and_read_back_from_the_servers_config() {
    for (v, wanted) in [("2.11.4", false), ("2.12.0", true), ("v2.15.1", true)] {
        let mut s = Startup::new(BucketOptions::default(), v, T, Instant::now());
        let (id, _) = next_request(&mut s);
        absent(&mut s, id);
        let (id, r) = next_request(&mut s);
        let config: Value = serde_json::from_slice(&r.payload).unwrap();
        assert_eq!(config.get("allow_atomic").is_some(), wanted, "{v}");
        s.handle_outcome(Instant::now(), id, info(config));
        assert_eq!(served_mode(&mut s).0, Mode::Ready);
        assert_eq!(s.atomic(), wanted, "{v}");
    }
    // An existing 2.14 stream without it is updated; a server that drops it
    // from the config it returns leaves batches off.
    let mut s = Startup::new(BucketOptions::default(), "2.14.0", T, Instant::now());
    let (id, _) = next_request(&mut s);
    s.handle_outcome(Instant::now(), id, info(stream_config(1)));
    let (id, r) = next_request(&mut s);
    assert_eq!(r.subject, "$JS.API.STREAM.UPDATE.KV_leases");
    let config: Value = serde_json::from_slice(&r.payload).unwrap();
    assert_eq!(config["allow_atomic"], true);
    s.handle_outcome(Instant::now(), id, info(stream_config(1)));
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
    assert!(!s.atomic());
}

#[test]
fn tenancy_creates_the_per_account_republish_and_moves_an_existing_bucket_to_it() {
    use crate::tenant::Tenancy;
    let tenants = BucketOptions {
        tenancy: Tenancy::Accounts,
        ..BucketOptions::default()
    };
    let wanted = json!({
        "src": "$KV.leases.*.*",
        "dest": "dagnats.lease.changed.{{wildcard(1)}}.{{wildcard(2)}}",
    });
    // No bucket yet: created with the tenants' republish.
    let mut s = Startup::new(tenants, "2.15.1", T, Instant::now());
    let (id, _) = next_request(&mut s);
    absent(&mut s, id);
    let (_, create) = next_request(&mut s);
    let body: Value = serde_json::from_slice(&create.payload).unwrap();
    assert_eq!(body["republish"], wanted);
    // A bucket of the one-namespace layout: updated to it, and the change logged.
    let mut s = Startup::new(tenants, "2.15.1", T, Instant::now());
    let (id, _) = next_request(&mut s);
    s.handle_outcome(Instant::now(), id, info(stream_config_with_atomic(1, true)));
    let (logs, (_, update)) = logged_request(&mut s);
    assert!(
        update.subject.ends_with("STREAM.UPDATE.KV_leases"),
        "{}",
        update.subject
    );
    let body: Value = serde_json::from_slice(&update.payload).unwrap();
    assert_eq!(body["republish"], wanted);
    assert!(logs.iter().any(|l| l.contains("republish")), "{logs:?}");
}

fn sharded(count: u32) -> BucketOptions {
    BucketOptions {
        shards: crate::shard::ShardMap::new(count).unwrap(),
        ..BucketOptions::default()
    }
}

fn refused(s: &mut Startup) -> String {
    assert!(s.poll_transmit(&mut owner_ids()).is_none());
    loop {
        match s.poll_event().expect("startup should have ended") {
            StartupEvent::Log(_) => {}
            StartupEvent::Serve(m) => panic!("served in {m:?}, not refused"),
            StartupEvent::StartRefused(r) => return r,
        }
    }
}

/// Three shards: after asking that the one-stream layout is absent (before shard
/// 0 is created, and again after), each shard's
/// stream is created with its own subjects, the shared republish destination and
/// metadata recording the count and its index.
#[test]
fn three_shards_create_three_streams_recording_the_count() {
    let mut s = Startup::new(sharded(3), "2.15.1", T, Instant::now());
    for i in 0..3 {
        let (id, r) = next_request(&mut s);
        assert_eq!(r.subject, format!("$JS.API.STREAM.INFO.KV_leases_{i}"));
        s.handle_outcome(
            Instant::now(),
            id,
            api_error(404, 10059, "stream not found"),
        );
        if i == 0 {
            other_layout_absent(&mut s, "KV_leases");
        }
        let (id, r) = next_request(&mut s);
        assert_eq!(r.subject, format!("$JS.API.STREAM.CREATE.KV_leases_{i}"));
        let config: Value = serde_json::from_slice(&r.payload).unwrap();
        assert_eq!(config["name"], format!("KV_leases_{i}"));
        let mut subjects = vec![format!("$KV.leases_{i}.>")];
        if i == 0 {
            // Inside the one-stream layout's `$KV.leases.>`: the server refuses
            // whichever layout is created second.
            subjects.push("$KV.leases.~sharded".to_string());
        }
        assert_eq!(config["subjects"], json!(subjects));
        assert_eq!(
            config["republish"],
            json!({"src": format!("$KV.leases_{i}.*"), "dest": "dagnats.lease.changed.{{wildcard(1)}}"})
        );
        assert_eq!(config["metadata"]["dagnats_shards"], "3");
        assert_eq!(config["metadata"]["dagnats_shard"], i.to_string());
        assert_eq!(config["subject_delete_marker_ttl"], 1_000_000_000u64);
        s.handle_outcome(Instant::now(), id, info(config));
        if i == 0 {
            // Asked again once shard 0 is there: a create at the same moment as
            // the other layout's can pass the server's overlap check.
            let (id, r) = next_request(&mut s);
            assert_eq!(r.subject, "$JS.API.STREAM.INFO.KV_leases");
            s.handle_outcome(
                Instant::now(),
                id,
                api_error(404, 10059, "stream not found"),
            );
        }
    }
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
}

/// The one-stream bucket exists: a service started with three shards refuses,
/// naming `--shards`, and creates nothing.
#[test]
fn shards_over_a_one_stream_bucket_are_refused() {
    let mut s = Startup::new(sharded(3), "2.15.1", T, Instant::now());
    let (id, _) = next_request(&mut s);
    s.handle_outcome(
        Instant::now(),
        id,
        api_error(404, 10059, "stream not found"),
    );
    let (id, r) = next_request(&mut s);
    assert_eq!(r.subject, "$JS.API.STREAM.INFO.KV_leases");
    s.handle_outcome(Instant::now(), id, info(stream_config(1)));
    let why = refused(&mut s);
    assert!(
        why.contains("--shards 1") && why.contains("--shards 3"),
        "{why}"
    );
    // KV_leases has no metadata to point at: the count is one, said outright.
    assert!(why.contains("Start it with --shards 1"), "{why}");
    assert!(!why.contains("metadata"), "{why}");
}

/// A sharded bucket exists: one shard is refused (its first stream is found), and
/// so is another count (the first stream's metadata says how many).
#[test]
fn another_shard_count_than_the_buckets_is_refused() {
    let mut s = Startup::new(BucketOptions::default(), "2.15.1", T, Instant::now());
    let (id, _) = next_request(&mut s);
    s.handle_outcome(
        Instant::now(),
        id,
        api_error(404, 10059, "stream not found"),
    );
    let (id, r) = next_request(&mut s);
    assert_eq!(r.subject, "$JS.API.STREAM.INFO.KV_leases_0");
    let two = crate::shard::ShardMap::new(2).unwrap();
    let made = crate::service::bucket::shard_stream_config(&two, 0, 1);
    s.handle_outcome(Instant::now(), id, info(made.clone()));
    let why = refused(&mut s);
    assert!(why.contains("--shards 1"), "{why}");
    // KV_leases_0's metadata tells the count to start with.
    assert!(why.contains("Start it with --shards 2"), "{why}");

    for count in [3, 4] {
        let mut s = Startup::new(sharded(count), "2.15.1", T, Instant::now());
        let (id, _) = next_request(&mut s);
        s.handle_outcome(Instant::now(), id, info(made.clone()));
        let why = refused(&mut s);
        assert!(
            why.contains(&format!("--shards {count}")) && why.contains("dagnats_shards 2"),
            "{why}"
        );
    }
    // A stream of the right name that no sharded service made: refused too.
    let mut s = Startup::new(sharded(2), "2.15.1", T, Instant::now());
    let (id, _) = next_request(&mut s);
    let mut foreign = made;
    foreign.as_object_mut().unwrap().remove("metadata");
    s.handle_outcome(Instant::now(), id, info(foreign));
    assert!(refused(&mut s).contains("no dagnats_shards"));
}

/// Replicas are the most of any shard's: one R3 shard is enough to confirm reads.
#[test]
fn replicas_are_the_most_of_any_shard() {
    let two = crate::shard::ShardMap::new(2).unwrap();
    let mut s = Startup::new(sharded(2), "2.15.1", T, Instant::now());
    // The R3 shard first: the R1 shard answering last must not turn it off.
    for (i, r) in [(0, 3), (1, 1)] {
        let (id, _) = next_request(&mut s);
        let mut config = crate::service::bucket::shard_stream_config(&two, i, r);
        config["allow_atomic"] = json!(true);
        s.handle_outcome(Instant::now(), id, info(config));
        if i == 0 {
            other_layout_absent(&mut s, "KV_leases");
        }
    }
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
    assert_eq!(s.replicas(), 3);
}

/// Before a create, the other layout's first stream must be answered for: no
/// answer (a backend user without the permission gets none) is never taken for
/// "absent"; the log names the subject, and startup asks again later.
#[test]
fn an_unanswered_layout_question_never_creates_blind() {
    let t0 = Instant::now();
    let mut s = Startup::new(BucketOptions::default(), "2.15.1", T, t0);
    let (id, _) = next_request(&mut s);
    s.handle_outcome(t0, id, api_error(404, 10059, "stream not found"));
    let (id, r) = next_request(&mut s);
    assert_eq!(r.subject, "$JS.API.STREAM.INFO.KV_leases_0");
    // Its owner times it out.
    s.handle_outcome(t0 + T, id, RequestOutcome::TimedOut);
    let mut logs = Vec::new();
    while let Some(e) = s.poll_event() {
        match e {
            StartupEvent::Log(l) => logs.push(l),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        logs.iter()
            .any(|l| l.contains("$JS.API.STREAM.INFO.KV_leases_0")
                && l.contains("If this repeats")
                && l.contains("may lack")),
        "{logs:?}"
    );
    assert!(
        s.poll_transmit(&mut owner_ids()).is_none(),
        "nothing created"
    );
    s.handle_timeout(t0 + T + STARTUP_RETRY);
    let (_, again) = next_request(&mut s);
    assert_eq!(again.subject, "$JS.API.STREAM.INFO.KV_leases");
    assert_eq!(s.mode(), Mode::Starting);
}

/// Tenancy on three shards: each shard's tenant keys go out on the tenants' one
/// client subject, `dagnats.lease.changed.<account>.<key>`.
#[test]
fn tenancy_on_shards_republishes_each_shard_to_the_tenant_subject() {
    let three = crate::shard::ShardMap::new(3).unwrap();
    for i in three.indexes() {
        assert_eq!(
            crate::service::bucket::shard_republish(&three, i, crate::tenant::Tenancy::Accounts),
            json!({
                "src": format!("$KV.leases_{i}.*.*"),
                "dest": "dagnats.lease.changed.{{wildcard(1)}}.{{wildcard(2)}}",
            })
        );
    }
}

/// A stand-in for the server's stream table: names to configs, with the two
/// refusals that keep layouts apart (name in use, subjects overlapping).
#[derive(Default)]
struct StandInStreams(std::collections::BTreeMap<String, Value>);

/// Whether two subject filters can match one subject (`*` one token, `>` the rest).
fn overlap(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.split('.'), b.split('.'));
    loop {
        match (a.next(), b.next()) {
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(x), Some(y)) if x == y || x == "*" || y == "*" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

impl StandInStreams {
    fn overlaps(&self, name: &str, config: &Value) -> bool {
        let subjects = |c: &Value| -> Vec<String> {
            c["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect()
        };
        let mine = subjects(config);
        self.0
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .any(|(_, c)| {
                subjects(c)
                    .iter()
                    .any(|t| mine.iter().any(|m| overlap(m, t)))
            })
    }

    fn answer(&mut self, request: &NatsRequest) -> RequestOutcome {
        let (verb, name) = request
            .subject
            .strip_prefix("$JS.API.STREAM.")
            .and_then(|r| r.split_once('.'))
            .unwrap();
        let name = name.to_string();
        let not_found = api_error(404, 10059, "stream not found");
        let overlapping = api_error(400, 10065, "subjects overlap with an existing stream");
        match verb {
            "INFO" => self.0.get(&name).cloned().map_or(not_found, info),
            "CREATE" | "UPDATE" => {
                let config: Value = serde_json::from_slice(&request.payload).unwrap();
                if verb == "CREATE" && self.0.contains_key(&name) {
                    api_error(400, 10058, "stream name already in use")
                } else if verb == "UPDATE" && !self.0.contains_key(&name) {
                    not_found
                } else if self.overlaps(&name, &config) {
                    overlapping
                } else {
                    self.0.insert(name, config.clone());
                    info(config)
                }
            }
            other => panic!("unexpected {other}"),
        }
    }
}

/// How a startup over the stand-in ended: `Some(true)` served, `Some(false)`
/// refused, `None` not yet.
fn step_stand_in(s: &mut Startup, streams: &mut StandInStreams) -> Option<bool> {
    if let Some(t) = s.poll_transmit(&mut owner_ids()) {
        let outcome = streams.answer(&t.request);
        s.handle_outcome(Instant::now(), t.id, outcome);
        return None;
    }
    loop {
        match s.poll_event() {
            Some(StartupEvent::Log(_)) => {}
            Some(StartupEvent::Serve(m)) => {
                assert_eq!(m, Mode::Ready);
                return Some(true);
            }
            Some(StartupEvent::StartRefused(_)) => return Some(false),
            None => panic!("neither a request nor an end"),
        }
    }
}

/// Runs two startups one request at a time each, in turn, `first` stepping first.
fn race(streams: &mut StandInStreams, first: BucketOptions, second: BucketOptions) -> [bool; 2] {
    let mut s = [first, second].map(|o| Startup::new(o, "2.15.1", T, Instant::now()));
    let mut ends = [None, None];
    while ends.iter().any(Option::is_none) {
        for (i, s) in s.iter_mut().enumerate() {
            if ends[i].is_none() {
                ends[i] = step_stand_in(s, streams);
            }
        }
    }
    ends.map(Option::unwrap)
}

/// Two services started at once on an empty server, with `--shards 1` and
/// `--shards 3`, each asking, finding nothing and creating: the server refuses the
/// second layout's overlapping stream, so one serves and the other is refused,
/// in either order, and after restarts the same one again. Both layouts there
/// already (made before the guard subject): neither serves.
#[test]
fn two_layouts_started_at_once_never_both_serve() {
    for single_first in [true, false] {
        let mut streams = StandInStreams::default();
        let (a, b) = if single_first {
            (BucketOptions::default(), sharded(3))
        } else {
            (sharded(3), BucketOptions::default())
        };
        let ends = race(&mut streams, a, b);
        assert_eq!(ends.iter().filter(|e| **e).count(), 1, "{ends:?}");
        for _ in 0..2 {
            assert_eq!(race(&mut streams, a, b), ends, "after a restart");
            assert_eq!(race(&mut streams, b, a), [ends[1], ends[0]]);
        }
    }
    let mut streams = StandInStreams::default();
    assert_eq!(
        race(
            &mut streams,
            BucketOptions::default(),
            BucketOptions::default()
        ),
        [true, true]
    );
    let three = crate::shard::ShardMap::new(3).unwrap();
    let mut old = crate::service::bucket::shard_stream_config(&three, 0, 1);
    old["subjects"] = json!(["$KV.leases_0.>"]);
    streams.0.insert("KV_leases_0".to_string(), old);
    assert_eq!(
        race(&mut streams, BucketOptions::default(), sharded(3)),
        [false, false]
    );
}

/// A sharded bucket made before the guard subject: its shard 0 is updated to
/// store it too (the server then refuses the update if `KV_leases` exists).
#[test]
fn shard_0_made_before_the_guard_subject_gets_it_by_an_update() {
    let two = crate::shard::ShardMap::new(2).unwrap();
    let mut s = Startup::new(sharded(2), "2.15.1", T, Instant::now());
    let (id, _) = next_request(&mut s);
    let mut old = crate::service::bucket::shard_stream_config(&two, 0, 1);
    old["allow_atomic"] = json!(true);
    old["subjects"] = json!(["$KV.leases_0.>"]);
    s.handle_outcome(Instant::now(), id, info(old));
    let (logs, (id, update)) = logged_request(&mut s);
    assert_eq!(update.subject, "$JS.API.STREAM.UPDATE.KV_leases_0");
    let body: Value = serde_json::from_slice(&update.payload).unwrap();
    assert_eq!(
        body["subjects"],
        json!(["$KV.leases_0.>", "$KV.leases.~sharded"])
    );
    assert!(
        logs.iter().any(|l| l.contains("adding")) && !logs.iter().any(|l| l.contains("left as")),
        "{logs:?}"
    );
    // KV_leases exists too: the server refuses the overlapping update.
    s.handle_outcome(
        Instant::now(),
        id,
        api_error(400, 10065, "subjects overlap with an existing stream"),
    );
    let why = refused(&mut s);
    assert!(why.contains("10065") && why.contains("--shards"), "{why}");
}

/// Where waiting cannot help, startup ends with the cause, at once or after its
/// bound: no responders on the JetStream API (JetStream off) past
/// [`JETSTREAM_OFF_GIVE_UP`], JetStream off for the account, replicas asked of a
/// server without a cluster, and a cluster that cannot place the replicas past
/// [`REPLICAS_GIVE_UP`]. Each answer is given to every request startup sends
/// (the stream info, then the create), as a server would.
#[test]
fn startup_names_the_cause_and_gives_up_where_waiting_cannot_help() {
    use crate::service::startup::{JETSTREAM_OFF_GIVE_UP, REPLICAS_GIVE_UP};
    let three = BucketOptions {
        replicas: Some(3),
        ..BucketOptions::default()
    };
    let no_account = api_error(503, 10039, "JetStream not enabled for account");
    let one_node = api_error(
        500,
        10074,
        "replicas > 1 not supported in non-clustered mode",
    );
    let no_peers = api_error(400, 10005, "no suitable peers for placement");
    // (options, the answer, whether stream infos find nothing (the answer is the
    // create's), the bound it gives up after (zero: at once), words the refusal
    // must have)
    let table = [
        (
            BucketOptions::default(),
            RequestOutcome::NoResponders,
            false,
            JETSTREAM_OFF_GIVE_UP,
            vec!["no JetStream", "-js"],
        ),
        (
            BucketOptions::default(),
            no_account,
            false,
            Duration::ZERO,
            vec!["not enabled for the NATS account"],
        ),
        (
            three,
            one_node,
            true,
            Duration::ZERO,
            vec!["--replicas 3", "without a cluster", "--replicas 1"],
        ),
        (
            three,
            no_peers,
            true,
            REPLICAS_GIVE_UP,
            vec!["cannot place KV_leases with 3 replicas", "10005"],
        ),
    ];
    for (options, answer, infos_absent, bound, words) in table {
        let t0 = Instant::now();
        let mut s = Startup::new(options, "2.14.0", T, t0);
        let mut now = t0;
        let refusal = loop {
            let mut refusal = None;
            while let Some(e) = s.poll_event() {
                match e {
                    StartupEvent::StartRefused(r) => refusal = Some(r),
                    StartupEvent::Serve(m) => panic!("{answer:?}: served in {m:?}"),
                    StartupEvent::Log(_) => {}
                }
            }
            if let Some(r) = refusal {
                break r;
            }
            if let Some(t) = s.poll_transmit(&mut owner_ids()) {
                let outcome = if infos_absent && t.request.subject.contains(".INFO.") {
                    api_error(404, 10059, "stream not found")
                } else {
                    answer.clone()
                };
                s.handle_outcome(now, t.id, outcome);
                continue;
            }
            let at = s.poll_timeout().expect("startup waits to ask again");
            assert!(
                at.duration_since(t0) <= bound + STARTUP_RETRY * 6,
                "{answer:?}: still waiting past its bound"
            );
            now = at;
            s.handle_timeout(now);
        };
        assert!(
            now.duration_since(t0) >= bound,
            "{answer:?}: gave up before its bound"
        );
        for word in words {
            assert!(refusal.contains(word), "{word:?} in {refusal}");
        }
    }
}

/// No responders that stop before the bound (a server came up) are forgotten:
/// startup goes on and serves.
#[test]
fn no_responders_that_end_before_the_bound_are_forgotten() {
    let t0 = Instant::now();
    let mut s = Startup::new(BucketOptions::default(), "2.14.0", T, t0);
    let (id, _) = next_request(&mut s);
    s.handle_outcome(t0, id, RequestOutcome::NoResponders);
    let logs: Vec<_> = std::iter::from_fn(|| s.poll_event()).collect();
    assert!(
        matches!(&logs[..], [StartupEvent::Log(l)] if l.contains("JetStream looks off")),
        "{logs:?}"
    );
    s.handle_timeout(t0 + STARTUP_RETRY);
    let (id, _) = next_request(&mut s);
    s.handle_outcome(
        t0 + STARTUP_RETRY,
        id,
        info(stream_config_with_atomic(1, true)),
    );
    assert_eq!(served_mode(&mut s).0, Mode::Ready);
}
