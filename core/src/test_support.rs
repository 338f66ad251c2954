//! Fixtures shared by the core's tests and the integration suite (`tests/`). Not
//! public API (`__test` feature).

use crate::io::TransmitId;
use crate::wire::Endpoint;

/// The invalid bodies every endpoint must reject.
pub fn invalid_bodies(endpoint: Endpoint) -> Vec<String> {
    let long = "k".repeat(129);
    let mut v = vec![
        "".to_string(),
        "not json".to_string(),
        "[]".to_string(),
        "{}".to_string(),
        r#"{"key":"a.b","holder":"h","ttl_ms":1000,"revision":1,"payload":"","timeout_ms":100}"#
            .to_string(),
        format!(
            r#"{{"key":"{long}","holder":"h","ttl_ms":1000,"revision":1,"payload":"","timeout_ms":100}}"#
        ),
        r#"{"key":"","holder":"h","ttl_ms":1000,"revision":1,"payload":"","timeout_ms":100}"#
            .to_string(),
        r#"{"key":"k*","holder":"h","ttl_ms":1000,"revision":1,"payload":"","timeout_ms":100}"#
            .to_string(),
    ];
    let extra: &[&str] = match endpoint {
        Endpoint::Acquire => &[
            r#"{"key":"k","holder":"h","ttl_ms":1500}"#,
            r#"{"key":"k","holder":"h","ttl_ms":999}"#,
            r#"{"key":"k","holder":"h","ttl_ms":601000}"#,
            r#"{"key":"k","holder":"h","ttl_ms":"1000"}"#,
            r#"{"key":"k","holder":"h","ttl_ms":1000.0}"#,
            r#"{"key":"k","holder":"h","ttl_ms":-1000}"#,
            r#"{"key":"k","holder":"h"}"#,
            r#"{"key":"k","holder":"h>","ttl_ms":1000}"#,
            r#"{"key":"k","holder":"h","ttl_ms":1000,"extra":1}"#,
            r#"{"key":"k","holder":"h","ttl_ms":1000} trailing"#,
            r#"{"key":"k","key":"k","holder":"h","ttl_ms":1000}"#,
        ],
        Endpoint::Renew => &[
            r#"{"key":"k","holder":"h","ttl_ms":1000}"#,
            r#"{"key":"k","holder":"h","revision":1,"ttl_ms":2500}"#,
            r#"{"key":"k","holder":"h","revision":"1"}"#,
            r#"{"key":"k","holder":"h","revision":-1}"#,
            r#"{"key":"k","holder":"","revision":1}"#,
            r#"{"key":"k","holder":"h","revision":1,"fence":1}"#,
        ],
        Endpoint::Release => &[
            r#"{"key":"k","holder":"h"}"#,
            r#"{"key":"k","holder":"h","revision":1,"ttl":1000}"#,
            r#"{"key":"k","holder":"h","revison":1}"#,
            r#"{"key":"k","holder":"h h","revision":1}"#,
            r#"{"key":"k","revision":1}"#,
        ],
        Endpoint::Owner => &[
            r#"{"key":"k","holdr":"h"}"#,
            r#"{"key":"k","revision":"1"}"#,
            r#"{"key":7}"#,
            r#"{"key":null}"#,
        ],
        Endpoint::Forward => &[
            r#"{"key":"k","payload":"aGk=","timeout_ms":99}"#,
            r#"{"key":"k","payload":"aGk=","timeout_ms":30001}"#,
            r#"{"key":"k","payload":"not base64!","timeout_ms":1000}"#,
            r#"{"key":"k","payload":"aGk=","timeout_ms":1000,"holder":"h"}"#,
            r#"{"key":"k","timeout_ms":1000}"#,
            r#"{"key":"k","payload":"aGk="}"#,
        ],
    };
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// A call to the lease service a holder or campaign sent, read back from its
/// transmit, for tests that check the endpoint and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderRequest {
    /// Feed the outcome back with this id.
    pub id: TransmitId,
    /// The endpoint called.
    pub endpoint: Endpoint,
    /// The JSON body.
    pub body: Vec<u8>,
    /// How long the caller waits for the answer.
    pub timeout: std::time::Duration,
}

impl From<crate::io::Transmit> for HolderRequest {
    fn from(t: crate::io::Transmit) -> Self {
        let crate::io::TransmitKind::Lease(endpoint) = t.kind else {
            panic!("not a call to the lease service: {t:?}");
        };
        Self {
            id: t.id,
            endpoint,
            body: t.request.payload,
            timeout: t.request.timeout,
        }
    }
}
