//! `serve --renew-many` against a real server, through the binary: on by default
//! the service lists `renew_many` in `$SRV.INFO` and answers it; `false` leaves it
//! unlisted and unsubscribed, so a request on it meets no responders (what the
//! holder library reads as "renew one by one"). `serve --changes`: alone, `auto` (the
//! default) takes no change events and `always` does; any other value is refused.

#[path = "support/scrape.rs"]
mod scrape;

use std::time::Duration;

use dagnats_leases_tests::NatsServer;
use scrape::Served;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");

/// The endpoint names `$SRV.INFO` lists, and how a `renew_many` request went.
async fn listed_and_answered(url: &str, extra: &[&str]) -> (Vec<String>, Result<Value, String>) {
    let served = Served::start(BIN, url, extra).await;
    let nats = async_nats::connect(url).await.expect("connect");
    let info = nats
        .request("$SRV.INFO.dagnats-api", "".into())
        .await
        .expect("$SRV.INFO answered");
    let info: Value = serde_json::from_slice(&info.payload).expect("INFO is JSON");
    let names = info["endpoints"]
        .as_array()
        .expect("INFO lists endpoints")
        .iter()
        .map(|e| e["name"].as_str().unwrap_or_default().to_string())
        .collect();
    let body = r#"{"leases":[{"key":"k","holder":"a","revision":1}]}"#;
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        nats.request("api.leases.renew_many", body.into()),
    )
    .await
    .expect("a reply or no responders within the bound")
    .map(|m| serde_json::from_slice(&m.payload).expect("a JSON reply"))
    .map_err(|e| e.kind().to_string());
    served.stop().await;
    (names, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_is_served_by_default_and_false_leaves_it_unlisted_and_unanswered() {
    let server = NatsServer::start();
    let (names, answer) = listed_and_answered(&server.url(), &[]).await;
    assert!(names.iter().any(|n| n == "renew_many"), "{names:?}");
    let answer = answer.expect("the default service answers renew_many");
    assert!(answer.get("results").is_some(), "{answer}");

    let (names, answer) = listed_and_answered(&server.url(), &["--renew-many", "false"]).await;
    assert!(!names.iter().any(|n| n == "renew_many"), "{names:?}");
    assert_eq!(names.len(), 5, "the five endpoints alone: {names:?}");
    let kind = answer.expect_err("no service answers renew_many");
    assert!(kind.to_lowercase().contains("no responders"), "{kind}");
}

/// Whether anything subscribes to the change events: a request there meets no
/// responders only where nothing does (a service that does is delivered it,
/// learns nothing from an event without `Nats-Sequence`, and answers nothing).
async fn changes_subscribed(nats: &async_nats::Client) -> bool {
    let asked = tokio::time::timeout(
        Duration::from_secs(2),
        nats.request("dagnats.lease.changed.probe", "".into()),
    )
    .await;
    !matches!(
        asked,
        Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_auto_alone_takes_no_change_events_and_always_does() {
    let server = NatsServer::start();
    let nats = async_nats::connect(server.url()).await.expect("connect");
    let served = Served::start(BIN, &server.url(), &[]).await;
    assert!(
        !changes_subscribed(&nats).await,
        "auto, alone: no change events"
    );
    served.stop().await;
    let served = Served::start(BIN, &server.url(), &["--changes", "always"]).await;
    assert!(changes_subscribed(&nats).await, "always: change events");
    served.stop().await;
}

#[test]
fn changes_refuses_a_value_it_does_not_know_naming_the_flag() {
    let out = std::process::Command::new(BIN)
        .args(["serve", "--changes", "sometimes"])
        .output()
        .expect("the binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--changes") && stderr.contains("auto, always"),
        "{stderr}"
    );
}
