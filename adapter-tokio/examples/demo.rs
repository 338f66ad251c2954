//! The demo `scripts/demo` runs against a local nats-server and lease service: three
//! replicas (the `replica` example, as child processes) elect a leader with the holder
//! library; the leader is frozen past its lease (SIGSTOP), another takes over with a
//! higher fence, the frozen one wakes and its late write is rejected by a fenced
//! store; then the new leader is killed (SIGKILL) and a third takes over. The store is
//! a NATS responder here, keeping a `FenceGuard`.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use dagnats_leases_core::holder::guard::FenceGuard;
use dagnats_leases_tokio::client::LeaseClient;
use futures::StreamExt;
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

const KEY: &str = "demo-leader";

/// What the store saw.
#[derive(Debug)]
enum StoreEvent {
    Accepted {
        writer: String,
        fence: u64,
    },
    Rejected {
        writer: String,
        fence: u64,
        highest: u64,
    },
}

fn say(line: &str) {
    println!("{line}");
}

#[tokio::main]
async fn main() {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let replica_bin = std::env::var("REPLICA_BIN").expect("REPLICA_BIN names the replica example");
    let nats = async_nats::connect(&url).await.expect("connect to NATS");
    let leases = LeaseClient::new(nats.clone()).with_timeout(Duration::from_secs(5));
    wait_for_service(&nats).await;

    // The fenced store.
    let (store_tx, mut store_rx) = mpsc::unbounded_channel();
    let mut writes = nats.subscribe("demo.store.write").await.unwrap();
    nats.flush().await.unwrap();
    let store_nats = nats.clone();
    tokio::spawn(async move {
        let mut guard = FenceGuard::new();
        while let Some(m) = writes.next().await {
            let fence: u64 = m
                .headers
                .as_ref()
                .and_then(|h| h.get("Demo-Fence"))
                .and_then(|v| v.as_str().parse().ok())
                .unwrap_or(0);
            let writer = String::from_utf8_lossy(&m.payload)
                .split(' ')
                .next()
                .unwrap_or_default()
                .to_string();
            let event = match guard.admit(fence) {
                Ok(()) => StoreEvent::Accepted { writer, fence },
                Err(stale) => StoreEvent::Rejected {
                    writer,
                    fence,
                    highest: stale.highest,
                },
            };
            if let Some(reply) = m.reply {
                let _ = store_nats.publish(reply, "ok".into()).await;
            }
            let _ = store_tx.send(event);
        }
    });

    say("== three replicas campaign for \"demo-leader\" (lease ttl 3 s)");
    let mut pids = HashMap::new();
    let mut children = Vec::new();
    for name in ["r1", "r2", "r3"] {
        let mut child = tokio::process::Command::new(&replica_bin)
            .arg(name)
            .env("NATS_URL", &url)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start a replica");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                println!("  {line}");
            }
        });
        pids.insert(name.to_string(), child.id().expect("running"));
        children.push((name, child));
    }

    let (first, fence1) = wait_for_writer(&mut store_rx, None).await;
    let lease = leases.owner(KEY).await.unwrap().expect("held");
    say(&format!(
        "== {first} leads (the service agrees: holder {}, revision {}); the store took its write with fence {fence1}",
        lease.holder, lease.revision
    ));

    say(&format!(
        "== freezing {first} (SIGSTOP) until well past its 3 s lease"
    ));
    signal(pids[&first], "-STOP");
    let (second, fence2) = wait_for_writer(&mut store_rx, Some(&first)).await;
    say(&format!(
        "== {second} took over with fence {fence2} (> {fence1}) while {first} was frozen"
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    say(&format!(
        "== waking {first} (SIGCONT): it was mid-write with fence {fence1}"
    ));
    signal(pids[&first], "-CONT");
    let rejected = wait_for_rejection(&mut store_rx, &first).await;
    match rejected {
        Some((fence, highest)) => say(&format!(
            "== the store REJECTED {first}'s late write: fence {fence} < {highest}"
        )),
        None => say(&format!(
            "== {first} woke and saw its deadline had passed: it wrote nothing late"
        )),
    }

    say(&format!("== killing the leader {second} (SIGKILL)"));
    signal(pids[&second], "-KILL");
    let (third, fence3) = wait_for_writer(&mut store_rx, Some(&second)).await;
    say(&format!(
        "== {third} leads with fence {fence3} (> {fence2}) after {second} died"
    ));
    say(&format!(
        "== fences in order: {first} {fence1} -> {second} {fence2} -> {third} {fence3}"
    ));

    // Stop the rest: SIGTERM makes a replica step down and release.
    for (name, mut child) in children {
        if name != second {
            signal(pids[name], "-TERM");
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    }
    let after = leases.owner(KEY).await.unwrap();
    say(&format!(
        "== replicas stopped; {KEY} is {}",
        if after.is_none() {
            "free"
        } else {
            "still held"
        }
    ));
    assert!(fence1 < fence2 && fence2 < fence3, "fences must grow");
    assert!(
        rejected.is_some(),
        "the late write should have been rejected"
    );
}

async fn wait_for_service(nats: &async_nats::Client) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while nats
        .request("$SRV.PING.dagnats-api", "".into())
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease service did not come up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The first writer the store accepts that is not `not`.
async fn wait_for_writer(
    rx: &mut mpsc::UnboundedReceiver<StoreEvent>,
    not: Option<&str>,
) -> (String, u64) {
    let wait = async {
        while let Some(event) = rx.recv().await {
            if let StoreEvent::Accepted { writer, fence } = event
                && Some(writer.as_str()) != not
            {
                return (writer, fence);
            }
        }
        panic!("the store stopped");
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("a leader wrote within 30 s")
}

/// A rejected write from `writer` within a few seconds, if any.
async fn wait_for_rejection(
    rx: &mut mpsc::UnboundedReceiver<StoreEvent>,
    writer: &str,
) -> Option<(u64, u64)> {
    let wait = async {
        while let Some(event) = rx.recv().await {
            if let StoreEvent::Rejected {
                writer: w,
                fence,
                highest,
            } = event
                && w == writer
            {
                return Some((fence, highest));
            }
        }
        None
    };
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .ok()
        .flatten()
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}
