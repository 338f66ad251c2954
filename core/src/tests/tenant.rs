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
use crate::tenant::{
    Caller, HDR_REQUEST_INFO, Tenancy, TenantAccounts, caller_of, scope_of, storage_key,
    tenant_endpoint_of,
};
use crate::wire::{Endpoint, ErrorKind, Response};

const SHARED: &str = r#"{"start":"2026-12-05T02:38:30Z","host":"127.0.0.1","id":9,"acc":"TA","user":"a1","name":"client-a1","rtt":493082,"kind":"Client"}"#;

fn a(user: &str) -> Caller {
    Caller {
        account: "TA".into(),
        user: Some(user.into()),
    }
}

fn tenants() -> TenantAccounts {
    TenantAccounts::new(["TA", "TB"]).unwrap()
}

/// The server's one header, as the service's intake hands it over.
fn info(value: &str) -> Vec<(String, String)> {
    vec![(HDR_REQUEST_INFO.to_string(), value.to_string())]
}

#[test]
fn a_request_across_an_import_is_its_subjects_account_and_the_servers_user() {
    assert_eq!(
        caller_of("TA", "_R_.DlX5NT.DTH8Wz", &info(SHARED), &tenants()),
        Ok(a("a1"))
    );
    assert_eq!(
        caller_of(
            "TB",
            "_R_.DlX5NT.x",
            &info(r#"{"acc":"TB","rtt":470243}"#),
            &tenants()
        ),
        Ok(Caller {
            account: "TB".into(),
            user: None
        })
    );
    assert_eq!(
        tenant_endpoint_of("api.leases.TA.acquire"),
        Some(("TA", "acquire"))
    );
    for other in [
        "api.leases.acquire",
        "api.leases.TA.acquire.x",
        "other.TA.acquire",
    ] {
        assert_eq!(tenant_endpoint_of(other), None, "{other}");
    }
}

#[test]
fn one_namespace_trusts_no_header_and_tenancy_asks_the_server() {
    let t = tenants();
    assert_eq!(
        scope_of(
            Tenancy::Single,
            &t,
            "api.leases.acquire",
            "_INBOX.x",
            &info(SHARED)
        ),
        Ok(None)
    );
    assert_eq!(
        scope_of(
            Tenancy::Accounts,
            &t,
            "api.leases.TA.acquire",
            "_R_.a.b",
            &info(SHARED)
        ),
        Ok(Some(a("a1")))
    );
    assert!(
        scope_of(
            Tenancy::Accounts,
            &t,
            "api.leases.TA.acquire",
            "_INBOX.x",
            &info(SHARED)
        )
        .is_err()
    );
    assert!(
        scope_of(
            Tenancy::Accounts,
            &t,
            "api.leases.acquire",
            "_R_.a.b",
            &info(SHARED)
        )
        .is_err()
    );
    assert_eq!(storage_key(None, "job"), "job");
    assert_eq!(storage_key(Some(&a("a1")), "job"), "TA.job");
}

#[test]
fn a_request_that_crossed_no_import_is_forbidden_whatever_header_it_carries() {
    for reply in ["_INBOX.abc.1", "_INBOX_billing.x", ""] {
        let e = caller_of("TA", reply, &info(SHARED), &tenants()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Forbidden, "{reply}");
        assert!(e.error.contains("import"), "{}", e.error);
    }
}

/// Only accounts the deployment names are served: a made-up one, the service's
/// own, or one that is no subject token is refused, even with a header that
/// names it.
#[test]
fn an_account_the_deployment_does_not_name_is_forbidden() {
    for account in ["NOSUCH", "LEASES", "", "ta", "T*"] {
        let header = info(&format!(r#"{{"acc":"{account}"}}"#));
        let e = caller_of(account, "_R_.a.b", &header, &tenants()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Forbidden, "{account}");
        assert!(e.error.contains("--tenant-account"), "{}", e.error);
    }
    for bad in ["T.A", "", "T A"] {
        assert!(TenantAccounts::new([bad]).is_err(), "{bad:?}");
    }
    assert!(
        TenantAccounts::new(Vec::<String>::new())
            .unwrap()
            .is_empty()
    );
}

/// The headers must be exactly the server's one `Nats-Request-Info`, strict JSON
/// of its shape naming the subject's account: anything beside it (a folded or
/// split line leaves a client's header or a second value), another spelling, a
/// value with trailing bytes, an unknown or repeated field, another account.
#[test]
fn the_headers_must_be_exactly_the_servers_one_request_info_naming_the_subjects_account() {
    let pair = |n: &str, v: &str| (n.to_string(), v.to_string());
    let folded = format!(r#"{{"acc":"TB"}} Nats-Request-Info: {SHARED}"#);
    let cases: Vec<(&str, Vec<(String, String)>)> = vec![
        ("none", vec![]),
        (
            "two values",
            vec![
                pair(HDR_REQUEST_INFO, SHARED),
                pair(HDR_REQUEST_INFO, SHARED),
            ],
        ),
        (
            "a client header first",
            vec![pair("X-A", "a"), pair(HDR_REQUEST_INFO, SHARED)],
        ),
        (
            "a client header after",
            vec![pair(HDR_REQUEST_INFO, SHARED), pair("X-B", "b")],
        ),
        (
            "the forged block as a lenient reader sees it",
            vec![
                pair("X-A", "a"),
                pair(HDR_REQUEST_INFO, r#"{"acc":"TB"}"#),
                pair("X-B", &format!("b Nats-Request-Info: {SHARED}")),
            ],
        ),
        ("another spelling", vec![pair("nats-request-info", SHARED)]),
        ("a folded value", vec![pair(HDR_REQUEST_INFO, &folded)]),
        ("not JSON", vec![pair(HDR_REQUEST_INFO, "not json")]),
        (
            "no account",
            vec![pair(HDR_REQUEST_INFO, r#"{"user":"a1"}"#)],
        ),
        (
            "another account",
            vec![pair(HDR_REQUEST_INFO, r#"{"acc":"TB","user":"a1"}"#)],
        ),
        (
            "an unknown field",
            vec![pair(HDR_REQUEST_INFO, r#"{"acc":"TA","user":"a1","x":1}"#)],
        ),
        (
            "a repeated field",
            vec![pair(
                HDR_REQUEST_INFO,
                r#"{"acc":"TA","user":"a2","user":"a1"}"#,
            )],
        ),
        (
            "trailing bytes",
            vec![pair(
                HDR_REQUEST_INFO,
                r#"{"acc":"TA","user":"a1"} {"acc":"TA"}"#,
            )],
        ),
        ("an array", vec![pair(HDR_REQUEST_INFO, r#"["TA"]"#)]),
        (
            "a user that is no string",
            vec![pair(HDR_REQUEST_INFO, r#"{"acc":"TA","user":1}"#)],
        ),
    ];
    for (name, headers) in cases {
        let e = caller_of("TA", "_R_.a.b", &headers, &tenants()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Forbidden, "{name}");
        assert!(e.error.contains("Nats-Request-Info"), "{name}: {}", e.error);
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
    call.poll_transmit(&mut owner_ids())
        .expect("a request to send")
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
        assert!(
            call.poll_transmit(&mut owner_ids()).is_none(),
            "{endpoint:?} wrote"
        );
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
    assert!(t.admit_request(&a("a1"), Endpoint::Acquire, new).is_err());
    assert_eq!(
        t.admit_request(&a("a1"), Endpoint::Owner, br#"{"key":"b"}"#),
        Ok(None)
    );
    assert_eq!(
        t.admit_request(&a("a1"), Endpoint::Acquire, b"not json"),
        Ok(None)
    );
    let held = br#"{"key":"a","holder":"h","ttl_ms":5000}"#;
    assert_eq!(
        t.admit_request(&a("a1"), Endpoint::Acquire, held),
        Ok(Some("a".to_string()))
    );
}

/// Acquires in flight count against the cap from their arrival to their end: a
/// burst of new keys at once takes the cap's places and no more; a second
/// acquire of a key in flight is let in; a place comes back when an acquire ends
/// without a grant, and stays taken (as a lease) after a grant.
#[test]
fn acquires_in_flight_count_against_the_cap() {
    use crate::tenant::TenantLeases;
    enum Step {
        Begin(&'static str, &'static str, bool),
        Granted(&'static str, &'static str),
        Ended(&'static str, &'static str),
        Count(&'static str, usize),
    }
    use Step::*;
    let table = [
        Begin("TA", "k1", true),
        Begin("TA", "k2", true),
        Begin("TA", "k3", true),
        Count("TA", 3),
        Begin("TA", "k4", false),
        Begin("TA", "k2", true),
        Begin("TB", "k4", true),
        Count("TA", 3),
        // k2's two acquires end without a grant: its place comes back after both.
        Ended("TA", "k2"),
        Begin("TA", "k4", false),
        Ended("TA", "k2"),
        Count("TA", 2),
        Begin("TA", "k4", true),
        // k1 granted: still one place, now as a lease.
        Granted("TA", "k1"),
        Ended("TA", "k1"),
        Count("TA", 3),
        Begin("TA", "k5", false),
        Begin("TA", "k1", true),
        Ended("TA", "k1"),
        // k3 and k4 end ungranted: two places back.
        Ended("TA", "k3"),
        Ended("TA", "k4"),
        Count("TA", 1),
        Count("TB", 1),
        // An end nobody began changes nothing.
        Ended("TA", "zz"),
        Ended("TC", "k1"),
        Count("TA", 1),
    ];
    let mut t = TenantLeases::new(Some(3));
    for (i, step) in table.iter().enumerate() {
        match *step {
            Begin(acc, key, ok) => {
                let got = t.begin_acquire(acc, key);
                assert_eq!(got.is_ok(), ok, "step {i}: {acc} {key}: {got:?}");
                if let Err(e) = got {
                    assert_eq!(e.kind, ErrorKind::Forbidden);
                    assert!(e.error.contains("cap of 3"), "{}", e.error);
                }
            }
            Granted(acc, key) => t.handle_granted(acc, key),
            Ended(acc, key) => t.handle_acquire_ended(acc, key),
            Count(acc, n) => assert_eq!(t.count(acc), n, "step {i}: {acc}"),
        }
    }
    // A burst of 1,500 new keys at once: the cap's 3 places, the rest refused.
    let mut t = TenantLeases::new(Some(3));
    let let_in = (0..1500)
        .filter(|i| t.begin_acquire("TA", &format!("burst-{i}")).is_ok())
        .count();
    assert_eq!(let_in, 3);
    // Without a cap nothing is counted or refused.
    let mut t = TenantLeases::new(None);
    assert!((0..100).all(|i| t.begin_acquire("TA", &format!("k{i}")).is_ok()));
    assert_eq!(t.count("TA"), 0);
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
