//! What the service reads and where its replies go: the subscriptions the
//! [`Service`](dagnats_leases_core::service::Service) machine asks for, read as one
//! stream from the strict connection, and its replies, plain publishes to the
//! subjects its reply rule let through ([`dagnats_leases_core::reply_scope`]).

use futures::stream::SelectAll;

use crate::strict::{StrictClient, Subscription};

/// Unsubscribes every subscription; the stream ends once the messages the server
/// sent before it read the UNSUBs are read.
pub(crate) async fn drain(incoming: &mut SelectAll<Subscription>) {
    for subscriber in incoming.iter_mut() {
        subscriber.drain();
    }
}

/// Publishes a reply. Untimed: the machine gives up one the connection has not
/// taken within [`HANDOFF_BOUND`] and the loop drops it.
///
/// [`HANDOFF_BOUND`]: dagnats_leases_core::io::HANDOFF_BOUND
pub(crate) async fn reply(client: &StrictClient, to: String, body: Vec<u8>) {
    if let Err(e) = client.publish(to, None, Vec::new(), body).await {
        tracing::warn!("reply not sent: {e}");
    }
}
