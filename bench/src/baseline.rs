//! The floor: a bare NATS responder on tokio and async-nats that does, for each
//! call, exactly the JetStream operations the service does for it, and replies.
//!
//! It checks nothing (no validation, no holder or fence check, no error kinds) and
//! its replies carry only what the load generator needs (the new revision), so no
//! lease service can beat it: the ratio service / baseline is the cost of the
//! service's own hop. It listens on the service's subjects in the same queue group,
//! so the load generator sends the very same requests to either.

use std::time::Duration;

use async_nats::jetstream::{self, stream::Stream};
use async_nats::{Client, HeaderMap, Message};
use base64::Engine as _;
use bytes::Bytes;
use dagnats_leases_core::record::{
    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_FENCE, HDR_KV_OPERATION, HDR_LEASE_EVENT, HDR_TTL,
    QUEUE_GROUP, STREAM, format_time, inbox_subject, kv_subject,
};
use futures::StreamExt;
use serde::Deserialize;

/// Every field any of the five requests has; the baseline reads what it needs.
#[derive(Deserialize)]
struct Body<'a> {
    key: &'a str,
    #[serde(default)]
    holder: Option<&'a str>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default)]
    payload: Option<&'a str>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

#[derive(Clone)]
struct Ctx {
    client: Client,
    js: jetstream::Context,
    stream: Stream<()>,
}

/// Serves the five subjects until the process is killed.
pub async fn serve(url: &str) {
    let client = async_nats::connect(url).await.expect("baseline connects");
    let js = jetstream::new(client.clone());
    let stream = js
        .get_stream_no_info(STREAM)
        .await
        .expect("the leases stream exists (the service created it)");
    let ctx = Ctx { client, js, stream };
    let mut subs = Vec::new();
    for name in ["acquire", "renew", "release", "owner", "forward"] {
        let sub = ctx
            .client
            .queue_subscribe(format!("api.leases.{name}"), QUEUE_GROUP.to_string())
            .await
            .expect("subscribe");
        subs.push(sub.map(move |m| (name, m)).boxed());
    }
    ctx.client.flush().await.expect("flush");
    let mut all = futures::stream::select_all(subs);
    while let Some((name, msg)) = all.next().await {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let Some(reply_to) = msg.reply.clone() else {
                return;
            };
            let body = handle(&ctx, name, &msg)
                .await
                .unwrap_or_else(|e| format!(r#"{{"error":"{e}","kind":"internal"}}"#));
            let _ = ctx.client.publish(reply_to, Bytes::from(body)).await;
        });
    }
}

async fn handle(ctx: &Ctx, name: &str, msg: &Message) -> Result<String, String> {
    let body: Body = serde_json::from_slice(&msg.payload).map_err(|e| e.to_string())?;
    let subject = kv_subject(body.key);
    match name {
        "acquire" => {
            let ttl_ms = body.ttl_ms.unwrap_or(15_000);
            let record = format!(
                r#"{{"holder":"{}","acquired_at":"{}","ttl_ms":{ttl_ms}}}"#,
                body.holder.unwrap_or(""),
                format_time(time::OffsetDateTime::now_utc())
            );
            let seq = write(ctx, subject, 0, Some(ttl_ms), "acquired", record.into()).await?;
            Ok(format!(r#"{{"granted":true,"revision":{seq}}}"#))
        }
        "renew" => {
            let msg = read(ctx, &subject).await?.ok_or("not held")?;
            let ttl_ms = body.ttl_ms.unwrap_or(15_000);
            let seq = write(
                ctx,
                subject,
                msg.sequence,
                Some(ttl_ms),
                "renewed",
                msg.payload,
            )
            .await?;
            Ok(format!(r#"{{"held":true,"revision":{seq}}}"#))
        }
        "release" => {
            let msg = read(ctx, &subject).await?.ok_or("not held")?;
            let seq = write(ctx, subject, msg.sequence, None, "released", Bytes::new()).await?;
            Ok(format!(
                r#"{{"released":true,"held":false,"revision":{seq}}}"#
            ))
        }
        "owner" => match read(ctx, &subject).await? {
            Some(msg) => Ok(format!(r#"{{"held":true,"revision":{}}}"#, msg.sequence)),
            None => Ok(r#"{"held":false}"#.to_string()),
        },
        "forward" => {
            let msg = read(ctx, &subject).await?.ok_or("not held")?;
            #[derive(Deserialize)]
            struct Record<'a> {
                holder: &'a str,
            }
            let record: Record = serde_json::from_slice(&msg.payload).map_err(|e| e.to_string())?;
            let b64 = base64::engine::general_purpose::STANDARD;
            let payload = b64
                .decode(body.payload.unwrap_or(""))
                .map_err(|e| e.to_string())?;
            let mut headers = HeaderMap::new();
            headers.insert(HDR_FENCE, msg.sequence.to_string().as_str());
            let request = async_nats::Request::new()
                .headers(headers)
                .payload(payload.into())
                .timeout(Some(Duration::from_millis(
                    body.timeout_ms.unwrap_or(5_000),
                )));
            let reply = ctx
                .client
                .send_request(inbox_subject(record.holder, body.key), request)
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!(
                r#"{{"payload":"{}","revision":{}}}"#,
                b64.encode(&reply.payload),
                msg.sequence
            ))
        }
        _ => Err("unknown subject".into()),
    }
}

/// The leader read (`$JS.API.STREAM.MSG.GET.KV_leases` with `last_by_subj`).
async fn read(
    ctx: &Ctx,
    subject: &str,
) -> Result<Option<async_nats::jetstream::message::StreamMessage>, String> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    match ctx.stream.get_last_raw_message_by_subject(subject).await {
        Ok(m) => Ok(Some(m)),
        Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// A JetStream publish with the service's headers; returns the new revision.
async fn write(
    ctx: &Ctx,
    subject: String,
    expected: u64,
    ttl_ms: Option<u64>,
    event: &str,
    payload: Bytes,
) -> Result<u64, String> {
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
    let ack = ctx
        .js
        .publish_with_headers(subject, headers, payload)
        .await
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    Ok(ack.sequence)
}
