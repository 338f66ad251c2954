//! What the service reads of a request's origin never panics and never lets
//! through what it must not: a reply subject is answered only when it starts with
//! an accepted inbox prefix and is a literal subject; a tenant is named only by a
//! reply the server rewrote (`_R_.`) with exactly one `Nats-Request-Info` whose
//! `acc` is one token; a `$SRV` subject names a verb only for this service; and a
//! tenant's call sends only to subjects under its own account.
#![no_main]

use std::time::Instant;

use dagnats_leases_core::call::{Call, CallConfig};
use dagnats_leases_core::micro::MicroService;
use dagnats_leases_core::reply_scope::ReplyScope;
use dagnats_leases_core::tenant::caller_of;
use dagnats_leases_core::wire::Endpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, '\u{0}');
    let reply = parts.next().unwrap_or_default();
    let info = parts.next().unwrap_or_default();
    let second = parts.next();
    let body = parts.next().unwrap_or_default();

    let scope = ReplyScope::default();
    if scope.check(Some(reply)).is_ok() {
        assert!(reply.starts_with("_INBOX.") || reply.starts_with("_R_."), "{reply:?}");
        // A literal subject: no wildcard token, no empty token, no whitespace.
        assert!(!reply.chars().any(|c| c.is_whitespace() || c.is_control()), "{reply:?}");
        assert!(reply.split('.').all(|t| !t.is_empty() && t != "*" && t != ">"), "{reply:?}");
    }

    let infos: Vec<&str> = std::iter::once(info).chain(second).collect();
    if let Ok(caller) = caller_of(reply, &infos) {
        assert!(reply.starts_with("_R_."));
        assert_eq!(infos.len(), 1);
        assert!(!caller.account.is_empty());
        assert!(caller.account.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
        // Every request of a tenant's call stays under its account.
        let endpoint = Endpoint::ALL[data.len() % Endpoint::ALL.len()];
        let mut call = Call::new_scoped(
            CallConfig::ready(1 << 20),
            Some(caller.clone()),
            None,
            endpoint,
            body.as_bytes(),
            time::OffsetDateTime::UNIX_EPOCH,
            Instant::now(),
        );
        if let Some(t) = call.poll_transmit() {
            let subject = &t.request.subject;
            let payload = String::from_utf8_lossy(&t.request.payload);
            let own = format!("$KV.leases.{}.", caller.account);
            assert!(
                subject.starts_with(&own) || payload.contains(&format!("\"{own}")),
                "{subject} {payload}"
            );
        }
    }

    let micro = MicroService::new("ID", "0.1.0", time::OffsetDateTime::UNIX_EPOCH);
    if micro.verb_of(reply).is_some() {
        assert!(reply.starts_with("$SRV."));
    }
});
