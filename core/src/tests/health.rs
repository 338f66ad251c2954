//! Health: the connection's log lines, readiness, and the service's refusal of a
//! bucket whose sequence went back.

use serde_json::json;

use crate::health::LogLevel;
use crate::health::{ConnectionLog, LinkEvent, NotReady, readiness};
use crate::io::Mode;
use crate::service::{ServiceConfig, ServiceEvent};
use crate::sim::service_world::ServiceWorld;
use crate::wire::{Endpoint, ErrorKind, Response};

/// One warning per outage however many attempts fail (each a debug line), one
/// info line when it is back naming the attempts; a connected state that follows.
#[test]
fn a_lost_connection_is_one_warning_and_its_return_one_info_line() {
    use LinkEvent::*;
    let failed = || AttemptFailed("connection refused".to_string());
    // (events, the levels logged, connected at the end)
    let table: Vec<(Vec<LinkEvent>, Vec<Option<LogLevel>>, bool)> = vec![
        (vec![Connected], vec![Some(LogLevel::Info)], true),
        (
            vec![Disconnected, failed(), failed(), failed(), Connected],
            vec![
                Some(LogLevel::Warn),
                Some(LogLevel::Debug),
                Some(LogLevel::Debug),
                Some(LogLevel::Debug),
                Some(LogLevel::Info),
            ],
            true,
        ),
        // A second disconnected in the same outage says nothing.
        (
            vec![Disconnected, failed(), Disconnected],
            vec![Some(LogLevel::Warn), Some(LogLevel::Debug), None],
            false,
        ),
        // Two outages: two warnings.
        (
            vec![Disconnected, Connected, Disconnected],
            vec![
                Some(LogLevel::Warn),
                Some(LogLevel::Info),
                Some(LogLevel::Warn),
            ],
            false,
        ),
        // An error while connected is worth a warning.
        (vec![failed()], vec![Some(LogLevel::Warn)], true),
        (
            vec![LameDuck, SlowConsumer(3)],
            vec![Some(LogLevel::Warn); 2],
            true,
        ),
        (vec![Closed], vec![Some(LogLevel::Warn)], false),
    ];
    for (events, levels, connected) in table {
        let mut log = ConnectionLog::new();
        let got: Vec<Option<LogLevel>> = events
            .iter()
            .map(|e| log.handle(e.clone()).map(|(level, _)| level))
            .collect();
        assert_eq!(got, levels, "{events:?}");
        assert_eq!(log.connected(), connected, "{events:?}");
    }
    let mut log = ConnectionLog::new();
    log.handle(Disconnected);
    log.handle(failed());
    log.handle(failed());
    let (_, line) = log.handle(Connected).unwrap();
    assert!(line.contains("after 2 failed attempts"), "{line}");
}

/// (not serving, connected, bucket, refused, stopping, expected)
type Row = (
    Option<NotReady>,
    bool,
    Result<(), String>,
    Option<&'static str>,
    bool,
    Result<(), NotReady>,
);

/// Ready only while serving, connected, the bucket reachable, not refused and
/// not stopping; the gravest reason wins.
#[test]
fn ready_means_serving_connected_reachable_not_refused_not_stopping() {
    let unreachable = || Err("stream KV_leases: timed out".to_string());
    // (not serving, connected, bucket, refused, stopping, expected)
    let table: Vec<Row> = vec![
        (None, true, Ok(()), None, false, Ok(())),
        (
            Some(NotReady::Starting),
            true,
            Ok(()),
            None,
            false,
            Err(NotReady::Starting),
        ),
        (
            Some(NotReady::Unsupported),
            true,
            Ok(()),
            None,
            false,
            Err(NotReady::Unsupported),
        ),
        (
            None,
            false,
            Ok(()),
            None,
            false,
            Err(NotReady::Disconnected),
        ),
        (
            Some(NotReady::Starting),
            false,
            Ok(()),
            None,
            false,
            Err(NotReady::Disconnected),
        ),
        (
            None,
            true,
            unreachable(),
            None,
            false,
            Err(NotReady::BucketUnreachable(
                "stream KV_leases: timed out".into(),
            )),
        ),
        (
            None,
            false,
            unreachable(),
            None,
            false,
            Err(NotReady::Disconnected),
        ),
        (
            None,
            true,
            Ok(()),
            Some("went back"),
            false,
            Err(NotReady::BucketRefused("went back".into())),
        ),
        (
            None,
            false,
            unreachable(),
            Some("went back"),
            false,
            Err(NotReady::BucketRefused("went back".into())),
        ),
        (
            None,
            true,
            Ok(()),
            Some("went back"),
            true,
            Err(NotReady::Stopping),
        ),
        (None, true, Ok(()), None, true, Err(NotReady::Stopping)),
    ];
    for (not_serving, connected, bucket, refused, stopping, expected) in table {
        let row = format!("{not_serving:?} {connected} {bucket:?} {refused:?} {stopping}");
        assert_eq!(
            readiness(not_serving, connected, bucket, refused, stopping),
            expected,
            "{row}"
        );
    }
}

fn config() -> ServiceConfig {
    let mut c = ServiceConfig::new("2.14.0", 1 << 20);
    c.coalesce_writes = crate::service::coalesce::CoalesceWrites::Off;
    c
}

fn serving() -> ServiceWorld {
    let mut w = ServiceWorld::new(config(), 1);
    while w.service.mode() != Mode::Ready && !w.in_flight().is_empty() {
        w.deliver(0);
        w.settle().unwrap();
    }
    assert_eq!(w.service.mode(), Mode::Ready);
    w
}

fn healths(w: &ServiceWorld) -> Vec<Result<(), NotReady>> {
    w.events
        .iter()
        .filter_map(|e| match e {
            ServiceEvent::Health(h) => Some(h.ready.clone()),
            _ => None,
        })
        .collect()
}

fn acquire(w: &mut ServiceWorld, key: &str) -> String {
    let reply = w.request(
        Endpoint::Acquire,
        json!({"key": key, "holder": "h", "ttl_ms": 5000}),
        true,
    );
    w.settle().unwrap();
    while !w.answered(&reply) && !w.in_flight().is_empty() {
        w.deliver(0);
        w.settle().unwrap();
    }
    reply
}

/// Fires timers until the replicas check asks, and answers it.
fn ask_replicas(w: &mut ServiceWorld) {
    while w.in_flight() != ["$JS.API.STREAM.INFO.KV_leases"] {
        assert!(w.in_flight().is_empty(), "{:?}", w.in_flight());
        w.fire_timer();
        w.settle().unwrap();
    }
    w.deliver(0);
    w.settle().unwrap();
}

/// The service reports starting, then ready; a lost connection makes it not
/// ready at once and its return ready again, each said once.
#[test]
fn a_lost_connection_makes_the_service_not_ready_until_it_is_back() {
    let mut w = serving();
    assert_eq!(healths(&w), vec![Err(NotReady::Starting), Ok(())]);
    let now = w.now();
    w.service.handle_connection(now, false);
    w.service.handle_connection(now, false);
    w.settle().unwrap();
    assert_eq!(w.service.health().ready, Err(NotReady::Disconnected));
    assert!(!w.service.health().connected);
    let info = "$JS.API.STREAM.INFO.KV_leases".to_string();
    assert!(!w.in_flight().contains(&info), "{:?}", w.in_flight());
    w.service.handle_connection(now, true);
    w.settle().unwrap();
    assert_eq!(
        healths(&w)[2..],
        [Err(NotReady::Disconnected), Ok(())],
        "each change said once"
    );
    // Back, the bucket is asked at once (beside the tombstone scan's read).
    assert!(w.in_flight().contains(&info), "{:?}", w.in_flight());
}

/// A stream made anew from sequence 1 under the service is refused: not ready,
/// and every call answered `unavailable` naming the cause, no write sent; one
/// made anew above every sequence used (the restore procedure) is served.
#[test]
fn a_stream_whose_sequence_went_back_is_refused_and_no_fence_repeats() {
    let mut w = serving();
    for key in ["a", "b", "c"] {
        let reply = acquire(&mut w, key);
        assert!(matches!(w.reply_to(&reply), Some(Response::Acquired(a)) if a.granted));
    }
    ask_replicas(&mut w);
    w.rewind_stream();
    ask_replicas(&mut w);
    let refusals: Vec<_> = w
        .events
        .iter()
        .filter_map(|e| match e {
            ServiceEvent::BucketRefused(why) => Some(why.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(refusals[0].contains("made anew"), "{}", refusals[0]);
    assert!(matches!(
        w.service.health().ready,
        Err(NotReady::BucketRefused(_))
    ));
    let reply = acquire(&mut w, "d");
    match w.reply_to(&reply) {
        Some(Response::Error(e)) => {
            assert_eq!(e.kind, ErrorKind::Unavailable);
            assert!(e.error.contains("refuses its bucket"), "{}", e.error);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        w.in_flight().is_empty(),
        "no write sent: {:?}",
        w.in_flight()
    );

    let mut w = serving();
    acquire(&mut w, "a");
    ask_replicas(&mut w);
    w.replace_stream();
    ask_replicas(&mut w);
    assert_eq!(w.service.health().ready, Ok(()));
    let reply = acquire(&mut w, "e");
    assert!(matches!(w.reply_to(&reply), Some(Response::Acquired(a)) if a.granted));
}

/// A write stored at or below a revision the service saw before the call
/// started says the stream went back, before any look at the stream: that call's
/// fence is never handed out, and the bucket is refused from then on.
#[test]
fn a_write_stored_below_what_was_seen_is_refused_before_its_reply() {
    let mut w = serving();
    let mut fences = Vec::new();
    for key in ["a", "b", "c"] {
        let reply = acquire(&mut w, key);
        match w.reply_to(&reply) {
            Some(Response::Acquired(a)) if a.granted => fences.push(a.lease.revision),
            other => panic!("{other:?}"),
        }
    }
    // Made anew under the service, no stream info asked since.
    w.rewind_stream();
    let reply = acquire(&mut w, "d");
    match w.reply_to(&reply) {
        Some(Response::Error(e)) => {
            assert_eq!(e.kind, ErrorKind::Unavailable);
            assert!(e.error.contains("at or below"), "{}", e.error);
        }
        other => panic!("a fence handed out again: {other:?} after {fences:?}"),
    }
    assert!(matches!(
        w.service.health().ready,
        Err(NotReady::BucketRefused(_))
    ));
    // From then on every call is refused at once.
    let reply = acquire(&mut w, "e");
    assert!(
        matches!(w.reply_to(&reply), Some(Response::Error(e)) if e.kind == ErrorKind::Unavailable)
    );
    assert!(w.in_flight().is_empty(), "{:?}", w.in_flight());
}
