//! The reply hand-off: each reply counted and handed to the adapter
//! ([`ServiceEvent::Reply`]), and given up if the client has not taken it within
//! [`HANDOFF_BOUND`] ([`ServiceEvent::CancelReply`]).

use super::*;

impl Service {
    /// Publishes a reply to a subject the reply rule let through, given up if the
    /// client has not taken it within [`HANDOFF_BOUND`].
    pub(super) fn reply(&mut self, now: Instant, to: String, body: Vec<u8>) {
        self.reply_with(now, to, body, Vec::new());
    }

    /// Publishes a reply, with the calls it answers (a call's, or each item's of
    /// a `renew_many`).
    pub(super) fn reply_with(
        &mut self,
        now: Instant,
        to: String,
        body: Vec<u8>,
        calls: Vec<Answered>,
    ) {
        let id = self.reply_ids.allocate();
        self.replies.hand(now, id);
        self.events.push_back(ServiceEvent::Reply {
            id,
            to,
            body,
            calls,
        });
    }

    /// A call's reply: counted, and sent with what it answered.
    pub(super) fn answered(
        &mut self,
        now: Instant,
        endpoint: Endpoint,
        reply: String,
        response: Response,
        took: Duration,
    ) {
        self.micro.handle_answered(endpoint, &response, took);
        let body = response.to_json();
        let call = Answered {
            endpoint,
            response,
            took,
        };
        self.reply_with(now, reply, body, vec![call]);
    }

    /// Reply `id` ([`ServiceEvent::Reply`]) was handed to the client, or its
    /// publish failed: a stop's flush waits for every one.
    pub fn handle_reply_sent(&mut self, now: Instant, id: ReplyId) {
        self.replies.forget(&id);
        self.pump(now);
    }

    /// Gives up the replies the client has not taken by `now`.
    pub(super) fn give_up_replies(&mut self, now: Instant) {
        let mut given_up = 0;
        while let Some(id) = self.replies.pop_given_up(now) {
            self.events.push_back(ServiceEvent::CancelReply { id });
            given_up += 1;
        }
        if given_up > 0 {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Warn,
                line: format!(
                    "{given_up} repl{} not sent: the NATS client took no command for \
                     {HANDOFF_BOUND:?}",
                    if given_up == 1 { "y" } else { "ies" }
                ),
            });
        }
    }
}
