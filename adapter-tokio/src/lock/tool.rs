//! The tool's side of `lock`: the holder library's campaign wired to the core's
//! [`Lock`] machine, and its loop.

use std::time::Duration;

use async_nats::Client;
use dagnats_leases_core::holder::relay::Heard;
use dagnats_leases_core::holder::supervise::{Lock, LockEvent, WatchdogReport, lock_grace};
use tokio::sync::mpsc;

use super::args::{ENV_FENCE, ENV_HOLDER, ENV_KEY, LockArgs};
use super::channel::{WatchdogProc, send_line, start_watchdog};
use super::process::{Reaped, Signals, become_subreaper, reap_children, signal_command};
use super::say::{Say, exit_code, say_waiting};
use crate::clock;
use crate::exit::{EXIT_BAD_GRACE, EXIT_ERROR};
use crate::member::{Elector, Member, Semaphore};

/// What `lock` campaigns with: the key itself, or a slot of a semaphore.
enum Campaigner {
    One(Elector),
    Slots(Semaphore),
}

impl Campaigner {
    /// The next event of its keys as a supervisor hears it, with the key.
    async fn next(&mut self) -> Option<(String, Heard)> {
        match self {
            Self::One(e) => e.next_heard().await,
            Self::Slots(s) => s.next_heard().await,
        }
    }

    async fn stop(self) {
        match self {
            Self::One(e) => e.stop().await,
            Self::Slots(s) => s.stop().await,
        }
    }
}

/// Runs `lock`; returns the exit code. Messages go to stderr (JSON lines with
/// `json`).
pub async fn run(nats: Client, args: LockArgs, json: bool) -> u8 {
    let say = Say {
        json,
        key: args.key.clone(),
    };
    let ttl = args.ttl.unwrap_or(Duration::from_millis(args.ttl_ms));
    let grace = match lock_grace(ttl, args.grace) {
        Ok(grace) => grace,
        Err(e) => {
            say.say("exit", Some("invalid"), &e.to_string());
            return EXIT_BAD_GRACE;
        }
    };
    // Signals are taken before anything is sent: one that follows the first
    // acquire must be handled, never meet the default action and kill the tool
    // with its lease held.
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            say.say(
                "exit",
                Some("internal"),
                &format!("cannot handle signals: {e}"),
            );
            return EXIT_ERROR;
        }
    };
    let holder = args
        .holder
        .clone()
        .unwrap_or_else(|| Member::unique_id("lock"));
    let member = match Member::new(nats, holder.clone()) {
        Ok(m) => m.supervised(),
        Err(e) => {
            say.say("exit", Some(e.kind().as_str()), &e.to_string());
            return crate::exit::exit_code(&e);
        }
    };
    let started = match args.permits {
        None => member.elect(&args.key, ttl).map(Campaigner::One),
        Some(permits) => member
            .semaphore(&args.key, permits, ttl)
            .map(Campaigner::Slots),
    };
    let mut campaign = match started {
        Ok(e) => e,
        Err(e) => {
            say.say("exit", Some(e.kind().as_str()), &e.to_string());
            return crate::exit::exit_code(&e);
        }
    };
    // Orphans of a watchdog that died become this process's children.
    become_subreaper();

    let mut lock = Lock::new(grace, args.wait, clock::now());
    let mut watchdog: Option<WatchdogProc> = None;
    // After the watchdog died: what reaping the command's processes shows.
    let mut reaped: Option<mpsc::UnboundedReceiver<Reaped>> = None;
    loop {
        while let Some(event) = lock.poll_event() {
            let (held_key, fence) = lock.held().unwrap_or((&args.key, 0));
            let (held_key, other) = (held_key.to_string(), lock.named_holder().map(String::from));
            match event {
                LockEvent::Waiting(why) => say_waiting(&say, why, &args.key, other.as_deref()),
                LockEvent::StartWatchdog { deadline } => {
                    say.say(
                        "holding",
                        None,
                        &format!(
                            "holding {held_key} as {holder} (fence {fence}); running {}",
                            args.command[0]
                        ),
                    );
                    let env = [
                        (ENV_KEY, held_key.clone()),
                        (ENV_HOLDER, holder.clone()),
                        (ENV_FENCE, fence.to_string()),
                    ];
                    match start_watchdog(&args, grace, deadline, env) {
                        Ok(g) => watchdog = Some(g),
                        Err(e) => {
                            campaign.stop().await;
                            say.say(
                                "exit",
                                Some("internal"),
                                &format!("cannot start the watchdog: {e}"),
                            );
                            return EXIT_ERROR;
                        }
                    }
                }
                LockEvent::ToWatchdog(message) => {
                    if let Some(g) = &mut watchdog {
                        send_line(&mut g.to, message.to_line(clock::to_boot)).await;
                    }
                }
                LockEvent::Signal { pgid, signal } => signal_command(pgid, signal),
                LockEvent::WatchGroup { .. } => reaped = Some(reap_children()),
                LockEvent::Exit { exit, release } => {
                    let code = exit_code(&say, exit, &held_key, args.wait, other.as_deref());
                    if !release {
                        say.say(
                            "left_to_expire",
                            None,
                            &format!(
                                "the watchdog died before it could name the command's \
                                 processes: the lease on {held_key} is left to run out by its TTL"
                            ),
                        );
                        // Exit now: no release may go out, nor any renewal.
                        std::process::exit(code.into());
                    }
                    campaign.stop().await;
                    return code;
                }
            }
        }
        let wake = lock.poll_timeout();
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep(at.saturating_duration_since(clock::now())).await,
                None => futures::future::pending().await,
            }
        };
        tokio::select! {
            heard = campaign.next() => match heard {
                Some((key, heard)) => lock.handle_heard(clock::now(), &key, &heard),
                None => {
                    say.say("exit", Some("internal"), &format!("the campaign for {} ended", args.key));
                    return EXIT_ERROR;
                }
            },
            line = async { watchdog.as_mut().expect("guarded by the condition").from.next_line().await },
                if watchdog.is_some() && reaped.is_none() => match line {
                Ok(Some(line)) => {
                    if let Some(report) = WatchdogReport::parse(&line) {
                        lock.handle_report(clock::now(), report);
                    }
                }
                // The channel closed: the watchdog is gone once it has exited (then its
                // orphans, if any, are this process's children).
                _ => {
                    if let Some(g) = &mut watchdog {
                        let _ = g.child.wait().await;
                    }
                    lock.handle_watchdog_gone(clock::now());
                    if reaped.is_none() {
                        watchdog = None;
                    }
                }
            },
            Some(seen) = async { reaped.as_mut().expect("guarded by the condition").recv().await },
                if reaped.is_some() => {
                if let Reaped::None = seen {
                    lock.handle_group_empty(clock::now());
                }
            }
            () = sleep => lock.handle_timeout(clock::now()),
            signal = signals.recv() => lock.handle_signal(clock::now(), signal),
        }
    }
}
