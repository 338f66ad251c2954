//! How a [`Holder`](super::Holder) campaigns and renews: its config, the bounds it
//! is checked against, and the candidate priority's hold-back.

use std::time::Duration;

use crate::wire::{self, ErrorKind, ErrorReply};

/// The default bound on clock drift between a holder and the server: 1%, far more
/// than any NTP-disciplined clock drifts over one TTL.
pub const DEFAULT_MAX_CLOCK_DRIFT_PPM: u32 = 10_000;

/// A [`HolderConfig`] outside the contract's bounds: what
/// [`Holder::new`](super::Holder::new) and [`HolderConfig::validate`] refuse. A misuse of the API, not a wire reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

impl ConfigError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// What is wrong with the config, as a sentence.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid holder config: {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The wire checks of key, holder and TTL report an `invalid` reply; as a config
/// error only their sentence is kept.
impl From<ErrorReply> for ConfigError {
    fn from(reply: ErrorReply) -> Self {
        Self::new(reply.error)
    }
}

/// Where a config error becomes a reply (the campaign's API): `invalid`.
impl From<ConfigError> for ErrorReply {
    fn from(e: ConfigError) -> Self {
        Self::new(ErrorKind::Invalid, e.message)
    }
}

/// How a [`Holder`](super::Holder) campaigns and renews.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderConfig {
    /// The lease key.
    pub key: String,
    /// This process's holder ID (unique per process).
    pub holder: String,
    /// The lease TTL: whole seconds, 1 s to 10 min.
    pub ttl: Duration,
    /// How often to renew: ttl/3 by default.
    pub renew_every: Duration,
    /// How much sooner than `renew_every` a tenure's first renewal comes (zero by
    /// default; below `renew_every`). Keys won in one burst get different offsets,
    /// so their renewals stay spread for good while each renews every
    /// `renew_every` after its first: the spread costs one early renewal a tenure,
    /// not a shorter interval for ever.
    pub first_renewal_sooner: Duration,
    /// How long to wait before asking again when another holder has the key (ttl/3 by
    /// default; a change event for the key asks at once, see
    /// [`Holder::handle_change`](super::Holder::handle_change)).
    pub campaign_every: Duration,
    /// How long to wait after a failed request before trying again.
    pub retry_every: Duration,
    /// Bound on one request to the service.
    pub request_timeout: Duration,
    /// Bound on how much faster the server's clock may run than the holder's, in parts
    /// per million; the local deadline is shortened by this share of the TTL.
    pub max_clock_drift_ppm: u32,
    /// How long to hold back after a change event that may have freed the key before
    /// asking for it (zero by default): a candidate that holds back less, a preferred
    /// one, wins a free key while it is alive; see [`HolderConfig::with_priority`].
    pub hold_back: Duration,
}

/// The highest candidate priority: it holds back nothing ([`HolderConfig::with_priority`]).
pub const MAX_PRIORITY: u8 = 10;

/// How much longer a candidate holds back per step of priority below [`MAX_PRIORITY`].
/// Far more than a loopback or LAN round trip, so that the preferred candidate's
/// acquire, sent on the change event, is in before the next one's.
pub const PRIORITY_STEP: Duration = Duration::from_millis(100);

/// The most a candidate holds back: [`MAX_PRIORITY`] steps.
pub const MAX_HOLD_BACK: Duration = Duration::from_secs(1);

impl HolderConfig {
    /// The defaults for `ttl`: renew and campaign every ttl/3, retry after ttl/10 (0.1
    /// to 1 s), requests bounded by ttl/4 (at most 5 s), 1% clock drift.
    pub fn new(key: impl Into<String>, holder: impl Into<String>, ttl: Duration) -> Self {
        Self {
            key: key.into(),
            holder: holder.into(),
            ttl,
            renew_every: ttl / 3,
            first_renewal_sooner: Duration::ZERO,
            campaign_every: ttl / 3,
            retry_every: (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1)),
            request_timeout: (ttl / 4).min(Duration::from_secs(5)),
            max_clock_drift_ppm: DEFAULT_MAX_CLOCK_DRIFT_PPM,
            hold_back: Duration::ZERO,
        }
    }

    /// This config for a candidate of `priority` (0 to [`MAX_PRIORITY`], higher
    /// preferred): after a release or an expiry it holds back
    /// ([`HolderConfig::hold_back`]) [`PRIORITY_STEP`] for each step below
    /// [`MAX_PRIORITY`], so the highest candidate alive wins a free key, and the
    /// others take it over within [`MAX_HOLD_BACK`] when it is not alive. No key is
    /// taken from a holder: the priority only decides who asks first. Give every
    /// candidate of a key a priority (one without holds back nothing).
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.hold_back = PRIORITY_STEP * u32::from(MAX_PRIORITY - priority.min(MAX_PRIORITY));
        self
    }

    /// The longest [`Holder::handle_stop`](super::Holder::handle_stop) (or
    /// [`Holder::handle_hand_over`](super::Holder::handle_hand_over)) takes to be done
    /// when no request is ever answered (NATS killed, frozen, unreachable): the
    /// request in flight at the stop, then at most [`MAX_STOP_REQUESTS`] more, each
    /// given up at `request_timeout`, none waited between. Elector, shards and
    /// semaphore stops, and `lock`'s release, end within it.
    pub fn stop_bound(&self) -> Duration {
        self.request_timeout.saturating_mul(MAX_STOP_REQUESTS + 1)
    }

    pub(super) fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// Checks the key, holder and TTL against the contract's bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        wire::check_name("key", &self.key)?;
        wire::check_name("holder", &self.holder)?;
        wire::check_ttl(self.ttl_ms())?;
        let invalid = |why: &str| Err(ConfigError::new(why));
        if self.max_clock_drift_ppm >= 500_000 {
            return invalid("max_clock_drift_ppm must be below 500000");
        }
        let span = self.believed_span(self.ttl);
        if self.renew_every.is_zero() || self.renew_every >= span {
            return invalid(
                "renew_every must be above zero and below the ttl less the drift margin",
            );
        }
        if self.first_renewal_sooner >= self.renew_every {
            return invalid("first_renewal_sooner must be below renew_every");
        }
        if self.request_timeout.is_zero() || self.request_timeout + self.renew_every >= span {
            return invalid(
                "request_timeout must be above zero, and renew_every + request_timeout below the ttl",
            );
        }
        if self.retry_every.is_zero() || self.retry_every >= self.ttl {
            return invalid("retry_every must be above zero and below the ttl");
        }
        if self.campaign_every.is_zero()
            || self.campaign_every > Duration::from_millis(wire::MAX_TTL_MS)
        {
            return invalid("campaign_every must be above zero and at most 600 s");
        }
        if self.hold_back > MAX_HOLD_BACK {
            return invalid("hold_back must be at most 1 s");
        }
        Ok(())
    }

    /// How long after a send the holder may still believe the lease is its: the TTL
    /// less the drift margin.
    pub fn believed_span(&self, ttl: Duration) -> Duration {
        let margin = ttl.as_micros() * u128::from(self.max_clock_drift_ppm) / 1_000_000;
        ttl.saturating_sub(Duration::from_micros(
            u64::try_from(margin).unwrap_or(u64::MAX),
        ))
    }
}

/// How many requests a stop may send (release, recovery acquire, release again).
pub const MAX_STOP_REQUESTS: u32 = 3;
