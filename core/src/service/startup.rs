//! Startup: ensure the `leases` bucket with per-message TTL, or settle on
//! `unsupported` mode, judged from the server version and the stream config the
//! server returns, never from an error alone. The bucket's config and how the
//! server's answers are read live in [`super::bucket`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::bucket::{
    ATOMIC_SERVER_VERSION, BucketOptions, MIN_SERVER_VERSION, configured_replicas, managed_fields,
    parse_version, shard_republish, shard_stream_config, stream_info_request,
};
use crate::io::{Mode, RequestOutcome, Transmit, TransmitId, TransmitKind};
use crate::js::{
    self, ERR_STREAM_NAME_IN_USE, ERR_STREAM_NOT_FOUND, ERR_STREAM_SUBJECT_OVERLAP, JsFailure,
};
use crate::outbox::Ids;
use crate::shard::{LAYOUT_GUARD_SUBJECT, META_SHARDS, ShardMap};
use crate::subjects::STREAM;
use crate::wire::ErrorKind;

/// How long startup waits before asking JetStream again after it was unavailable.
pub const STARTUP_RETRY: Duration = Duration::from_secs(1);
/// How long startup waits after an unexpected JetStream answer.
pub const STARTUP_RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);
/// How long startup keeps asking while the JetStream API has no responders (no
/// server of the account runs JetStream) before it gives up: long enough for a
/// server of a cluster that is starting, too short to hang a deployment.
pub const JETSTREAM_OFF_GIVE_UP: Duration = Duration::from_secs(10);
/// How long startup keeps asking while the cluster cannot place the replicas
/// asked (too few servers up) before it gives up.
pub const REPLICAS_GIVE_UP: Duration = Duration::from_secs(30);
/// JetStream is not enabled for the account (`JSNotEnabledForAccountErr`).
pub const ERR_JETSTREAM_NOT_ENABLED_FOR_ACCOUNT: u64 = 10039;
/// JetStream is not enabled (`JSNotEnabledErr`).
pub const ERR_JETSTREAM_NOT_ENABLED: u64 = 10076;
/// Replicas above one on a server without a cluster (`JSStreamReplicasNotSupportedErr`).
pub const ERR_REPLICAS_NOT_SUPPORTED: u64 = 10074;
/// No servers to place the stream's replicas on (`JSClusterNoPeersErrF`).
pub const ERR_NO_SUITABLE_PEERS: u64 = 10005;
/// The servers lack the resources for the stream (`JSInsufficientResourcesErr`).
pub const ERR_INSUFFICIENT_RESOURCES: u64 = 10023;
/// How many times startup asks again after a create raced another instance's.
const MAX_CREATE_RACES: u32 = 3;

/// What startup reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupEvent {
    /// Worth a log line: a difference found in an existing stream's config, or a retry.
    Log(String),
    /// Startup is over: serve in this mode.
    Serve(Mode),
    /// The bucket exists with another layout (another `--shards`): serving would
    /// move keys to other streams and restart their fences, so the service must not
    /// start. The sentence says which count the bucket has.
    StartRefused(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Info,
    /// Asking whether the other layout's first stream exists: before creating
    /// shard 0, and again once shard 0 is there.
    Layout,
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
    /// The request waited on (its owner times it out and says so with
    /// [`RequestOutcome::TimedOut`]).
    waiting: Option<TransmitId>,
    races: u32,
    replicas: usize,
    mode: Mode,
    /// Whether the server version takes atomic batches: `allow_atomic` is set.
    atomic_wanted: bool,
    /// Whether the stream's config, as the server returned it, allows them.
    atomic: bool,
    transmits: VecDeque<Transmit>,
    events: VecDeque<StartupEvent>,
    /// The shard being ensured, one after another from 0.
    shard: u32,
    /// Whether the other layout was found absent in this start.
    layout_checked: bool,
    /// Whether shard 0 is ensured: a layout question answered "absent" then goes
    /// on to the next shard instead of creating shard 0.
    first_ensured: bool,
    /// Whether the other layout was found absent after shard 0 was ensured: asked
    /// even when this start created shard 0, because two creates at the same
    /// moment can both pass the server's overlap check (seen on a single 2.15.1).
    layout_confirmed: bool,
    /// Whether every stream so far says `allow_msg_ttl: true`.
    ttl: bool,
    /// Since when the JetStream API has had no responders, every answer since.
    no_jetstream_since: Option<Instant>,
    /// Since when the cluster could not place the replicas, every answer since.
    no_placement_since: Option<Instant>,
    /// Each shard's stream as startup last saw it: its `created` time and last
    /// sequence, the replicas check's first knowledge (fences never repeat).
    seen: Vec<(Option<String>, u64)>,
}

impl Startup {
    /// Starts at `now` from the version the server sent in INFO. Each request is
    /// given `timeout`: unanswered by then, its owner feeds back
    /// [`RequestOutcome::TimedOut`].
    pub fn new(
        options: BucketOptions,
        server_version: &str,
        timeout: Duration,
        _now: Instant,
    ) -> Self {
        let mut s = Self {
            options,
            timeout,
            step: Step::Done,
            waiting: None,
            races: 0,
            replicas: 1,
            mode: Mode::Starting,
            atomic_wanted: parse_version(server_version)
                .is_some_and(|v| v >= ATOMIC_SERVER_VERSION),
            atomic: false,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            shard: 0,
            layout_checked: false,
            first_ensured: false,
            layout_confirmed: false,
            ttl: true,
            no_jetstream_since: None,
            no_placement_since: None,
            seen: Vec::new(),
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

    /// The stream's replicas as the server returned them (1 until known), the
    /// most of any shard's: reads are confirmed when there are more than one.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Each shard's stream as startup saw it ensured, by index: its `created`
    /// time and last sequence (0 when the answer did not say).
    pub fn seen(&self) -> &[(Option<String>, u64)] {
        &self.seen
    }

    /// Whether the streams take ADR-50 atomic batches: the server is 2.12+ and the
    /// config it returned says `allow_atomic: true` for every shard.
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
    /// It goes under an id from its owner's `ids`: feed its outcome back with it.
    pub fn poll_transmit(&mut self, ids: &mut Ids<TransmitId>) -> Option<Transmit> {
        let mut transmit = self.transmits.pop_front()?;
        transmit.id = ids.allocate();
        if let Some(waited) = &mut self.waiting {
            *waited = transmit.id;
        }
        Some(transmit)
    }

    /// The next log line, or the end with the mode to serve in.
    pub fn poll_event(&mut self) -> Option<StartupEvent> {
        self.events.pop_front()
    }

    /// Whether startup is over and its end was polled.
    pub fn is_done(&self) -> bool {
        self.step == Step::Done && self.transmits.is_empty() && self.events.is_empty()
    }

    /// When to call [`Startup::handle_timeout`]: the end of a wait before
    /// retrying. A request waited on has no deadline here: its owner times it out
    /// and feeds back [`RequestOutcome::TimedOut`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.step, self.waiting) {
            (Step::Wait(at), None) => Some(at),
            _ => None,
        }
    }

    /// A wait that is over retries.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Step::Wait(at) = self.step
            && now >= at
        {
            self.ask_info();
        }
    }

    /// Feeds back the outcome of a request.
    pub fn handle_outcome(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        if self.waiting != Some(id) {
            return;
        }
        self.waiting = None;
        // The layout question's silence is its own (a permission): see below.
        if outcome == RequestOutcome::NoResponders && self.step != Step::Layout {
            return self.no_jetstream(now);
        }
        self.no_jetstream_since = None;
        if let Ok(Err(e)) = js::parse_api_reply(&outcome) {
            if let Some(refusal) = self.cannot_serve(&e) {
                return self.refuse(refusal);
            }
            if matches!(
                e.err_code,
                ERR_NO_SUITABLE_PEERS | ERR_INSUFFICIENT_RESOURCES
            ) {
                return self.no_placement(now, &e);
            }
        }
        let reply = match js::parse_api_reply(&outcome) {
            Ok(reply) => reply,
            Err(failure) if self.step == Step::Layout => {
                // Never created blind: a bucket of the other layout would lose its
                // fences. A user not allowed to ask gets no answer: say so.
                let other = self.other_layout_stream();
                self.log(format!(
                    "no answer to $JS.API.STREAM.INFO.{other} ({}): startup must know that no \
                     bucket of another --shards exists before it serves; asking again. If \
                     this repeats, the backend user may lack publish permission on that \
                     subject (docs/security.md)",
                    failure.detail
                ));
                return self.retry_later(now, failure);
            }
            Err(failure) => return self.retry_later(now, failure),
        };
        match (&self.step, reply) {
            (Step::Info, Err(e)) if e.err_code == ERR_STREAM_NOT_FOUND => {
                if self.layout_checked {
                    self.create()
                } else {
                    self.ask_layout()
                }
            }
            (Step::Layout, Err(e)) if e.err_code == ERR_STREAM_NOT_FOUND => {
                self.layout_checked = true;
                if self.first_ensured {
                    self.layout_confirmed = true;
                    self.next_shard();
                } else {
                    self.create();
                }
            }
            (Step::Layout, Ok(info)) => self.refuse_layout(&info),
            (Step::Create | Step::Update, Err(e)) if e.err_code == ERR_STREAM_SUBJECT_OVERLAP => {
                self.refuse_overlap(&e.description)
            }
            (Step::Create, Err(e)) if e.err_code == ERR_STREAM_NAME_IN_USE => {
                self.races += 1;
                if self.races > MAX_CREATE_RACES {
                    let stream = self.stream();
                    self.fail_internal(
                        now,
                        format!("creating {stream} keeps failing: {}", e.description),
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

    fn send(&mut self, step: Step, subject: String, body: Value) {
        let id = TransmitId::UNSENT;
        self.step = step;
        self.waiting = Some(id);
        let request = js::api_request(subject, &body, self.timeout);
        self.transmits
            .push_back(Transmit::new(id, TransmitKind::Api, request));
    }

    /// The stream being ensured now.
    fn stream(&self) -> String {
        self.options.shards.stream(self.shard)
    }

    fn ask_info(&mut self) {
        let id = TransmitId::UNSENT;
        self.step = Step::Info;
        self.waiting = Some(id);
        let request = stream_info_request(&self.stream(), self.timeout);
        self.transmits
            .push_back(Transmit::new(id, TransmitKind::Api, request));
    }

    /// The other layout's first stream: `KV_leases_0` for one shard, `KV_leases`
    /// for several. Found, the bucket was made with another `--shards`.
    fn other_layout_stream(&self) -> String {
        if self.options.shards.is_single() {
            ShardMap::first_sharded_stream()
        } else {
            STREAM.to_string()
        }
    }

    fn ask_layout(&mut self) {
        let id = TransmitId::UNSENT;
        self.step = Step::Layout;
        self.waiting = Some(id);
        let request = stream_info_request(&self.other_layout_stream(), self.timeout);
        self.transmits
            .push_back(Transmit::new(id, TransmitKind::Api, request));
    }

    /// The other layout's first stream exists: say which `--shards` the bucket has,
    /// from `KV_leases_0`'s metadata, or `1` for `KV_leases` (which has none).
    fn refuse_layout(&mut self, info: &Value) {
        let other = self.other_layout_stream();
        let count = self.options.shards.count();
        let (made, start) = if self.options.shards.is_single() {
            let theirs = info
                .get("config")
                .and_then(|c| c.get("metadata"))
                .and_then(|m| m.get(META_SHARDS))
                .and_then(Value::as_str);
            match theirs {
                Some(n) => (
                    format!("--shards {n} ({META_SHARDS} in its metadata)"),
                    format!("--shards {n}"),
                ),
                None => (
                    format!("more than one shard (though it has no {META_SHARDS} in its metadata)"),
                    "the bucket's --shards".to_string(),
                ),
            }
        } else {
            ("--shards 1".to_string(), "--shards 1".to_string())
        };
        self.refuse(format!(
            "stream {other} exists: the leases bucket was made with {made}, and this service \
             was started with --shards {count}; keys would move to other streams and their \
             fences restart. Start it with {start}"
        ));
    }

    /// The server refused shard 0 (or the one stream) because its subjects overlap
    /// another stream's: the other layout was made first, maybe at this very moment.
    fn refuse_overlap(&mut self, description: &str) {
        let stream = self.stream();
        let other = self.other_layout_stream();
        let count = self.options.shards.count();
        self.refuse(format!(
            "the server refused {stream} because its subjects overlap another stream's \
             (JetStream {ERR_STREAM_SUBJECT_OVERLAP}: {description}): the leases bucket was \
             made with another --shards (stream {other}) while this service, started with \
             --shards {count}, was starting, or another stream stores $KV.leases subjects. \
             Start it with the bucket's --shards"
        ));
    }

    fn refuse(&mut self, sentence: String) {
        self.step = Step::Done;
        self.events.push_back(StartupEvent::StartRefused(sentence));
    }

    fn create(&mut self) {
        let mut config = shard_stream_config(
            &self.options.shards,
            self.shard,
            self.options.replicas.unwrap_or(1),
        );
        if self.atomic_wanted {
            config["allow_atomic"] = json!(true);
        }
        config["republish"] =
            shard_republish(&self.options.shards, self.shard, self.options.tenancy);
        let stream = self.stream();
        self.send(
            Step::Create,
            format!("$JS.API.STREAM.CREATE.{stream}"),
            config,
        );
    }

    fn check_existing(&mut self, now: Instant, info: Value) {
        let Some(config) = info.get("config").and_then(Value::as_object) else {
            return self.fail_internal(now, "stream info without a config".to_string());
        };
        let shards = self.options.shards;
        let stream = self.stream();
        if !shards.is_single() {
            let theirs = config
                .get("metadata")
                .and_then(|m| m.get(META_SHARDS))
                .and_then(Value::as_str);
            if theirs != Some(shards.count().to_string().as_str()) {
                let theirs = theirs.map_or_else(
                    || format!("no {META_SHARDS} in its metadata"),
                    |n| format!("{META_SHARDS} {n} in its metadata"),
                );
                return self.refuse(format!(
                    "stream {stream} has {theirs}, and this service was started with --shards \
                     {}; keys would move to other streams and their fences restart. Start it \
                     with the bucket's --shards",
                    shards.count()
                ));
            }
        }
        let mut wanted = config.clone();
        let mut differs = false;
        let mut fields = managed_fields();
        for (field, value) in &mut fields {
            if *field == "republish" {
                *value = shard_republish(&shards, self.shard, self.options.tenancy);
            }
        }
        if self.atomic_wanted {
            fields.push(("allow_atomic", json!(true)));
        }
        for (field, value) in fields {
            if config.get(field) != Some(&value) {
                self.log(format!(
                    "{stream}: {field} is {}, setting it to {value}",
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
                    "{stream}: num_replicas is {have:?}, setting it to {r}"
                ));
                wanted.insert("num_replicas".to_string(), json!(r));
                differs = true;
            }
        }
        // Shard 0 of a bucket made before the guard subject gets it: the server
        // then refuses the update if the one-stream layout exists too.
        if !shards.is_single() && self.shard == 0 {
            let mut subjects: Vec<Value> = config
                .get("subjects")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if !subjects.iter().any(|s| s == LAYOUT_GUARD_SUBJECT) {
                self.log(format!(
                    "{stream}: subjects lack {LAYOUT_GUARD_SUBJECT}, adding it (it keeps the \
                     one-stream layout from being made beside this one)"
                ));
                subjects.push(json!(LAYOUT_GUARD_SUBJECT));
                wanted.insert("subjects".to_string(), Value::Array(subjects));
                differs = true;
            }
        }
        for (field, value) in [
            ("subjects", json!(shards.stream_subject_list(self.shard))),
            ("storage", json!("file")),
        ] {
            if wanted.get(field) != Some(&value) {
                self.log(format!(
                    "{stream}: {field} is {}, expected {value}; left as it is",
                    config
                        .get(field)
                        .map_or("unset".to_string(), Value::to_string)
                ));
            }
        }
        if differs {
            self.send(
                Step::Update,
                format!("$JS.API.STREAM.UPDATE.{stream}"),
                Value::Object(wanted),
            );
        } else {
            self.check_final(info);
        }
    }

    /// The server's own word on the config decides: no `allow_msg_ttl: true`, no leases.
    /// Every shard's stream is judged in turn; the last one ends startup.
    fn check_final(&mut self, info: Value) {
        self.no_placement_since = None;
        let created = info
            .get("created")
            .and_then(Value::as_str)
            .map(str::to_string);
        let last_seq = info
            .get("state")
            .and_then(|s| s.get("last_seq"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let shard = self.shard as usize;
        if self.seen.len() <= shard {
            self.seen.resize(shard + 1, (None, 0));
        }
        self.seen[shard] = (created, last_seq);
        let replicas = configured_replicas(&info).unwrap_or(1);
        let atomic = self.atomic_wanted
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
        if self.shard == 0 {
            self.replicas = replicas;
            self.atomic = atomic;
        } else {
            self.replicas = self.replicas.max(replicas);
            self.atomic &= atomic;
        }
        if !ttl {
            let stream = self.stream();
            self.log(format!(
                "the server accepted {stream} but its config does not say allow_msg_ttl: true, so \
                 leases would never expire; every lease call replies `unsupported`"
            ));
            self.ttl = false;
        }
        if self.shard == 0 {
            self.first_ensured = true;
            if !self.layout_confirmed {
                // Found or created, asked again: a service of the other layout may
                // have made its own meanwhile, at the same moment, or before the
                // guard subject existed. Of two such, the later to ask refuses.
                return self.ask_layout();
            }
        }
        self.next_shard();
    }

    /// Shard `self.shard` is ensured: on to the next one, or the end.
    fn next_shard(&mut self) {
        if self.shard + 1 < self.options.shards.count() {
            self.shard += 1;
            self.races = 0;
            return self.ask_info();
        }
        if self.ttl {
            self.finish(Mode::Ready);
        } else {
            self.finish(Mode::Unsupported);
        }
    }

    /// An API error waiting cannot mend: JetStream is off for the account, or
    /// replicas were asked of a server without a cluster.
    fn cannot_serve(&self, e: &js::ApiError) -> Option<String> {
        let said = format!("JetStream {} ({}): {}", e.err_code, e.code, e.description);
        match e.err_code {
            ERR_JETSTREAM_NOT_ENABLED_FOR_ACCOUNT | ERR_JETSTREAM_NOT_ENABLED => Some(format!(
                "JetStream is not enabled for the NATS account this service connects as \
                 ({said}): the leases bucket is a JetStream stream. Enable JetStream for \
                 the account (`jetstream: enabled` in its accounts block, or JetStream \
                 limits in its JWT)"
            )),
            ERR_REPLICAS_NOT_SUPPORTED => {
                let asked = self.options.replicas.unwrap_or(1);
                Some(format!(
                    "--replicas {asked} asks for {asked} copies of the leases stream, but \
                     nats-server runs JetStream without a cluster ({said}). Start the service \
                     with --replicas 1, or run a JetStream cluster of at least {asked} servers"
                ))
            }
            _ => None,
        }
    }

    /// No responders on the JetStream API: no server of this account runs
    /// JetStream. Asked again for [`JETSTREAM_OFF_GIVE_UP`], then refused.
    fn no_jetstream(&mut self, now: Instant) {
        let since = *self.no_jetstream_since.get_or_insert(now);
        let stream = self.stream();
        if now.saturating_duration_since(since) >= JETSTREAM_OFF_GIVE_UP {
            return self.refuse(format!(
                "no JetStream: $JS.API.STREAM.INFO.{stream} had no responders for \
                 {JETSTREAM_OFF_GIVE_UP:?}, so no server of this account runs JetStream. \
                 Start nats-server with JetStream (-js, or a jetstream block in its config)"
            ));
        }
        if since == now {
            self.log(format!(
                "no responders on $JS.API.STREAM.INFO.{stream}: JetStream looks off on this \
                 server (no -js or jetstream block); asking again every {STARTUP_RETRY:?}, \
                 giving up after {JETSTREAM_OFF_GIVE_UP:?}"
            ));
        }
        self.step = Step::Wait(now + STARTUP_RETRY);
    }

    /// The cluster cannot place the replicas now: asked again for
    /// [`REPLICAS_GIVE_UP`] (servers may be joining), then refused.
    fn no_placement(&mut self, now: Instant, e: &js::ApiError) {
        let since = *self.no_placement_since.get_or_insert(now);
        let asked = self.options.replicas.unwrap_or(1);
        let stream = self.stream();
        let said = format!("JetStream {} ({}): {}", e.err_code, e.code, e.description);
        if now.saturating_duration_since(since) >= REPLICAS_GIVE_UP {
            return self.refuse(format!(
                "the JetStream cluster cannot place {stream} with {asked} replicas ({said}) \
                 for {REPLICAS_GIVE_UP:?}: fewer servers are up than replicas asked. Start \
                 the service with fewer --replicas, or bring up at least {asked} JetStream \
                 servers"
            ));
        }
        self.log(format!(
            "the JetStream cluster cannot place {stream} with {asked} replicas now ({said}); \
             asking again in {STARTUP_RETRY_AFTER_ERROR:?}, giving up after {REPLICAS_GIVE_UP:?}"
        ));
        self.step = Step::Wait(now + STARTUP_RETRY_AFTER_ERROR);
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
        self.events.push_back(StartupEvent::Serve(mode));
    }
}
