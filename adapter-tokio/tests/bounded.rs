//! The service runs at most `max_calls_in_flight` calls at once, on a real server:
//! forwards to an owner that answers only when the test lets it hold calls open; a
//! request past the bound waits until one ends, and past `max_calls_waiting` it is
//! answered `unavailable` at once (half the waiting room kept for renewals).

use std::time::Duration;

use dagnats_leases_core::subjects::inbox_subject;
use dagnats_leases_core::wire::{
    Endpoint, ErrorKind, ForwardRequest, RenewRequest, Request, Response,
};
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::client::LeaseClient;
use dagnats_leases_tokio::service::{self, ServiceConfig, ServiceOptions};
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_bound_wait_until_one_ends() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let options = ServiceOptions::from(ServiceConfig {
        max_calls_in_flight: 2,
        ..ServiceConfig::default()
    });
    let _service = service::start((server.url(), client.clone()), options)
        .await
        .unwrap();
    let leases = LeaseClient::new(client.clone());
    let granted = leases
        .acquire("k", "owner", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(granted.granted);
    // The owner's inbox, answered by hand.
    let mut inbox = client.subscribe(inbox_subject("owner", "k")).await.unwrap();
    client.flush().await.unwrap();
    let forwards: Vec<_> = (0..3)
        .map(|i| {
            let leases = leases.clone();
            tokio::spawn(async move {
                leases
                    .forward("k", format!("call {i}").as_bytes(), Duration::from_secs(20))
                    .await
            })
        })
        .collect();
    // Two calls reach the owner and stay open; the third waits.
    let first = inbox.next().await.unwrap();
    let second = inbox.next().await.unwrap();
    let third = tokio::time::timeout(Duration::from_millis(500), inbox.next()).await;
    assert!(third.is_err(), "a third call ran past the bound of 2");
    // One ends: the waiting one starts.
    client
        .publish(first.reply.clone().unwrap(), "done".into())
        .await
        .unwrap();
    let third = tokio::time::timeout(Duration::from_secs(10), inbox.next())
        .await
        .expect("the waiting call starts once one ended")
        .unwrap();
    for m in [&third, &second] {
        client
            .publish(m.reply.clone().unwrap(), "done".into())
            .await
            .unwrap();
    }
    for f in forwards {
        let reply = f.await.unwrap().expect("every forward answered");
        assert_eq!(&reply.payload[..], b"done");
    }
}

/// The next message, failing the test (rather than hanging it) if none comes
/// within 10 s.
async fn within(
    next: impl std::future::Future<Output = Option<async_nats::Message>>,
) -> async_nats::Message {
    tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("a message within 10 s")
        .expect("the subscription is open")
}

/// Publishes `request` to its endpoint with `inbox` as the reply subject: requests
/// sent one after another on one connection arrive in that order.
async fn send(client: &async_nats::Client, inbox: &str, request: &Request) {
    let endpoint = request.endpoint();
    client
        .publish_with_reply(
            endpoint.subject(),
            inbox.to_string(),
            request.to_json().into(),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_waiting_room_a_request_is_refused_at_once_and_renewals_keep_half() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let options = ServiceOptions::from(ServiceConfig {
        max_calls_in_flight: 1,
        max_calls_waiting: 2,
        ..ServiceConfig::default()
    });
    let _service = service::start((server.url(), client.clone()), options)
        .await
        .unwrap();
    let leases = LeaseClient::new(client.clone());
    let lease = leases
        .acquire("k", "owner", Duration::from_secs(30))
        .await
        .unwrap()
        .lease;
    let mut inbox = client.subscribe(inbox_subject("owner", "k")).await.unwrap();
    let replies = client.new_inbox();
    let mut answers = client.subscribe(format!("{replies}.*")).await.unwrap();
    client.flush().await.unwrap();
    let forward = |n: u8| {
        Request::Forward(ForwardRequest {
            key: "k".into(),
            payload: vec![n],
            timeout_ms: 20_000,
        })
    };
    // The one call in flight: a forward the owner holds open.
    send(&client, &format!("{replies}.a"), &forward(0)).await;
    let held = within(inbox.next()).await;
    // In order: a forward waits (half the room is for calls that take or read), a
    // second forward finds that half full and is refused, a renew takes the other
    // half, a second renew finds the room full and is refused.
    send(&client, &format!("{replies}.b"), &forward(1)).await;
    send(&client, &format!("{replies}.c"), &forward(2)).await;
    let renew = Request::Renew(RenewRequest {
        key: "k".into(),
        holder: "owner".into(),
        revision: lease.revision,
        ttl_ms: None,
    });
    send(&client, &format!("{replies}.d"), &renew).await;
    send(&client, &format!("{replies}.e"), &renew).await;
    client.flush().await.unwrap();
    let mut refused = Vec::new();
    for _ in 0..2 {
        let m = within(answers.next()).await;
        let which = m.subject.rsplit('.').next().unwrap().to_string();
        let reply = Response::decode(Endpoint::Forward, &m.payload).unwrap();
        assert!(
            matches!(&reply, Response::Error(e) if e.kind == ErrorKind::Unavailable),
            "{which}: {reply:?}"
        );
        refused.push(which);
    }
    refused.sort();
    assert_eq!(
        refused,
        ["c", "e"],
        "refused while the first call was still open"
    );
    // The held call ends: the waiting forward, then the waiting renew, run.
    client
        .publish(held.reply.clone().unwrap(), "done".into())
        .await
        .unwrap();
    let waiting = within(inbox.next()).await;
    client
        .publish(waiting.reply.clone().unwrap(), "done".into())
        .await
        .unwrap();
    let mut rest = Vec::new();
    for _ in 0..3 {
        let m = within(answers.next()).await;
        rest.push((m.subject.rsplit('.').next().unwrap().to_string(), m.payload));
    }
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    let names: Vec<&str> = rest.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b", "d"]);
    let renewed = Response::decode(Endpoint::Renew, &rest[2].1).unwrap();
    assert!(matches!(renewed, Response::Lease(_)), "{renewed:?}");
}
