//! What a simulator asks of the machine to judge it call by call (tests only):
//! which call each message of a transmit belongs to. The machine's ids are its
//! own, so the outside cannot tell which of two calls on one key a read is for.

use super::*;

impl Service {
    /// The reply subject of the call each message of `transmit` belongs to, in
    /// order (its publishes, then its request): a call's own request, or each
    /// write of the coalescer's send; `None` for a part's message, or a call
    /// that ended. Ask as the transmit is polled, before its outcome.
    pub fn callers_of(&self, transmit: &Transmit) -> Vec<Option<String>> {
        let reply = |token: &CallId| self.calls.get(token).map(|r| r.reply.clone());
        let n = transmit.publish.len() + 1;
        match self.routes.get(&transmit.id) {
            Some(Route::Call(token)) => vec![reply(token)],
            Some(Route::Part(Part::Coalescer)) => {
                let writes = self
                    .coalescer
                    .as_ref()
                    .map(|c| c.writes_of(transmit.id))
                    .unwrap_or_default();
                let mut owners: Vec<Option<String>> = writes
                    .iter()
                    .map(|w| match self.routes.get(w) {
                        Some(Route::Write(token)) => reply(token),
                        _ => None,
                    })
                    .collect();
                owners.resize(n, None);
                owners
            }
            _ => vec![None; n],
        }
    }
}
