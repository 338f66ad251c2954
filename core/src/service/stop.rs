//! The stop ([`Service::handle_stop`]): the intake closed, the drain, the cut-off
//! of calls still running, a flush asked once every reply is handed over, each
//! phase at its bound ([`Shutdown`]).

use super::*;

impl Service {
    /// Stop: take no more requests (the subscriptions go), answer every request
    /// already delivered, wait for the calls up to the drain's bound, then cut off
    /// what still runs, flush, and end. A second stop changes nothing.
    pub fn handle_stop(&mut self, now: Instant) {
        if self.stop.is_some() {
            return;
        }
        self.stop = Some(Shutdown::new(self.config.shutdown_timeout, now));
        self.events.push_back(ServiceEvent::Unsubscribe);
        self.admission.handle_stop(now);
        self.admit(now);
        let running = self.calls.len();
        if running > 0 {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Info,
                line: format!(
                    "stopping: waiting up to {:?} for {running} calls",
                    self.config.shutdown_timeout
                ),
            });
        }
        self.pump(now);
    }

    /// Every subscription of requests ended and the messages delivered before that
    /// are all fed: after the stop's unsubscribes, or earlier (the connection
    /// closed for good), in which case a stop later finds the intake closed.
    pub fn handle_intake_closed(&mut self, now: Instant) {
        self.intake_open = false;
        self.pump(now);
    }

    /// Stopping: the flush [`ServiceEvent::Flush`] asked for in `phase` is over:
    /// the client's writes of then are on the socket. It ends that phase only if
    /// the stop is still in it.
    pub fn handle_flushed(&mut self, now: Instant, phase: StopPhase) {
        if let Some(stop) = &mut self.stop
            && matches!(stop.phase(), StopPhase::Replies | StopPhase::Flush)
            && stop.phase() == phase
        {
            stop.handle_phase_over(now);
            self.stop_events(now);
        }
        self.pump(now);
    }

    /// Stopping, in a phase that ends with a flush: asks for it once every reply
    /// is handed to the client.
    pub(super) fn ask_flush(&mut self) {
        let Some(phase) = self.stop.as_ref().map(Shutdown::phase) else {
            return;
        };
        if matches!(phase, StopPhase::Replies | StopPhase::Flush)
            && self.flush_asked != Some(phase)
            && self.replies.is_empty()
        {
            self.flush_asked = Some(phase);
            self.events.push_back(ServiceEvent::Flush { phase });
        }
    }

    /// The drain ends once the intake is closed and every call answered; a flush
    /// waits for the replies.
    pub(super) fn pump_stop(&mut self, now: Instant) {
        self.ask_flush();
        let Some(stop) = &mut self.stop else {
            return;
        };
        if stop.phase() == StopPhase::Drain && !self.intake_open && self.calls.is_empty() {
            stop.handle_phase_over(now);
            self.stop_events(now);
        }
    }

    /// Acts on the stop machine's events and phase.
    pub(super) fn stop_events(&mut self, now: Instant) {
        let Some(stop) = &mut self.stop else {
            return;
        };
        let mut cut = false;
        let mut lines = Vec::new();
        while let Some(event) = stop.poll_event() {
            match event {
                ShutdownEvent::GaveUp(StopPhase::Drain)
                    if self.intake_open && self.calls.is_empty() =>
                {
                    lines.push(
                        "stopping: the endpoints did not close in time (NATS unreachable?)"
                            .to_string(),
                    )
                }
                ShutdownEvent::GaveUp(phase) => {
                    lines.push(format!("stopping: gave up waiting in phase {phase:?}"))
                }
                ShutdownEvent::CutOff => cut = true,
            }
        }
        let phase = stop.phase();
        let left_drain = phase != StopPhase::Drain;
        if left_drain && self.late > 0 {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Info,
                line: format!(
                    "stopping: took {} requests delivered before the unsubscribe",
                    self.late
                ),
            });
            self.late = 0;
        }
        for line in lines {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Warn,
                line,
            });
        }
        if cut {
            self.cut_off(now);
        }
        match phase {
            StopPhase::Drain => {}
            StopPhase::Replies | StopPhase::Flush => self.ask_flush(),
            StopPhase::Stopped => {}
        }
    }

    /// Every call still running is cut off and answers `internal`.
    fn cut_off(&mut self, now: Instant) {
        if !self.calls.is_empty() {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Warn,
                line: format!(
                    "stopping: {} calls did not finish in time; they are answered `internal`",
                    self.calls.len()
                ),
            });
        }
        let mut tokens: Vec<CallId> = self.calls.keys().copied().collect();
        tokens.sort_unstable();
        for token in tokens {
            if let Some(running) = self.calls.get_mut(&token) {
                running.call.handle_stop(now);
                self.drive(now, token);
            }
        }
    }
}
