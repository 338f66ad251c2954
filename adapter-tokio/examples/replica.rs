//! One replica of a small example service: it campaigns for `demo-leader` with the
//! holder library and, while leader, writes to a fenced store with its fence, one
//! write after another. Each write is prepared first (the fence taken), then sent
//! after 400 ms of "work", so a replica frozen mid-work wakes up holding a stale
//! fence: exactly what the store's fence check is for. `scripts/demo` runs three.
//!
//! Usage: `NATS_URL=... replica <name>`; SIGTERM steps down, releases and exits.

use std::time::Duration;

use async_nats::HeaderMap;
use dagnats_leases_tokio::member::{Member, Ownership};

const KEY: &str = "demo-leader";
const TTL: Duration = Duration::from_secs(3);
const WORK: Duration = Duration::from_millis(400);

#[tokio::main]
async fn main() {
    let name = std::env::args().nth(1).unwrap_or_else(|| "replica".into());
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let nats = async_nats::connect(&url).await.expect("connect to NATS");
    let member = Member::new(nats.clone(), name.clone()).expect("a valid holder ID");
    let mut elector = member.elect(KEY, TTL).expect("a valid lease config");
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    // While leader, one write is always in preparation: its fence taken, its "work"
    // (400 ms) under way. A replica frozen now wakes up holding that fence.
    let mut pending: Option<(u64, std::pin::Pin<Box<tokio::time::Sleep>>)> = None;
    let mut writes = 0u64;
    loop {
        if pending.is_none()
            && let Some(tenure) = elector.tenure()
        {
            pending = Some((tenure.fence, Box::pin(tokio::time::sleep(WORK))));
        }
        let work = async {
            match pending.as_mut() {
                Some((_, sleep)) => sleep.as_mut().await,
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        tokio::select! {
            change = elector.next() => match change.map(|c| c.ownership) {
                Some(Ownership::Elected { fence }) => println!("{name}: elected leader, fence {fence}"),
                Some(Ownership::SteppedDown { reason }) => println!("{name}: stepped down ({reason})"),
                None => break,
            },
            _ = work => {
                let Some((fence, _)) = pending.take() else { continue };
                writes += 1;
                let mut headers = HeaderMap::new();
                headers.insert("Demo-Fence", fence.to_string().as_str());
                let body = format!("{name} write {writes}");
                let _ = nats.request_with_headers("demo.store.write", headers, body.into()).await;
            }
            _ = term.recv() => break,
        }
    }
    elector.stop().await;
}
