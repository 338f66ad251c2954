//! Semaphores: one of `permits` slot leases, a group of the slots that holds at
//! most one.

use super::*;

/// The most slots a semaphore may have.
pub const MAX_PERMITS: usize = 1024;

/// The key of slot `i` of semaphore `name`: `<name>-<i>`.
pub fn semaphore_slot(name: &str, i: usize) -> String {
    format!("{name}-{i}")
}

impl Campaign {
    /// Starts a semaphore: holds one of `permits` slots, the leases
    /// `<config.key>-<i>` for `i` below `permits` (see [`semaphore_slot`]), each with
    /// its own fence. It is a group of the slots that holds at most one, so its
    /// acquires go out one at a time and the slots take turns until one is granted;
    /// `permits` holders of the name hold a slot each, any more wait for a release or
    /// an expiry. Refused for `permits` outside 1 to [`MAX_PERMITS`], or a slot key
    /// outside the key bounds.
    pub fn add_semaphore(
        &mut self,
        now: Instant,
        config: HolderConfig,
        permits: usize,
    ) -> Result<GroupId, ErrorReply> {
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(ErrorReply::new(
                ErrorKind::Invalid,
                format!("permits must be 1 to {MAX_PERMITS}, got {permits}"),
            ));
        }
        let candidacies = (0..permits)
            .map(|i| HolderConfig {
                key: semaphore_slot(&config.key, i),
                ..config.clone()
            })
            .collect();
        self.add_group(now, candidacies, 1)
    }
}
