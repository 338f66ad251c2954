//! A world of `lock` runs: tools (the real [`Holder`] and [`Lock`]) with watchdogs (the
//! real [`Supervisor`]) and simulated commands, campaigning for one key against a
//! **stand-in lease service** (an in-memory lease table with the contract's
//! acquire, renew and release, its TTL counted from when a write arrives). The
//! holder's own safety against the real service is the holder worlds' job; this
//! world checks what `lock` adds: no process of a command runs while the server
//! does not hold the lease for its tool, and a tool releases only once every
//! process of its command is gone. Faults: tools frozen (SIGSTOP) or killed, watchdogs
//! killed, requests and replies lost or slow, commands that ignore SIGTERM or leave
//! children behind.

use crate::holder::supervise::NotGranted;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::stand_in::{Rng, StandIn, TTL_MS};
use crate::holder::supervise::{
    GroupSignal, Lock, LockEvent, LockExit, StopCause, Supervisor, SupervisorEvent,
    WatchdogMessage, WatchdogReport,
};
use crate::holder::{Holder, HolderConfig, HolderEvent};
use crate::io::{RequestOutcome, TransmitId};
use crate::test_support::HolderRequest;
use crate::wire::Endpoint;

const KEY: &str = super::stand_in::KEY;
const GRACE: Duration = Duration::from_millis(1_000);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// The tool is frozen (SIGSTOP) for a while, from `at`.
    PauseTool {
        at: u64,
        for_ms: u64,
    },
    /// The tool is SIGKILLed at `at`.
    KillTool {
        at: u64,
    },
    /// The watchdog is SIGKILLed at `at`.
    KillWatchdog {
        at: u64,
    },
}

struct Proc {
    alive: bool,
    ignores_term: bool,
    /// Dies of a SIGTERM it does not ignore at this time.
    dies_at: Option<u64>,
}

struct Watchdog {
    supervisor: Supervisor,
    alive: bool,
    inbox: VecDeque<(u64, WatchdogMessage)>,
    leader_seen: bool,
    tool_gone_seen: bool,
}

struct Tool {
    name: String,
    holder: Holder,
    lock: Lock,
    fault: Fault,
    dead: bool,
    watchdog: Option<Watchdog>,
    /// Reports on their way from the watchdog.
    reports: VecDeque<(u64, WatchdogReport)>,
    watchdog_gone_told: bool,
    watching: bool,
    /// The command's processes; the first is the leader.
    procs: Vec<Proc>,
    /// The leader exits by itself at this time.
    leader_exits_at: Option<u64>,
    exited: Option<LockExit>,
}

/// What the world saw, for the coverage check.
#[derive(Debug, Default)]
struct Stats {
    commands: u64,
    kills: u64,
    stopped_at_deadline: u64,
    watchdog_takeovers: u64,
    tools_killed: u64,
    exits: std::collections::BTreeMap<String, u64>,
}

struct World {
    rng: Rng,
    t: u64,
    base: Instant,
    server: StandIn,
    tools: Vec<Tool>,
    /// (arrive at, tool, request id, endpoint, body) on their way to the service.
    requests: Vec<(u64, usize, TransmitId, Endpoint, Vec<u8>)>,
    /// (arrive at, tool, request id, reply) on their way back.
    replies: Vec<(u64, usize, TransmitId, RequestOutcome)>,
    next_tool_at: u64,
    stats: Stats,
}

impl World {
    fn new(seed: u64) -> Self {
        Self {
            rng: Rng::new(seed),
            t: 0,
            base: Instant::now(),
            server: StandIn::new(false),
            tools: Vec::new(),
            requests: Vec::new(),
            replies: Vec::new(),
            next_tool_at: 0,
            stats: Stats::default(),
        }
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.t)
    }

    fn latency(&mut self) -> u64 {
        self.rng.latency()
    }

    fn spawn_tool(&mut self) {
        let i = self.tools.len();
        let name = format!("lock-{i}");
        let config = HolderConfig::new(KEY, &name, Duration::from_millis(TTL_MS));
        let now = self.now();
        let at = self.t + self.rng.below(3 * TTL_MS);
        let fault = match self.rng.below(5) {
            0 => Fault::PauseTool {
                at,
                for_ms: 500 + self.rng.below(2 * TTL_MS),
            },
            1 => Fault::KillTool { at },
            2 => Fault::KillWatchdog { at },
            _ => Fault::None,
        };
        self.tools.push(Tool {
            holder: Holder::new(config, now).expect("a valid config"),
            lock: Lock::new(GRACE, None, now),
            name,
            fault,
            dead: false,
            watchdog: None,
            reports: VecDeque::new(),
            watchdog_gone_told: false,
            watching: false,
            procs: Vec::new(),
            leader_exits_at: None,
            exited: None,
        });
    }

    fn paused(&self, i: usize) -> bool {
        matches!(self.tools[i].fault, Fault::PauseTool { at, for_ms }
            if self.t >= at && self.t < at + for_ms)
    }

    fn run(&mut self, until_ms: u64) -> Result<(), String> {
        while self.t < until_ms {
            if self.t >= self.next_tool_at
                && self
                    .tools
                    .iter()
                    .filter(|t| t.exited.is_none() && !t.dead)
                    .count()
                    < 3
            {
                self.spawn_tool();
                self.next_tool_at = self.t + self.rng.below(2 * TTL_MS);
            }
            self.deliver_requests();
            for i in 0..self.tools.len() {
                self.step_procs(i);
                self.step_watchdog(i);
                self.step_tool(i)?;
            }
            self.check()?;
            self.t += 1;
        }
        Ok(())
    }

    fn deliver_requests(&mut self) {
        let due: Vec<_> = {
            let (due, later) = std::mem::take(&mut self.requests)
                .into_iter()
                .partition(|r| r.0 <= self.t);
            self.requests = later;
            due
        };
        for (_, i, id, endpoint, body) in due {
            let response = self.server.handle(self.t, endpoint, &body);
            if !self.rng.chance(5) {
                let at = self.t + self.latency();
                self.replies
                    .push((at, i, id, RequestOutcome::reply(response.to_json())));
            }
        }
    }

    fn signal(&mut self, i: usize, signal: GroupSignal) {
        let t = self.t;
        for p in 0..self.tools[i].procs.len() {
            let delay = self.rng.below(300);
            let proc = &mut self.tools[i].procs[p];
            if !proc.alive {
                continue;
            }
            match signal {
                GroupSignal::Kill => {
                    proc.alive = false;
                    self.stats.kills += 1;
                }
                _ if proc.ignores_term => {}
                _ => {
                    proc.dies_at.get_or_insert(t + delay);
                }
            }
        }
    }

    fn step_procs(&mut self, i: usize) {
        let t = self.t;
        let tool = &mut self.tools[i];
        if tool.leader_exits_at.is_some_and(|at| t >= at)
            && let Some(leader) = tool.procs.first_mut()
        {
            leader.alive = false;
        }
        for p in &mut tool.procs {
            if p.dies_at.is_some_and(|at| t >= at) {
                p.alive = false;
            }
        }
    }

    fn step_watchdog(&mut self, i: usize) {
        let (t, now) = (self.t, self.now());
        if matches!(self.tools[i].fault, Fault::KillWatchdog { at } if t >= at)
            && let Some(g) = &mut self.tools[i].watchdog
            && g.alive
        {
            g.alive = false;
        }
        let tool = &mut self.tools[i];
        let tool_gone = tool.dead;
        let leader_code = tool.procs.first().filter(|p| !p.alive).map(|_| 0);
        let empty = tool.procs.iter().all(|p| !p.alive);
        let Some(g) = tool.watchdog.as_mut().filter(|g| g.alive) else {
            return;
        };
        while g.inbox.front().is_some_and(|m| m.0 <= t) {
            match g.inbox.pop_front().expect("a message").1 {
                WatchdogMessage::Deadline(d) => g.supervisor.handle_deadline(now, d),
                WatchdogMessage::Lost => g.supervisor.handle_lost(now),
                WatchdogMessage::Signal(s) => g.supervisor.handle_signal(now, s),
            }
        }
        if tool_gone && !g.tool_gone_seen {
            g.tool_gone_seen = true;
            g.supervisor.handle_tool_gone(now);
        }
        if let Some(code) = leader_code
            && !g.leader_seen
        {
            g.leader_seen = true;
            g.supervisor.handle_leader_exited(now, code);
        }
        if empty {
            g.supervisor.handle_group_empty(now);
        }
        if g.supervisor.poll_timeout().is_some_and(|at| now >= at) {
            g.supervisor.handle_timeout(now);
        }
        let mut signals = Vec::new();
        let mut finished = None;
        while let Some(event) = g.supervisor.poll_event() {
            match event {
                SupervisorEvent::Signal(s) => signals.push(s),
                SupervisorEvent::Report(report @ WatchdogReport::Finished { .. }) => {
                    finished = Some(report)
                }
                // Started before the world's watchdog runs (see `LockEvent::StartWatchdog`).
                SupervisorEvent::Start
                | SupervisorEvent::Report(WatchdogReport::Started { .. }) => {}
            }
        }
        if let Some(report) = finished {
            if let WatchdogReport::Finished {
                stopped: Some(StopCause::DeadlineNear),
                ..
            } = report
            {
                self.stats.stopped_at_deadline += 1;
            }
            tool.reports.push_back((t + 1, report));
            g.alive = false;
        }
        for s in signals {
            self.signal(i, s);
        }
    }

    fn step_tool(&mut self, i: usize) -> Result<(), String> {
        let (t, now) = (self.t, self.now());
        if matches!(self.tools[i].fault, Fault::KillTool { at } if t >= at) && !self.tools[i].dead {
            self.tools[i].dead = true;
            self.stats.tools_killed += 1;
        }
        if self.tools[i].dead || self.paused(i) || self.tools[i].holder.is_done() {
            return Ok(());
        }
        // Replies due.
        let due: Vec<_> = {
            let (due, later) = std::mem::take(&mut self.replies)
                .into_iter()
                .partition(|r| r.0 <= t && r.1 == i);
            self.replies = later;
            due
        };
        let Self {
            rng,
            tools,
            stats,
            requests,
            ..
        } = self;
        let tool = &mut tools[i];
        for (_, _, id, outcome) in due {
            tool.holder.handle_outcome(now, id, outcome);
        }
        while tool.reports.front().is_some_and(|r| r.0 <= t) {
            let report = tool.reports.pop_front().expect("a report").1;
            tool.lock.handle_report(now, report);
        }
        let watchdog_gone = tool.watchdog.as_ref().is_some_and(|g| !g.alive);
        if watchdog_gone && tool.reports.is_empty() && !tool.watchdog_gone_told {
            tool.watchdog_gone_told = true;
            tool.lock.handle_watchdog_gone(now);
        }
        if tool.watching && tool.procs.iter().all(|p| !p.alive) {
            tool.lock.handle_group_empty(now);
        }
        if tool.holder.poll_timeout().is_some_and(|at| now >= at) {
            tool.holder.handle_timeout(now);
        }
        if tool.lock.poll_timeout().is_some_and(|at| now >= at) {
            tool.lock.handle_timeout(now);
        }
        while let Some(event) = tool.holder.poll_event() {
            match event {
                HolderEvent::Elected { deadline, .. } => {
                    tool.lock.handle_elected(now, Some(deadline))
                }
                HolderEvent::Renewed { deadline, .. } => tool.lock.handle_deadline(now, deadline),
                HolderEvent::SteppedDown { .. } => tool.lock.handle_lost(now),
                HolderEvent::NotGranted { holder, answer } => tool
                    .lock
                    .handle_not_granted(now, NotGranted::of(holder.is_some(), answer)),
                HolderEvent::Failed { kind, message } => {
                    return Err(format!("{} failed: {kind}: {message}", tool.name));
                }
            }
        }
        let mut signals = Vec::new();
        while let Some(event) = tool.lock.poll_event() {
            match event {
                LockEvent::StartWatchdog { deadline } => {
                    let mut supervisor = Supervisor::new(deadline, GRACE, now);
                    if supervisor.poll_event() != Some(SupervisorEvent::Start) {
                        return Err(format!("{} started with too little left", tool.name));
                    }
                    tool.watchdog = Some(Watchdog {
                        supervisor,
                        alive: true,
                        inbox: VecDeque::new(),
                        leader_seen: false,
                        tool_gone_seen: false,
                    });
                    let children = rng.below(3);
                    tool.procs = (0..=children)
                        .map(|_| Proc {
                            alive: true,
                            ignores_term: rng.chance(30),
                            dies_at: None,
                        })
                        .collect();
                    tool.leader_exits_at =
                        (!rng.chance(40)).then(|| t + 100 + rng.below(3 * TTL_MS));
                    tool.reports.push_back((
                        t + 1,
                        WatchdogReport::Started {
                            pgid: 100 + i as u32,
                        },
                    ));
                    stats.commands += 1;
                }
                LockEvent::Waiting(_) => {}
                LockEvent::ToWatchdog(m) => {
                    if let Some(g) = &mut tool.watchdog {
                        g.inbox.push_back((t + 1, m));
                    }
                }
                LockEvent::Signal { signal, .. } => signals.push(signal),
                LockEvent::WatchGroup { .. } => {
                    tool.watching = true;
                    stats.watchdog_takeovers += 1;
                }
                LockEvent::Exit { exit, release } => {
                    if release && tool.procs.iter().any(|p| p.alive) {
                        return Err(format!(
                            "t={t}: {} releases while its command runs ({exit:?})",
                            tool.name
                        ));
                    }
                    tool.exited = Some(exit);
                    *stats.exits.entry(format!("{exit:?}")).or_default() += 1;
                    if release {
                        tool.holder.handle_stop(now);
                    } else {
                        tool.dead = true;
                    }
                }
            }
        }
        while let Some(request) = tool.holder.poll_transmit().map(HolderRequest::from) {
            let lost = rng.chance(5);
            let at = t + rng.latency();
            if !lost {
                requests.push((at, i, request.id, request.endpoint, request.body));
            }
        }
        for s in signals {
            self.signal(i, s);
        }
        Ok(())
    }

    /// No process of a command runs unless the server holds the key for its tool.
    fn check(&self) -> Result<(), String> {
        for tool in &self.tools {
            if tool.procs.iter().any(|p| p.alive)
                && self.server.held_by(self.t) != Some(tool.name.as_str())
            {
                return Err(format!(
                    "t={}: {}'s command runs but the server's lease is {:?} (until {}), fault {:?}",
                    self.t,
                    tool.name,
                    self.server.held_by(self.t),
                    self.server.expires_at,
                    tool.fault
                ));
            }
        }
        Ok(())
    }
}

#[test]
fn no_command_runs_past_its_lease_and_none_is_released_while_one_runs() {
    let mut total = Stats::default();
    for seed in 0..16 {
        let mut world = World::new(seed);
        if let Err(violation) = world.run(120_000) {
            panic!("seed {seed}: {violation}");
        }
        let s = world.stats;
        total.commands += s.commands;
        total.kills += s.kills;
        total.stopped_at_deadline += s.stopped_at_deadline;
        total.watchdog_takeovers += s.watchdog_takeovers;
        total.tools_killed += s.tools_killed;
        for (k, v) in s.exits {
            *total.exits.entry(k).or_default() += v;
        }
    }
    println!("lock worlds (16 x 120 s): {total:?}");
    // The faults happened and the rules were exercised, not only the happy path.
    assert!(total.commands >= 100, "{total:?}");
    assert!(total.kills > 0, "{total:?}");
    assert!(total.stopped_at_deadline > 0, "{total:?}");
    assert!(total.watchdog_takeovers > 0, "{total:?}");
    assert!(total.tools_killed > 0, "{total:?}");
    for exit in ["LeaseLost", "WatchdogGone", "Command(0)"] {
        assert!(total.exits.contains_key(exit), "no {exit} exit: {total:?}");
    }
}
