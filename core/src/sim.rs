//! simulated JetStream
