//! What the service reads and where its replies go: the subscriptions the
//! [`Service`](dagnats_leases_core::service::Service) machine asks for, read as one
//! stream, and its replies, plain publishes to the subjects its reply rule let
//! through ([`dagnats_leases_core::reply_scope`]).

use std::time::Instant;

use async_nats::{Client, Subject, Subscriber};
use dagnats_leases_core::shutdown::HANDOFF_BOUND;
use futures::stream::SelectAll;

use crate::runtime::{self, Runtime};

/// Unsubscribes every subscription; the stream ends once the messages already
/// delivered to this client are read.
pub(crate) async fn drain(incoming: &mut SelectAll<Subscriber>) {
    for subscriber in incoming.iter_mut() {
        let _ = subscriber.drain().await;
    }
}

/// Publishes a reply, handed to the client within [`HANDOFF_BOUND`]: while
/// async-nats reconnects it reads no command, and a reply must not hold the loop
/// (or a stop) for as long.
pub(crate) async fn reply(runtime: &dyn Runtime, client: &Client, to: Subject, body: Vec<u8>) {
    let deadline: Instant = runtime.now() + HANDOFF_BOUND;
    let publish = client.publish(to, body.into());
    match runtime::until(runtime, deadline, publish).await {
        Some(Ok(())) => {}
        Some(Err(e)) => tracing::warn!("reply not sent: {e}"),
        None => {
            tracing::warn!("reply not sent: the NATS client took no command for {HANDOFF_BOUND:?}")
        }
    }
}
