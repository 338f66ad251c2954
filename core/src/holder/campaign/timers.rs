//! The timer index: every holder's next deadline in order, so that a timeout feeds
//! only the holders due, and the campaign's one wake-up.

use super::*;

impl Campaign {
    /// When to call [`Campaign::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let holders = self.timers.next();
        let requests = self.out.routes.next_due();
        let cooldowns = self.cooldown.values().copied();
        // An unhealthy group holding keys steps down at its deadline.
        let health = self.groups.iter().filter_map(|(id, g)| {
            let at = g.health.step_down_at()?;
            self.candidacies
                .values()
                .any(|s| {
                    s.group == *id
                        && matches!(
                            s.holder.status(),
                            HolderStatus::Owner | HolderStatus::Confirming
                        )
                })
                .then_some(at)
        });
        holders
            .into_iter()
            .chain(requests)
            .chain(cooldowns)
            .chain(health)
            .chain(self.handoffs.next_due())
            .min()
    }

    /// Indexes the deadlines of the holders drained in this settle again.
    pub(super) fn index_timers(&mut self) {
        for key in std::mem::take(&mut self.drained) {
            // A candidacy gone took its entry with it (`remove_finished`).
            let Some(candidacy) = self.candidacies.get(&key) else {
                continue;
            };
            let next = candidacy.holder.poll_timeout();
            if next != self.timers.get(&key) {
                self.timers.set(key, next);
            }
        }
        #[cfg(debug_assertions)]
        for (key, candidacy) in &self.candidacies {
            debug_assert!(
                !candidacy.holder.has_output(),
                "{key}: a holder fed without being marked touched"
            );
            debug_assert_eq!(
                self.timers.get(key),
                candidacy.holder.poll_timeout(),
                "{key}: a deadline not indexed"
            );
        }
        #[cfg(debug_assertions)]
        debug_assert_eq!(
            self.timers.len(),
            self.candidacies
                .values()
                .filter(|s| s.holder.poll_timeout().is_some())
                .count(),
            "an index entry of a candidacy gone"
        );
    }
}
