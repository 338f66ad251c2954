//! What the benchmark binary and `batch_probe` share: the servers they start
//! ([`servers`]), so that both run nats-server the same way.
#![warn(missing_docs)]

pub mod servers;
