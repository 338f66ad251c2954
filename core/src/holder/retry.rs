//! How a [`Holder`](super::Holder) spreads its retries: an owner's backoff after
//! transient failures, with a jitter seeded per key and holder ID.

use std::time::Duration;

/// How long an owner waits before it sends its renew again after the
/// `failures`-th transient failure in a row (`unavailable`, `internal`, no answer),
/// `room` being the time left until the last send whose reply, bounded by the
/// request timeout, still comes before its local deadline.
///
/// The first failure is retried after `retry_every`, as a blip always was. From the
/// second on, the wait doubles (`retry_every` × 2^(failures-1)) and a share of up to
/// half of it is added from `jitter` (a random draw the caller makes), so owners
/// that failed together do not come back together: a service refusing work under
/// load is not asked again by all of them each `retry_every`. The wait never
/// reaches past `room`, so the owner still tries to renew before its deadline; once
/// less than `retry_every` is left of it, the owner tries every `retry_every`, as
/// before, until it renews or steps down at its deadline.
pub fn owner_retry_delay(
    retry_every: Duration,
    failures: u32,
    jitter: u64,
    room: Duration,
) -> Duration {
    if failures <= 1 {
        return retry_every;
    }
    let base = retry_every.saturating_mul(1 << (failures - 1).min(16));
    // jitter / 2^64 of half the base, in nanoseconds, without floating point.
    let half = base.as_nanos() / 2;
    let spread = (half * u128::from(jitter)) >> 64;
    let wait = base.saturating_add(Duration::from_nanos(
        u64::try_from(spread).unwrap_or(u64::MAX),
    ));
    if room >= retry_every {
        wait.min(room)
    } else {
        retry_every
    }
}

/// The jitter a holder starts from: a hash (FNV-1a) of its key and holder ID, so
/// that holders differ without any randomness drawn in the core.
pub fn jitter_seed(key: &str, holder: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain([0]).chain(holder.bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
