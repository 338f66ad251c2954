//! What the service reads and where its replies go: the five endpoints (queue
//! group `dagnats-leases`) and the micro protocol's `$SRV` verbs as one stream of
//! messages, each let through only when its reply subject is a reply inbox
//! ([`ReplyScope`]). Replies are plain publishes to that subject, so no reply
//! leaves the service but through [`Gate::admit`].

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use async_nats::{Client, Message, Subject, Subscriber};
use bytes::Bytes;
use dagnats_leases_core::micro::MicroService;
use dagnats_leases_core::reply_scope::{REFUSAL_LOG_EVERY, RefusalLog, ReplyScope};
use dagnats_leases_core::shutdown::HANDOFF_BOUND;
use dagnats_leases_core::subjects::QUEUE_GROUP;
use dagnats_leases_core::tenant::{self, Caller, HDR_REQUEST_INFO, Tenancy};
use dagnats_leases_core::wire::Endpoint;
use dagnats_leases_core::wire::ErrorReply;
use futures::Stream;
use futures::stream::SelectAll;

use crate::runtime::{self, Runtime};
use crate::telemetry;
use crate::{Error, ErrorKind};

/// Which subscription a message came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// One of the five lease endpoints.
    Api(Endpoint),
    /// A `$SRV` verb of the micro protocol.
    Srv,
}

impl Source {
    fn label(self) -> &'static str {
        match self {
            Self::Api(_) => "api",
            Self::Srv => "srv",
        }
    }
}

/// One subscription, its messages tagged with where they came in.
#[derive(Debug)]
pub(crate) struct Tagged {
    source: Source,
    subscriber: Subscriber,
}

impl Stream for Tagged {
    type Item = (Source, Message);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let source = self.source;
        Pin::new(&mut self.subscriber)
            .poll_next(cx)
            .map(|m| m.map(|m| (source, m)))
    }
}

/// Every subscription of the service, read as one stream.
pub(crate) type Incoming = SelectAll<Tagged>;

/// Subscribes to the five endpoints in the queue group and to the micro verbs of
/// `micro` (every instance answers those).
pub(crate) async fn subscribe(client: &Client, micro: &MicroService) -> Result<Incoming, Error> {
    let mut incoming = SelectAll::new();
    for endpoint in Endpoint::ALL {
        let subscriber = client
            .queue_subscribe(endpoint.subject(), QUEUE_GROUP.to_string())
            .await
            .map_err(|e| Error::new(ErrorKind::Nats, e))?;
        incoming.push(Tagged {
            source: Source::Api(endpoint),
            subscriber,
        });
    }
    for subject in micro.subjects() {
        let subscriber = client
            .subscribe(subject)
            .await
            .map_err(|e| Error::new(ErrorKind::Nats, e))?;
        incoming.push(Tagged {
            source: Source::Srv,
            subscriber,
        });
    }
    Ok(incoming)
}

/// Unsubscribes every subscription; each stream ends once the messages already
/// delivered to this client are read.
pub(crate) async fn drain(incoming: &mut Incoming) {
    for tagged in incoming.iter_mut() {
        let _ = tagged.subscriber.drain().await;
    }
}

/// A request let through: its reply subject is a reply inbox.
#[derive(Debug)]
pub(crate) struct Admitted {
    /// Where the answer goes.
    pub(crate) reply: Subject,
    /// The request body.
    pub(crate) payload: Bytes,
    /// The subject it came in on (for a `$SRV` verb).
    pub(crate) subject: Subject,
    /// Whose request it is, as the server vouches ([`tenant::scope_of`]), or the
    /// refusal to answer it with.
    pub(crate) scope: Result<Option<Caller>, ErrorReply>,
}

impl Admitted {
    /// The tenant whose queue it waits in.
    pub(crate) fn tenant(&self) -> Option<String> {
        match &self.scope {
            Ok(Some(c)) => Some(c.account.clone()),
            _ => None,
        }
    }
}

/// The reply rule and its rate-limited log.
#[derive(Debug)]
pub(crate) struct Gate {
    scope: ReplyScope,
    tenancy: Tenancy,
    log: RefusalLog,
}

impl Gate {
    pub(crate) fn new(scope: ReplyScope, tenancy: Tenancy) -> Self {
        Self {
            scope,
            tenancy,
            log: RefusalLog::new(REFUSAL_LOG_EVERY),
        }
    }

    /// The message as a request to answer, or `None` (counted, and logged at
    /// most once per interval) when its reply subject may not be answered.
    pub(crate) fn admit(&mut self, now: Instant, source: Source, m: Message) -> Option<Admitted> {
        match self.scope.check(m.reply.as_deref()) {
            Ok(()) => {
                let reply = m.reply.expect("checked: a reply subject");
                // Every value, its exact spelling only (a client's
                // `nats-request-info` is another header to the server).
                let infos: Vec<&str> = m
                    .headers
                    .iter()
                    .flat_map(|h| h.iter())
                    .filter(|(name, _)| AsRef::<str>::as_ref(*name) == HDR_REQUEST_INFO)
                    .flat_map(|(_, values)| values.iter().map(|v| v.as_str()))
                    .collect();
                let scope = tenant::scope_of(self.tenancy, &reply, &infos);
                Some(Admitted {
                    reply,
                    payload: m.payload,
                    subject: m.subject,
                    scope,
                })
            }
            Err(reason) => {
                telemetry::reply_refused(source.label(), reason);
                if let Some(n) = self.log.handle_refused(now) {
                    tracing::warn!(
                        subject = %m.subject,
                        reply = ?m.reply.as_deref().map(|r| r.escape_debug().to_string()),
                        reason = reason.as_str(),
                        "dropped {n} request(s) unanswered: a reply goes only to a reply inbox ({})",
                        self.scope.prefixes().join(", ")
                    );
                }
                None
            }
        }
    }
}

/// Publishes a reply to an admitted request, handed to the client within
/// [`HANDOFF_BOUND`]: while async-nats reconnects it reads no command, and a reply
/// must not hold the loop (or a stop) for as long.
pub(crate) async fn reply(runtime: &dyn Runtime, client: &Client, to: Subject, body: Vec<u8>) {
    let publish = client.publish(to, body.into());
    match runtime::until(runtime, runtime.now() + HANDOFF_BOUND, publish).await {
        Some(Ok(())) => {}
        Some(Err(e)) => tracing::warn!("reply not sent: {e}"),
        None => {
            tracing::warn!("reply not sent: the NATS client took no command for {HANDOFF_BOUND:?}")
        }
    }
}
