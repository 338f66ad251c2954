//! The service's resident memory with few and with many leases held. The service
//! keeps no per-lease state, so the figure should not grow with the count.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::load::{self, Op};
use crate::procs::{self, Impl};

/// Resident memory of one implementation at each step.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// The implementation.
    pub implementation: String,
    /// Leases held at each step, and VmRSS in KiB then.
    pub steps: Vec<MemoryStep>,
}

/// One step of the memory measurement.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryStep {
    /// Leases held (messages in the stream that are live leases).
    pub leases: usize,
    /// The service process' VmRSS, KiB.
    pub rss_kib: u64,
    /// Messages in `KV_leases`, as the server reports.
    pub stream_messages: u64,
}

/// Measures the tokio and the smol service, each on a fresh nats-server: after a
/// warm-up, with about 1,000 leases held, and with about `many`.
pub async fn measure(out: &Path, many: usize) -> Vec<Memory> {
    let mut all = Vec::new();
    for imp in [Impl::Tokio, Impl::Smol] {
        let server = crate::servers::Nats::start();
        let client = server.connect(imp.name()).await;
        let js = async_nats::jetstream::new(client.clone());
        let running = procs::start(imp, imp.name(), &server.url(), None, out, &client).await;
        let mut steps = Vec::new();
        let mut held = 0;
        for (tag, target) in [("m0", 0usize), ("m1", 1_000), ("m2", many)] {
            let n = target.saturating_sub(held);
            if n > 0 {
                load::measure(&client, Op::Acquire, tag, 64, n).await;
                held += n;
            }
            // The same traffic at every step (it also holds 64 leases of its own),
            // so the figures differ only by the leases held.
            load::measure(&client, Op::Owner, tag, 64, 2_000).await;
            held += 64;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let stream_messages = js
                .get_stream("KV_leases")
                .await
                .expect("stream")
                .cached_info()
                .state
                .messages;
            let rss_kib = procs::rss_kib(running.pid());
            println!(
                "memory {}: {held} leases held ({stream_messages} messages), VmRSS {rss_kib} KiB",
                imp.name()
            );
            steps.push(MemoryStep {
                leases: held,
                rss_kib,
                stream_messages,
            });
        }
        running.stop();
        all.push(Memory {
            implementation: imp.name().to_string(),
            steps,
        });
    }
    all
}
