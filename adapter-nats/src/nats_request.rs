//! One NATS request as the core's machines ask for it: a [`NatsRequest`] sent with
//! async-nats, its reply (or failure) read back as the [`RequestOutcome`] the
//! machine is fed; and a message's headers as the core reads them.

use async_nats::{Client, HeaderMap, RequestErrorKind};
use dagnats_leases_core::{NatsRequest, RequestOutcome};

use crate::runtime::{self, Runtime};

/// Sends one request and reports what came of it, as the core expects, timed
/// by the request's own timeout. For a caller with no machine keeping a deadline:
/// the client library's one-shot calls ([`crate::client`]). The timeout runs on
/// `runtime`'s timer, not async-nats' (which would need tokio's timer in the
/// calling task): an async-nats request is otherwise only a message to its
/// connection task and a channel to wait on, so it runs on any executor.
pub async fn send(runtime: &dyn Runtime, client: &Client, request: NatsRequest) -> RequestOutcome {
    let deadline = runtime.now() + request.timeout;
    runtime::until(runtime, deadline, send_untimed(client, request))
        .await
        .unwrap_or(RequestOutcome::TimedOut)
}

/// [`send`] without a timer of its own, for a caller whose machine keeps the
/// request's deadline and says when to drop it: the service
/// ([`ServiceEvent::Cancel`]), a holder's campaign (`CampaignEvent::Cancel`), a
/// waiting acquire (its `poll_timeout`). One timer per request instead of two: on
/// smol each timer armed wakes async-io's reactor thread, which the service's p50
/// showed.
///
/// [`ServiceEvent::Cancel`]: dagnats_leases_core::service::ServiceEvent::Cancel
pub async fn send_untimed(client: &Client, request: NatsRequest) -> RequestOutcome {
    let nats_request = async_nats::Request::new()
        .headers(header_map(&request.headers))
        .payload(request.payload.into())
        .timeout(None);
    let reply = client.send_request(request.subject, nats_request).await;
    match reply {
        Ok(message) => RequestOutcome::Reply {
            headers: header_pairs(message.headers.as_ref()),
            payload: message.payload.to_vec(),
        },
        Err(e) => match e.kind() {
            RequestErrorKind::NoResponders => RequestOutcome::NoResponders,
            RequestErrorKind::TimedOut => RequestOutcome::TimedOut,
            _ => RequestOutcome::Failed(e.to_string()),
        },
    }
}

/// The headers a machine put on a request or message, as async-nats sends them:
/// [`header_pairs`] the other way.
pub fn header_map(pairs: &[(&'static str, String)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.insert(*name, value.as_str());
    }
    headers
}

/// A message's headers as the core reads them: each value of each name, in order.
pub fn header_pairs(headers: Option<&HeaderMap>) -> Vec<(String, String)> {
    headers
        .iter()
        .flat_map(|h| h.iter())
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |v| (name.to_string(), v.as_str().to_string()))
        })
        .collect()
}
