//! Health-gated leadership: an unhealthy group sends no campaign acquire, and its
//! keys step down once it has been unhealthy for `unhealthy_for`.

use super::*;

/// A group's health as the application reported it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Health {
    /// How long unhealthy before the held keys step down.
    pub(super) unhealthy_for: Duration,
    /// Unhealthy since then; `None` while healthy.
    pub(super) since: Option<Instant>,
}

impl Health {
    /// When the held keys step down, while unhealthy.
    pub(super) fn step_down_at(&self) -> Option<Instant> {
        self.since.map(|t| t + self.unhealthy_for)
    }
}

impl Campaign {
    /// The application's health check for `group` passed (`healthy`) or failed at
    /// `now` (see the [module docs](crate::holder::campaign)): while it fails, no campaign acquire of
    /// the group goes out; failing since T, at T + `unhealthy_for` its keys step
    /// down with [`StepDownReason::Unhealthy`]; passing again, its campaigns ask at
    /// once. A balanced group's presence follows it. An unknown group is ignored.
    pub fn handle_health(&mut self, now: Instant, group: GroupId, healthy: bool) {
        for id in self.with_presence(group) {
            let Some(g) = self.groups.get_mut(&id) else {
                continue;
            };
            if healthy {
                if g.health.since.take().is_some() {
                    for (key, candidacy) in
                        self.candidacies.iter_mut().filter(|(_, s)| s.group == id)
                    {
                        candidacy.holder.ask_now(now);
                        self.touched.insert(key.clone());
                    }
                }
            } else {
                g.health.since.get_or_insert(now);
                self.recall(now, id);
            }
        }
        self.settle(now);
    }

    /// How long `group` may stay unhealthy before its keys step down (its keys'
    /// TTL unless set). A balanced group's presence follows it.
    pub fn set_unhealthy_for(&mut self, now: Instant, group: GroupId, unhealthy_for: Duration) {
        for id in self.with_presence(group) {
            if let Some(g) = self.groups.get_mut(&id) {
                g.health.unhealthy_for = unhealthy_for;
            }
        }
        self.settle(now);
    }

    /// Whether `group` is healthy, as last reported (true for an unknown group).
    pub fn is_healthy(&self, group: GroupId) -> bool {
        self.groups
            .get(&group)
            .is_none_or(|g| g.health.since.is_none())
    }

    /// `group`, and its presence group if it is a balanced set.
    pub(super) fn with_presence(&self, group: GroupId) -> Vec<GroupId> {
        let presence = self.groups.get(&group).and_then(|g| g.balance);
        std::iter::once(group)
            .chain(presence.map(|b| b.presence))
            .collect()
    }

    /// Takes back `group`'s campaign acquires made ready but not yet polled: never
    /// sent, they are cancelled.
    pub(super) fn recall(&mut self, now: Instant, group: GroupId) {
        let routes = &self.out.routes;
        let (recalled, kept): (VecDeque<Transmit>, VecDeque<Transmit>) =
            std::mem::take(&mut self.out.requests)
                .into_iter()
                .partition(|r| {
                    routes
                        .get(&r.id)
                        .is_some_and(|route| route.gated && route.group == group)
                });
        self.out.requests = kept;
        for request in recalled {
            self.withdraw(now, request.id);
        }
    }

    /// Steps down the keys of groups unhealthy for their `unhealthy_for`: owned keys
    /// are revoked ([`StepDownReason::Unhealthy`]), keys being confirmed released
    /// (after the confirming renew, if it is out) and never elected; presence keys,
    /// which guard no writes, are released at once.
    /// Returns whether it changed anything.
    pub(super) fn gate_health(&mut self, now: Instant) -> bool {
        let due: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| !g.stopping && g.health.step_down_at().is_some_and(|at| now >= at))
            .map(|(id, _)| *id)
            .collect();
        let mut changed = false;
        for id in due {
            let presence = self
                .groups
                .values()
                .any(|g| g.balance.is_some_and(|b| b.presence == id));
            for (_, key) in self.holding(id, now) {
                if let Some(candidacy) = self.candidacies.get_mut(&key) {
                    if presence {
                        candidacy.holder.handle_stop(now);
                    } else {
                        candidacy.holder.handle_revoke_unhealthy(now);
                    }
                    self.touched.insert(key);
                    changed = true;
                }
            }
        }
        changed
    }
}
