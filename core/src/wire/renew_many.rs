//! The batched renewal, `renew_many`: its subject and bounds, the request (decoded
//! whole, each item as a renew request alone) and its reply, one result per item in
//! request order.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

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

/// The body of a `renew_many` request as [`decode_renew_many`] reads it first: each
/// item its own bytes, untouched, to be decoded once as a renew request alone.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewManyRaw<'a> {
    #[serde(borrow)]
    leases: Vec<&'a RawValue>,
}

/// The body of a `renew_many` request as the decoding of record reads it: each item
/// a JSON value, written out again and decoded as a renew request alone. Only a body
/// the one-pass reading refuses comes here, so that every invalid input keeps its
/// error sentence to the letter.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewManyWire {
    leases: Vec<serde_json::Value>,
}

/// Decodes and validates a `renew_many` body: 1 to [`MAX_RENEW_MANY`] items, each
/// decoded as a renew request is (the same fields and bounds), no key twice. Any
/// failure is one `invalid` reply for the whole request, naming the item
/// (`leases[i]`) and its field: no item of an invalid request is renewed.
///
/// A valid body is read in one pass, each item's own bytes decoded once
/// (`decode_renew_many_items`). A body that pass refuses is read again the way of
/// record (each item parsed to a JSON value, written out, decoded), which gives its
/// sentence. An item is valid only as its own bytes: one the way of record alone
/// takes (a field given twice, of which a JSON value keeps the last) is refused, as
/// a renew of that body alone is.
pub fn decode_renew_many(body: &[u8]) -> Result<Vec<RenewRequest>, ErrorReply> {
    match decode_renew_many_items(body) {
        Some(items) => Ok(items.into_iter().map(|(renew, _)| renew).collect()),
        None => {
            let items = decode_renew_many_of_record(body)?;
            match first_item_refused_alone(body) {
                Some(refused) => Err(refused),
                None => Ok(items),
            }
        }
    }
}

/// The first item whose own bytes a renew alone refuses, as the request's error.
fn first_item_refused_alone(body: &[u8]) -> Option<ErrorReply> {
    let wire: RenewManyRaw<'_> = serde_json::from_slice(body).ok()?;
    wire.leases.iter().enumerate().find_map(|(i, item)| {
        Request::decode(Endpoint::Renew, item.get().as_bytes())
            .err()
            .map(|e| item_error(i, e))
    })
}

/// A renew request's error as item `i`'s of a `renew_many` request.
fn item_error(i: usize, e: ErrorReply) -> ErrorReply {
    let why = e
        .error
        .strip_prefix("invalid renew request: ")
        .unwrap_or(&e.error);
    invalid(format!(
        "invalid {RENEW_MANY} request: `leases[{i}]`: {why}"
    ))
}

/// The one pass of [`decode_renew_many`]: each item with its own bytes, which
/// [`Request::decode`] reads as exactly that renew request. `None` for any body it
/// does not take whole (invalid, or valid only the way of record).
pub(crate) fn decode_renew_many_items(body: &[u8]) -> Option<Vec<(RenewRequest, &[u8])>> {
    // An object, as the way of record requires (serde takes a struct from an array).
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let wire: RenewManyRaw<'_> = serde_json::from_slice(body).ok()?;
    if wire.leases.is_empty() || wire.leases.len() > MAX_RENEW_MANY {
        return None;
    }
    let mut seen = std::collections::HashSet::with_capacity(wire.leases.len());
    let mut out = Vec::with_capacity(wire.leases.len());
    for item in wire.leases {
        let bytes = item.get().as_bytes();
        if bytes.first() != Some(&b'{') {
            return None;
        }
        let Ok(Request::Renew(renew)) = Request::decode(Endpoint::Renew, bytes) else {
            return None;
        };
        if !seen.insert(renew.key.clone()) {
            return None;
        }
        out.push((renew, bytes));
    }
    Some(out)
}

/// [`decode_renew_many`] the way of record: every sentence it gives is this one's.
pub(crate) fn decode_renew_many_of_record(body: &[u8]) -> Result<Vec<RenewRequest>, ErrorReply> {
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
        let at = |e: ErrorReply| item_error(i, e);
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

    /// Reads a `renew_many` reply body as the holders it answers hear it: for each
    /// item its key, its error kind when not renewed, and the body a renew of that
    /// key alone would have replied (what [`RenewManyResult::renew_body`] gives), or
    /// the whole request's error. Accepts and refuses exactly what
    /// [`RenewManyReply::decode`] does.
    ///
    /// Read in one pass where every item has exactly a renew reply's fields (a
    /// lease, or an error with its `key`): a renewed item's body is then its own
    /// bytes, which read as the same lease (a service's own reply writes them byte
    /// for byte as a renew alone would). Any other body is read by
    /// [`RenewManyReply::decode`] and each item written out again.
    pub fn decode_bodies(body: &[u8]) -> Result<Result<Vec<RenewBody>, ErrorReply>, String> {
        if let Some(items) = renew_bodies(body) {
            return Ok(Ok(items));
        }
        Ok(Self::decode(body)?.map(|reply| {
            reply
                .results
                .iter()
                .map(|result| RenewBody {
                    key: result.key().to_string(),
                    error: match result {
                        RenewManyResult::Renewed(_) => None,
                        RenewManyResult::Failed { error, .. } => Some(error.kind),
                    },
                    body: result.renew_body(),
                })
                .collect()
        }))
    }
}

/// One item of a `renew_many` reply as its holder hears it
/// ([`RenewManyReply::decode_bodies`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewBody {
    /// The key the item is about.
    pub key: String,
    /// The error's kind when the item was not renewed; `None` when it was.
    pub error: Option<ErrorKind>,
    /// The body a renew of this key alone would have replied.
    pub body: Vec<u8>,
}

/// A `renew_many` reply as the one pass of [`RenewManyReply::decode_bodies`] reads
/// it: each result its own bytes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultsRaw<'a> {
    #[serde(borrow)]
    results: Vec<&'a RawValue>,
}

/// A renewed item with exactly a [`Lease`]'s fields, each of its type: what reads
/// as the same lease however it is parsed. Its values are only checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct LeaseExact<'a> {
    held: bool,
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow)]
    holder: Cow<'a, str>,
    revision: u64,
    #[serde(borrow)]
    acquired_at: Cow<'a, str>,
    #[serde(borrow)]
    expires_at: Cow<'a, str>,
    ttl_ms: u64,
}

/// A failed item with exactly [`RenewManyResult::Failed`]'s fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailedExact {
    key: String,
    error: String,
    kind: ErrorKind,
    #[serde(default)]
    holder: Option<String>,
    #[serde(default)]
    revision: Option<u64>,
}

/// The one pass of [`RenewManyReply::decode_bodies`]: `None` unless the body is
/// `{"results": [...]}` and every item reads exactly as a lease or a failed item.
fn renew_bodies(body: &[u8]) -> Option<Vec<RenewBody>> {
    let raw: ResultsRaw<'_> = serde_json::from_slice(body).ok()?;
    raw.results
        .into_iter()
        .map(|item| {
            let text = item.get();
            if let Ok(lease) = serde_json::from_str::<LeaseExact<'_>>(text) {
                return Some(RenewBody {
                    key: lease.key.into_owned(),
                    error: None,
                    body: text.as_bytes().to_vec(),
                });
            }
            let failed: FailedExact = serde_json::from_str(text).ok()?;
            let error = ErrorReply {
                error: failed.error,
                kind: failed.kind,
                holder: failed.holder,
                revision: failed.revision,
            };
            Some(RenewBody {
                key: failed.key,
                error: Some(error.kind),
                body: Response::Error(error).to_json(),
            })
        })
        .collect()
}
