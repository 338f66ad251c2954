//! The clock the adapters read: `CLOCK_BOOTTIME`, as an [`Instant`].
//!
//! `Instant` reads `CLOCK_MONOTONIC` on Linux, which stops while the machine is
//! suspended; the server's TTL does not. A holder that read it would wake from a
//! suspend longer than its lease still believing it owns the key. This clock counts
//! suspended time: [`now`] is the process's first reading of `Instant::now()` plus
//! the `CLOCK_BOOTTIME` time elapsed since, so it equals `Instant::now()` until the
//! first suspend and runs ahead of it by the time suspended after. Every deadline
//! the adapters hand a machine or arm a timer for is on this clock
//! ([`crate::runtime::Runtime::now`]).
//!
//! `CLOCK_BOOTTIME` is one clock for every process on the machine, so `lock` hands
//! its watchdog process deadlines as absolute readings of it ([`to_boot`],
//! [`from_boot`]).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `CLOCK_BOOTTIME` now: time since boot, suspended time included.
pub fn boottime() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// The instant and the boot time of this process's first reading.
fn base() -> (Instant, Duration) {
    static BASE: OnceLock<(Instant, Duration)> = OnceLock::new();
    *BASE.get_or_init(|| (Instant::now(), boottime()))
}

/// Now, counting time suspended.
pub fn now() -> Instant {
    let (instant, boot) = base();
    instant + boottime().saturating_sub(boot)
}

/// An instant of [`now`]'s clock as an absolute `CLOCK_BOOTTIME` reading.
pub fn to_boot(at: Instant) -> Duration {
    let (instant, boot) = base();
    boot + at.saturating_duration_since(instant)
}

/// An absolute `CLOCK_BOOTTIME` reading as an instant of [`now`]'s clock (a reading
/// from before this process's first one is taken as that one); `None` for a
/// reading so far ahead that no instant stands for it.
pub fn from_boot(at: Duration) -> Option<Instant> {
    let (instant, boot) = base();
    instant.checked_add(at.saturating_sub(boot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_readings_round_trip_and_follow_the_clock() {
        let at = now() + Duration::from_millis(1_500);
        let boot = to_boot(at);
        assert_eq!(from_boot(boot), Some(at));
        assert_eq!(from_boot(Duration::MAX), None, "out of range, not a panic");
        assert!(boot > boottime(), "a later instant is a later reading");
        let before = now();
        let after = now();
        assert!(after >= before);
    }
}
