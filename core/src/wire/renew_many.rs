//! The batched renewal, `renew_many`: its subject and bounds, the request (decoded
//! whole, each item as a renew request alone) and its reply, one result per item in
//! request order.

use serde::{Deserialize, Serialize};

use super::endpoint::Endpoint;
use super::error::{ErrorKind, ErrorReply, invalid};
use super::reply::{Lease, Response};
use super::request::{RenewRequest, Request, decode_json_named};

/// The last subject token of the batched renewal, `api.leases.renew_many` (a
/// tenant's `api.leases.<account>.renew_many`), and its micro-service endpoint
/// name. An extension beside the five: a service without it has no subscriber there.
pub const RENEW_MANY: &str = "renew_many";

/// Most renewals one `renew_many` request carries.
pub const MAX_RENEW_MANY: usize = 256;

/// The subject of the batched renewal: `api.leases.renew_many`.
pub fn renew_many_subject() -> String {
    format!("{}.{RENEW_MANY}", crate::subjects::API_PREFIX)
}

/// `api.leases.renew_many` as it travels: `{"leases": [<renew request>, ...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewManyRequest {
    /// The renewals, each with exactly the fields a renew request takes.
    pub leases: Vec<RenewRequest>,
}

/// The body of a `renew_many` request as [`decode_renew_many`] first reads it: each
/// item still raw, so that it goes through the renew request's own decoding.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewManyWire {
    leases: Vec<serde_json::Value>,
}

/// Decodes and validates a `renew_many` body: 1 to [`MAX_RENEW_MANY`] items, each
/// decoded as a renew request is (the same fields and bounds), no key twice. Any
/// failure is one `invalid` reply for the whole request, naming the item
/// (`leases[i]`) and its field: no item of an invalid request is renewed.
pub fn decode_renew_many(body: &[u8]) -> Result<Vec<RenewRequest>, ErrorReply> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(invalid(format!(
            "invalid {RENEW_MANY} request: the body must be a JSON object with field `leases`"
        )));
    }
    let wire: RenewManyWire = decode_json_named(RENEW_MANY, body)?;
    if wire.leases.is_empty() {
        return Err(invalid(format!(
            "invalid {RENEW_MANY} request: field `leases` is empty: send 1 to \
             {MAX_RENEW_MANY} renewals"
        )));
    }
    if wire.leases.len() > MAX_RENEW_MANY {
        return Err(invalid(format!(
            "invalid {RENEW_MANY} request: field `leases` holds {} renewals, at most \
             {MAX_RENEW_MANY} are taken in one request",
            wire.leases.len()
        )));
    }
    let mut seen = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(wire.leases.len());
    for (i, item) in wire.leases.iter().enumerate() {
        let at = |e: ErrorReply| {
            let why = e
                .error
                .strip_prefix("invalid renew request: ")
                .unwrap_or(&e.error)
                .to_string();
            invalid(format!(
                "invalid {RENEW_MANY} request: `leases[{i}]`: {why}"
            ))
        };
        if !item.is_object() {
            return Err(at(invalid("the item must be a JSON object".to_string())));
        }
        let bytes = serde_json::to_vec(item).expect("a JSON value serialises");
        let Request::Renew(renew) = Request::decode(Endpoint::Renew, &bytes).map_err(at)? else {
            unreachable!("a renew body decodes as a renew")
        };
        if let Some(first) = seen.insert(renew.key.clone(), i) {
            return Err(invalid(format!(
                "invalid {RENEW_MANY} request: `leases[{i}]`: field `key` repeats \
                 `leases[{first}]`: each key at most once in one request"
            )));
        }
        out.push(renew);
    }
    Ok(out)
}

/// One item of a `renew_many` reply: exactly what a renew of that key alone would
/// have replied (a lease, or `{"error", "kind"}`), the error with its `key` added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RenewManyResult {
    /// Renewed: the lease, with its new fence in `revision`.
    Renewed(Lease),
    /// Not renewed: the item's key and the renew's error.
    Failed {
        /// The key of the item.
        key: String,
        /// The renew's error, as a renew alone would have replied it.
        #[serde(flatten)]
        error: ErrorReply,
    },
}

impl RenewManyResult {
    /// The item's result from what its renew replied.
    pub fn of(key: &str, response: &Response) -> Self {
        match response {
            Response::Lease(lease) => Self::Renewed(lease.clone()),
            Response::Error(e) => Self::Failed {
                key: key.to_string(),
                error: e.clone(),
            },
            // A renew replies a lease or an error: anything else is a bug, reported.
            other => Self::Failed {
                key: key.to_string(),
                error: ErrorReply::new(
                    ErrorKind::Internal,
                    format!("the renew replied an unexpected shape: {other:?}"),
                ),
            },
        }
    }

    /// The key the item is about.
    pub fn key(&self) -> &str {
        match self {
            Self::Renewed(lease) => &lease.key,
            Self::Failed { key, .. } => key,
        }
    }

    /// The body a renew of this key alone would have replied.
    pub fn renew_body(&self) -> Vec<u8> {
        match self {
            Self::Renewed(lease) => Response::Lease(lease.clone()).to_json(),
            Self::Failed { error, .. } => Response::Error(error.clone()).to_json(),
        }
    }
}

/// The reply to `renew_many`: one result per item, in request order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewManyReply {
    /// The items' results, in the order the request listed them.
    pub results: Vec<RenewManyResult>,
}

impl RenewManyReply {
    /// The JSON body to send back.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("reply types always serialise")
    }

    /// Reads a `renew_many` reply body: the results, or the whole request's error
    /// (`{"error", "kind"}`). `Err` names what does not parse.
    pub fn decode(body: &[u8]) -> Result<Result<Self, ErrorReply>, String> {
        let value: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| format!("the {RENEW_MANY} reply is not JSON: {e}"))?;
        let shape = |e: serde_json::Error| format!("the {RENEW_MANY} reply is malformed: {e}");
        if value.get("kind").is_some() {
            return serde_json::from_value(value).map(Err).map_err(shape);
        }
        serde_json::from_value(value).map(Ok).map_err(shape)
    }
}
