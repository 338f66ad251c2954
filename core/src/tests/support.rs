//! Helpers for table tests: drive one call with scripted JetStream answers.

use std::time::{Duration, Instant};

use time::OffsetDateTime;

use crate::call::{
    Call, CallConfig, CallEvent, CallRequest, ConfirmRead, InboxRequest, KvRead, KvWrite,
};

use crate::io::TransmitId;
use crate::outbox::Ids;

thread_local! {
    static NEXT_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
}

/// Ids for a part a table test polls alone, as its owner gives them: never one
/// twice (each is taken for one poll).
pub(crate) fn owner_ids() -> Ids<TransmitId> {
    NEXT_ID.with(|next| {
        let first = next.get();
        next.set(first + 1);
        Ids::starting_from(first)
    })
}
use crate::io::RequestOutcome;
use crate::record::LeaseRecord;
use crate::sim::{self, MsgKind, SimMsg};
use crate::subjects::{HDR_KV_OPERATION, HDR_LEASE_EVENT, HDR_MARKER_REASON};
use crate::wire::{Endpoint, ErrorReply, Response};

pub(super) const MAX_PAYLOAD: usize = 1024 * 1024;

pub(super) fn epoch() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap()
}

/// A call's wall time: a second after the records these helpers write, so a
/// lease they show is live with most of its TTL left.
pub(super) fn wall() -> OffsetDateTime {
    epoch() + Duration::from_secs(1)
}

pub(super) struct Drive {
    pub call: Call,
    pub now: Instant,
}

impl Drive {
    pub(super) fn new(endpoint: Endpoint, body: &str) -> Self {
        Self::with_config(CallConfig::ready(MAX_PAYLOAD), endpoint, body)
    }

    pub(super) fn with_config(config: CallConfig, endpoint: Endpoint, body: &str) -> Self {
        Self::at_wall(config, endpoint, body, wall())
    }

    /// A call whose service clock reads `wall` as it starts.
    pub(super) fn at_wall(
        config: CallConfig,
        endpoint: Endpoint,
        body: &str,
        wall: OffsetDateTime,
    ) -> Self {
        let now = Instant::now();
        Self {
            call: Call::new(config, endpoint, body.as_bytes(), wall, now),
            now,
        }
    }

    /// A call on a bucket of three replicas, which confirms its reads.
    pub(super) fn replicated(endpoint: Endpoint, body: &str) -> Self {
        Self::with_config(
            CallConfig::ready(MAX_PAYLOAD).for_replicas(3),
            endpoint,
            body,
        )
    }

    pub(super) fn confirm(&mut self) -> ConfirmRead {
        match self.effect() {
            CallRequest::ConfirmRead(c) => c,
            other => panic!("expected a read confirmation, got {other:?}"),
        }
    }

    pub(super) fn effect(&mut self) -> CallRequest {
        self.call
            .poll_request(&mut owner_ids())
            .expect("the call wants an effect")
    }

    pub(super) fn read(&mut self) -> KvRead {
        match self.effect() {
            CallRequest::KvRead(r) => r,
            other => panic!("expected a leader read, got {other:?}"),
        }
    }

    pub(super) fn write(&mut self) -> KvWrite {
        match self.effect() {
            CallRequest::KvWrite(w) => w,
            other => panic!("expected a KV write, got {other:?}"),
        }
    }

    pub(super) fn inbox(&mut self) -> InboxRequest {
        match self.effect() {
            CallRequest::InboxRequest(i) => i,
            other => panic!("expected an inbox request, got {other:?}"),
        }
    }

    pub(super) fn reply(&mut self) -> Response {
        if let Some(other) = self.call.poll_request(&mut owner_ids()) {
            panic!("expected the reply, got {other:?}");
        }
        let replies: Vec<Response> = self
            .events()
            .into_iter()
            .filter_map(|e| match e {
                CallEvent::Replied(r) => Some(r),
                CallEvent::Kv(_) => None,
            })
            .collect();
        assert!(self.call.is_done());
        match <[Response; 1]>::try_from(replies) {
            Ok([r]) => r,
            Err(replies) => panic!("expected one reply, got {replies:?}"),
        }
    }

    /// Every event the call reported since the last drain.
    pub(super) fn events(&mut self) -> Vec<CallEvent> {
        std::iter::from_fn(|| self.call.poll_event()).collect()
    }

    pub(super) fn error(&mut self) -> ErrorReply {
        match self.reply() {
            Response::Error(e) => e,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    pub(super) fn feed(&mut self, id: TransmitId, outcome: RequestOutcome) {
        assert!(
            self.call.poll_request(&mut owner_ids()).is_none(),
            "drain before feeding"
        );
        self.call.handle_outcome(self.now, id, outcome);
    }

    pub(super) fn advance(&mut self, d: Duration) {
        self.now += d;
    }
}

pub(super) fn ack(seq: u64) -> RequestOutcome {
    RequestOutcome::reply(format!(r#"{{"stream":"KV_leases","seq":{seq}}}"#))
}

pub(super) fn wrong_last_sequence() -> RequestOutcome {
    sim::api_error(400, 10071, "wrong last sequence: 7")
}

pub(super) fn no_message() -> RequestOutcome {
    sim::api_error(404, 10037, "no message found")
}

pub(super) fn msg(
    seq: u64,
    kind: MsgKind,
    headers: Vec<(&str, &str)>,
    data: Vec<u8>,
    time_ms: u64,
) -> RequestOutcome {
    let m = SimMsg {
        seq,
        key: "k".into(),
        kind,
        headers: headers
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        data,
        time_ms,
        ttl_ms: None,
        late_ms: 0,
    };
    RequestOutcome::reply(sim::stored_message_json(epoch(), &m))
}

/// A live record written at `epoch + time_ms`.
pub(super) fn held(seq: u64, holder: &str, ttl_ms: u64, time_ms: u64) -> RequestOutcome {
    let record = LeaseRecord {
        holder: holder.into(),
        acquired_at: "2026-09-21T00:00:00Z".into(),
        ttl_ms,
        bound_to: None,
        unknown: Default::default(),
    };
    msg(
        seq,
        MsgKind::Value,
        vec![(HDR_LEASE_EVENT, "acquired"), ("Nats-TTL", "15s")],
        record.to_json(),
        time_ms,
    )
}

pub(super) fn marker(seq: u64) -> RequestOutcome {
    msg(
        seq,
        MsgKind::Marker,
        vec![(HDR_MARKER_REASON, "MaxAge"), ("Nats-TTL", "1s")],
        vec![],
        0,
    )
}

pub(super) fn tombstone(seq: u64) -> RequestOutcome {
    msg(
        seq,
        MsgKind::Tombstone,
        vec![(HDR_KV_OPERATION, "DEL"), (HDR_LEASE_EVENT, "released")],
        vec![],
        0,
    )
}

pub(super) fn corrupt(seq: u64) -> RequestOutcome {
    msg(seq, MsgKind::Value, vec![], b"{not a record".to_vec(), 0)
}

pub(super) fn header<'a>(w: &'a crate::io::NatsRequest, name: &str) -> Option<&'a str> {
    w.headers
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_str())
}

/// `call`'s reply, if it has replied: its events drained, whatever else they report.
pub(super) fn reply_of(call: &mut Call) -> Option<Response> {
    std::iter::from_fn(|| call.poll_event())
        .filter_map(|e| match e {
            CallEvent::Replied(r) => Some(r),
            CallEvent::Kv(_) => None,
        })
        .last()
}
