//! Groups and their caps: adding a group (an elector, shards, a balanced set's two
//! groups), the check that a key has one campaign, stopping, handing over, the
//! queue of campaign acquires that go out only under the cap, and a group's end.

use super::*;

/// Keys of one group are often won in one burst (every shard at startup), and each
/// renews `renew_every` after its last write's send, so they would renew in one
/// burst too, for ever: every request of the group queued at the service at once.
/// Key `i` of `n` renews the first time in a tenure `renew_every / 4 × i / n`
/// sooner instead ([`HolderConfig::first_renewal_sooner`]), spreading the group's
/// renewals over a quarter of the interval; after that each renews every
/// `renew_every`, so the spread stays without renewing more often. Renewing sooner
/// is always safe; a group of one key is unchanged.
pub(super) fn spread_renewals(keys: &mut [HolderConfig]) {
    let n = keys.len() as u32;
    for (i, config) in keys.iter_mut().enumerate() {
        config.first_renewal_sooner = config.renew_every / 4 * i as u32 / n;
    }
}

impl Campaign {
    /// The keys `group` campaigns for as the application's candidate: an elector's
    /// key, a shard set's shards, a semaphore's slots; none for a balanced set's
    /// presence group (nor an unknown group). Their leader gauges show from the
    /// group's start, at 0 until elected.
    pub fn candidates(&self, group: GroupId) -> impl Iterator<Item = &str> {
        self.groups
            .get(&group)
            .filter(|g| !g.presence)
            .into_iter()
            .flat_map(|g| g.keys.iter().map(|c| c.key.as_str()))
    }

    /// Starts campaigning for `keys` (each config's `holder` must be this campaign's),
    /// holding at most `max_held` of them (at least 1). Refused when a config is
    /// outside the bounds, or a key is campaigned for already.
    pub fn add_group(
        &mut self,
        now: Instant,
        keys: Vec<HolderConfig>,
        max_held: usize,
    ) -> Result<GroupId, ErrorReply> {
        self.check_group(&keys)?;
        let id = self.insert_group(now, keys, max_held, None, false);
        self.settle(now);
        Ok(id)
    }

    /// Starts a balanced shard group named `set` over `keys`: the members campaigning
    /// for the same set share it, each holding `floor` or `ceil(keys / members)` once
    /// settled (see the [module docs](crate::holder::campaign)). Its presence keys are
    /// `<set>-member-<i>`, one per shard, configured like the first key.
    pub fn add_balanced_group(
        &mut self,
        now: Instant,
        set: &str,
        keys: Vec<HolderConfig>,
    ) -> Result<GroupId, ErrorReply> {
        let Some(first) = keys.first() else {
            return Err(ErrorReply::new(
                ErrorKind::Invalid,
                "a campaign needs at least one key".to_string(),
            ));
        };
        let presence: Vec<HolderConfig> = (0..keys.len())
            .map(|i| HolderConfig {
                key: presence_key(set, i),
                ..first.clone()
            })
            .collect();
        let mut all = presence.clone();
        all.extend(keys.iter().cloned());
        self.check_group(&all)?;
        let presence = self.insert_group(now, presence, 1, None, true);
        let balance = Balance {
            presence,
            shed_at: now,
        };
        let id = self.insert_group(now, keys, usize::MAX, Some(balance), false);
        self.settle(now);
        Ok(id)
    }

    pub(super) fn check_group(&self, keys: &[HolderConfig]) -> Result<(), ErrorReply> {
        let invalid = |why: String| Err(ErrorReply::new(ErrorKind::Invalid, why));
        if keys.is_empty() {
            return invalid("a campaign needs at least one key".to_string());
        }
        let mut seen = BTreeSet::new();
        for config in keys {
            config.validate()?;
            if config.holder != self.holder {
                return invalid(format!(
                    "holder {:?} of key {:?} is not this campaign's holder {:?}",
                    config.holder, config.key, self.holder
                ));
            }
            if self.claimed.contains_key(&config.key) || !seen.insert(config.key.as_str()) {
                return invalid(format!(
                    "key {:?} already has a campaign of holder {:?}: one holder ID \
                     campaigns for a key once",
                    config.key, self.holder
                ));
            }
        }
        Ok(())
    }

    pub(super) fn insert_group(
        &mut self,
        now: Instant,
        mut keys: Vec<HolderConfig>,
        max_held: usize,
        balance: Option<Balance>,
        presence: bool,
    ) -> GroupId {
        let id = GroupId(self.next_group);
        self.next_group += 1;
        spread_renewals(&mut keys);
        let health = Health {
            unhealthy_for: keys.first().map_or(Duration::ZERO, |c| c.ttl),
            since: None,
        };
        for config in &keys {
            self.claimed.insert(config.key.clone(), id);
            let key = config.key.clone();
            self.handoffs.watch(now, key, &mut self.events);
        }
        self.vacancies = true;
        self.groups.insert(
            id,
            Group {
                keys,
                max_held: max_held.max(1),
                balance,
                stopping: false,
                failed: BTreeSet::new(),
                deferred: VecDeque::new(),
                gated_in_flight: 0,
                health,
                presence,
                campaigning_since: now,
            },
        );
        id
    }

    /// Stops one group: its holders step down and release what they hold; then
    /// [`CampaignEvent::Finished`].
    pub fn handle_stop_group(&mut self, now: Instant, group: GroupId) {
        let Some(g) = self.groups.get_mut(&group) else {
            return;
        };
        g.stopping = true;
        let presence = g.balance.map(|b| b.presence);
        for (key, candidacy) in self
            .candidacies
            .iter_mut()
            .filter(|(_, s)| s.group == group)
        {
            candidacy.holder.handle_stop(now);
            self.touched.insert(key.clone());
        }
        // A balanced group leaves its set: its presence goes with it.
        if let Some(presence) = presence {
            self.handle_stop_group(now, presence);
        }
        self.settle(now);
    }

    /// Hands every key `group` holds over: each steps down
    /// ([`StepDownReason::HandedOver`]) and is released now, and the group asks for
    /// it again only a campaign interval after the release, so a member waiting for
    /// the key (woken by the release's change event) is elected first. The group
    /// goes on campaigning.
    pub fn handle_hand_over(&mut self, now: Instant, group: GroupId) {
        for (_, key) in self.holding(group, now) {
            if let Some(candidacy) = self.candidacies.get_mut(&key) {
                candidacy.holder.handle_hand_over(now);
                candidacy.shed = true;
                self.touched.insert(key);
            }
        }
        self.settle(now);
    }

    /// Stops every group.
    pub fn handle_stop(&mut self, now: Instant) {
        let groups: Vec<GroupId> = self.groups.keys().copied().collect();
        for group in groups {
            self.handle_stop_group(now, group);
        }
    }

    /// The application has stopped writing under revoked `key` (see
    /// [`StepDownReason::Revoked`], [`StepDownReason::Unhealthy`]): it writes no more
    /// under that tenure, so the lease is released now rather than at its deadline.
    /// A key not being revoked is left alone.
    pub fn handle_stopped_writing(&mut self, now: Instant, key: &str) {
        if let Some(candidacy) = self.candidacies.get_mut(key)
            && candidacy.holder.revoked_until().is_some()
        {
            candidacy.holder.handle_stop(now);
            self.touched.insert(key.to_string());
            self.settle(now);
        }
    }

    /// Drops the candidacies whose holder is done; a key shed for balance waits a
    /// campaign interval from its release before it is asked for again.
    pub(super) fn remove_finished(&mut self, now: Instant) {
        let finished: Vec<String> = self
            .drained
            .iter()
            .filter(|k| self.candidacies.get(*k).is_some_and(|s| s.holder.is_done()))
            .cloned()
            .collect();
        for key in finished {
            let Some(candidacy) = self.candidacies.remove(&key) else {
                continue;
            };
            self.timers.remove(&key);
            // A holder done owns nothing (its step-down said so already, if it did).
            if self.owned.contains(&key) {
                lead(&mut self.owned, &mut self.events, &key, false);
            }
            self.vacancies = true;
            if candidacy.shed {
                let wait = candidacy.holder.config().campaign_every;
                self.cooldown.insert(key, now + wait);
            }
        }
    }

    /// Sends queued campaign acquires while there is room under each group's cap;
    /// cancels those whose holder stopped campaigning. Returns whether it cancelled
    /// any (that holder may act on it).
    pub(super) fn pump(&mut self, now: Instant) -> bool {
        let mut cancelled = false;
        let ids: Vec<GroupId> = self.groups.keys().copied().collect();
        for id in ids {
            // An unhealthy group campaigns for nothing.
            let g = &self.groups[&id];
            if g.deferred.is_empty() {
                continue;
            }
            let room = match g.health.since {
                Some(_) => 0,
                None => self
                    .cap(id, now)
                    .saturating_sub(self.held_count(id, now))
                    .min(MAX_CAMPAIGNS_IN_FLIGHT),
            };
            let Some(group) = self.groups.get_mut(&id) else {
                continue;
            };
            let mut kept = VecDeque::new();
            while let Some((key, request, expires)) = group.deferred.pop_front() {
                let Some(candidacy) = self.candidacies.get_mut(&key) else {
                    continue;
                };
                if !candidacy.holder.waits_for(request.id) {
                    continue;
                } else if candidacy.holder.status() != HolderStatus::Campaigning || now >= expires {
                    // Stopped, or waited here as long as the holder would wait for an
                    // answer: it was never sent, and the holder hears so.
                    candidacy.holder.handle_cancel(now, request.id);
                    self.touched.insert(key);
                    cancelled = true;
                } else if group.gated_in_flight < room {
                    group.gated_in_flight += 1;
                    self.out
                        .send(now, &key, candidacy, true, &self.renew_unclear, request);
                } else {
                    kept.push_back((key, request, expires));
                }
            }
            group.deferred = kept;
        }
        cancelled
    }

    /// Ends the groups with nothing left to do (a balanced set after its presence).
    pub(super) fn finish_groups(&mut self, now: Instant) {
        loop {
            // A balanced set whose every key was refused for good leaves the set.
            let abandoned: Vec<GroupId> = self
                .groups
                .values()
                .filter(|g| g.failed.len() == g.keys.len())
                .filter_map(|g| g.balance.map(|b| b.presence))
                .filter(|p| self.groups.get(p).is_some_and(|g| !g.stopping))
                .collect();
            for presence in abandoned {
                self.handle_stop_group(now, presence);
            }
            let finished: Vec<GroupId> = self
                .groups
                .iter()
                .filter(|(id, g)| {
                    let all_failed = g.failed.len() == g.keys.len();
                    let presence_gone = g
                        .balance
                        .is_none_or(|b| !self.groups.contains_key(&b.presence));
                    (g.stopping || all_failed)
                        && presence_gone
                        && g.deferred.is_empty()
                        && !self.candidacies.values().any(|s| s.group == **id)
                })
                .map(|(id, _)| *id)
                .collect();
            if finished.is_empty() {
                return;
            }
            for id in finished {
                if let Some(group) = self.groups.remove(&id) {
                    for config in group.keys {
                        self.claimed.remove(&config.key);
                        self.renew_unclear.remove(&config.key);
                        self.handoffs.unwatch(&config.key, &mut self.events);
                    }
                }
                self.events.push_back(CampaignEvent::Finished { group: id });
            }
        }
    }
}
