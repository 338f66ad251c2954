//! The watchdog's side of `lock`: the command run under the core's [`Supervisor`]
//! machine, and its loop.

use std::os::unix::process::CommandExt;
use std::time::Duration;

use dagnats_leases_core::holder::supervise::{
    StopCause, Supervisor, SupervisorEvent, WatchdogMessage, WatchdogReport,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use super::args::WatchdogArgs;
use super::channel::{channel_from_stdin, send_line};
use super::process::{BootTimer, Reaped, Signals, become_subreaper, reap_children, signal_command};
use crate::clock;
use crate::exit::EXIT_ERROR;

/// Runs `__lock-watchdog`: the command in its own process group, stopped at the
/// deadline; returns the command's code. The caller must then exit the process
/// without dropping the runtime (`std::process::exit`).
pub async fn watchdog(args: WatchdogArgs) -> u8 {
    let Some(deadline) =
        WatchdogMessage::parse_clock_arg(&args.deadline).and_then(clock::from_boot)
    else {
        eprintln!("dagnats-leases: __lock-watchdog: bad --deadline");
        return EXIT_ERROR;
    };
    let grace = Duration::from_millis(args.grace_ms);
    let (from_tool, mut to_tool) = match channel_from_stdin() {
        Ok(stream) => stream.into_split(),
        Err(e) => {
            eprintln!("dagnats-leases: __lock-watchdog: stdin is not lock's channel: {e}");
            return EXIT_ERROR;
        }
    };
    let (mut signals, mut timer) = match (Signals::new(), BootTimer::new()) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("dagnats-leases: __lock-watchdog: {e}");
            return EXIT_ERROR;
        }
    };
    become_subreaper();
    let mut supervisor = Supervisor::new(deadline, grace, clock::now());
    // The command's first process, whose PID is its group's ID; 0 until started.
    let mut pgid = 0;
    let mut reaped: Option<mpsc::UnboundedReceiver<Reaped>> = None;
    let mut lines = BufReader::new(from_tool).lines();
    let mut tool_open = true;
    loop {
        while let Some(event) = supervisor.poll_event() {
            match event {
                SupervisorEvent::Start => {
                    let child = std::process::Command::new(&args.command[0])
                        .args(&args.command[1..])
                        .stdin(std::process::Stdio::null())
                        .process_group(0)
                        .spawn();
                    match child {
                        Ok(c) => {
                            pgid = c.id();
                            reaped = Some(reap_children());
                            supervisor.handle_started(clock::now(), pgid);
                        }
                        Err(e) => {
                            eprintln!("dagnats-leases: cannot run {}: {e}", args.command[0]);
                            supervisor.handle_start_failed(clock::now());
                        }
                    }
                }
                SupervisorEvent::Signal(signal) => signal_command(pgid, signal),
                SupervisorEvent::Report(report) => {
                    send_line(&mut to_tool, report.to_line()).await;
                    if let WatchdogReport::Finished { code, stopped } = report {
                        if pgid == 0 && stopped == Some(StopCause::DeadlineNear) {
                            eprintln!(
                                "dagnats-leases: the lease has no more than --grace left: \
                                 not starting the command"
                            );
                        }
                        return code;
                    }
                }
            }
        }
        if let Some(wake) = supervisor.poll_timer()
            && let Err(e) = timer.arm(wake)
        {
            eprintln!("dagnats-leases: __lock-watchdog: cannot arm its timer: {e}");
            supervisor.handle_timer_failed(clock::now());
            continue;
        }
        tokio::select! {
            line = lines.next_line(), if tool_open => match line {
                Ok(Some(line)) => match WatchdogMessage::parse(&line, clock::from_boot) {
                    Some(WatchdogMessage::Deadline(at)) => supervisor.handle_deadline(clock::now(), at),
                    Some(WatchdogMessage::Lost) => supervisor.handle_lost(clock::now()),
                    Some(WatchdogMessage::Signal(s)) => supervisor.handle_signal(clock::now(), s),
                    None => {}
                },
                // The tool is gone: nobody renews the lease.
                _ => {
                    tool_open = false;
                    supervisor.handle_tool_gone(clock::now());
                }
            },
            Some(seen) = async { reaped.as_mut().expect("guarded by the condition").recv().await },
                if reaped.is_some() => match seen {
                Reaped::Exited { pid, code } => supervisor.handle_exited(clock::now(), pid, code),
                Reaped::None => supervisor.handle_group_empty(clock::now()),
            },
            fired = timer.fired() => match fired {
                Ok(()) => supervisor.handle_timeout(clock::now()),
                Err(e) => {
                    eprintln!("dagnats-leases: __lock-watchdog: its timer failed: {e}");
                    supervisor.handle_timer_failed(clock::now());
                }
            },
            signal = signals.recv() => supervisor.handle_signal(clock::now(), signal),
        }
    }
}
