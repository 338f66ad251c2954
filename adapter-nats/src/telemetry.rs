//! The metrics the service and the holder library record, through the [`metrics`]
//! facade: nothing is kept or sent until the application installs a recorder (the
//! `serve --metrics-addr` of both binaries installs a Prometheus exporter). A
//! library emits; the application picks the exporter.
//!
//! Every name starts `dagnats_leases_`; labels are lower_snake_case. The machines
//! of the core record nothing: the adapters record from the effects they carry
//! out, the outcomes they feed back and the events the machines report. The holder
//! library's metrics come from the campaign's events alone
//! ([`dagnats_leases_core::holder::campaign::CampaignEvent`]): how an outcome reads, a
//! renew retry, ownership and the time a campaign took are the machine's to say.
//!
//! Service (recorded by [`crate::service`]):
//!
//! | name | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | [`CALLS`] | counter | `endpoint`, `reply` | calls answered |
//! | [`CALL_DURATION`] | histogram | `endpoint` | seconds from request to reply |
//! | [`READ_CONFIRMATIONS`] | counter | | read confirmations sent |
//! | [`READ_CONFIRMATION_RETRIES`] | counter | | confirmations that found the key moved on: read again |
//! | [`JETSTREAM_ERRORS`] | counter | `op`, `kind` | JetStream requests of a call that failed |
//! | [`MODE`] | gauge | `mode` | 1 for the mode the service is in, 0 for the others |
//! | [`READY`] | gauge | | 1 while the service is ready (what `/readyz` answers 200 for) |
//! | [`CONNECTED`] | gauge | | 1 while every NATS connection of the service is up |
//! | [`BUCKET_REFUSED`] | gauge | | 1 once the service refused its bucket (its sequence went back) |
//! | [`STREAM_LAST_SEQ`] | gauge | `stream` | the highest last sequence seen of the stream: no fence handed out on it is above |
//! | [`BUILD_INFO`] | gauge | `version` | always 1: the running version |
//!
//! Holder library (recorded by [`crate::member`]):
//!
//! | name | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | [`LEADER`] | gauge | `key` | 1 while this process owns the key, 0 otherwise |
//! | [`STEP_DOWNS`] | counter | `reason` | step-downs |
//! | [`SLOWPATH`] | counter | `endpoint`, `reason` | renew retries and requests of unknown outcome |
//! | [`RENEW_DURATION`] | histogram | | seconds from a renew's send to its outcome |
//! | [`CAMPAIGN_TO_ELECTED`] | histogram | | seconds from the start of a campaign to `Elected` |

use std::time::Duration;

use dagnats_leases_core::health::{Health, NotReady};
use dagnats_leases_core::holder::StepDownReason;
use dagnats_leases_core::holder::campaign::AnsweredRequest;
use dagnats_leases_core::io::Mode;
use dagnats_leases_core::reply_scope::DropReason;
use dagnats_leases_core::wire::{Endpoint, Response};
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

/// Counter, labels `endpoint` (`acquire`, `renew`, `release`, `owner`, `forward`)
/// and `reply`: `ok`, `not_granted` (an acquire another holder has), or the error
/// kind of the reply (`lost`, `fence_mismatch`, `unavailable`, `invalid`, ...).
pub const CALLS: &str = "dagnats_leases_calls_total";
/// Counter, label `endpoint`: requests answered `unavailable` at once because the
/// service was at its bound of calls running and waiting ([`dagnats_leases_core::service::admit`]).
pub const OVERLOADED: &str = "dagnats_leases_calls_refused_total";
/// Counter, labels `subject` (`api`: one of the five endpoints, `srv`: the micro
/// service's `$SRV` verbs) and `reason` (`missing`, `not_an_inbox`, `malformed`):
/// requests dropped unanswered because their reply subject is not a reply inbox
/// ([`dagnats_leases_core::reply_scope`]). No call runs for them.
pub const REPLIES_DROPPED: &str = "dagnats_leases_replies_refused_total";
/// Counter, label `reason` (`failed`, `dropped`): released keys whose tombstone
/// the service could not purge ([`dagnats_leases_core::service::sweep`]); each stays in the
/// stream, a few bytes, never a wrong answer.
pub const TOMBSTONES_LEFT: &str = "dagnats_leases_tombstones_left_total";
/// Histogram, label `endpoint`: seconds from a call's start to its reply.
pub const CALL_DURATION: &str = "dagnats_leases_call_duration_seconds";
/// Counter: read confirmations sent (on a replicated bucket, every read that
/// decides a reply is confirmed through the stream leader).
pub const READ_CONFIRMATIONS: &str = "dagnats_leases_read_confirmations_total";
/// Counter: read confirmations that found the key written since the read, so the
/// call read it again.
pub const READ_CONFIRMATION_RETRIES: &str = "dagnats_leases_read_confirmation_retries_total";
/// Counter, labels `op` (`read`, `write`, `confirm`) and `kind` (`timed_out`,
/// `no_responders`, `request_failed`, `unavailable`: an API error saying "not
/// now", `internal`: any other API error): a call's JetStream request that failed.
pub const JETSTREAM_ERRORS: &str = "dagnats_leases_jetstream_errors_total";
/// Gauge, label `mode` (`starting`, `serving`, `unsupported`): 1 for the mode the
/// service is in, 0 for the others.
pub const MODE: &str = "dagnats_leases_mode";

/// Gauge: 1 while the service is ready to serve (serving, connected, its bucket
/// reachable at the last look, not refused, not stopping), 0 otherwise; `/readyz`
/// answers 200 exactly then.
pub const READY: &str = "dagnats_leases_ready";
/// Gauge: 1 while every NATS connection of the service is up, 0 while one is
/// lost and the client reconnects.
pub const CONNECTED: &str = "dagnats_leases_connected";
/// Gauge: 1 once the service refused its bucket because the stream's sequence
/// went back (restored or made anew under it); it answers every call
/// `unavailable` until restarted after the restore procedure.
pub const BUCKET_REFUSED: &str = "dagnats_leases_bucket_refused";
/// Gauge, label `stream`: the highest last sequence the service has seen of the
/// stream (asked every replicas re-check). Every fence handed out on it is at
/// most this: a restore starts the stream above it (docs/operations.md).
pub const STREAM_LAST_SEQ: &str = "dagnats_leases_stream_last_seq";
/// Gauge, label `version`: always 1, the version of the running binary.
pub const BUILD_INFO: &str = "dagnats_leases_build_info";

/// Gauge, label `key`: 1 while this process owns the key, 0 otherwise (as
/// client-go's `leader_election_master_status`). A key appears once campaigned for.
pub const LEADER: &str = "dagnats_leases_leader";
/// Counter, label `reason` (`lost`, `deadline_missed`, `stopped`, `failed`,
/// `revoked`): times this process stopped acting as owner of a key.
pub const STEP_DOWNS: &str = "dagnats_leases_step_downs_total";
/// Counter, labels `endpoint` (`acquire`, `renew`, `release`) and `reason`:
/// `renew_retry` (a renew sent while the key's last renew had no clear answer), or
/// an outcome the holder cannot read as a yes or a no: `timed_out`,
/// `no_responders`, `request_failed`, `unavailable`, `internal` (an `internal`
/// reply, or one of no endpoint's shape), as the campaign classes it
/// ([`dagnats_leases_core::holder::OutcomeClass`]; as client-go's
/// `leader_election_slowpath_total`).
pub const SLOWPATH: &str = "dagnats_leases_slowpath_total";
/// Histogram: seconds from a renew's send to its outcome (the renew confirming a
/// grant included; one given up counts until it was).
pub const RENEW_DURATION: &str = "dagnats_leases_renew_duration_seconds";
/// Histogram: seconds from the start of a campaign (an elector, shard set or
/// semaphore started, or its last step-down) to `Elected`.
pub const CAMPAIGN_TO_ELECTED: &str = "dagnats_leases_campaign_to_elected_seconds";

/// Every histogram's name, for an exporter's bucket settings.
pub const HISTOGRAMS: [&str; 3] = [CALL_DURATION, RENEW_DURATION, CAMPAIGN_TO_ELECTED];

/// Registers every metric's description with the installed recorder (Prometheus'
/// `# HELP` lines). Call it after installing one; the names record without it.
pub fn describe() {
    describe_counter!(CALLS, "Calls answered, by endpoint and reply kind.");
    describe_counter!(
        OVERLOADED,
        "Requests answered unavailable at once: the service was at its bound."
    );
    describe_counter!(
        REPLIES_DROPPED,
        "Requests dropped unanswered: their reply subject is not a reply inbox."
    );
    describe_counter!(
        TOMBSTONES_LEFT,
        "Released keys whose tombstone could not be purged (failed or dropped)."
    );
    describe_histogram!(
        CALL_DURATION,
        metrics::Unit::Seconds,
        "Seconds from a call's start to its reply, by endpoint."
    );
    describe_counter!(READ_CONFIRMATIONS, "Read confirmations sent.");
    describe_counter!(
        READ_CONFIRMATION_RETRIES,
        "Read confirmations that found the key moved on (the call read again)."
    );
    describe_counter!(
        JETSTREAM_ERRORS,
        "JetStream requests of a call that failed, by op and kind."
    );
    describe_gauge!(
        MODE,
        "1 for the mode the service is in (starting, serving, unsupported)."
    );
    describe_gauge!(
        READY,
        "1 while the service is ready: serving, connected, bucket reachable."
    );
    describe_gauge!(CONNECTED, "1 while every NATS connection is up.");
    describe_gauge!(
        BUCKET_REFUSED,
        "1 once the service refused its bucket: the stream's sequence went back."
    );
    describe_gauge!(
        STREAM_LAST_SEQ,
        "The highest last sequence seen of the stream: no fence on it is above."
    );
    describe_gauge!(BUILD_INFO, "Always 1, labelled with the running version.");
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    describe_gauge!(LEADER, "1 while this process owns the key, 0 otherwise.");
    describe_counter!(STEP_DOWNS, "Step-downs of this process, by reason.");
    describe_counter!(
        SLOWPATH,
        "Holder requests on the slow path: renew retries and outcomes neither yes nor no."
    );
    describe_histogram!(
        RENEW_DURATION,
        metrics::Unit::Seconds,
        "Seconds from a renew's send to its outcome."
    );
    describe_histogram!(
        CAMPAIGN_TO_ELECTED,
        metrics::Unit::Seconds,
        "Seconds from the start of a campaign to Elected."
    );
}

/// The `reply` label of a call's reply.
fn reply_kind(response: &Response) -> &'static str {
    match response {
        Response::Error(e) => e.kind.as_str(),
        Response::Acquired(r) if !r.granted => "not_granted",
        _ => "ok",
    }
}

/// A call answered `response` after `took`.
pub(crate) fn call_answered(endpoint: Endpoint, response: &Response, took: Duration) {
    counter!(CALLS, "endpoint" => endpoint.name(), "reply" => reply_kind(response)).increment(1);
    histogram!(CALL_DURATION, "endpoint" => endpoint.name()).record(took.as_secs_f64());
}

/// A request for `endpoint` was refused at the service's bound.
pub(crate) fn overloaded(endpoint: Endpoint) {
    counter!(OVERLOADED, "endpoint" => endpoint.name()).increment(1);
}

/// A request on `subject` (`api` or `srv`) was dropped: its reply was refused.
pub(crate) fn dropped(subject: &'static str, reason: DropReason) {
    counter!(REPLIES_DROPPED, "subject" => subject, "reason" => reason.as_str()).increment(1);
}

/// A released key's tombstone stays in the stream (`failed` or `dropped`).
pub(crate) fn tombstone_left(reason: &'static str) {
    counter!(TOMBSTONES_LEFT, "reason" => reason).increment(1);
}

/// The service is in `mode` now.
pub(crate) fn set_mode(mode: Mode) {
    let now = match mode {
        Mode::Starting => "starting",
        Mode::Ready => "serving",
        Mode::Unsupported => "unsupported",
    };
    for name in ["starting", "serving", "unsupported"] {
        gauge!(MODE, "mode" => name).set(if name == now { 1.0 } else { 0.0 });
    }
}

/// What `/readyz` answers: the readiness the service last reported, or not
/// ready while no service has reported yet.
static READINESS: std::sync::Mutex<Option<Result<(), String>>> = std::sync::Mutex::new(None);

/// The readiness the service last reported (`Err` with the reason when not ready).
pub fn readiness() -> Result<(), String> {
    READINESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| Err("starting: connecting to NATS".to_string()))
}

/// The service's health changed: the gauges and what `/readyz` answers.
pub(crate) fn set_health(health: &Health) {
    gauge!(READY).set(if health.ready.is_ok() { 1.0 } else { 0.0 });
    gauge!(CONNECTED).set(if health.connected { 1.0 } else { 0.0 });
    let refused = matches!(health.ready, Err(NotReady::BucketRefused(_)));
    gauge!(BUCKET_REFUSED).set(if refused { 1.0 } else { 0.0 });
    *READINESS.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(health.ready.clone().map_err(|why| why.to_string()));
}

/// Registers the leader gauge of each of `keys` at 0, so that it shows before the
/// first election.
pub(crate) fn campaigning_for<'a>(keys: impl IntoIterator<Item = &'a str>) {
    for key in keys {
        gauge!(LEADER, "key" => key.to_string()).increment(0.0);
    }
}

/// This process began (`true`) or stopped (`false`) owning `key`. An increment, not
/// a set: two members of one process may campaign for the same key.
pub(crate) fn leading(key: &str, owns: bool) {
    let gauge = gauge!(LEADER, "key" => key.to_string());
    if owns {
        gauge.increment(1.0);
    } else {
        gauge.decrement(1.0);
    }
}

/// A key stepped down for `reason`.
pub(crate) fn stepped_down(reason: &StepDownReason) {
    counter!(STEP_DOWNS, "reason" => reason.to_string()).increment(1);
}

/// A key was elected `after` its campaign began.
pub(crate) fn elected(after: Duration) {
    histogram!(CAMPAIGN_TO_ELECTED).record(after.as_secs_f64());
}

/// A holder's request came back (or was timed out), as the campaign read it: its
/// time for a renew, its class when the slow path, and a renew retry.
pub(crate) fn holder_answered(answered: &AnsweredRequest) {
    let endpoint = answered.endpoint;
    if endpoint == Endpoint::Renew {
        histogram!(RENEW_DURATION).record(answered.took.as_secs_f64());
    }
    if answered.renew_retry {
        counter!(SLOWPATH, "endpoint" => endpoint.name(), "reason" => "renew_retry").increment(1);
    }
    if let Some(reason) = answered.class.label() {
        counter!(SLOWPATH, "endpoint" => endpoint.name(), "reason" => reason).increment(1);
    }
}

#[cfg(all(test, feature = "cli"))]
mod tests {
    use super::*;
    use dagnats_leases_core::holder::OutcomeClass;
    use metrics_exporter_prometheus::PrometheusBuilder;

    /// What `record` recorded, as Prometheus text.
    fn recorded(record: impl FnOnce()) -> String {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, record);
        handle.render()
    }

    #[test]
    fn holder_answers_on_the_slow_path_as_the_campaign_classed_them() {
        let text = recorded(|| {
            let answered = |endpoint, class, renew_retry| AnsweredRequest {
                key: "leader".to_string(),
                endpoint,
                took: Duration::from_millis(2),
                class,
                renew_retry,
            };
            holder_answered(&answered(Endpoint::Renew, OutcomeClass::Unavailable, false));
            holder_answered(&answered(Endpoint::Renew, OutcomeClass::Clear, true));
            holder_answered(&answered(Endpoint::Acquire, OutcomeClass::TimedOut, false));
        });
        for (endpoint, reason) in [
            ("renew", "unavailable"),
            ("acquire", "timed_out"),
            ("renew", "renew_retry"),
        ] {
            let line = format!(r#"{SLOWPATH}{{endpoint="{endpoint}",reason="{reason}"}} 1"#);
            assert!(text.contains(&line), "{line}: {text}");
        }
        // Two renews timed (a summary without buckets here: its count).
        assert!(
            text.contains(&format!("{RENEW_DURATION}_count 2")),
            "{text}"
        );
    }
}
