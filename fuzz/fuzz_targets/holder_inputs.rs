//! Whatever the service (or anything on its subjects) answers, and whatever arrives on
//! an inbox, the holder side never panics and never believes past what it may: a
//! holder's deadline is never later than the earliest send of a request that could
//! have written its lease, plus the TTL.
#![no_main]

use std::time::{Duration, Instant};

use dagnats_leases_core::holder::guard::InboxGuard;
use dagnats_leases_core::holder::{Holder, HolderConfig};
use dagnats_leases_core::io::{RequestOutcome};
use dagnats_leases_core::wire::{Endpoint, Response};
use libfuzzer_sys::fuzz_target;

const TTL: Duration = Duration::from_secs(3);

fuzz_target!(|data: &[u8]| {
    let t0 = Instant::now();
    let mut holder = Holder::new(HolderConfig::new("k", "h", TTL), t0).expect("valid config");
    let mut guard = InboxGuard::new("h");
    let mut now = t0;
    // A request is answered in a later step, after time has passed: a deadline taken
    // from the reply instead of the send would show.
    let mut outstanding = holder.poll_transmit();
    let mut last_send = t0;
    for step in data.split(|b| *b == 0xff) {
        let Some((&op, rest)) = step.split_first() else {
            continue;
        };
        now += Duration::from_millis(u64::from(op & 0x3f) * 50);
        match outstanding.take() {
            Some(r) => {
                let outcome = match op >> 6 {
                    0 => RequestOutcome::reply(rest.to_vec()),
                    1 => RequestOutcome::TimedOut,
                    2 => RequestOutcome::NoResponders,
                    _ => RequestOutcome::Failed(String::from_utf8_lossy(rest).into_owned()),
                };
                for endpoint in Endpoint::ALL {
                    let _ = Response::decode(endpoint, rest);
                }
                holder.handle_outcome(now, r.id, outcome);
            }
            None => holder.handle_timeout(now),
        }
        if let Some(r) = holder.poll_transmit() {
            last_send = now;
            outstanding = Some(r);
        }
        while let Some(event) = holder.poll_event() {
            guard.observe("k", &event);
        }
        if let Some(own) = holder.tenure(now) {
            assert!(own.deadline <= last_send + TTL, "a deadline past any send + ttl");
            assert!(own.deadline > now);
        }
        let fence = String::from_utf8_lossy(rest);
        let subject = format!("dagnats.lease.inbox.h.{fence}");
        let _ = guard.check(now, &subject, Some(&fence));
        let _ = guard.check(now, "dagnats.lease.inbox.h.k", Some(&fence));
        if op & 0x80 != 0 && op & 0x40 != 0 && rest.len() == 1 {
            holder.handle_stop(now);
        }
    }
});
