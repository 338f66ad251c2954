//! The channel between the tool and its watchdog: starting the watchdog process
//! with a socket pair as its stdin, and the lines sent over it.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use dagnats_leases_core::holder::supervise::WatchdogMessage;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};

use super::args::LockArgs;
use crate::clock;

/// The watchdog's side of the channel: the tool's socket, which is the watchdog's stdin.
pub(super) fn channel_from_stdin() -> io::Result<UnixStream> {
    let fd = io::stdin().as_fd().try_clone_to_owned()?;
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_nonblocking(true)?;
    UnixStream::from_std(stream)
}

pub(super) async fn send_line(to: &mut OwnedWriteHalf, line: String) {
    // A peer that is gone shows as the end of its lines; nothing to do here.
    let _ = to.write_all(format!("{line}\n").as_bytes()).await;
}

/// The watchdog as the tool runs it.
pub(super) struct WatchdogProc {
    pub(super) child: Child,
    pub(super) to: OwnedWriteHalf,
    pub(super) from: Lines<BufReader<OwnedReadHalf>>,
}

/// Starts the watchdog under `deadline`, the command's environment set.
pub(super) fn start_watchdog(
    args: &LockArgs,
    grace: Duration,
    deadline: Instant,
    env: [(&str, String); 3],
) -> io::Result<WatchdogProc> {
    let exe = std::env::current_exe()?;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let child = Command::new(exe)
        .arg("__lock-watchdog")
        .args(["--grace-ms", &grace.as_millis().to_string()])
        .args([
            "--deadline",
            &WatchdogMessage::clock_arg(clock::to_boot(deadline)),
        ])
        .arg("--")
        .args(&args.command)
        .envs(env)
        .stdin(std::process::Stdio::from(OwnedFd::from(theirs)))
        .process_group(0)
        .spawn()?;
    let (from, to) = UnixStream::from_std(ours)?.into_split();
    Ok(WatchdogProc {
        child,
        to,
        from: BufReader::new(from).lines(),
    })
}
