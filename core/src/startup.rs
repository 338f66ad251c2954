//! Startup: ensure the `leases` bucket with per-message TTL, or settle on
//! `unsupported` mode, judged from the server version and the stream config the
//! server returns, never from an error alone.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::io::{EffectId, Mode, NatsRequest, RequestOutcome, Transmit, TransmitKind};
use crate::js::{self, ERR_STREAM_NAME_IN_USE, ERR_STREAM_NOT_FOUND, JsFailure};
use crate::subjects::{
    LEASE_SUBJECTS, REPUBLISH_DEST, STREAM, STREAM_SUBJECTS, TENANT_LEASE_SUBJECTS,
    TENANT_REPUBLISH_DEST,
};
use crate::tenant::Tenancy;
use crate::wire::ErrorKind;

/// The first nats-server version with per-message TTL.
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 11);
/// The first nats-server version with ADR-50 atomic batches (`allow_atomic`).
pub const ATOMIC_SERVER_VERSION: (u64, u64) = (2, 12);
/// `subject_delete_marker_ttl` of the bucket: how long an expiry marker stays (1 s, in ns).
pub const MARKER_TTL_NS: u64 = 1_000_000_000;
/// How long startup waits before asking JetStream again after it was unavailable.
pub const STARTUP_RETRY: Duration = Duration::from_secs(1);
/// How long startup waits after an unexpected JetStream answer.
pub const STARTUP_RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);
/// How often a running service asks the stream's replicas again, to turn read
/// confirmation on or off when an operator changes them.
pub const REPLICAS_RECHECK: Duration = Duration::from_secs(10);
/// How many times startup asks again after a create raced another instance's.
const MAX_CREATE_RACES: u32 = 3;

/// What the operator chose for the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketOptions {
    /// Stream replicas; `None` creates with 1 and leaves an existing stream's alone.
    pub replicas: Option<usize>,
    /// One namespace, or one per tenant account: the republish follows it. A
    /// stream has one republish, so a bucket serves one layout at a time.
    pub tenancy: Tenancy,
}

/// The stream config the bucket is created with (contract.md, "Server and bucket").
pub fn stream_config(replicas: usize) -> Value {
    json!({
        "name": STREAM,
        "subjects": [STREAM_SUBJECTS],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": 0,
        "max_msgs_per_subject": 1,
        "max_msg_size": -1,
        "storage": "file",
        "discard": "new",
        "num_replicas": replicas,
        "duplicate_window": 120_000_000_000u64,
        "allow_rollup_hdrs": true,
        "deny_delete": true,
        "deny_purge": false,
        "allow_direct": false,
        "mirror_direct": false,
        "allow_msg_ttl": true,
        "subject_delete_marker_ttl": MARKER_TTL_NS,
        "republish": republish(),
    })
}

/// [`stream_config`], with `allow_atomic: true` when the server takes atomic
/// batches (2.12+): the write coalescer sends its batches only then.
pub fn stream_config_for(replicas: usize, atomic: bool) -> Value {
    let mut config = stream_config(replicas);
    if atomic {
        config["allow_atomic"] = json!(true);
    }
    config
}

/// RePublish of the lease keys only: read confirmations and their markers are
/// stream messages too, and must never become change events.
fn republish() -> Value {
    json!({ "src": LEASE_SUBJECTS, "dest": REPUBLISH_DEST })
}

/// The republish of a layout: a tenant's key `$KV.leases.<account>.<key>` goes
/// out on `dagnats.lease.changed.<account>.<key>`, which the tenant imports as
/// `dagnats.lease.changed.<key>` (`account_token_position` keeps it to its own).
pub fn republish_for(tenancy: Tenancy) -> Value {
    match tenancy {
        Tenancy::Single => republish(),
        Tenancy::Accounts => json!({
            "src": TENANT_LEASE_SUBJECTS,
            "dest": TENANT_REPUBLISH_DEST,
        }),
    }
}

/// The fields startup makes right on an existing stream, and their wanted values.
fn managed_fields() -> Vec<(&'static str, Value)> {
    vec![
        ("max_msgs_per_subject", json!(1)),
        ("allow_rollup_hdrs", json!(true)),
        ("allow_direct", json!(false)),
        ("allow_msg_ttl", json!(true)),
        ("subject_delete_marker_ttl", json!(MARKER_TTL_NS)),
        // Was `$KV.leases.>` before read confirmations: an older bucket migrates.
        ("republish", republish()),
    ]
}

/// `$JS.API.STREAM.INFO.KV_leases`: asked again while serving, for the replicas.
pub fn stream_info_request(timeout: Duration) -> NatsRequest {
    js::api_request(format!("$JS.API.STREAM.INFO.{STREAM}"), &json!({}), timeout)
}

/// The stream's replicas from a reply to [`stream_info_request`]; `None` when the
/// reply does not tell (an error, or JetStream unavailable): keep what was known.
pub fn replicas_from_reply(outcome: &RequestOutcome) -> Option<usize> {
    match js::parse_api_reply(outcome) {
        Ok(Ok(info)) => replicas_in(&info),
        _ => None,
    }
}

fn replicas_in(info: &Value) -> Option<usize> {
    let n = info.get("config")?.get("num_replicas")?.as_u64()?;
    usize::try_from(n).ok().map(|n| n.max(1))
}

/// Parses `2.14.0`, `v2.11.0-RC.1` and the like into (major, minor).
pub fn parse_version(version: &str) -> Option<(u64, u64)> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// What startup reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupEvent {
    /// Worth a log line: a difference found in an existing stream's config, or a retry.
    Log(String),
    /// Startup is over: serve in this mode.
    Done(Mode),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Info,
    Create,
    Update,
    Wait(Instant),
    Done,
}

/// Ensures the bucket. Drain [`Startup::poll_transmit`] and [`Startup::poll_event`]
/// after every input.
#[derive(Debug)]
pub struct Startup {
    options: BucketOptions,
    timeout: Duration,
    step: Step,
    /// The request waited on, and when it is given up for `TimedOut`.
    waiting: Option<(EffectId, Instant)>,
    /// The instant of the input being handled: requests sent now are due by it
    /// plus `timeout`.
    now: Instant,
    next_id: u64,
    races: u32,
    replicas: usize,
    mode: Mode,
    /// Whether the server version takes atomic batches: `allow_atomic` is set.
    atomic_wanted: bool,
    /// Whether the stream's config, as the server returned it, allows them.
    atomic: bool,
    transmits: VecDeque<Transmit>,
    events: VecDeque<StartupEvent>,
}

impl Startup {
    /// Starts at `now` from the version the server sent in INFO. Each request is
    /// given `timeout`: unanswered by then, it is `TimedOut` in
    /// [`Startup::handle_timeout`].
    pub fn new(
        options: BucketOptions,
        server_version: &str,
        timeout: Duration,
        now: Instant,
    ) -> Self {
        let mut s = Self {
            options,
            timeout,
            step: Step::Done,
            waiting: None,
            now,
            next_id: 0,
            races: 0,
            replicas: 1,
            mode: Mode::Starting,
            atomic_wanted: parse_version(server_version)
                .is_some_and(|v| v >= ATOMIC_SERVER_VERSION),
            atomic: false,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        };
        match parse_version(server_version) {
            Some(v) if v >= MIN_SERVER_VERSION => s.ask_info(),
            _ => {
                s.log(format!(
                    "nats-server {server_version} is older than {}.{}: no per-message TTL, so no \
                     leases bucket; every lease call replies `unsupported`",
                    MIN_SERVER_VERSION.0, MIN_SERVER_VERSION.1
                ));
                s.finish(Mode::Unsupported);
            }
        }
        s
    }

    /// The stream's replicas as the server returned them (1 until known): reads
    /// are confirmed when there are more than one.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Whether the stream takes ADR-50 atomic batches: the server is 2.12+ and the
    /// config it returned says `allow_atomic: true`.
    pub fn atomic(&self) -> bool {
        self.atomic
    }

    /// The mode calls are served in now: [`Mode::Starting`] (every call replies
    /// `unavailable`) until startup is done, then the mode it settled on. A service
    /// answers from the start, so that callers get `unavailable` and retry instead
    /// of "no responders" while the bucket is ensured.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The next request to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next log line, or the end with the mode to serve in.
    pub fn poll_event(&mut self) -> Option<StartupEvent> {
        self.events.pop_front()
    }

    /// Whether startup is over and its end was polled.
    pub fn is_done(&self) -> bool {
        self.step == Step::Done && self.transmits.is_empty() && self.events.is_empty()
    }

    /// When to call [`Startup::handle_timeout`]: the deadline of the request waited
    /// on, or the end of a wait before retrying.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.step, self.waiting) {
            (_, Some((_, due))) => Some(due),
            (Step::Wait(at), None) => Some(at),
            _ => None,
        }
    }

    /// A request unanswered by its deadline times out; a wait that is over retries.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        if let Some((id, due)) = self.waiting
            && now >= due
        {
            return self.handle_outcome(now, id, RequestOutcome::TimedOut);
        }
        if let Step::Wait(at) = self.step
            && now >= at
        {
            self.ask_info();
        }
    }

    /// Feeds back the outcome of a request.
    pub fn handle_outcome(&mut self, now: Instant, id: EffectId, outcome: RequestOutcome) {
        if self.waiting.map(|(w, _)| w) != Some(id) {
            return;
        }
        self.now = now;
        self.waiting = None;
        let reply = match js::parse_api_reply(&outcome) {
            Ok(reply) => reply,
            Err(failure) => return self.retry_later(now, failure),
        };
        match (&self.step, reply) {
            (Step::Info, Err(e)) if e.err_code == ERR_STREAM_NOT_FOUND => self.create(),
            (Step::Create, Err(e)) if e.err_code == ERR_STREAM_NAME_IN_USE => {
                self.races += 1;
                if self.races > MAX_CREATE_RACES {
                    self.fail_internal(
                        now,
                        format!("creating {STREAM} keeps failing: {}", e.description),
                    );
                } else {
                    self.ask_info();
                }
            }
            (_, Err(e)) => {
                let failure = js::api_failure(&e);
                if failure.kind == ErrorKind::Unavailable {
                    self.retry_later(now, failure);
                } else {
                    self.fail_internal(now, failure.detail);
                }
            }
            (Step::Info, Ok(info)) => self.check_existing(now, info),
            (Step::Create | Step::Update, Ok(info)) => self.check_final(info),
            (Step::Wait(_) | Step::Done, Ok(_)) => {}
        }
    }

    fn id(&mut self) -> EffectId {
        self.next_id += 1;
        EffectId(self.next_id)
    }

    fn send(&mut self, step: Step, subject: String, body: Value) {
        let id = self.id();
        self.step = step;
        self.waiting = Some((id, self.now + self.timeout));
        let request = js::api_request(subject, &body, self.timeout);
        self.transmits
            .push_back(Transmit::new(id, TransmitKind::Api, request));
    }

    fn ask_info(&mut self) {
        let id = self.id();
        self.step = Step::Info;
        self.waiting = Some((id, self.now + self.timeout));
        let request = stream_info_request(self.timeout);
        self.transmits
            .push_back(Transmit::new(id, TransmitKind::Api, request));
    }

    fn create(&mut self) {
        let mut config = stream_config_for(self.options.replicas.unwrap_or(1), self.atomic_wanted);
        config["republish"] = republish_for(self.options.tenancy);
        self.send(
            Step::Create,
            format!("$JS.API.STREAM.CREATE.{STREAM}"),
            config,
        );
    }

    fn check_existing(&mut self, now: Instant, info: Value) {
        let Some(config) = info.get("config").and_then(Value::as_object) else {
            return self.fail_internal(now, "stream info without a config".to_string());
        };
        let mut wanted = config.clone();
        let mut differs = false;
        let mut fields = managed_fields();
        for (field, value) in &mut fields {
            if *field == "republish" {
                *value = republish_for(self.options.tenancy);
            }
        }
        if self.atomic_wanted {
            fields.push(("allow_atomic", json!(true)));
        }
        for (field, value) in fields {
            if config.get(field) != Some(&value) {
                self.log(format!(
                    "{STREAM}: {field} is {}, setting it to {value}",
                    config
                        .get(field)
                        .map_or("unset".to_string(), Value::to_string)
                ));
                wanted.insert(field.to_string(), value);
                differs = true;
            }
        }
        if let Some(r) = self.options.replicas {
            let have = config.get("num_replicas").and_then(Value::as_u64);
            if have != Some(r as u64) {
                self.log(format!(
                    "{STREAM}: num_replicas is {have:?}, setting it to {r}"
                ));
                wanted.insert("num_replicas".to_string(), json!(r));
                differs = true;
            }
        }
        for (field, value) in [
            ("subjects", json!([STREAM_SUBJECTS])),
            ("storage", json!("file")),
        ] {
            if config.get(field) != Some(&value) {
                self.log(format!(
                    "{STREAM}: {field} is {}, expected {value}; left as it is",
                    config
                        .get(field)
                        .map_or("unset".to_string(), Value::to_string)
                ));
            }
        }
        if differs {
            self.send(
                Step::Update,
                format!("$JS.API.STREAM.UPDATE.{STREAM}"),
                Value::Object(wanted),
            );
        } else {
            self.check_final(info);
        }
    }

    /// The server's own word on the config decides: no `allow_msg_ttl: true`, no leases.
    fn check_final(&mut self, info: Value) {
        self.replicas = replicas_in(&info).unwrap_or(1);
        self.atomic = self.atomic_wanted
            && info
                .get("config")
                .and_then(|c| c.get("allow_atomic"))
                .and_then(Value::as_bool)
                == Some(true);
        let ttl = info
            .get("config")
            .and_then(|c| c.get("allow_msg_ttl"))
            .and_then(Value::as_bool)
            == Some(true);
        if ttl {
            self.finish(Mode::Ready);
        } else {
            self.log(format!(
                "the server accepted {STREAM} but its config does not say allow_msg_ttl: true, so \
                 leases would never expire; every lease call replies `unsupported`"
            ));
            self.finish(Mode::Unsupported);
        }
    }

    fn retry_later(&mut self, now: Instant, failure: JsFailure) {
        self.log(format!(
            "JetStream is not ready ({}); asking again in {:?}",
            failure.detail, STARTUP_RETRY
        ));
        self.step = Step::Wait(now + STARTUP_RETRY);
    }

    /// An unexpected answer: say so and ask again later; calls meanwhile get `unavailable`.
    fn fail_internal(&mut self, now: Instant, detail: String) {
        self.log(format!(
            "cannot ensure the leases bucket: {detail}; asking again in {STARTUP_RETRY_AFTER_ERROR:?}"
        ));
        self.step = Step::Wait(now + STARTUP_RETRY_AFTER_ERROR);
    }

    fn log(&mut self, line: String) {
        self.events.push_back(StartupEvent::Log(line));
    }

    fn finish(&mut self, mode: Mode) {
        self.step = Step::Done;
        self.mode = mode;
        self.events.push_back(StartupEvent::Done(mode));
    }
}
