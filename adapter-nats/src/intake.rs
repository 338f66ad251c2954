//! What the service reads and where its replies go: the subscriptions the
//! [`Service`](dagnats_leases_core::service::Service) machine asks for, read as one
//! stream, and its replies, plain publishes to the subjects its reply rule let
//! through ([`dagnats_leases_core::reply_scope`]).

use async_nats::{Client, Subject, Subscriber};
use futures::stream::SelectAll;

/// Unsubscribes every subscription; the stream ends once the messages already
/// delivered to this client are read.
pub(crate) async fn drain(incoming: &mut SelectAll<Subscriber>) {
    for subscriber in incoming.iter_mut() {
        let _ = subscriber.drain().await;
    }
}

/// Publishes a reply. Untimed: the machine gives up one the client has not taken
/// within [`HANDOFF_BOUND`] (while async-nats reconnects it reads no command) and
/// the loop drops it.
///
/// [`HANDOFF_BOUND`]: dagnats_leases_core::shutdown::HANDOFF_BOUND
pub(crate) async fn reply(client: &Client, to: Subject, body: Vec<u8>) {
    if let Err(e) = client.publish(to, body.into()).await {
        tracing::warn!("reply not sent: {e}");
    }
}
