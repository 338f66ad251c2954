//! Request decoding never panics, accepts only in-bound requests, and an invalid
//! body ends its call with `invalid` before any KV effect. A `renew_many` body is
//! accepted only with 1 to 256 in-bound renewals of distinct keys.
#![no_main]

use std::time::Instant;

use dagnats_leases_core::call::{Call, CallConfig, CallEvent};
use dagnats_leases_core::wire::{Endpoint, ErrorKind, MAX_RENEW_MANY, Request, decode_renew_many};
use libfuzzer_sys::fuzz_target;

fn name_ok(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn ttl_ok(t: u64) -> bool {
    (1000..=600_000).contains(&t) && t.is_multiple_of(1000)
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else { return };
    let choice = pick as usize % (Endpoint::ALL.len() + 1);
    if choice == Endpoint::ALL.len() {
        match decode_renew_many(body) {
            Ok(items) => {
                assert!((1..=MAX_RENEW_MANY).contains(&items.len()));
                assert_eq!(body.iter().find(|b| !b.is_ascii_whitespace()), Some(&b'{'));
                let keys: std::collections::BTreeSet<&str> = items.iter().map(|r| r.key.as_str()).collect();
                assert_eq!(keys.len(), items.len(), "a key twice");
                for r in &items {
                    assert!(name_ok(&r.key) && name_ok(&r.holder) && r.ttl_ms.is_none_or(ttl_ok));
                }
            }
            Err(e) => assert_eq!(e.kind, ErrorKind::Invalid),
        }
        return;
    }
    let endpoint = Endpoint::ALL[choice];
    let decoded = Request::decode(endpoint, body);
    if decoded.is_ok() {
        // Only a JSON object names its fields (serde would read an array too).
        assert_eq!(body.iter().find(|b| !b.is_ascii_whitespace()), Some(&b'{'));
    }
    match &decoded {
        Ok(Request::Acquire(r)) => assert!(name_ok(&r.key) && name_ok(&r.holder) && ttl_ok(r.ttl_ms)),
        Ok(Request::Renew(r)) => assert!(name_ok(&r.key) && name_ok(&r.holder) && r.ttl_ms.is_none_or(ttl_ok)),
        Ok(Request::Release(r)) => assert!(name_ok(&r.key) && name_ok(&r.holder)),
        Ok(Request::Owner(r)) => assert!(name_ok(&r.key)),
        Ok(Request::Forward(r)) => assert!(name_ok(&r.key) && (100..=30_000).contains(&r.timeout_ms)),
        Err(e) => assert_eq!(e.kind, ErrorKind::Invalid),
    }
    let mut call = Call::new(CallConfig::ready(1 << 20), endpoint, body, time::OffsetDateTime::UNIX_EPOCH, Instant::now());
    let first = call.poll_transmit(&mut dagnats_leases_core::outbox::Ids::starting_from(1));
    if decoded.is_err() {
        assert!(first.is_none(), "an invalid body reached {first:?}");
        let Some(CallEvent::Replied(reply)) = call.poll_event() else {
            panic!("an invalid body is answered");
        };
        assert_eq!(reply.error_kind(), Some(ErrorKind::Invalid));
        assert!(call.is_done());
    } else {
        assert!(first.is_some(), "a valid request replied without reading");
        assert!(
            std::iter::from_fn(|| call.poll_event()).all(|e| !matches!(e, CallEvent::Replied(_))),
            "a reply beside a request"
        );
    }
});
