//! JetStream on the wire, without a NATS client: the requests the machines ask an
//! adapter to send, what comes back, and how the core reads the server's answers.
//!
//! Every effect is one NATS request (a JetStream publish is a request to the
//! stream's subject; a leader read is a request to `$JS.API.STREAM.MSG.GET`), so an
//! adapter needs one call, and everything about JetStream's answers is decided here.

use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use time::OffsetDateTime;

use crate::io::{NatsRequest, RequestOutcome};
use crate::record::LeaseRecord;
use crate::shard::ShardMap;
use crate::subjects::{HDR_KV_OPERATION, HDR_MARKER_REASON};
use crate::wire::{ErrorKind, Lease};

/// JetStream's error code for a failed expected-last-sequence check.
pub const ERR_WRONG_LAST_SEQUENCE: u64 = 10071;
/// JetStream's error code, in a cluster, for an expected-last-sequence write to a
/// subject that already has a write in flight: checked from the leader's local
/// state before any Raft round (seen on nats-server 2.14: "wrong last sequence").
/// The key is changing: read again, as after [`ERR_WRONG_LAST_SEQUENCE`].
pub const ERR_WRONG_LAST_SEQUENCE_IN_FLIGHT: u64 = 10164;
/// JetStream's error code for a message that is not there.
pub const ERR_NO_MESSAGE_FOUND: u64 = 10037;
/// JetStream's error code for a stream that is not there.
pub const ERR_STREAM_NOT_FOUND: u64 = 10059;
/// JetStream's error code for a stream name in use with another config.
pub const ERR_STREAM_NAME_IN_USE: u64 = 10058;
/// JetStream's error code for a stream whose subjects overlap another stream's:
/// the server keeps the one-stream and the sharded layout apart with it.
pub const ERR_STREAM_SUBJECT_OVERLAP: u64 = 10065;

/// A JetStream failure, already sorted into the error kind a caller sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsFailure {
    /// `unavailable` or `internal`.
    pub kind: ErrorKind,
    /// What happened, for the error sentence.
    pub detail: String,
}

impl JsFailure {
    fn unavailable(detail: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Unavailable,
            detail: detail.into(),
        }
    }

    fn internal(detail: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Internal,
            detail: detail.into(),
        }
    }
}

/// Sorts an outcome that brought no usable reply; `None` for a reply.
fn transport_failure(outcome: &RequestOutcome) -> Option<JsFailure> {
    match outcome {
        RequestOutcome::Reply { .. } => None,
        RequestOutcome::NoResponders => Some(JsFailure::unavailable(
            "JetStream has no responder for the leases stream (no stream leader right now)",
        )),
        RequestOutcome::TimedOut => {
            Some(JsFailure::unavailable("JetStream did not answer in time"))
        }
        RequestOutcome::Failed(e) => {
            Some(JsFailure::unavailable(format!("NATS request failed: {e}")))
        }
    }
}

/// A JetStream API error body: `{"error": {"code", "err_code", "description"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ApiError {
    /// HTTP-like status.
    #[serde(default)]
    pub code: u64,
    /// JetStream's own error code.
    #[serde(default)]
    pub err_code: u64,
    /// The server's sentence.
    #[serde(default)]
    pub description: String,
}

impl ApiError {
    fn to_failure(&self) -> JsFailure {
        let detail = format!(
            "JetStream error {} ({}): {}",
            self.err_code, self.code, self.description
        );
        // 503s are the server saying "not now" (no leader, cluster not ready);
        // a stream that is not found is also what a leader election looks like.
        if self.code == 503 || self.code == 408 || self.err_code == ERR_STREAM_NOT_FOUND {
            JsFailure::unavailable(detail)
        } else {
            JsFailure::internal(detail)
        }
    }
}

fn reply_payload(outcome: &RequestOutcome) -> Result<&[u8], JsFailure> {
    if let Some(f) = transport_failure(outcome) {
        return Err(f);
    }
    match outcome {
        RequestOutcome::Reply { payload, .. } => Ok(payload),
        _ => unreachable!("transport_failure covers every other outcome"),
    }
}

/// The result of a JetStream publish, from its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishResult {
    /// Stored at this sequence: the key's new revision.
    Stored(u64),
    /// The key's last revision was not the expected one.
    WrongLastSequence,
}

/// Reads a PubAck.
pub fn parse_pub_ack(outcome: &RequestOutcome) -> Result<PublishResult, JsFailure> {
    #[derive(Deserialize)]
    struct PubAck {
        #[serde(default)]
        seq: Option<u64>,
        #[serde(default)]
        error: Option<ApiError>,
    }
    let payload = reply_payload(outcome)?;
    let ack: PubAck = serde_json::from_slice(payload)
        .map_err(|e| JsFailure::internal(format!("unreadable JetStream publish ack: {e}")))?;
    match (ack.error, ack.seq) {
        (Some(err), _)
            if err.err_code == ERR_WRONG_LAST_SEQUENCE
                || err.err_code == ERR_WRONG_LAST_SEQUENCE_IN_FLIGHT =>
        {
            Ok(PublishResult::WrongLastSequence)
        }
        (Some(err), _) => Err(err.to_failure()),
        (None, Some(seq)) if seq > 0 => Ok(PublishResult::Stored(seq)),
        (None, _) => Err(JsFailure::internal(
            "JetStream publish ack without a sequence",
        )),
    }
}

/// What the leader read of a key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// The key was never written (or was purged away).
    Absent,
    /// The last message is an expiry marker, a tombstone or a purge: nobody holds it.
    Free {
        /// The sequence of that message: a create must expect it.
        revision: u64,
    },
    /// A live lease.
    Held {
        /// The fence.
        revision: u64,
        /// The stored record.
        record: LeaseRecord,
        /// The server's store time of this revision.
        written_at: OffsetDateTime,
    },
    /// The stored value does not parse.
    Corrupt {
        /// The revision of the bad record.
        revision: u64,
        /// Why it does not parse.
        reason: String,
    },
}

impl KeyState {
    /// The key's last revision, 0 if never written.
    pub fn revision(&self) -> u64 {
        match self {
            Self::Absent => 0,
            Self::Free { revision }
            | Self::Held { revision, .. }
            | Self::Corrupt { revision, .. } => *revision,
        }
    }
}

/// The leader read of a storage key in its shard's stream
/// (`$JS.API.STREAM.MSG.GET.<stream>` with `last_by_subj`).
pub fn read_request(key: &str, timeout: Duration, shards: &ShardMap) -> NatsRequest {
    // Serialised straight from a struct: a `json!` value built a map first (a
    // profile showed it as a tenth of the service's own cost on an owner call).
    #[derive(serde::Serialize)]
    struct LastBySubject<'a> {
        last_by_subj: &'a str,
    }
    let subject = shards.kv_subject(key);
    let payload = serde_json::to_vec(&LastBySubject {
        last_by_subj: &subject,
    })
    .expect("a string always serialises");
    NatsRequest {
        subject: shards.api_subject("STREAM.MSG.GET", key),
        headers: Vec::new(),
        payload,
        timeout,
    }
}

/// Reads the reply to [`read_request`].
pub fn parse_read(outcome: &RequestOutcome) -> Result<KeyState, JsFailure> {
    // Borrowed where the text has no escapes (base64 never has): no copy per field.
    #[derive(Deserialize)]
    struct Reply<'a> {
        #[serde(default, borrow)]
        message: Option<StoredMessage<'a>>,
        #[serde(default)]
        error: Option<ApiError>,
    }
    #[derive(Deserialize)]
    struct StoredMessage<'a> {
        seq: u64,
        #[serde(default, borrow)]
        hdrs: Option<std::borrow::Cow<'a, str>>,
        #[serde(default, borrow)]
        data: Option<std::borrow::Cow<'a, str>>,
        #[serde(with = "time::serde::rfc3339")]
        time: OffsetDateTime,
    }
    let payload = reply_payload(outcome)?;
    let reply: Reply = serde_json::from_slice(payload)
        .map_err(|e| JsFailure::internal(format!("unreadable JetStream message get reply: {e}")))?;
    if let Some(err) = reply.error {
        if err.err_code == ERR_NO_MESSAGE_FOUND {
            return Ok(KeyState::Absent);
        }
        return Err(err.to_failure());
    }
    let msg = reply
        .message
        .ok_or_else(|| JsFailure::internal("JetStream message get reply without a message"))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let headers = match msg.hdrs.as_deref() {
        Some(h) if !h.is_empty() => {
            let raw = b64
                .decode(h)
                .map_err(|e| JsFailure::internal(format!("stored headers are not base64: {e}")))?;
            parse_header_block(&raw)
        }
        _ => Vec::new(),
    };
    let data = match msg.data.as_deref() {
        Some(d) => b64
            .decode(d)
            .map_err(|e| JsFailure::internal(format!("stored data is not base64: {e}"))),
        None => Ok(Vec::new()),
    }?;
    Ok(KeyState::of_message(
        msg.seq,
        |name| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        },
        &data,
        msg.time,
    ))
}

impl KeyState {
    /// What a stored message of a key says: its sequence `seq`, its headers (by
    /// name, case-insensitive), its data and the server's store time. A marker, a
    /// tombstone or a purge is free; a record that does not parse is corrupt.
    pub fn of_message<'a>(
        seq: u64,
        header: impl Fn(&str) -> Option<&'a str>,
        data: &[u8],
        stored_at: OffsetDateTime,
    ) -> Self {
        let is_free = header(HDR_MARKER_REASON).is_some()
            || header(HDR_KV_OPERATION).is_some_and(|v| v == "DEL" || v == "PURGE");
        if is_free {
            return Self::Free { revision: seq };
        }
        match LeaseRecord::parse(data) {
            Ok(record) => Self::Held {
                revision: seq,
                record,
                written_at: stored_at,
            },
            Err(reason) => Self::Corrupt {
                revision: seq,
                reason,
            },
        }
    }

    /// The lease of `key` as `owner` answers it from this state: held, or `None`.
    pub fn lease(&self, key: &str) -> Option<Lease> {
        let Self::Held {
            revision,
            record,
            written_at,
        } = self
        else {
            return None;
        };
        Some(Lease {
            held: true,
            key: key.to_string(),
            holder: record.holder.clone(),
            revision: *revision,
            acquired_at: record.acquired_at.clone(),
            expires_at: crate::record::format_time(
                *written_at + Duration::from_millis(record.ttl_ms),
            ),
            ttl_ms: record.ttl_ms,
        })
    }
}

/// Parses a NATS header block (`NATS/1.0\r\nName: value\r\n\r\n`) into pairs.
pub fn parse_header_block(raw: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(raw);
    text.split("\r\n")
        .skip(1)
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_string(), value.trim().to_string()))
        })
        .collect()
}

/// A JetStream API request (`$JS.API.…`) with a JSON body.
pub fn api_request(subject: String, body: &serde_json::Value, timeout: Duration) -> NatsRequest {
    NatsRequest {
        subject,
        headers: Vec::new(),
        payload: body.to_string().into_bytes(),
        timeout,
    }
}

/// Reads a JetStream API reply into JSON, or its error.
pub fn parse_api_reply(
    outcome: &RequestOutcome,
) -> Result<Result<serde_json::Value, ApiError>, JsFailure> {
    let payload = reply_payload(outcome)?;
    let value: serde_json::Value = serde_json::from_slice(payload)
        .map_err(|e| JsFailure::internal(format!("unreadable JetStream API reply: {e}")))?;
    if let Some(err) = value.get("error") {
        let err: ApiError = serde_json::from_value(err.clone())
            .map_err(|e| JsFailure::internal(format!("unreadable JetStream API error: {e}")))?;
        return Ok(Err(err));
    }
    Ok(Ok(value))
}

/// Sorts a JetStream API error into `unavailable` or `internal`.
pub fn api_failure(err: &ApiError) -> JsFailure {
    err.to_failure()
}
