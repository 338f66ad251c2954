//! The simulated server as a [`Service`] meets it: the stream API around the
//! simulated KV (the stream's info, its purges) and the change events its
//! RePublish delivers. The service world and the holder world both answer the
//! service's requests through here, so the service runs as it is deployed.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{SimJetStream, SimMsg};
use crate::io::{RequestOutcome, Transmit};
use crate::service::bucket::stream_config_with_atomic;
use crate::service::{Received, Service, ServiceEvent};
use crate::subjects::{HDR_SEQUENCE, HDR_TIME_STAMP, STREAM, changed_subject};

/// What the stream API says of the stream: its replicas, when it was made, and
/// the `first_seq` it was made anew with, if it was.
#[derive(Debug, Clone)]
pub struct StreamAdmin {
    /// The replicas the next stream info reports.
    pub replicas: usize,
    /// Bumped each time the stream is made anew (its info's `created`).
    pub created: u64,
    /// The `first_seq` the stream was made anew with, if it was.
    pub first_seq: Option<u64>,
}

impl StreamAdmin {
    /// A stream of `replicas`, made once.
    pub fn new(replicas: usize) -> Self {
        Self {
            replicas: replicas.max(1),
            created: 1,
            first_seq: None,
        }
    }

    /// Carries out `transmit` on `sim`: its publishes first, then its request,
    /// whose answer is returned.
    pub fn answer(&self, sim: &mut SimJetStream, transmit: &Transmit) -> RequestOutcome {
        for m in &transmit.publish {
            sim.handle_publish(m);
        }
        let subject = transmit.request.subject.as_str();
        if ["INFO", "CREATE", "UPDATE"]
            .iter()
            .any(|verb| subject == format!("$JS.API.STREAM.{verb}.{STREAM}"))
        {
            let mut info = json!({
                "config": stream_config_with_atomic(self.replicas, true),
                "state": {"last_seq": sim.last_seq()},
                "created": format!("2026-01-01T00:00:{:02}Z", self.created % 60),
            });
            info["config"]["republish"] =
                crate::service::bucket::one_stream_republish(crate::tenant::Tenancy::Single);
            if let Some(first) = self.first_seq {
                info["config"]["first_seq"] = json!(first);
            }
            RequestOutcome::reply(info.to_string())
        } else if subject.starts_with("$JS.API.STREAM.INFO.") {
            // Startup's other-layout question: no stream but the world's exists.
            super::api_error(404, crate::js::ERR_STREAM_NOT_FOUND, "stream not found")
        } else if subject.starts_with("$JS.API.STREAM.PURGE.") {
            RequestOutcome::reply(json!({"success": true, "purged": 1}).to_string())
        } else {
            sim.handle(&transmit.request)
        }
    }
}

/// The change event of stored message `m` as the server's RePublish delivers it
/// (`epoch`: the stream's wall clock at its time 0): its headers, the sequence
/// and the store time, and its body.
pub fn republished(epoch: time::OffsetDateTime, m: &SimMsg) -> Received {
    let mut headers = m.headers.clone();
    headers.push((HDR_SEQUENCE.to_string(), m.seq.to_string()));
    headers.push((
        HDR_TIME_STAMP.to_string(),
        crate::record::format_time(epoch + Duration::from_millis(m.time_ms)),
    ));
    Received {
        subject: changed_subject(&m.key),
        reply: None,
        headers,
        payload: m.data.clone(),
        header_error: None,
    }
}

/// A service started at `now` on `sim`, its startup answered at once (no time
/// passes): serving when this returns, as an instance already up would be. With
/// it, the events it reported meanwhile (its subscriptions among them).
pub fn started(
    config: crate::service::ServiceConfig,
    sim: &mut SimJetStream,
    admin: &StreamAdmin,
    now: Instant,
) -> (Service, Vec<ServiceEvent>) {
    let mut service = Service::new(config, sim.wall(), now);
    let mut events = Vec::new();
    for _ in 0..64 {
        let mut moved = false;
        while let Some(t) = service.poll_transmit() {
            moved = true;
            let outcome = admin.answer(sim, &t);
            service.handle_outcome(now, t.id, outcome);
        }
        while let Some(event) = service.poll_event() {
            moved = true;
            match event {
                ServiceEvent::Reply { id, .. } => service.handle_reply_sent(now, id),
                event => events.push(event),
            }
        }
        if !moved {
            break;
        }
    }
    assert_eq!(
        service.mode(),
        crate::io::Mode::Ready,
        "the simulated service did not start"
    );
    (service, events)
}
