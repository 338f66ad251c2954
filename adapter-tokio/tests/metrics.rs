//! Metrics against a real server: the `dagnats-leases serve --metrics-addr` binary
//! scraped over HTTP, and the holder library's metrics through a Prometheus
//! recorder installed in this process (one global recorder a process: this test
//! binary holds one test that installs it).

use std::time::Duration;

use dagnats_leases_tests::{NatsCluster, NatsServer};
use dagnats_leases_tokio::cli;
use dagnats_leases_tokio::member::{Member, Ownership};
use dagnats_leases_tokio::telemetry;

#[path = "support/scrape.rs"]
mod scrape;

use scrape::{Served, count, scrape, value};

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_binary_counts_calls_by_endpoint_and_reply() {
    scrape::counts_calls(BIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_moves_the_service_and_library_metrics() {
    let library = cli::prometheus_builder().install_recorder().unwrap();
    telemetry::describe();
    let server = NatsServer::start();
    let served = Served::start(BIN, &server.url(), &[]).await;
    let before = scrape(served.addr).await.unwrap();

    let nats = async_nats::connect(server.url()).await.unwrap();
    let member = Member::new(nats, "metrics-holder").unwrap();
    let key = "metrics-leader";
    let mut elector = member.elect(key, Duration::from_secs(5)).unwrap();
    let shown = library.render();
    assert_eq!(
        value(&shown, telemetry::LEADER, &[("key", key)]),
        Some(0.0),
        "the gauge shows 0 while campaigning: {shown}"
    );
    let change = tokio::time::timeout(Duration::from_secs(10), elector.next())
        .await
        .expect("elected in time")
        .unwrap();
    assert!(matches!(change.ownership, Ownership::Elected { .. }));

    let elected = library.render();
    assert_eq!(
        value(&elected, telemetry::LEADER, &[("key", key)]),
        Some(1.0)
    );
    let to_elected = format!("{}_count", telemetry::CAMPAIGN_TO_ELECTED);
    assert_eq!(value(&elected, &to_elected, &[]), Some(1.0), "{elected}");
    // The grant is confirmed by a renew.
    let renews = format!("{}_count", telemetry::RENEW_DURATION);
    assert!(count(&elected, &renews, &[]) >= 1.0, "{elected}");
    assert_eq!(count(&elected, telemetry::SLOWPATH, &[]), 0.0, "{elected}");

    elector.stop().await;
    let stopped = library.render();
    assert_eq!(
        value(&stopped, telemetry::LEADER, &[("key", key)]),
        Some(0.0)
    );
    assert_eq!(
        value(&stopped, telemetry::STEP_DOWNS, &[("reason", "stopped")]),
        Some(1.0),
        "{stopped}"
    );
    assert_eq!(value(&stopped, &to_elected, &[]), Some(1.0));

    // The service saw the campaign's acquire, its confirming renew and the release.
    let after = scrape(served.addr).await.unwrap();
    let calls = telemetry::CALLS;
    for endpoint in ["acquire", "renew", "release"] {
        let labels = [("endpoint", endpoint), ("reply", "ok")];
        let grew = count(&after, calls, &labels) - count(&before, calls, &labels);
        assert!(grew >= 1.0, "{endpoint}: {after}");
        let latency = format!("{}_count", telemetry::CALL_DURATION);
        let labels = [("endpoint", endpoint)];
        assert!(count(&after, &latency, &labels) > count(&before, &latency, &labels));
    }
    // The library's metrics are this process's, not the service's.
    assert!(!after.contains(telemetry::LEADER), "{after}");
    assert_eq!(served.stop().await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_bucket_counts_read_confirmations() {
    let cluster = tokio::task::spawn_blocking(NatsCluster::start)
        .await
        .unwrap();
    let served = Served::start(BIN, &cluster.url(0), &["--replicas", "3"]).await;
    let nats = async_nats::connect(cluster.url(0)).await.unwrap();
    let call = |endpoint, body| scrape::call(&nats, endpoint, body);
    // A new stream may still settle its leader: `unavailable` is retried.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let granted = call("acquire", r#"{"key":"c","holder":"a","ttl_ms":30000}"#).await;
        if granted.contains(r#""granted":true"#) {
            break;
        }
        assert!(
            granted.contains(r#""kind":"unavailable""#) && tokio::time::Instant::now() < deadline,
            "{granted}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = scrape(served.addr).await.unwrap();
    // An owner call answers from a read, which a replicated bucket confirms.
    let owner = call("owner", r#"{"key":"c"}"#).await;
    assert!(owner.contains(r#""holder":"a""#), "{owner}");
    let after = scrape(served.addr).await.unwrap();
    let confirmations = telemetry::READ_CONFIRMATIONS;
    assert_eq!(
        count(&after, confirmations, &[]) - count(&before, confirmations, &[]),
        1.0,
        "{after}"
    );
    for quiet in [
        telemetry::READ_CONFIRMATION_RETRIES,
        telemetry::JETSTREAM_ERRORS,
    ] {
        let (was, is) = (count(&before, quiet, &[]), count(&after, quiet, &[]));
        assert_eq!(was, is, "{quiet}: {after}");
    }
    assert_eq!(served.stop().await, Some(0));
}
