//! The NATS micro service protocol (ADR-32), answered by the service itself.
//!
//! The service registers as `dagnats-api` so that `nats micro ls`, `$SRV.PING`,
//! `$SRV.INFO` and `$SRV.STATS` find it. async-nats' service API answers those
//! verbs inside a task of its own, replying to whatever subject the request named;
//! a reply steered at the bucket or the JetStream API would be published with the
//! service's rights. So the service answers the verbs in its own loop, behind the
//! same [`ReplyScope`](crate::reply_scope::ReplyScope) as its endpoints, and this
//! module is the protocol: which subjects carry a verb, and what each answer holds.

use std::time::Duration;

use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::subjects::{QUEUE_GROUP, SERVICE_NAME};
use crate::wire::{Endpoint, ErrorReply, RENEW_MANY, Response, renew_many_subject};

/// The description every instance announces in `$SRV.INFO`.
pub const DESCRIPTION: &str = "dagnats leases: leader election and shard ownership over NATS";

/// The three verbs of the micro protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MicroVerb {
    /// `$SRV.PING[.name[.id]]`: who is there.
    Ping,
    /// `$SRV.INFO[.name[.id]]`: the endpoints.
    Info,
    /// `$SRV.STATS[.name[.id]]`: requests, errors and processing time per endpoint.
    Stats,
}

impl MicroVerb {
    /// Every verb.
    pub const ALL: [Self; 3] = [Self::Ping, Self::Info, Self::Stats];

    fn token(self) -> &'static str {
        match self {
            Self::Ping => "PING",
            Self::Info => "INFO",
            Self::Stats => "STATS",
        }
    }
}

#[derive(Debug, Clone, Default)]
struct EndpointStats {
    requests: u64,
    errors: u64,
    processing: Duration,
    last_error: String,
}

/// One instance of the micro service: its identity and its endpoints' counts.
#[derive(Debug, Clone)]
pub struct MicroService {
    id: String,
    version: String,
    started: OffsetDateTime,
    stats: [EndpointStats; 5],
    /// The `renew_many` endpoint's counts, when the service serves it.
    renew_many: Option<EndpointStats>,
}

impl MicroService {
    /// An instance with a process-unique `id` (a NUID), the service's semver
    /// `version`, started at wall-clock time `started`.
    pub fn new(id: impl Into<String>, version: impl Into<String>, started: OffsetDateTime) -> Self {
        Self {
            id: id.into(),
            version: version.into(),
            started,
            stats: Default::default(),
            renew_many: None,
        }
    }

    /// This instance serves `renew_many` too: `$SRV.INFO` and `$SRV.STATS` list it
    /// after the five, so a holder library can tell it may batch its renewals.
    pub fn with_renew_many(mut self) -> Self {
        self.renew_many = Some(EndpointStats::default());
        self
    }

    /// A `renew_many` request was answered after `took`: with its results (`None`),
    /// or with one error for the whole request.
    pub fn handle_many_answered(&mut self, error: Option<&ErrorReply>, took: Duration) {
        let Some(stats) = &mut self.renew_many else {
            return;
        };
        stats.requests += 1;
        stats.processing += took;
        if let Some(e) = error {
            stats.errors += 1;
            stats.last_error = format!("{}: {}", e.kind.as_str(), e.error);
        }
    }

    /// Requests answered so far at `renew_many`, when served.
    pub fn renew_many_requests(&self) -> Option<u64> {
        self.renew_many.as_ref().map(|s| s.requests)
    }

    /// This instance's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The nine subjects to subscribe to (no queue group: every instance answers
    /// a verb).
    pub fn subjects(&self) -> Vec<String> {
        MicroVerb::ALL
            .into_iter()
            .flat_map(|v| {
                let base = format!("$SRV.{}", v.token());
                [
                    base.clone(),
                    format!("{base}.{SERVICE_NAME}"),
                    format!("{base}.{SERVICE_NAME}.{}", self.id),
                ]
            })
            .collect()
    }

    /// The verb a message on `subject` asks for: `None` for any other subject
    /// (another service's name or another instance's id).
    pub fn verb_of(&self, subject: &str) -> Option<MicroVerb> {
        let mut tokens = subject.split('.');
        if tokens.next() != Some("$SRV") {
            return None;
        }
        let verb = tokens.next()?;
        let verb = MicroVerb::ALL.into_iter().find(|v| v.token() == verb)?;
        match (tokens.next(), tokens.next(), tokens.next()) {
            (None, _, _) => Some(verb),
            (Some(SERVICE_NAME), None, _) => Some(verb),
            (Some(SERVICE_NAME), Some(id), None) if id == self.id => Some(verb),
            _ => None,
        }
    }

    /// A request to `endpoint` was answered with `response` after `took`.
    pub fn handle_answered(&mut self, endpoint: Endpoint, response: &Response, took: Duration) {
        let stats = &mut self.stats[index(endpoint)];
        stats.requests += 1;
        stats.processing += took;
        if let Response::Error(e) = response {
            stats.errors += 1;
            stats.last_error = format!("{}: {}", e.kind.as_str(), e.error);
        }
    }

    /// Requests answered so far at `endpoint`.
    pub fn requests(&self, endpoint: Endpoint) -> u64 {
        self.stats[index(endpoint)].requests
    }

    /// The answer to `verb`, as ADR-32 shapes it.
    pub fn reply(&self, verb: MicroVerb) -> Vec<u8> {
        let value = match verb {
            MicroVerb::Ping => json!({
                "type": "io.nats.micro.v1.ping_response",
                "name": SERVICE_NAME,
                "id": self.id,
                "version": self.version,
                "metadata": {},
            }),
            MicroVerb::Info => json!({
                "type": "io.nats.micro.v1.info_response",
                "name": SERVICE_NAME,
                "id": self.id,
                "description": DESCRIPTION,
                "version": self.version,
                "metadata": {},
                "endpoints": Endpoint::ALL
                    .map(|e| (e.name(), e.subject()))
                    .into_iter()
                    .chain(self.renew_many.as_ref().map(|_| (RENEW_MANY, renew_many_subject())))
                    .map(|(name, subject)| json!({
                        "name": name,
                        "subject": subject,
                        "queue_group": QUEUE_GROUP,
                        "metadata": {},
                    }))
                    .collect::<Vec<_>>(),
            }),
            MicroVerb::Stats => json!({
                "type": "io.nats.micro.v1.stats_response",
                "name": SERVICE_NAME,
                "id": self.id,
                "version": self.version,
                "started": self.started.format(&Rfc3339).unwrap_or_default(),
                "metadata": {},
                "endpoints": Endpoint::ALL
                    .map(|e| stats_json(e.name(), e.subject(), &self.stats[index(e)]))
                    .into_iter()
                    .chain(self.renew_many.as_ref().map(|s| {
                        stats_json(RENEW_MANY, renew_many_subject(), s)
                    }))
                    .collect::<Vec<_>>(),
            }),
        };
        value.to_string().into_bytes()
    }
}

fn stats_json(name: &str, subject: String, s: &EndpointStats) -> Value {
    let average = match u32::try_from(s.requests) {
        Ok(n) if n > 0 => s.processing / n,
        _ => Duration::ZERO,
    };
    json!({
        "name": name,
        "subject": subject,
        "queue_group": QUEUE_GROUP,
        "num_requests": s.requests,
        "num_errors": s.errors,
        "processing_time": nanos(s.processing),
        "average_processing_time": nanos(average),
        "last_error": s.last_error,
    })
}

/// Where a holder library asks every instance of this service for its endpoints:
/// `$SRV.INFO.dagnats-api` (the first answer is the one read).
pub fn info_subject() -> String {
    format!("$SRV.{}.{SERVICE_NAME}", MicroVerb::Info.token())
}

/// Whether a `$SRV.INFO` answer is this service's and lists `renew_many` among its
/// endpoints: what a holder library reads before it batches renewals. Anything
/// else (another service, a body that does not parse, an older service) is `false`.
pub fn advertises_renew_many(info: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<Value>(info) else {
        return false;
    };
    value.get("name").and_then(Value::as_str) == Some(SERVICE_NAME)
        && value
            .get("endpoints")
            .and_then(Value::as_array)
            .is_some_and(|endpoints| {
                endpoints
                    .iter()
                    .any(|e| e.get("name").and_then(Value::as_str) == Some(RENEW_MANY))
            })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn index(endpoint: Endpoint) -> usize {
    Endpoint::ALL
        .iter()
        .position(|e| *e == endpoint)
        .expect("every endpoint is in ALL")
}
