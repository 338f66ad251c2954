//! The service's intake order: what arrived at once is taken change events
//! first, and the start is settled once startup picks a mode. A row fails when
//! a request is taken before a change event that came with it.

use std::time::Instant;

use super::service::{config, ready};
use crate::io::Mode;
use crate::service::{Arrivals, Received, Service};
use crate::wire::Endpoint;

/// A change event: `k` held by `h` at revision 7.
fn acquired_at_7() -> Received {
    Received {
        subject: "dagnats.lease.changed.k".to_string(),
        headers: vec![
            ("Dagnats-Lease-Event".to_string(), "acquired".to_string()),
            ("Nats-Sequence".to_string(), "7".to_string()),
            (
                "Nats-Time-Stamp".to_string(),
                "1970-01-01T00:00:00Z".to_string(),
            ),
        ],
        payload: br#"{"holder":"h","acquired_at":"1970-01-01T00:00:00Z","ttl_ms":60000}"#.to_vec(),
        ..Received::default()
    }
}

/// A renew of `k` at revision 7.
fn renew_of_7() -> Received {
    Received {
        subject: Endpoint::Renew.subject(),
        reply: Some("_INBOX.r".to_string()),
        payload: br#"{"key":"k","holder":"h","revision":7}"#.to_vec(),
        ..Received::default()
    }
}

#[test]
fn change_events_that_arrived_with_a_request_are_taken_before_it() {
    let t0 = Instant::now();
    // (what arrived at once, the subject of the renew's first request): the
    // known path writes `$KV.leases.k` at once; without the change learnt, the
    // renew reads first.
    let cases = [
        (
            Arrivals::request(renew_of_7(), vec![acquired_at_7()]),
            "$KV.leases.k",
        ),
        (
            Arrivals::request(renew_of_7(), Vec::new()),
            "$JS.API.STREAM.MSG.GET.KV_leases",
        ),
    ];
    for (arrivals, first) in cases {
        let (mut s, _) = ready(config(), t0);
        s.handle_arrivals(t0, time::OffsetDateTime::UNIX_EPOCH, arrivals);
        let sent = s.poll_transmit().expect("the renew sends").request.subject;
        assert_eq!(sent, first);
    }
    // Change events alone are learnt: a renew that follows writes at once.
    let (mut s, _) = ready(config(), t0);
    let wall = time::OffsetDateTime::UNIX_EPOCH;
    s.handle_arrivals(t0, wall, Arrivals::changes(vec![acquired_at_7()]));
    s.handle_arrivals(t0, wall, Arrivals::request(renew_of_7(), Vec::new()));
    let sent = s.poll_transmit().expect("the renew sends").request.subject;
    assert_eq!(sent, "$KV.leases.k");
}

#[test]
fn the_start_is_settled_once_startup_picks_a_mode() {
    let t0 = Instant::now();
    let s = Service::new(config(), time::OffsetDateTime::UNIX_EPOCH, t0);
    assert_eq!((s.mode(), s.is_starting()), (Mode::Starting, true));
    let (s, _) = ready(config(), t0);
    assert_eq!((s.mode(), s.is_starting()), (Mode::Ready, false));
}
