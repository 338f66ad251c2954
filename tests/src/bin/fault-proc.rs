//! Processes the fault suite kills and freezes with real signals.
//!
//! - `fault-proc serve URL REPLICAS`: the lease service (tokio) on one NATS URL,
//!   bucket replicas as given; prints `ready` once serving; runs until killed or
//!   SIGTERM.
//! - `fault-proc holder URLS HOLDER KEY TTL_MS STORE_SUBJECT WORK_MS [KIND]`: one
//!   holder (KIND `library`, the holder library; `library-shards`, its shard set over the
//!   comma-separated keys of KEY; or `leases-md`, the default: a
//!   client written from leases.md) campaigning for KEY, writing to the fenced store over
//!   NATS on STORE_SUBJECT, with WORK_MS of work between its deadline check and each
//!   write. Prints every history record as a JSON line (`{"record": ..}`) and
//!   `{"working": fence}` right after each deadline check; on SIGTERM it stops,
//!   releases what it holds, and exits 0.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dagnats_leases_tests::history::{History, Record};
use dagnats_leases_tests::load::{self, HolderConfig, HolderKind, Observer, StoreTarget};
use dagnats_leases_tokio::service::{self, BucketOptions, ServiceConfig, ServiceOptions};

fn line(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

struct Print;
impl Observer for Print {
    fn working(&self, _key: &str, fence: u64) {
        line(serde_json::json!({ "working": fence }));
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    match args.first().map(String::as_str) {
        Some("serve") => {
            let url = &args[1];
            let replicas: usize = args[2].parse().expect("REPLICAS");
            let client = async_nats::ConnectOptions::new()
                .connect(url)
                .await
                .expect("connect");
            let options = ServiceOptions::from(ServiceConfig {
                bucket: BucketOptions {
                    replicas: Some(replicas),
                    // Inherited from the fault suite: `DAGNATS_TEST_SHARDS`.
                    shards: dagnats_leases_tests::test_shards(),
                    ..BucketOptions::default()
                },
                ..ServiceConfig::default()
            });
            let handle = service::start((url.as_str(), client), options)
                .await
                .expect("service starts");
            line(serde_json::json!("ready"));
            term.recv().await;
            handle.shutdown().await;
        }
        Some("holder") => {
            let urls: Vec<String> = args[1].split(',').map(str::to_owned).collect();
            let cfg = HolderConfig {
                holder: args[2].clone(),
                key: args[3].clone(),
                ttl_ms: args[4].parse().expect("TTL_MS"),
                write_every: Duration::from_millis(100),
                campaign_every: Duration::from_millis(150),
                release_chance: 0.0,
                work: Duration::from_millis(args[6].parse().expect("WORK_MS")),
            };
            let client = load::connect(&urls).await;
            let store = StoreTarget::Remote(client.clone(), args[5].clone());
            let history = History::with_tap(Arc::new(|r: &Record| {
                line(serde_json::json!({ "record": r }));
            }));
            let stop = Arc::new(AtomicBool::new(false));
            let kind = match args.get(7).map(String::as_str) {
                None | Some("leases-md") => HolderKind::LeasesMd,
                Some("library") => HolderKind::Library,
                Some("library-shards") => HolderKind::LibraryShards,
                Some(other) => panic!("unknown holder kind {other:?}"),
            };
            let task = tokio::spawn(load::run_holder(
                kind,
                client.clone(),
                cfg,
                store,
                history,
                Arc::clone(&stop),
                Arc::new(Print),
            ));
            term.recv().await;
            stop.store(true, Ordering::Relaxed);
            task.await.expect("the holder ends");
            client.flush().await.ok();
        }
        _ => {
            eprintln!(
                "usage: fault-proc serve URL REPLICAS | holder URLS HOLDER KEY TTL_MS STORE_SUBJECT WORK_MS [library|library-shards|leases-md]"
            );
            std::process::exit(2);
        }
    }
}
