//! What a call reports about its JetStream requests for the metrics
//! ([`CallEvent::Kv`]): read from the outcome the call parsed to act on, one class
//! per row, driven through a [`Call`](crate::call::Call). A row fails when the
//! call reports another class, or none, or one where there is nothing to count.

use std::time::Duration;

use super::support::{Drive, ack, held, no_message, wrong_last_sequence};
use crate::call::{CallEvent, DEFAULT_KV_TIMEOUT};
use crate::call::{KvFact, KvOp};
use crate::io::{RequestOutcome, TransmitId};
use crate::sim::api_error;
use crate::wire::Endpoint;

/// A call waiting on one request: the call and the request's id.
type Start = fn() -> (Drive, TransmitId);

/// What happens to the request waited on.
enum Step {
    /// Its outcome comes back.
    Outcome(RequestOutcome),
    /// The call's timer fires at the request's timeout, nothing answered.
    Timer,
    /// The call's timer fires at a forward's deadline (the read is bounded by it).
    Deadline,
    /// Its outcome comes back after a forward's deadline.
    Late(RequestOutcome),
}

/// An owner on one replica: its leader read.
fn read() -> (Drive, TransmitId) {
    let mut d = Drive::new(Endpoint::Owner, r#"{"key":"k"}"#);
    let id = d.read().id;
    d.events();
    (d, id)
}

/// An acquire: its create.
fn write() -> (Drive, TransmitId) {
    let mut d = Drive::new(
        Endpoint::Acquire,
        r#"{"key":"k","holder":"h","ttl_ms":15000}"#,
    );
    let id = d.write().id;
    d.events();
    (d, id)
}

/// An owner on three replicas: its read, answered held, which it confirms.
fn confirm() -> (Drive, TransmitId) {
    let (mut d, read) = replicated_read();
    d.feed(read, held(4, "h", 15_000, 0));
    let id = d.confirm().id;
    d.events();
    (d, id)
}

/// An owner on three replicas: its leader read.
fn replicated_read() -> (Drive, TransmitId) {
    let mut d = Drive::replicated(Endpoint::Owner, r#"{"key":"k"}"#);
    let id = d.read().id;
    d.events();
    (d, id)
}

/// A forward with a second to go: its read of the owner.
fn forward_read() -> (Drive, TransmitId) {
    let mut d = Drive::new(
        Endpoint::Forward,
        r#"{"key":"k","payload":"AAEC/w==","timeout_ms":1000}"#,
    );
    let id = d.read().id;
    d.events();
    (d, id)
}

fn failed(op: KvOp, kind: &'static str) -> Vec<KvFact> {
    vec![KvFact::Error { op, kind }]
}

#[test]
fn a_call_reports_each_jetstream_outcome_class_once_as_it_read_it() {
    let unavailable = || api_error(503, 10008, "JetStream system temporarily unavailable");
    let server_error = || api_error(500, 10001, "something broke");
    let table: Vec<(&str, Start, Step, Vec<KvFact>)> = vec![
        (
            "a read that found the key: nothing to count",
            read,
            Step::Outcome(held(4, "h", 15_000, 0)),
            vec![],
        ),
        (
            "a key never written is no error",
            read,
            Step::Outcome(no_message()),
            vec![],
        ),
        (
            "a read timed out",
            read,
            Step::Outcome(RequestOutcome::TimedOut),
            failed(KvOp::Read, "timed_out"),
        ),
        (
            "a read nobody answered",
            read,
            Step::Outcome(RequestOutcome::NoResponders),
            failed(KvOp::Read, "no_responders"),
        ),
        (
            "a read that could not be sent",
            read,
            Step::Outcome(RequestOutcome::Failed("gone".into())),
            failed(KvOp::Read, "request_failed"),
        ),
        (
            "a read JetStream could not serve now",
            read,
            Step::Outcome(unavailable()),
            failed(KvOp::Read, "unavailable"),
        ),
        (
            "a read's server error",
            read,
            Step::Outcome(server_error()),
            failed(KvOp::Read, "internal"),
        ),
        (
            "a read unanswered until the call's timer",
            read,
            Step::Timer,
            failed(KvOp::Read, "timed_out"),
        ),
        (
            "a write stored: nothing to count",
            write,
            Step::Outcome(ack(4)),
            vec![],
        ),
        (
            "a write that lost its race is no error",
            write,
            Step::Outcome(wrong_last_sequence()),
            vec![],
        ),
        (
            "a write nobody answered",
            write,
            Step::Outcome(RequestOutcome::NoResponders),
            failed(KvOp::Write, "no_responders"),
        ),
        (
            "a write JetStream could not take now",
            write,
            Step::Outcome(unavailable()),
            failed(KvOp::Write, "unavailable"),
        ),
        (
            "a read on a replicated bucket: its confirmation goes out",
            replicated_read,
            Step::Outcome(held(4, "h", 15_000, 0)),
            vec![KvFact::ConfirmSent],
        ),
        (
            "a confirmation stored: nothing to count",
            confirm,
            Step::Outcome(ack(5)),
            vec![],
        ),
        (
            "a confirmation overtaken by a write: retried",
            confirm,
            Step::Outcome(wrong_last_sequence()),
            vec![KvFact::ConfirmRetry],
        ),
        (
            "a confirmation JetStream could not take",
            confirm,
            Step::Outcome(unavailable()),
            failed(KvOp::Confirm, "unavailable"),
        ),
        (
            "a confirmation's server error",
            confirm,
            Step::Outcome(server_error()),
            failed(KvOp::Confirm, "internal"),
        ),
        (
            "a forward's read cut short by its deadline",
            forward_read,
            Step::Deadline,
            failed(KvOp::Read, "timed_out"),
        ),
        (
            "a forward's read failing after its deadline",
            forward_read,
            Step::Late(RequestOutcome::NoResponders),
            failed(KvOp::Read, "no_responders"),
        ),
    ];
    for (name, start, step, expected) in table {
        let (mut d, id) = start();
        match step {
            Step::Outcome(outcome) => d.feed(id, outcome),
            Step::Timer => {
                d.advance(DEFAULT_KV_TIMEOUT);
                d.call.handle_timeout(d.now);
            }
            Step::Deadline => {
                d.advance(Duration::from_secs(1));
                d.call.handle_timeout(d.now);
            }
            Step::Late(outcome) => {
                d.advance(Duration::from_secs(1));
                d.feed(id, outcome);
            }
        }
        let facts: Vec<KvFact> = d
            .events()
            .into_iter()
            .filter_map(|e| match e {
                CallEvent::Kv(fact) => Some(fact),
                CallEvent::Replied(_) => None,
            })
            .collect();
        assert_eq!(facts, expected, "{name}");
    }
}

/// The service passes each fact its calls report on as its own event, once.
#[test]
fn the_service_reports_what_its_calls_report() {
    use crate::service::ServiceEvent;
    use serde_json::json;
    let mut w = crate::sim::service_world::ServiceWorld::new(
        crate::service::ServiceConfig::new("2.14.0", 1 << 20),
        3,
    );
    while w.service.mode() != crate::io::Mode::Ready {
        w.deliver(0);
        w.settle().unwrap();
    }
    let reply = w.request(Endpoint::Owner, json!({"key": "k"}), true);
    w.settle().unwrap();
    let before = w.events.len();
    // The read (a key never written), then its confirmation.
    while w.reply_to(&reply).is_none() {
        w.deliver(0);
        w.settle().unwrap();
    }
    let facts: Vec<_> = w.events[before..]
        .iter()
        .filter_map(|e| match e {
            ServiceEvent::Kv(fact) => Some(*fact),
            _ => None,
        })
        .collect();
    assert_eq!(facts, vec![KvFact::ConfirmSent]);
}
