//! What the holder world checks after every step (the invariants of the module
//! docs), against the stream's log.

use super::{Grouping, HolderWorld, Machine, Nodes};
use crate::holder::Tenure;
use crate::sim::MsgKind;

impl HolderWorld {
    /// Whether every member in the set holds the floor or the ceiling of the
    /// shards, and every shard is held.
    pub(super) fn balanced(&self) -> bool {
        let Nodes::Members { shards, .. } = self.p.nodes else {
            return false;
        };
        let joined: Vec<usize> = (0..self.holders.len())
            .filter(|h| {
                matches!(
                    self.holders[*h].machine,
                    Machine::Member { group: Some(_), .. }
                )
            })
            .collect();
        let shares = self.shares();
        let (floor, ceil) = (
            shards / joined.len().max(1),
            shards.div_ceil(joined.len().max(1)),
        );
        joined.iter().all(|h| (floor..=ceil).contains(&shares[*h]))
            && shares.iter().sum::<usize>() == shards
    }

    /// Checks the invariants at the current instant: every key a node believes it
    /// owns is its on the server, uninterrupted since the tenure began; no two nodes
    /// believe they own one key; no member believes more than its cap.
    pub(super) fn check(&mut self) -> Result<(), String> {
        for m in &self.js.log[self.runs_read..] {
            let writer = (m.kind == MsgKind::Value)
                .then(|| m.record().map(|r| r.holder))
                .flatten();
            let runs = self.runs.entry(m.key.clone()).or_default();
            match runs.last_mut() {
                Some(last) if writer.is_some() && last.2 == writer => last.1 = m.seq,
                _ => runs.push((m.seq, m.seq, writer)),
            }
        }
        self.runs_read = self.js.log.len();
        let mut believers: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        for h in 0..self.holders.len() {
            let now = self.holder_now(h, self.t);
            let sim = &self.holders[h];
            let believed = sim.machine.believed(&sim.configs, now);
            if let Nodes::Members {
                max_held, grouping, ..
            } = self.p.nodes
                && grouping != Grouping::Balanced
                && believed.len() > max_held
            {
                return Err(format!(
                    "t={}ms: {} believes it owns {} keys, more than its cap {max_held}",
                    self.t,
                    sim.name,
                    believed.len()
                ));
            }
            for (key, own) in believed {
                believers.entry(key.clone()).or_default().push(h);
                self.check_owner(&sim.name, &key, own)?;
            }
        }
        self.stats.most_believers = self.stats.most_believers.max(believers.len());
        self.check_unhealthy_leases()?;
        if let Some(v) = self.violation.take() {
            return Err(v);
        }
        if let Some(&(joined, None)) = self.stats.rebalances.last()
            && self.t > joined
            && self.balanced()
        {
            let last = self.stats.rebalances.len() - 1;
            self.stats.rebalances[last].1 = Some(self.t - joined);
        }
        if let Some((key, hs)) = believers.iter().find(|(_, hs)| hs.len() > 1) {
            return Err(format!(
                "t={}ms: holders {hs:?} all believe they own {key}",
                self.t
            ));
        }
        Ok(())
    }

    /// A member unhealthy since T holds no lease on the server past T +
    /// `unhealthy_for` + two TTLs, and the slack of drift, timeouts and latency.
    fn check_unhealthy_leases(&self) -> Result<(), String> {
        let p = &self.p;
        let ttl_ms = p.ttl_s * 1000;
        let span = (p.unhealthy_for_ms + 2 * ttl_ms) as f64
            * (1.0 + 2.0 * p.actual_drift_ppm as f64 / 1e6);
        let bound = span as u64 + 2 * p.ttl_s * p.timeout_per_ttl_s + 4 * p.max_latency_ms + 1000;
        for sim in &self.holders {
            let Some(since) = sim.unhealthy_since else {
                continue;
            };
            if self.t <= since + bound {
                continue;
            }
            for config in &sim.configs {
                if let Some((record, revision)) = self.js.leased(&config.key)
                    && record.holder == sim.name
                {
                    return Err(format!(
                        "t={}ms: {} is unhealthy since t={since}ms and still holds {} \
                         (revision {revision}) on the server",
                        self.t, sim.name, config.key
                    ));
                }
            }
        }
        Ok(())
    }

    /// `name` believes it owns `key` in tenure `own`: the server must agree.
    fn check_owner(&self, name: &str, key: &str, own: Tenure) -> Result<(), String> {
        // The lease by its TTL: expired but not yet marked does not count.
        let Some((record, revision)) = self.js.leased(key) else {
            return Err(format!(
                "t={}ms: {name} believes it owns {key} (tenure {}, fence {}) but the \
                 server holds no lease",
                self.t, own.tenure, own.fence
            ));
        };
        if record.holder != name || revision < own.fence {
            return Err(format!(
                "t={}ms: {name} believes it owns {key} at fence {} but the server has \
                 {} at {revision}",
                self.t, own.fence, record.holder
            ));
        }
        let runs = self.runs.get(key).map(Vec::as_slice).unwrap_or_default();
        let from = runs.partition_point(|r| r.1 <= own.tenure);
        let interrupted = runs[from..]
            .iter()
            .take_while(|r| r.0 <= revision)
            .any(|r| r.2.as_deref() != Some(name));
        if interrupted {
            return Err(format!(
                "t={}ms: {name}'s tenure {} of {key} was interrupted on the server before \
                 revision {revision}",
                self.t, own.tenure
            ));
        }
        Ok(())
    }

    /// How many keys each node believes it owns now.
    pub fn shares(&self) -> Vec<usize> {
        (0..self.holders.len())
            .map(|h| {
                let now = self.holder_now(h, self.t);
                let sim = &self.holders[h];
                sim.machine.believed(&sim.configs, now).len()
            })
            .collect()
    }
}
