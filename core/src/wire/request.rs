//! Requests of the five lease subjects and their strict decoding: every failure an
//! `invalid` error reply whose sentence names the field.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::bounds::{MAX_FORWARD_TIMEOUT_MS, MIN_FORWARD_TIMEOUT_MS, check_name, check_ttl};
use super::endpoint::Endpoint;
use super::error::{ErrorReply, invalid};

/// `api.leases.acquire`: grant `key` to `holder` for `ttl_ms` if nobody holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireRequest {
    /// The lease key, one subject token.
    pub key: String,
    /// The caller's holder ID, unique per process.
    pub holder: String,
    /// Lease time to live, whole seconds in milliseconds.
    pub ttl_ms: u64,
}

/// `api.leases.renew`: extend the lease to `ttl_ms` from now under the fence check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewRequest {
    /// The lease key.
    pub key: String,
    /// The caller's holder ID.
    pub holder: String,
    /// The fence from the caller's last reply.
    pub revision: u64,
    /// New time to live; the lease's own when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// `api.leases.release`: free the key under the fence check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// The lease key.
    pub key: String,
    /// The caller's holder ID.
    pub holder: String,
    /// The fence from the caller's last reply.
    pub revision: u64,
}

/// `api.leases.owner`: who holds `key`, with no side effects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRequest {
    /// The lease key.
    pub key: String,
}

/// `api.leases.forward` as it travels: the payload still base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardRequestWire {
    /// The lease key whose owner should receive the payload.
    pub key: String,
    /// The request body for the owner, base64 (standard alphabet, padded).
    pub payload: String,
    /// Bound on the whole call, 100 to 30000.
    pub timeout_ms: u64,
}

/// `api.leases.forward`, decoded: the payload as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardRequest {
    /// The lease key whose owner should receive the payload.
    pub key: String,
    /// The decoded request body for the owner.
    pub payload: Vec<u8>,
    /// Bound on the whole call, 100 to 30000.
    pub timeout_ms: u64,
}

/// A decoded and validated request to one of the five subjects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// See [`AcquireRequest`].
    Acquire(AcquireRequest),
    /// See [`RenewRequest`].
    Renew(RenewRequest),
    /// See [`ReleaseRequest`].
    Release(ReleaseRequest),
    /// See [`OwnerRequest`].
    Owner(OwnerRequest),
    /// See [`ForwardRequest`].
    Forward(ForwardRequest),
}

impl Request {
    /// The endpoint this request belongs to.
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Self::Acquire(_) => Endpoint::Acquire,
            Self::Renew(_) => Endpoint::Renew,
            Self::Release(_) => Endpoint::Release,
            Self::Owner(_) => Endpoint::Owner,
            Self::Forward(_) => Endpoint::Forward,
        }
    }

    /// The lease key the request is about.
    pub fn key(&self) -> &str {
        match self {
            Self::Acquire(r) => &r.key,
            Self::Renew(r) => &r.key,
            Self::Release(r) => &r.key,
            Self::Owner(r) => &r.key,
            Self::Forward(r) => &r.key,
        }
    }

    /// Decodes and validates a request body for `endpoint`.
    ///
    /// The four lease calls share one set of request fields (`key`, `holder`,
    /// `revision`, `ttl_ms`): each checks the ones it uses and ignores the others,
    /// because clients reuse one request struct for every call. Any other field is
    /// `invalid`. Every failure is an `invalid` [`ErrorReply`] whose sentence names
    /// the field.
    pub fn decode(endpoint: Endpoint, body: &[u8]) -> Result<Self, ErrorReply> {
        if endpoint == Endpoint::Forward {
            return decode_forward(body);
        }
        let fields: SharedFields = decode_json(endpoint, body)?;
        let name = endpoint.name();
        let missing =
            |field: &str| invalid(format!("invalid {name} request: missing field `{field}`"));
        let key = fields.key.ok_or_else(|| missing("key"))?;
        check_name("key", &key)?;
        if endpoint == Endpoint::Owner {
            return Ok(Self::Owner(OwnerRequest { key }));
        }
        let holder = fields.holder.ok_or_else(|| missing("holder"))?;
        check_name("holder", &holder)?;
        match endpoint {
            Endpoint::Acquire => {
                let ttl_ms = fields.ttl_ms.ok_or_else(|| missing("ttl_ms"))?;
                check_ttl(ttl_ms)?;
                Ok(Self::Acquire(AcquireRequest {
                    key,
                    holder,
                    ttl_ms,
                }))
            }
            Endpoint::Renew => {
                let revision = fields.revision.ok_or_else(|| missing("revision"))?;
                if let Some(ttl) = fields.ttl_ms {
                    check_ttl(ttl)?;
                }
                Ok(Self::Renew(RenewRequest {
                    key,
                    holder,
                    revision,
                    ttl_ms: fields.ttl_ms,
                }))
            }
            Endpoint::Release => {
                let revision = fields.revision.ok_or_else(|| missing("revision"))?;
                Ok(Self::Release(ReleaseRequest {
                    key,
                    holder,
                    revision,
                }))
            }
            Endpoint::Owner | Endpoint::Forward => unreachable!("decoded above"),
        }
    }
}

/// The request fields the four lease calls share. Each field is typed, so a wrong
/// type is `invalid` even where the call ignores the field; unknown fields are not.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SharedFields {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    holder: Option<String>,
    #[serde(default)]
    revision: Option<u64>,
    #[serde(default)]
    ttl_ms: Option<u64>,
}

fn decode_forward(body: &[u8]) -> Result<Request, ErrorReply> {
    let r: ForwardRequestWire = decode_json(Endpoint::Forward, body)?;
    check_name("key", &r.key)?;
    if !(MIN_FORWARD_TIMEOUT_MS..=MAX_FORWARD_TIMEOUT_MS).contains(&r.timeout_ms) {
        return Err(invalid(format!(
            "field `timeout_ms` must be from {MIN_FORWARD_TIMEOUT_MS} to \
             {MAX_FORWARD_TIMEOUT_MS}, got {}",
            r.timeout_ms
        )));
    }
    let payload = base64::engine::general_purpose::STANDARD
        .decode(r.payload.as_bytes())
        .map_err(|e| invalid(format!("field `payload` is not base64: {e}")))?;
    Ok(Request::Forward(ForwardRequest {
        key: r.key,
        payload,
        timeout_ms: r.timeout_ms,
    }))
}

fn decode_json<T: serde::de::DeserializeOwned>(
    endpoint: Endpoint,
    body: &[u8],
) -> Result<T, ErrorReply> {
    decode_json_named(endpoint.name(), body)
}

impl Request {
    /// The JSON body a client sends for this request (a forward's payload as base64).
    pub fn to_json(&self) -> Vec<u8> {
        let encoded = match self {
            Self::Acquire(r) => serde_json::to_vec(r),
            Self::Renew(r) => serde_json::to_vec(r),
            Self::Release(r) => serde_json::to_vec(r),
            Self::Owner(r) => serde_json::to_vec(r),
            Self::Forward(r) => serde_json::to_vec(&ForwardRequestWire {
                key: r.key.clone(),
                payload: base64::engine::general_purpose::STANDARD.encode(&r.payload),
                timeout_ms: r.timeout_ms,
            }),
        };
        encoded.expect("request types always serialise")
    }
}

/// Reads a JSON object body of request `name`; every failure is `invalid`, naming
/// the field.
pub(super) fn decode_json_named<T: serde::de::DeserializeOwned>(
    name: &str,
    body: &[u8],
) -> Result<T, ErrorReply> {
    // A valid object reads as it does below, without tracking each field's path:
    // the path only names what failed, so any failure is read again below.
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
        && let Ok(value) = serde_json::from_slice(body)
    {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    match parsed {
        Ok(value) => {
            de.end()
                .map_err(|e| invalid(format!("invalid {name} request: body is not JSON: {e}")))?;
            // serde reads a struct from a JSON array too (`["k","h"]` would be key
            // and holder): only an object names its fields.
            if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
                return Err(invalid(format!(
                    "invalid {name} request: the body must be a JSON object"
                )));
            }
            Ok(value)
        }
        Err(err) => {
            let path = err.path().to_string();
            let inner = err.into_inner();
            let what = if inner.is_syntax() || inner.is_eof() {
                format!("body is not JSON: {inner}")
            } else if path == "." {
                format!("{inner}")
            } else {
                format!("field `{path}`: {inner}")
            };
            Err(invalid(format!("invalid {name} request: {what}")))
        }
    }
}
