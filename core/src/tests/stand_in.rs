//! A stand-in lease service for the worlds that check what the holder machines feed
//! (`lock`'s supervision, candidate priorities): an in-memory lease table with the
//! contract's acquire, renew and release for one key. The holder's own safety
//! against the real service is the holder worlds' job (the call machines over the
//! simulated JetStream); here a table is enough, and it is named a stand-in.

use std::time::Duration;

use crate::record::format_time;
use crate::wire::{
    AcquireReply, Endpoint, ErrorKind, ErrorReply, FreeReply, Lease, ReleaseReply, Request,
    Response,
};

/// The one key.
pub(super) const KEY: &str = "job";
/// Every lease's TTL.
pub(super) const TTL_MS: u64 = 3_000;

pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }

    pub(super) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// Mostly loopback-fast, sometimes slow (a busy server).
    pub(super) fn latency(&mut self) -> u64 {
        if self.chance(5) {
            200 + self.below(1_000)
        } else {
            1 + self.below(30)
        }
    }
}

/// The stand-in lease service: one key. Its TTL counts from a write's arrival; with
/// `late_expiry`, an expired lease is removed (and the key free) only at the
/// server's expiry check, 0 to 325 ms after its end, as nats-server does.
pub(super) struct StandIn {
    holder: Option<String>,
    revision: u64,
    /// When the lease runs out (server ms).
    pub(super) expires_at: u64,
    acquired_at: u64,
    late_expiry: bool,
    /// Every fresh grant: (server ms, holder).
    pub(super) grants: Vec<(u64, String)>,
}

impl StandIn {
    pub(super) fn new(late_expiry: bool) -> Self {
        Self {
            holder: None,
            revision: 0,
            expires_at: 0,
            acquired_at: 0,
            late_expiry,
            grants: Vec::new(),
        }
    }

    /// When the lease is gone: its end, or with `late_expiry` the expiry check after
    /// it (a lateness drawn from the revision, so runs replay).
    fn gone_at(&self) -> u64 {
        let late = if self.late_expiry {
            self.revision.wrapping_mul(7_919) % 326
        } else {
            0
        };
        self.expires_at + late
    }

    /// Who holds the key at `t`.
    pub(super) fn held_by(&self, t: u64) -> Option<&str> {
        self.holder.as_deref().filter(|_| t < self.gone_at())
    }

    fn lease(&self, holder: &str) -> Lease {
        let epoch = time::OffsetDateTime::UNIX_EPOCH + time::Duration::days(20_000);
        let at = |ms: u64| format_time(epoch + Duration::from_millis(ms));
        Lease {
            held: true,
            key: KEY.to_string(),
            holder: holder.to_string(),
            revision: self.revision,
            acquired_at: at(self.acquired_at),
            expires_at: at(self.expires_at),
            ttl_ms: TTL_MS,
        }
    }

    pub(super) fn handle(&mut self, t: u64, endpoint: Endpoint, body: &[u8]) -> Response {
        let error = |kind, text: &str| Response::Error(ErrorReply::new(kind, text));
        match Request::decode(endpoint, body).expect("the holder sends valid requests") {
            Request::Acquire(r) => match self.held_by(t) {
                Some(h) if h == r.holder => Response::Acquired(AcquireReply {
                    granted: true,
                    lease: self.lease(&r.holder),
                }),
                Some(h) => {
                    let h = h.to_string();
                    Response::Acquired(AcquireReply {
                        granted: false,
                        lease: self.lease(&h),
                    })
                }
                None => {
                    self.revision += 1;
                    self.grants.push((t, r.holder.clone()));
                    self.holder = Some(r.holder.clone());
                    self.acquired_at = t;
                    self.expires_at = t + TTL_MS;
                    Response::Acquired(AcquireReply {
                        granted: true,
                        lease: self.lease(&r.holder),
                    })
                }
            },
            Request::Renew(r) => match self.held_by(t) {
                Some(h) if h == r.holder && r.revision == self.revision => {
                    self.revision += 1;
                    self.expires_at = t + TTL_MS;
                    Response::Lease(self.lease(&r.holder))
                }
                Some(h) if h == r.holder => error(ErrorKind::FenceMismatch, "fence"),
                _ => error(ErrorKind::Lost, "lost"),
            },
            Request::Release(r) => match self.held_by(t) {
                Some(h) if h == r.holder && r.revision == self.revision => {
                    self.revision += 1;
                    self.holder = None;
                    Response::Released(ReleaseReply {
                        released: true,
                        held: false,
                        key: KEY.to_string(),
                        holder: r.holder,
                        revision: self.revision,
                    })
                }
                Some(h) if h == r.holder => error(ErrorKind::FenceMismatch, "fence"),
                _ => error(ErrorKind::Lost, "lost"),
            },
            Request::Owner(_) => match self.held_by(t) {
                Some(h) => {
                    let h = h.to_string();
                    Response::Lease(self.lease(&h))
                }
                None => Response::Free(FreeReply {
                    held: false,
                    key: KEY.to_string(),
                }),
            },
            other => panic!("the holder sent {other:?}"),
        }
    }
}
