//! The service runs at most `max_calls_in_flight` calls at once, on a real server:
//! forwards to an owner that answers only when the test lets it hold calls open,
//! and a request past the bound waits (in its subscription) until one ends.

use std::time::Duration;

use dagnats_leases_core::subjects::inbox_subject;
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::client::LeaseClient;
use dagnats_leases_tokio::service::{self, ServiceOptions};
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_bound_wait_until_one_ends() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let options = ServiceOptions {
        max_calls_in_flight: 2,
        ..ServiceOptions::default()
    };
    let _service = service::start(client.clone(), options).await.unwrap();
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
