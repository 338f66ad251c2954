//! Tenancy through NATS accounts: who a request comes from (only what the server
//! vouches for), where a tenant's keys and holders live, and a lease bound to the
//! user that acquired it.

use std::time::Instant;

use serde_json::Value;

use super::support::*;
use crate::call::{Call, CallConfig};
use crate::io::{RequestOutcome, Transmit};
use crate::sim::MsgKind;
use crate::subjects::HDR_LEASE_EVENT;
use crate::tenant::{Caller, Tenancy, caller_of, scope_of, storage_key};
use crate::wire::{Endpoint, ErrorKind, Response};

const SHARED: &str = r#"{"start":"2026-12-05T02:38:30Z","host":"127.0.0.1","id":9,"acc":"TA","user":"a1","name":"client-a1","rtt":493082,"kind":"Client"}"#;

fn a(user: &str) -> Caller {
    Caller {
        account: "TA".into(),
        user: Some(user.into()),
    }
}

#[test]
fn a_request_across_an_import_is_its_accounts_and_users_as_the_server_says() {
    assert_eq!(caller_of("_R_.DlX5NT.DTH8Wz", &[SHARED]), Ok(a("a1")));
    assert_eq!(
        caller_of("_R_.DlX5NT.x", &[r#"{"acc":"TB","rtt":470243}"#]),
        Ok(Caller {
            account: "TB".into(),
            user: None
        })
    );
}

#[test]
fn one_namespace_trusts_no_header_and_tenancy_asks_the_server() {
    assert_eq!(scope_of(Tenancy::Single, "_INBOX.x", &[SHARED]), Ok(None));
    assert_eq!(
        scope_of(Tenancy::Accounts, "_R_.a.b", &[SHARED]),
        Ok(Some(a("a1")))
    );
    assert!(scope_of(Tenancy::Accounts, "_INBOX.x", &[SHARED]).is_err());
    assert_eq!(storage_key(None, "job"), "job");
    assert_eq!(storage_key(Some(&a("a1")), "job"), "TA.job");
}

#[test]
fn a_request_that_crossed_no_import_is_forbidden_whatever_header_it_carries() {
    for reply in ["_INBOX.abc.1", "_INBOX_billing.x", ""] {
        let e = caller_of(reply, &[SHARED]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Forbidden, "{reply}");
        assert!(e.error.contains("import"), "{}", e.error);
    }
}

#[test]
fn the_request_info_header_must_be_there_once_and_name_one_account_token() {
    let cases: [&[&str]; 7] = [
        &[],
        &[SHARED, r#"{"acc":"TB"}"#],
        &["not json"],
        &[r#"{"user":"a1"}"#],
        &[r#"{"acc":"T.C","user":"a1"}"#],
        &[r#"{"acc":"","user":"a1"}"#],
        &[r#"{"acc":"TA *","user":"a1"}"#],
    ];
    for infos in cases {
        let e = caller_of("_R_.a.b", infos).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Forbidden, "{infos:?}");
        assert!(e.error.contains("Nats-Request-Info"), "{}", e.error);
    }
}

fn scoped(caller: Caller, endpoint: Endpoint, body: &str) -> Call {
    Call::new_scoped(
        CallConfig::ready(1024 * 1024).for_replicas(3),
        Some(caller),
        None,
        endpoint,
        body.as_bytes(),
        wall(),
        Instant::now(),
    )
}

fn transmit(call: &mut Call) -> Transmit {
    call.poll_transmit().expect("a request to send")
}

fn bound_record(user: &str) -> RequestOutcome {
    let body = format!(
        r#"{{"holder":"me","acquired_at":"2026-09-21T00:00:00Z","ttl_ms":15000,"bound_to":"{user}"}}"#
    );
    msg(
        40,
        MsgKind::Value,
        vec![(HDR_LEASE_EVENT, "acquired"), ("Nats-TTL", "15s")],
        body.into_bytes(),
        0,
    )
}

#[test]
fn a_tenants_key_lives_under_its_account_and_a_grant_is_bound_to_its_user() {
    let mut call = scoped(
        a("a1"),
        Endpoint::Acquire,
        r#"{"key":"job","holder":"me","ttl_ms":15000}"#,
    );
    let t = transmit(&mut call);
    assert_eq!(t.request.subject, "$KV.leases.TA.job");
    let record: Value = serde_json::from_slice(&t.request.payload).unwrap();
    assert_eq!(record["bound_to"], "a1");
    call.handle_outcome(Instant::now(), t.id, ack(41));
    let Some(Response::Acquired(r)) = crate::tests::support::reply_of(&mut call) else {
        panic!("no grant")
    };
    assert_eq!((r.granted, r.lease.key.as_str()), (true, "job"));
}

#[test]
fn reads_confirmations_and_forwards_of_a_tenant_stay_under_its_account() {
    let mut call = scoped(a("a1"), Endpoint::Owner, r#"{"key":"job"}"#);
    let read = transmit(&mut call);
    assert!(
        String::from_utf8_lossy(&read.request.payload).contains(r#""$KV.leases.TA.job""#),
        "{:?}",
        read.request
    );
    call.handle_outcome(Instant::now(), read.id, bound_record("a1"));
    let confirm = transmit(&mut call);
    assert_eq!(confirm.request.subject, "$KV.leases.TA.job.read");
    assert!(
        confirm
            .request
            .headers
            .iter()
            .any(|(_, v)| v == "$KV.leases.TA.job")
    );
    let mut call = scoped(
        a("a2"),
        Endpoint::Forward,
        r#"{"key":"job","payload":"","timeout_ms":1000}"#,
    );
    let read = transmit(&mut call);
    call.handle_outcome(Instant::now(), read.id, bound_record("a1"));
    let confirm = transmit(&mut call);
    call.handle_outcome(Instant::now(), confirm.id, ack(42));
    let inbox = transmit(&mut call);
    assert_eq!(inbox.request.subject, "dagnats.lease.inbox.TA.me.job");
}

#[test]
fn another_user_of_the_account_cannot_renew_release_or_take_a_bound_lease_and_is_told_no_names() {
    for (endpoint, body) in [
        (
            Endpoint::Renew,
            r#"{"key":"job","holder":"me","revision":40}"#,
        ),
        (
            Endpoint::Release,
            r#"{"key":"job","holder":"me","revision":40}"#,
        ),
        (
            Endpoint::Acquire,
            r#"{"key":"job","holder":"me","ttl_ms":15000}"#,
        ),
    ] {
        let mut call = scoped(a("a2"), endpoint, body);
        let mut t = transmit(&mut call);
        if endpoint == Endpoint::Acquire {
            // The create finds the key taken, then reads it.
            call.handle_outcome(Instant::now(), t.id, wrong_last_sequence());
            t = transmit(&mut call);
        }
        call.handle_outcome(Instant::now(), t.id, bound_record("a1"));
        let confirm = transmit(&mut call);
        call.handle_outcome(Instant::now(), confirm.id, ack(41));
        let Some(Response::Error(e)) = crate::tests::support::reply_of(&mut call) else {
            panic!("{endpoint:?}: not refused")
        };
        assert_eq!(e.kind, ErrorKind::Forbidden, "{endpoint:?}");
        for name in ["a1", "me", "40"] {
            assert!(
                !e.error.contains(name),
                "{endpoint:?} names {name}: {}",
                e.error
            );
        }
        assert!(call.poll_transmit().is_none(), "{endpoint:?} wrote");
    }
    // The user it is bound to renews.
    let mut call = scoped(
        a("a1"),
        Endpoint::Renew,
        r#"{"key":"job","holder":"me","revision":40}"#,
    );
    let t = transmit(&mut call);
    call.handle_outcome(Instant::now(), t.id, bound_record("a1"));
    let w = transmit(&mut call);
    assert_eq!(w.request.subject, "$KV.leases.TA.job");
    let record: Value = serde_json::from_slice(&w.request.payload).unwrap();
    assert_eq!(record["bound_to"], "a1", "the renewal keeps the binding");
}

#[test]
fn past_its_cap_a_tenant_is_refused_new_keys_but_not_the_ones_it_holds_and_others_go_on() {
    use crate::change::ChangeKind;
    use crate::tenant::TenantLeases;
    let mut t = TenantLeases::new(Some(2));
    t.handle_granted("TA", "a");
    t.handle_change("TA", "b", ChangeKind::Renewed);
    assert_eq!(t.count("TA"), 2);
    let e = t.check_acquire("TA", "c").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Forbidden);
    assert!(e.error.contains("cap of 2"), "{}", e.error);
    assert_eq!(t.check_acquire("TA", "a"), Ok(()), "a key it holds");
    assert_eq!(t.check_acquire("TB", "c"), Ok(()), "another tenant");
    // A release, an expiry or a deletion frees a place.
    for kind in [
        ChangeKind::Released,
        ChangeKind::Expired,
        ChangeKind::Deleted,
    ] {
        t.handle_change("TA", "b", kind);
        assert_eq!(t.check_acquire("TA", "c"), Ok(()), "{kind:?}");
        t.handle_change("TA", "b", ChangeKind::Acquired);
    }
    assert!(TenantLeases::new(None).check_acquire("TA", "z").is_ok());
}

#[test]
fn only_an_acquire_of_a_new_key_past_the_cap_is_refused() {
    use crate::tenant::TenantLeases;
    let mut t = TenantLeases::new(Some(1));
    t.handle_granted("TA", "a");
    let new = br#"{"key":"b","holder":"h","ttl_ms":5000}"#;
    assert!(t.check_request(&a("a1"), Endpoint::Acquire, new).is_err());
    assert!(
        t.check_request(&a("a1"), Endpoint::Owner, br#"{"key":"b"}"#)
            .is_ok()
    );
    assert!(
        t.check_request(&a("a1"), Endpoint::Acquire, b"not json")
            .is_ok()
    );
    let held = br#"{"key":"a","holder":"h","ttl_ms":5000}"#;
    assert!(t.check_request(&a("a1"), Endpoint::Acquire, held).is_ok());
}

#[test]
fn a_tenants_change_subject_names_its_account_and_key() {
    use crate::tenant::TenantLeases;
    assert_eq!(
        TenantLeases::key_of("dagnats.lease.changed.TA.job"),
        Some(("TA", "job"))
    );
    for other in [
        "dagnats.lease.changed.job",
        "dagnats.lease.changed.TA.job.x",
        "dagnats.lease.changed..job",
        "other.TA.job",
    ] {
        assert_eq!(TenantLeases::key_of(other), None, "{other}");
    }
}

#[test]
fn tenancy_warns_on_servers_that_keep_a_forged_request_info() {
    use crate::tenant::request_info_warning;
    for old in ["2.11.11", "2.11.14", "v2.12.5", "2.13.2"] {
        let w = request_info_warning(old).expect(old);
        assert!(w.contains("upgrade"), "{w}");
    }
    for fixed in [
        "2.11.15",
        "2.12.6",
        "2.14.0",
        "2.15.1",
        "v2.15.1-RC.1",
        "3.0.0",
    ] {
        assert_eq!(request_info_warning(fixed), None, "{fixed}");
    }
}
