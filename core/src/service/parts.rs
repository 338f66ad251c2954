//! The parts other than the calls: startup's questions and the start of serving
//! from what it found, the coalescer's sends and results, the sweep's purges and
//! the replicas check's looks and switches, moved along in one pump, which every
//! input ends with, until nothing is left.

use super::*;

impl Service {
    /// Moves every part's outputs along, in one fixed order, until nothing is
    /// left: startup's, the presence machine's, the coalescer's and the calls they
    /// answer, admission's, the sweep's and the replicas check's, then the stop's
    /// drain. Every input ends here (see the [module docs](super)).
    pub(super) fn pump(&mut self, now: Instant) {
        // Startup first: the parts serving begins with are moved along below; the
        // stop last: its drain ends on the calls finished above.
        self.pump_startup(now);
        self.pump_peers();
        loop {
            let mut moved = false;
            while let Some(CoalescerEvent::Outcome { write, outcome }) =
                self.coalescer.as_mut().and_then(Coalescer::poll_event)
            {
                moved = true;
                // The call may have given up: nobody to tell then.
                if let Some(Route::Write(token)) = self.routes.get(&write).copied() {
                    self.routes.take(&write);
                    self.call_outcome(now, token, write, outcome);
                }
            }
            while let Some(t) = self
                .coalescer
                .as_mut()
                .and_then(|c| c.poll_transmit(&mut self.transmit_ids))
            {
                moved = true;
                self.send_routed(now, Part::Coalescer, t);
            }
            // A call admitted now may hand the coalescer a write: go round again.
            moved |= self.admit(now);
            if !moved {
                break;
            }
        }
        if self.stop.is_none() {
            self.pump_serving(now);
        }
        self.pump_stop(now);
    }

    /// The sweep's and the replicas check's outputs, while serving.
    fn pump_serving(&mut self, now: Instant) {
        while let Some(t) = self.sweep.poll_transmit(&mut self.transmit_ids) {
            self.send_routed(now, Part::Sweep, t);
        }
        while let Some(event) = self.sweep.poll_event() {
            self.sweep_event(event);
        }
        while let Some(t) = self
            .check
            .as_mut()
            .and_then(|c| c.poll_transmit(&mut self.transmit_ids))
        {
            self.send_routed(now, Part::Replicas, t);
        }
        while let Some(event) = self.check.as_mut().and_then(ReplicasCheck::poll_event) {
            match event {
                ReplicasCheckEvent::ConfirmReads { replicas, on } => {
                    #[cfg(any(test, feature = "__test"))]
                    let on = on && !self.config.unconfirmed_reads_for_tests;
                    self.call_config.confirm_reads = on;
                    self.events
                        .push_back(ServiceEvent::ConfirmReads { replicas, on });
                }
                ReplicasCheckEvent::StreamReplaced => {
                    if let Some(known) = &mut self.known {
                        known.clear();
                    }
                    self.events.push_back(ServiceEvent::StreamReplaced);
                }
                ReplicasCheckEvent::Reachable(reachable) => self.bucket = reachable,
                ReplicasCheckEvent::Sequence { stream, last_seq } => {
                    let shards = self.config.bucket.shards;
                    if let Some(i) = shards.indexes().find(|i| shards.stream(*i) == stream)
                        && let Some(floor) = self.floors.get_mut(i as usize)
                    {
                        *floor = (*floor).max(last_seq);
                    }
                    self.events
                        .push_back(ServiceEvent::StreamSequence { stream, last_seq })
                }
                ReplicasCheckEvent::Rewound(why) => self.refuse_bucket(why),
            }
        }
    }

    /// What the sweep reports, as metric facts and log lines.
    fn sweep_event(&mut self, event: TombstoneSweepEvent) {
        let (level, line) = match event {
            TombstoneSweepEvent::Failed { key, reason } => {
                return self.events.push_back(ServiceEvent::TombstoneLeft {
                    reason: "failed",
                    key,
                    detail: format!(
                        "the released key's purge failed ({reason}): a scan of the stream \
                         finds its tombstone"
                    ),
                });
            }
            TombstoneSweepEvent::Deferred { key } => {
                return self.events.push_back(ServiceEvent::TombstoneLeft {
                    reason: "deferred",
                    key,
                    detail: "too many tombstones queued: a scan of the stream finds this one"
                        .to_string(),
                });
            }
            TombstoneSweepEvent::ScanStarted { stream, reason } => (
                LogLevel::Debug,
                format!("scanning {stream} for tombstones left behind ({reason:?})"),
            ),
            TombstoneSweepEvent::Scanned {
                stream,
                read,
                found,
            } => (
                if found > 0 {
                    LogLevel::Info
                } else {
                    LogLevel::Debug
                },
                format!(
                    "scanned {stream}: {read} messages read, {found} tombstones left behind \
                     queued for their purge"
                ),
            ),
            TombstoneSweepEvent::ScanFailed { stream, reason } => (
                LogLevel::Warn,
                format!(
                    "the scan of {stream} for tombstones failed ({reason}); it resumes in \
                     {:?}",
                    crate::service::sweep::RETRY_AFTER
                ),
            ),
        };
        self.events.push_back(ServiceEvent::Log { level, line });
    }

    /// Startup's outputs; at its end, serving begins.
    fn pump_startup(&mut self, now: Instant) {
        let Phase::Starting(startup) = &mut self.phase else {
            return;
        };
        let ids = &mut self.transmit_ids;
        let sends: Vec<Transmit> = std::iter::from_fn(|| startup.poll_transmit(ids)).collect();
        for t in sends {
            self.send_routed(now, Part::Startup, t);
        }
        let Phase::Starting(startup) = &mut self.phase else {
            return;
        };
        let mut done = None;
        while let Some(event) = startup.poll_event() {
            match event {
                StartupEvent::Log(line) => self.events.push_back(ServiceEvent::Log {
                    level: LogLevel::Warn,
                    line,
                }),
                StartupEvent::Serve(mode) => {
                    done = Some((
                        mode,
                        startup.replicas(),
                        startup.atomic(),
                        startup.seen().to_vec(),
                    ));
                }
                StartupEvent::StartRefused(why) => {
                    self.events.push_back(ServiceEvent::StartRefused(why));
                }
            }
        }
        if let Some((mode, replicas, atomic, seen)) = done {
            self.serve(now, mode, replicas, atomic, &seen);
        }
    }

    /// The bucket is ensured: the mode, the confirm switch's start, the coalescer
    /// and the replicas check follow from what startup found.
    fn serve(
        &mut self,
        now: Instant,
        mode: Mode,
        replicas: usize,
        atomic: bool,
        seen: &[(Option<String>, u64)],
    ) {
        self.phase = Phase::Serving;
        self.mode = mode;
        if self.config.bucket.tenancy == Tenancy::Accounts
            && let Some(warning) = tenant::request_info_warning(&self.config.server_version)
        {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Warn,
                line: warning,
            });
        }
        // Writes gather into batches where the setting and the bucket say so, past
        // a window of singles that follows the replicas (`single_window`).
        let atomic = coalesce_on(self.config.coalesce_writes, atomic);
        if atomic {
            let config = CoalescerConfig {
                single_window: single_window(self.config.batch_after, replicas),
                min_batch: self.config.min_batch,
                max_batch: self.config.max_batch,
                max_in_flight: self.config.batches_in_flight,
                // Unique per process: the server keys open batches by id.
                ..CoalescerConfig::atomic(format!("{}-", self.config.instance_id))
            };
            self.coalescer = Some(Coalescer::new(config, now));
        }
        // The replicas are asked again now and then: read confirmation follows them.
        let check = (mode == Mode::Ready).then(|| {
            ReplicasCheck::new(
                self.config.replicas_recheck,
                self.config.kv_timeout,
                replicas,
                now,
            )
            .with_shards(self.config.bucket.shards)
            .with_seen(seen)
        });
        let confirm = check.as_ref().is_some_and(ReplicasCheck::confirm_reads);
        #[cfg(any(test, feature = "__test"))]
        let confirm = confirm && !self.config.unconfirmed_reads_for_tests;
        self.check = check;
        if mode == Mode::Ready {
            self.sweep.handle_serving(now);
        }
        self.call_config = CallConfig {
            mode,
            confirm_reads: confirm,
            ..self.call_config
        };
        self.events.push_back(ServiceEvent::Serving(Serving {
            mode,
            replicas,
            confirm_reads: confirm,
            atomic_batches: atomic,
        }));
    }
}
