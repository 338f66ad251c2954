//! The owner's inbox as the application reads it: requests the campaign accepted.

use super::*;

/// Requests forwarded to this member as owner (see [`Member::inbox`]).
///
/// ```no_run
/// # async fn run(member: dagnats_leases_nats::member::Member) -> Result<(), Box<dyn std::error::Error>> {
/// let mut inbox = member.inbox().await?;
/// while let Some(request) = inbox.next().await {
///     // Only requests for keys this member owns, with a fence of its tenure, get here.
///     let answer = format!("handled under fence {}", request.fence);
///     request.respond(answer).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Inbox {
    pub(super) requests: mpsc::UnboundedReceiver<ForwardedRequest>,
    pub(super) rejected: Arc<AtomicU64>,
}

/// One forwarded request this member accepted as owner: answer it with
/// [`ForwardedRequest::respond`].
#[derive(Debug)]
pub struct ForwardedRequest {
    /// The key it was forwarded for.
    pub key: String,
    /// The fence the service sent: fence the writes this request makes with it.
    pub fence: u64,
    /// The request body.
    pub payload: Vec<u8>,
    pub(super) reply: Option<async_nats::Subject>,
    pub(super) nats: Client,
}

impl ForwardedRequest {
    /// Sends `body` back as the owner's reply.
    pub async fn respond(self, body: impl Into<bytes::Bytes>) -> Result<(), crate::Error> {
        if let Some(reply) = self.reply {
            self.nats
                .publish(reply, body.into())
                .await
                .map_err(|e| crate::Error::new(crate::ErrorKind::Nats, e))?;
        }
        Ok(())
    }
}

impl Inbox {
    /// The next request this member should process as owner; rejected ones are
    /// answered by the member and skipped. `None` when the subscription ends.
    pub async fn next(&mut self) -> Option<ForwardedRequest> {
        self.requests.recv().await
    }

    /// How many forwarded requests were rejected so far.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
}
