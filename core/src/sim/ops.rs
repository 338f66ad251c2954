//! The operation grammar of a [`World`](super::World): the steps a property test or the
//! fuzzer applies, and how raw bytes are read as a sequence of them.

/// How a simulated owner answers a forwarded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, arbitrary::Arbitrary)]
pub enum OwnerBehaviour {
    /// Echoes the payload.
    Echo,
    /// Replies `Dagnats-Lease-Reject: stale`.
    Reject,
    /// Nobody subscribes.
    NoResponders,
    /// Never replies.
    Silent,
    /// Replies with more than `max_payload` allows.
    Huge,
}

/// One step of a world.
#[derive(Debug, Clone, arbitrary::Arbitrary)]
pub enum Op {
    /// A holder asks for a key.
    Acquire {
        /// Which holder (mod the holder count).
        holder: u8,
        /// Which key (mod the key count).
        key: u8,
        /// TTL in seconds, 1 to 3.
        ttl_s: u8,
    },
    /// A holder renews with its last known fence, or a stale one.
    Renew {
        /// Which holder.
        holder: u8,
        /// Which key.
        key: u8,
        /// Use an older fence than the holder knows.
        stale: bool,
        /// A new TTL in seconds, if any.
        ttl_s: Option<u8>,
    },
    /// A holder releases with its last known fence, or a stale one.
    Release {
        /// Which holder.
        holder: u8,
        /// Which key.
        key: u8,
        /// Use an older fence than the holder knows.
        stale: bool,
    },
    /// Who holds a key.
    Owner {
        /// Which key.
        key: u8,
    },
    /// Forward to a key's owner.
    Forward {
        /// Which key.
        key: u8,
        /// `timeout_ms`, clamped into bounds.
        timeout_ms: u16,
    },
    /// A request from the list of invalid ones, or raw bytes.
    Invalid {
        /// Which endpoint.
        endpoint: u8,
        /// Which invalid body.
        which: u8,
        /// Raw bytes tried as a body as well.
        raw: Vec<u8>,
    },
    /// Carry out one request the service sent (a call's effect, a batch of
    /// writes, a part's stream question) and feed its outcome back.
    Step {
        /// Which request (mod the number on the network).
        call: u8,
        /// For a stream request: apply it but lose the reply (the service sees a
        /// timeout) when this is a multiple of 8.
        lose_reply: u8,
        /// For an inbox request: how the owner answers.
        owner: OwnerBehaviour,
        /// During a partition: the request reaches the deposed leader.
        via_cut: bool,
    },
    /// A replicated bucket's stream leader is cut off (its state frozen, still
    /// answering as leader to the calls that reach it), or the cut heals.
    Partition {
        /// Cut (a no-op while cut) or heal.
        cut: bool,
    },
    /// Let server time pass, expiring leases.
    Advance {
        /// How long, ms (mod 1200).
        ms: u16,
    },
}

/// Reads a sequence of steps from raw bytes (for proptest and the fuzzer). Three in
/// four steps carry out a request in flight, so calls interleave instead of piling up.
pub fn ops_from_bytes(bytes: &[u8]) -> Vec<Op> {
    use arbitrary::{Arbitrary, Unstructured};
    let mut u = Unstructured::new(bytes);
    let mut ops = Vec::new();
    while !u.is_empty() {
        let Ok(pick) = u8::arbitrary(&mut u) else {
            break;
        };
        let op = if pick < 192 {
            match (
                u8::arbitrary(&mut u),
                u8::arbitrary(&mut u),
                OwnerBehaviour::arbitrary(&mut u),
                bool::arbitrary(&mut u),
            ) {
                (Ok(call), Ok(lose_reply), Ok(owner), Ok(via_cut)) => Op::Step {
                    call,
                    lose_reply,
                    owner,
                    via_cut,
                },
                _ => break,
            }
        } else {
            match Op::arbitrary(&mut u) {
                Ok(op) => op,
                Err(_) => break,
            }
        };
        ops.push(op);
    }
    ops
}
