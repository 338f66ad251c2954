//! The floor: a bare NATS responder on tokio and async-nats that does, for each
//! call, exactly the JetStream operations the service does for it, and replies:
//! acquire one create, renew and release one conditional write at the caller's
//! revision (the service knows the revision it granted or saw in a change event,
//! so it does not read first), owner and forward one read first. After a
//! release's reply, like the service's tombstone sweep (`core/src/service/sweep.rs`), it
//! purges the key below the tombstone, one purge out at a time: the server does
//! that work for every release of the service too.
//!
//! It checks nothing (no validation, no holder or fence check, no error kinds) and
//! its replies carry only what the load generator needs (the new revision), so no
//! lease service can beat it: the ratio service / baseline is the cost of the
//! service's own hop. It listens on the service's subjects in the same queue group,
//! so the load generator sends the very same requests to either.

use std::time::Duration;

use async_nats::{Client, HeaderMap, Message};
use base64::Engine as _;
use bytes::Bytes;
use dagnats_leases_core::io::NatsRequest;
use dagnats_leases_core::record::format_time;
use dagnats_leases_core::service::sweep::purge_request;
use dagnats_leases_core::subjects::{
    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_FENCE, HDR_KV_OPERATION, HDR_LEASE_EVENT, HDR_TTL,
    QUEUE_GROUP, STREAM, inbox_subject, kv_subject,
};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde::Deserialize;

/// JetStream's bound on its own requests, as the service's default.
const KV_TIMEOUT: Duration = Duration::from_secs(5);

/// Every field any of the five requests has; the baseline reads what it needs.
#[derive(Deserialize)]
struct Body<'a> {
    key: &'a str,
    #[serde(default)]
    holder: Option<&'a str>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default)]
    revision: Option<u64>,
    #[serde(default)]
    payload: Option<&'a str>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// Serves the five subjects until the process is killed. Like the service, one
/// future polls every call in flight; unlike it, there is no micro-service
/// framework, no validation, and only what the load generator reads is replied.
pub async fn serve(url: &str, user: &str, password: &str) {
    let client = async_nats::ConnectOptions::new()
        .user_and_password(user.to_string(), password.to_string())
        .connect(url)
        .await
        .expect("baseline connects");
    let mut subs = Vec::new();
    for name in ["acquire", "renew", "release", "owner", "forward"] {
        let sub = client
            .queue_subscribe(format!("api.leases.{name}"), QUEUE_GROUP.to_string())
            .await
            .expect("subscribe");
        subs.push(sub.map(move |m| (name, m)).boxed());
    }
    client.flush().await.expect("flush");
    let mut requests = futures::stream::select_all(subs);
    let mut calls = FuturesUnordered::new();
    // The sweep's one purge out at a time.
    let sweep = std::sync::Arc::new(tokio::sync::Mutex::new(()));
    loop {
        tokio::select! {
            next = requests.next() => {
                let Some((name, msg)) = next else { break };
                let client = client.clone();
                let sweep = sweep.clone();
                calls.push(async move {
                    let Some(reply_to) = msg.reply.clone() else { return };
                    let (body, purge) = match handle(&client, name, &msg).await {
                        Ok(reply) => reply,
                        Err(e) => (format!(r#"{{"error":"{e}","kind":"internal"}}"#), None),
                    };
                    let _ = client.publish(reply_to, Bytes::from(body)).await;
                    if let Some(request) = purge {
                        let _one = sweep.lock().await;
                        let _ = client
                            .request(request.subject, request.payload.into())
                            .await;
                    }
                });
            }
            Some(()) = calls.next(), if !calls.is_empty() => {}
        }
    }
}

/// The reply's body, and for a release the purge the service's sweep sends after it.
async fn handle(
    client: &Client,
    name: &str,
    msg: &Message,
) -> Result<(String, Option<NatsRequest>), String> {
    let body: Body = serde_json::from_slice(&msg.payload).map_err(|e| e.to_string())?;
    let subject = kv_subject(body.key);
    let ttl_ms = body.ttl_ms.unwrap_or(15_000);
    let record = || {
        format!(
            r#"{{"holder":"{}","acquired_at":"{}","ttl_ms":{ttl_ms}}}"#,
            body.holder.unwrap_or(""),
            format_time(time::OffsetDateTime::now_utc())
        )
    };
    match name {
        "acquire" => {
            let seq = write(
                client,
                subject,
                0,
                Some(ttl_ms),
                "acquired",
                record().into(),
            )
            .await?;
            Ok((format!(r#"{{"granted":true,"revision":{seq}}}"#), None))
        }
        "renew" => {
            let expected = body.revision.ok_or("no revision")?;
            let seq = write(
                client,
                subject,
                expected,
                Some(ttl_ms),
                "renewed",
                record().into(),
            )
            .await?;
            Ok((format!(r#"{{"held":true,"revision":{seq}}}"#), None))
        }
        "release" => {
            let expected = body.revision.ok_or("no revision")?;
            let seq = write(client, subject, expected, None, "released", Bytes::new()).await?;
            Ok((
                format!(r#"{{"released":true,"held":false,"revision":{seq}}}"#),
                Some(purge_request(body.key, seq, KV_TIMEOUT)),
            ))
        }
        "owner" => match read(client, &subject).await? {
            Some((seq, _)) => Ok((format!(r#"{{"held":true,"revision":{seq}}}"#), None)),
            None => Ok((r#"{"held":false}"#.to_string(), None)),
        },
        "forward" => {
            let (seq, data) = read(client, &subject).await?.ok_or("not held")?;
            #[derive(Deserialize)]
            struct Record<'a> {
                holder: &'a str,
            }
            let record: Record = serde_json::from_slice(&data).map_err(|e| e.to_string())?;
            let b64 = base64::engine::general_purpose::STANDARD;
            let payload = b64
                .decode(body.payload.unwrap_or(""))
                .map_err(|e| e.to_string())?;
            let mut headers = HeaderMap::new();
            headers.insert(HDR_FENCE, seq.to_string().as_str());
            let request = async_nats::Request::new()
                .headers(headers)
                .payload(payload.into())
                .timeout(Some(Duration::from_millis(
                    body.timeout_ms.unwrap_or(5_000),
                )));
            let reply = client
                .send_request(inbox_subject(record.holder, body.key), request)
                .await
                .map_err(|e| e.to_string())?;
            Ok((
                format!(
                    r#"{{"payload":"{}","revision":{seq}}}"#,
                    b64.encode(&reply.payload)
                ),
                None,
            ))
        }
        _ => Err("unknown subject".into()),
    }
}

/// The leader read: a request to `$JS.API.STREAM.MSG.GET.KV_leases` with
/// `last_by_subj`; the key's revision and stored value, `None` if never written.
async fn read(client: &Client, subject: &str) -> Result<Option<(u64, Vec<u8>)>, String> {
    #[derive(Deserialize)]
    struct Reply {
        message: Option<Stored>,
        error: Option<ApiError>,
    }
    #[derive(Deserialize)]
    struct Stored {
        seq: u64,
        #[serde(default)]
        data: Option<String>,
    }
    #[derive(Deserialize)]
    struct ApiError {
        err_code: u64,
    }
    let request = async_nats::Request::new()
        .payload(format!(r#"{{"last_by_subj":"{subject}"}}"#).into())
        .timeout(Some(KV_TIMEOUT));
    let reply = client
        .send_request(format!("$JS.API.STREAM.MSG.GET.{STREAM}"), request)
        .await
        .map_err(|e| e.to_string())?;
    let reply: Reply = serde_json::from_slice(&reply.payload).map_err(|e| e.to_string())?;
    match (reply.message, reply.error) {
        (Some(m), _) => {
            let data = base64::engine::general_purpose::STANDARD
                .decode(m.data.unwrap_or_default())
                .map_err(|e| e.to_string())?;
            Ok(Some((m.seq, data)))
        }
        (None, Some(e)) if e.err_code == 10037 => Ok(None),
        _ => Err("message get failed".into()),
    }
}

/// A JetStream publish with the service's headers; returns the new revision.
async fn write(
    client: &Client,
    subject: String,
    expected: u64,
    ttl_ms: Option<u64>,
    event: &str,
    payload: Bytes,
) -> Result<u64, String> {
    #[derive(Deserialize)]
    struct Ack {
        seq: Option<u64>,
    }
    let mut headers = HeaderMap::new();
    headers.insert(
        HDR_EXPECTED_LAST_SUBJECT_SEQUENCE,
        expected.to_string().as_str(),
    );
    headers.insert(HDR_LEASE_EVENT, event);
    match ttl_ms {
        Some(ttl) => headers.insert(HDR_TTL, format!("{}s", ttl / 1000).as_str()),
        None => headers.insert(HDR_KV_OPERATION, "DEL"),
    }
    let request = async_nats::Request::new()
        .headers(headers)
        .payload(payload)
        .timeout(Some(KV_TIMEOUT));
    let reply = client
        .send_request(subject, request)
        .await
        .map_err(|e| e.to_string())?;
    let ack: Ack = serde_json::from_slice(&reply.payload).map_err(|e| e.to_string())?;
    ack.seq.ok_or_else(|| {
        format!(
            "publish failed: {}",
            String::from_utf8_lossy(&reply.payload).replace('"', "'")
        )
    })
}
