//! Carries out the core's effects: each is one NATS request.

use async_nats::{Client, HeaderMap, RequestErrorKind};
use dagnats_leases_core::{NatsRequest, RequestOutcome};

/// Sends one request and reports what came of it, as the core expects.
pub async fn send(client: &Client, request: NatsRequest) -> RequestOutcome {
    let mut headers = HeaderMap::new();
    for (name, value) in &request.headers {
        headers.insert(*name, value.as_str());
    }
    let nats_request = async_nats::Request::new()
        .headers(headers)
        .payload(request.payload.into())
        .timeout(Some(request.timeout));
    match client.send_request(request.subject, nats_request).await {
        Ok(message) => RequestOutcome::Reply {
            headers: message
                .headers
                .iter()
                .flat_map(|h| h.iter())
                .flat_map(|(name, values)| {
                    values
                        .iter()
                        .map(move |v| (name.to_string(), v.as_str().to_string()))
                })
                .collect(),
            payload: message.payload.to_vec(),
        },
        Err(e) => match e.kind() {
            RequestErrorKind::NoResponders => RequestOutcome::NoResponders,
            RequestErrorKind::TimedOut => RequestOutcome::TimedOut,
            _ => RequestOutcome::Failed(e.to_string()),
        },
    }
}
