//! The demo: three replicas elect a leader over `api.leases.*`, the leader dies,
//! another takes over with a higher fence, and a fenced store turns away the old
//! leader's late write. Run by `scripts/demo` against a running service.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

async fn call(client: &async_nats::Client, endpoint: &str, body: Value) -> Value {
    let msg = client
        .request(format!("api.leases.{endpoint}"), body.to_string().into())
        .await
        .expect("the lease service answers");
    serde_json::from_slice(&msg.payload).expect("JSON reply")
}

/// A downstream store that accepts a write only with a fence at least the highest seen.
#[derive(Default)]
struct FencedStore {
    highest: u64,
}

impl FencedStore {
    fn write(&mut self, who: &str, fence: u64, what: &str) {
        if fence < self.highest {
            println!(
                "  store: REJECTED {who}'s write {what:?} (fence {fence} < {})",
                self.highest
            );
        } else {
            self.highest = fence;
            println!("  store: accepted {who}'s write {what:?} (fence {fence})");
        }
    }
}

#[tokio::main]
async fn main() {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let client = async_nats::connect(&url).await.expect("connect to NATS");
    // Wait until the service answers its micro-service PING.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ping = client.request("$SRV.PING.dagnats-api", "".into()).await;
        if ping.is_ok() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease service did not come up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = "demo-leader";
    let ttl_ms = 2000;
    let mut events = client
        .subscribe(format!("dagnats.lease.changed.{key}"))
        .await
        .unwrap();
    let replicas = ["replica-a", "replica-b", "replica-c"];
    println!("three replicas campaign for {key:?} (ttl {ttl_ms} ms):");
    let mut leader = None;
    for r in replicas {
        let reply = call(
            &client,
            "acquire",
            json!({"key": key, "holder": r, "ttl_ms": ttl_ms}),
        )
        .await;
        let outcome = if reply["granted"] == true {
            "elected"
        } else {
            "follows"
        };
        println!(
            "  {r}: {outcome} (leader {} at fence {})",
            reply["holder"], reply["revision"]
        );
        if reply["granted"] == true {
            leader = Some((r, reply["revision"].as_u64().unwrap()));
        }
    }
    let (old, old_fence) = leader.expect("one replica was elected");
    let mut store = FencedStore::default();
    store.write(old, old_fence, "config v1");

    // The leader serves forwarded requests on its inbox.
    let mut inbox = client
        .subscribe(format!("dagnats.lease.inbox.{old}.>"))
        .await
        .unwrap();
    client.flush().await.unwrap();
    let responder = client.clone();
    let serving = tokio::spawn(async move {
        if let Some(msg) = inbox.next().await {
            let reply = format!("{old} handled {}", String::from_utf8_lossy(&msg.payload));
            responder
                .publish(msg.reply.unwrap(), reply.into())
                .await
                .unwrap();
        }
    });
    let payload = base64_encode(b"job-17");
    let fwd = call(
        &client,
        "forward",
        json!({"key": key, "payload": payload, "timeout_ms": 2000}),
    )
    .await;
    println!(
        "forward to whoever leads: {} answered {:?}",
        fwd["holder"],
        String::from_utf8_lossy(&base64_decode(fwd["payload"].as_str().unwrap_or("")))
    );
    serving.await.unwrap();

    println!("{old} freezes (no more renewals); the server expires its lease...");
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("the expiry event")
            .unwrap();
        let h = msg.headers.unwrap_or_default();
        if h.get("Nats-Marker-Reason").is_some() {
            println!(
                "  event: expired (revision {})",
                h.get("Nats-Sequence").map(|v| v.as_str()).unwrap_or("?")
            );
            break;
        }
    }
    let mut new_leader = None;
    for r in replicas.iter().filter(|r| **r != old) {
        let reply = call(
            &client,
            "acquire",
            json!({"key": key, "holder": r, "ttl_ms": ttl_ms}),
        )
        .await;
        if reply["granted"] == true {
            println!(
                "  {r}: elected at fence {} (was {old_fence})",
                reply["revision"]
            );
            new_leader = Some((*r, reply["revision"].as_u64().unwrap()));
            break;
        }
    }
    let (new, new_fence) = new_leader.expect("a new leader");
    assert!(new_fence > old_fence, "a new tenure's fence is higher");
    store.write(new, new_fence, "config v2");
    println!("{old} wakes up and still believes it leads:");
    let renew = call(
        &client,
        "renew",
        json!({"key": key, "holder": old, "revision": old_fence}),
    )
    .await;
    println!("  its renew: {} ({})", renew["kind"], renew["error"]);
    store.write(old, old_fence, "config v1-late");
    let release = call(
        &client,
        "release",
        json!({"key": key, "holder": new, "revision": new_fence}),
    )
    .await;
    println!("{new} releases the lease: released={}", release["released"]);
    println!("demo done: one leader at a time, and the late write was fenced off");
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_default()
}
