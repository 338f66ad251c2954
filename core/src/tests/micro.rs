//! The micro protocol (ADR-32) as the service answers it: which subjects carry a
//! verb, and what PING, INFO and STATS hold.

use std::time::Duration;

use serde_json::Value;
use time::macros::datetime;

use crate::service::micro::{MicroService, MicroVerb};
use crate::wire::{Endpoint, ErrorKind, ErrorReply, FreeReply, Response};

fn service() -> MicroService {
    MicroService::new("ID42", "1.2.3", datetime!(2026-12-05 03:00 UTC))
}

fn json(bytes: Vec<u8>) -> Value {
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn each_verb_is_asked_on_three_subjects_and_only_those() {
    let s = service();
    let subjects = s.subjects();
    assert_eq!(subjects.len(), 9);
    for subject in &subjects {
        assert!(s.verb_of(subject).is_some(), "{subject}");
    }
    assert_eq!(s.verb_of("$SRV.PING"), Some(MicroVerb::Ping));
    assert_eq!(s.verb_of("$SRV.INFO.dagnats-api"), Some(MicroVerb::Info));
    assert_eq!(
        s.verb_of("$SRV.STATS.dagnats-api.ID42"),
        Some(MicroVerb::Stats)
    );
    for other in [
        "$SRV.PING.other-svc",
        "$SRV.PING.dagnats-api.OTHER",
        "$SRV.PING.dagnats-api.ID42.x",
        "$SRV.HELLO",
        "$SRV",
        "SRV.PING",
        "api.leases.acquire",
    ] {
        assert_eq!(s.verb_of(other), None, "{other}");
    }
}

#[test]
fn ping_and_info_name_the_service_and_every_endpoint_in_the_queue_group() {
    let s = service();
    let ping = json(s.reply(MicroVerb::Ping));
    assert_eq!(ping["type"], "io.nats.micro.v1.ping_response");
    assert_eq!(ping["name"], "dagnats-api");
    assert_eq!(ping["id"], "ID42");
    assert_eq!(ping["version"], "1.2.3");
    let info = json(s.reply(MicroVerb::Info));
    assert_eq!(info["type"], "io.nats.micro.v1.info_response");
    let endpoints = info["endpoints"].as_array().unwrap();
    let subjects: Vec<&str> = endpoints
        .iter()
        .map(|e| e["subject"].as_str().unwrap())
        .collect();
    assert_eq!(
        subjects,
        Endpoint::ALL
            .map(|e| e.subject())
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    for e in endpoints {
        assert_eq!(e["queue_group"], "dagnats-leases");
    }
}

#[test]
fn stats_count_requests_errors_and_processing_time_per_endpoint() {
    let mut s = service();
    let free = Response::Free(FreeReply {
        held: false,
        key: "k".into(),
    });
    s.handle_answered(Endpoint::Owner, &free, Duration::from_millis(2));
    s.handle_answered(Endpoint::Owner, &free, Duration::from_millis(4));
    let lost = Response::Error(ErrorReply::new(ErrorKind::Lost, "the lease is gone"));
    s.handle_answered(Endpoint::Renew, &lost, Duration::from_millis(1));
    let stats = json(s.reply(MicroVerb::Stats));
    assert_eq!(stats["type"], "io.nats.micro.v1.stats_response");
    assert_eq!(stats["started"], "2026-12-05T03:00:00Z");
    let by_name = |name: &str| {
        stats["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap()
            .clone()
    };
    let owner = by_name("owner");
    assert_eq!(owner["num_requests"], 2);
    assert_eq!(owner["num_errors"], 0);
    assert_eq!(owner["processing_time"], 6_000_000);
    assert_eq!(owner["average_processing_time"], 3_000_000);
    let renew = by_name("renew");
    assert_eq!(renew["num_errors"], 1);
    assert_eq!(renew["last_error"], "lost: the lease is gone");
    assert_eq!(by_name("acquire")["num_requests"], 0);
    assert_eq!(by_name("acquire")["average_processing_time"], 0);
    assert_eq!(s.requests(Endpoint::Owner), 2);
}
