//! Test support for dagnats-leases: real `nats-server` processes for integration tests.
//!
//! [`NatsServer`] runs one nats-server on a loopback port with JetStream and its own
//! temporary store directory, and kills it when dropped (also when the test panics).
//! Starting and stopping are synchronous ([`std::process`]), so tests on any async
//! runtime (tokio, smol) can use it; each call blocks for as long as the server takes
//! to become ready, typically a few milliseconds.
//!
//! The binaries come from `scripts/install-nats-server`:
//! - [`NatsServer::start`]: upstream v2.15.1 at `.nats/bin/nats-server` in the checkout
//!   (override with the environment variable `DAGNATS_NATS_SERVER`: `scripts/test` points
//!   it at v2.11.x, the oldest supported release, `.nats/bin-2.11/nats-server`, for a
//!   second run of the scenario suite);
//! - [`NatsServer::start_legacy`]: Debian's v2.9.10 at `/usr/sbin/nats-server`, too old
//!   for per-message TTL (override with `DAGNATS_NATS_SERVER_LEGACY`).
//!
//! Ports: the first start passes `-p -1`, so the server itself binds a free port chosen
//! by the kernel (no probe-then-release race), and the harness reads the port from the
//! server's ports file (`--ports_file_dir`). Restarts reuse that port explicitly.
//!
//! ```no_run
//! use dagnats_leases_tests::NatsServer;
//!
//! let mut server = NatsServer::builder().max_payload(64 * 1024).start();
//! println!("{} runs v{}", server.url(), server.version());
//! server.restart(); // same port, same store directory
//! ```
#![warn(missing_docs)]

pub mod cluster;
pub mod history;
pub mod load;
pub mod probe;
pub mod proxy;
pub mod raw;
pub mod secure;
pub mod server;
pub mod tap;

pub use cluster::NatsCluster;

/// The environment variable naming the shard count the suites run the service
/// with (`serve --shards`); unset, one.
pub const ENV_SHARDS: &str = "DAGNATS_TEST_SHARDS";

/// The shard count [`ENV_SHARDS`] names (default 1): `scripts/test` runs the
/// scenario, fault and read-confirmation suites again with several shards.
pub fn test_shards() -> dagnats_leases_core::shard::ShardMap {
    let Some(n) = std::env::var(ENV_SHARDS).ok().filter(|v| !v.is_empty()) else {
        return dagnats_leases_core::shard::ShardMap::SINGLE;
    };
    let count: u32 = n
        .parse()
        .unwrap_or_else(|e| panic!("{ENV_SHARDS}={n:?} is no count: {e}"));
    dagnats_leases_core::shard::ShardMap::new(count).unwrap_or_else(|e| panic!("{ENV_SHARDS}: {e}"))
}
pub use server::*;
