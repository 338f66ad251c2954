//! What `lock` says on stderr (a sentence, or JSON lines) and the exit code it ends
//! with.

use std::time::Duration;

use dagnats_leases_core::holder::supervise::{LockExit, NotGranted};

use crate::exit::{EXIT_ERROR, EXIT_LEASE_LOST, EXIT_NO_SERVER, EXIT_NOT_HELD};

/// How `lock` tells what it does and how it ended, on stderr (stdout is the
/// command's): a readable sentence, or with `--json` one JSON object a line,
/// `{"event", "key", "message"}` and `kind` (snake_case) for a failure.
#[derive(Debug, Clone)]
pub(super) struct Say {
    pub(super) json: bool,
    pub(super) key: String,
}

impl Say {
    pub(super) fn say(&self, event: &str, kind: Option<&str>, message: &str) {
        if self.json {
            let mut line = serde_json::json!({"event": event, "key": self.key, "message": message});
            if let Some(kind) = kind {
                line["kind"] = kind.into();
            }
            eprintln!("{line}");
        } else {
            eprintln!("dagnats-leases: {message}");
        }
    }
}

/// The sentence `lock` says while it campaigns, for a refusal unlike the last.
pub(super) fn say_waiting(say: &Say, why: NotGranted, key: &str, holder: Option<&str>) {
    match why {
        NotGranted::Held => say.say(
            "waiting",
            None,
            &format!(
                "waiting for {key} (held by {})",
                holder.unwrap_or("another holder")
            ),
        ),
        NotGranted::NoService => say.say(
            "waiting",
            Some("no_service"),
            &format!(
                "no lease service answers on {}: trying again",
                dagnats_leases_core::wire::Endpoint::Acquire.subject()
            ),
        ),
        NotGranted::NoAnswer => say.say(
            "waiting",
            Some("no_answer"),
            "the lease service gave no usable answer: trying again",
        ),
    }
}

/// The exit code for how `lock` ended, with the sentence said on stderr.
pub(super) fn exit_code(
    say: &Say,
    exit: LockExit,
    key: &str,
    wait: Option<Duration>,
    holder: Option<&str>,
) -> u8 {
    let waited = humantime::format_duration(wait.unwrap_or_default());
    let (code, kind, message) = match exit {
        LockExit::Command(code) => (code, None, format!("the command exited with {code}")),
        LockExit::LeaseLost => (
            EXIT_LEASE_LOST,
            Some("lost"),
            format!("lost {key}: the command was stopped (or never started)"),
        ),
        LockExit::NotHeld => (
            EXIT_NOT_HELD,
            Some("not_held"),
            format!(
                "{key} is held by {} (waited {waited})",
                holder.unwrap_or("another holder")
            ),
        ),
        LockExit::NoService => (
            EXIT_NO_SERVER,
            Some("no_service"),
            format!(
                "no lease service answers on {} (waited {waited})",
                dagnats_leases_core::wire::Endpoint::Acquire.subject()
            ),
        ),
        LockExit::NoAnswer => (
            EXIT_ERROR,
            Some("no_answer"),
            format!("the lease service gave no usable answer for {key} (waited {waited})"),
        ),
        LockExit::Interrupted(signal) => (
            signal.exit_code(),
            Some("interrupted"),
            format!("{signal:?} before the command started"),
        ),
        LockExit::WatchdogGone => (
            EXIT_ERROR,
            Some("watchdog_gone"),
            "the watchdog process died: the command was stopped by lock".to_string(),
        ),
    };
    // The command's own end and an interrupt are not news in readable output.
    if say.json || !matches!(exit, LockExit::Command(_) | LockExit::Interrupted(_)) {
        say.say("exit", kind, &message);
    }
    code
}
