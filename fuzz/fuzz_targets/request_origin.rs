//! What the service reads of a request's origin never panics and never lets
//! through what it must not: a reply subject is answered only when it starts with
//! an accepted inbox prefix and is a literal subject; a tenant is named only by a
//! reply the server rewrote (`_R_.`), a subject account the deployment names, and
//! exactly one header, `Nats-Request-Info`, naming that account; a `$SRV` subject
//! names a verb only for this service; and a tenant's call sends only to subjects
//! under its own account.
#![no_main]

use std::time::Instant;

use dagnats_leases_core::call::{Call, CallConfig};
use dagnats_leases_core::service::micro::MicroService;
use dagnats_leases_core::reply_scope::ReplyScope;
use dagnats_leases_core::tenant::{HDR_REQUEST_INFO, TenantAccounts, caller_of};
use dagnats_leases_core::wire::Endpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(5, '\u{0}');
    let account = parts.next().unwrap_or_default();
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

    // The second part is a second header: its name before the first ':'.
    let headers: Vec<(String, String)> = std::iter::once((HDR_REQUEST_INFO, info))
        .chain(second.map(|h| h.split_once(':').unwrap_or((h, ""))))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    let tenants = TenantAccounts::new(["TA", "TB", "T-1_x"]).unwrap();
    if let Ok(caller) = caller_of(account, reply, &headers, &tenants) {
        assert!(reply.starts_with("_R_."));
        assert_eq!(headers.len(), 1);
        assert_eq!(caller.account, account);
        assert!(tenants.contains(&caller.account));
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
        if let Some(t) = call.poll_transmit(&mut dagnats_leases_core::outbox::Ids::starting_from(1)) {
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
