//! Balanced shard sets: members counted from presence leases, each holding the
//! floor or the ceiling of its share, the newest tenures revoked first.

use super::*;

#[derive(Debug, Clone, Copy)]
pub(super) struct Balance {
    pub(super) presence: GroupId,
    pub(super) shed_at: Instant,
}

/// Who holds a key, as the last change event said, and until when that is believed
/// without a newer event (a renewal refreshes it every ttl/3).
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) holder: String,
    pub(super) until: Instant,
}

/// The `i`th presence key of balanced set `set`.
pub fn presence_key(set: &str, i: usize) -> String {
    format!("{set}-member-{i}")
}

impl Campaign {
    /// How many keys of `group` are held now or being confirmed: [`Self::holding`]'s
    /// length, without building it.
    pub(super) fn held_count(&self, group: GroupId, now: Instant) -> usize {
        self.candidacies
            .values()
            .filter(|s| {
                s.group == group
                    && (s.holder.status() == HolderStatus::Confirming
                        || s.holder.tenure(now).is_some())
            })
            .count()
    }

    /// Keys of `group` held now or being confirmed, oldest tenure first.
    pub(super) fn holding(&self, group: GroupId, now: Instant) -> Vec<(u64, String)> {
        let mut holding: Vec<(u64, String)> = self
            .candidacies
            .iter()
            .filter(|(_, s)| s.group == group)
            .filter_map(|(k, s)| match s.holder.tenure(now) {
                Some(own) => Some((own.tenure, k.clone())),
                None if s.holder.status() == HolderStatus::Confirming => {
                    Some((u64::MAX, k.clone()))
                }
                None => None,
            })
            .collect();
        holding.sort();
        holding
    }

    /// Makes a holder for every key of a running group that has none (and was not
    /// refused for good), and revokes the newest tenures of a group above its cap.
    /// Returns whether it changed anything.
    pub(super) fn rebalance(&mut self, now: Instant) -> bool {
        let mut changed = false;
        let cooling = self.cooldown.len();
        self.cooldown.retain(|_, until| now < *until);
        self.vacancies |= self.cooldown.len() != cooling;
        let running: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| !g.stopping)
            .map(|(id, _)| *id)
            .collect();
        let vacancies = std::mem::take(&mut self.vacancies);
        for id in running {
            let shed = self.to_shed(id, now);
            // The newest tenures go first: the oldest have served longest unmoved.
            let surplus: Vec<String> = match shed {
                0 => Vec::new(),
                _ => self
                    .holding(id, now)
                    .into_iter()
                    .rev()
                    .take(shed)
                    .map(|(_, key)| key)
                    .collect(),
            };
            let mut balanced = false;
            if let (Some(g), false) = (self.groups.get_mut(&id), surplus.is_empty())
                && let Some(b) = g.balance.as_mut()
            {
                b.shed_at = now + g.keys[0].renew_every;
                balanced = true;
            }
            for key in surplus {
                if let Some(candidacy) = self.candidacies.get_mut(&key) {
                    candidacy.holder.handle_revoke(now);
                    candidacy.shed = balanced;
                    self.touched.insert(key);
                    changed = true;
                }
            }
            if !vacancies {
                continue;
            }
            let group = &self.groups[&id];
            for config in &group.keys {
                if self.candidacies.contains_key(&config.key)
                    || group.failed.contains(&config.key)
                    || self.cooldown.contains_key(&config.key)
                {
                    continue;
                }
                let Ok(mut holder) = Holder::new(config.clone(), now) else {
                    continue;
                };
                holder.seed_jitter(self.jitter_seed);
                self.candidacies.insert(
                    config.key.clone(),
                    Candidacy {
                        group: id,
                        serial: self.next_serial,
                        holder,
                        shed: false,
                    },
                );
                self.next_serial += 1;
                self.touched.insert(config.key.clone());
                changed = true;
            }
        }
        changed
    }

    /// How many of `group`'s keys it may hold: its `max_held`, or for a balanced
    /// group `ceil(keys / members)`.
    pub(super) fn cap(&self, group: GroupId, now: Instant) -> usize {
        let g = &self.groups[&group];
        match g.balance {
            None => g.max_held,
            Some(b) => g.keys.len().div_ceil(self.members(b.presence, now).len()),
        }
    }

    /// The members of a balanced set: the holders of its presence keys as change
    /// events show them, and this one.
    pub(super) fn members(&self, presence: GroupId, now: Instant) -> BTreeSet<&str> {
        // The presence group may have finished first, while the set is stopping.
        let presence_keys = self.groups.get(&presence).map(|g| g.keys.as_slice());
        let mut members: BTreeSet<&str> = presence_keys
            .unwrap_or_default()
            .iter()
            .filter_map(|c| self.seen.get(&c.key))
            .filter(|s| now < s.until)
            .map(|s| s.holder.as_str())
            .collect();
        members.insert(&self.holder);
        members
    }

    /// How many tenures `group`, holding `held`, should revoke now: what is above
    /// its cap; for a balanced group also one when it is above the floor while a
    /// member holds less than the floor; at most half the surplus (at least one)
    /// per renew interval. Keys being revoked count as given up already.
    pub(super) fn to_shed(&self, group: GroupId, now: Instant) -> usize {
        let g = &self.groups[&group];
        let Some(b) = g.balance else {
            // A group that may hold all its keys holds none too many.
            if g.keys.len() <= g.max_held {
                return 0;
            }
            return self.held_count(group, now).saturating_sub(g.max_held);
        };
        if now < b.shed_at {
            return 0;
        }
        let held = self.held_count(group, now);
        let cap = self.cap(group, now);
        let members = self.members(b.presence, now);
        let floor = g.keys.len() / members.len();
        let share = |m: &str| {
            g.keys
                .iter()
                .filter_map(|c| self.seen.get(&c.key))
                .filter(|s| now < s.until && s.holder == m)
                .count()
        };
        let starved = members
            .iter()
            .any(|m| *m != self.holder && share(m) < floor);
        let surplus = held.saturating_sub(cap);
        if surplus > 0 {
            surplus.div_ceil(2)
        } else if held > floor && starved {
            1
        } else {
            0
        }
    }
}
