//! Replies go only to reply inboxes: one table test per rule of [`ReplyScope`], and
//! the log's one line per interval.

use std::time::{Duration, Instant};

use crate::reply_scope::{DropLog, DropReason, ReplyScope};

#[test]
fn a_reply_goes_to_the_default_inboxes() {
    let scope = ReplyScope::default();
    for reply in [
        "_INBOX.Xy12.3",
        "_INBOX.abc",
        "_R_.Hn5Qa8.ZFR2LQ",
        "_INBOX.a.b.c.d",
    ] {
        assert_eq!(scope.check(Some(reply)), Ok(()), "{reply}");
    }
}

#[test]
fn a_reply_steered_at_the_bucket_the_js_api_or_the_services_own_subjects_is_refused() {
    let scope = ReplyScope::default();
    for reply in [
        "$KV.leases.victim",
        "$KV.leases.victim.read",
        "$JS.API.STREAM.PURGE.KV_leases",
        "$JS.API.STREAM.DELETE.KV_leases",
        "$SRV.PING",
        "api.leases.acquire",
        "dagnats.lease.changed.job",
        "dagnats.lease.inbox.h1.job",
        "$SYS.REQ.SERVER.PING",
        "INBOX.x",
        "_INBOXx.y",
        "_inbox.x",
        "x._INBOX.y",
        "_R_",
        "",
    ] {
        assert_eq!(
            scope.check(Some(reply)),
            Err(DropReason::NotAnInbox),
            "{reply:?}"
        );
    }
}

#[test]
fn a_request_without_a_reply_is_refused_as_missing() {
    assert_eq!(ReplyScope::default().check(None), Err(DropReason::Missing));
}

#[test]
fn an_inbox_that_is_no_literal_subject_is_refused_as_malformed() {
    let scope = ReplyScope::default();
    let long = format!("_INBOX.{}", "a".repeat(600));
    for reply in [
        "_INBOX.",
        "_INBOX..x",
        "_INBOX.x.",
        "_INBOX.*",
        "_INBOX.>",
        "_INBOX.a.*.b",
        "_INBOX.a b",
        "_INBOX.a\tb",
        "_INBOX.a\r\nPUB $KV.leases.x 1",
        "_R_.>",
        long.as_str(),
    ] {
        assert_eq!(
            scope.check(Some(reply)),
            Err(DropReason::Malformed),
            "{reply:?}"
        );
    }
}

#[test]
fn an_operator_prefix_is_accepted_besides_the_defaults() {
    let scope = ReplyScope::with_prefixes(["_INBOX_billing.", "replies.svc."]).unwrap();
    assert_eq!(scope.check(Some("_INBOX_billing.x1")), Ok(()));
    assert_eq!(scope.check(Some("replies.svc.r.1")), Ok(()));
    assert_eq!(scope.check(Some("_INBOX.still")), Ok(()));
    assert_eq!(
        scope.check(Some("replies.other.1")),
        Err(DropReason::NotAnInbox)
    );
    assert_eq!(scope.prefixes().len(), 4);
}

#[test]
fn an_operator_prefix_that_could_reach_protected_subjects_or_is_no_token_is_refused() {
    for prefix in [
        "$KV.",
        "$KV.leases.",
        "$JS.API.",
        "$SRV.",
        "api.leases.",
        "dagnats.lease.inbox.",
        "_INBOX",
        "",
        ".",
        "a..",
        "*.",
        "a.>.",
        "a b.",
    ] {
        let err = ReplyScope::with_prefixes([prefix]).unwrap_err();
        assert!(err.0.contains("reply prefix"), "{prefix:?}: {err}");
    }
}

#[test]
fn the_refusal_log_writes_one_line_per_interval_covering_the_ones_between() {
    let t0 = Instant::now();
    let every = Duration::from_secs(10);
    let mut log = DropLog::new(every);
    assert_eq!(log.handle_dropped(t0), Some(1));
    assert_eq!(log.handle_dropped(t0 + Duration::from_secs(1)), None);
    assert_eq!(log.handle_dropped(t0 + Duration::from_secs(9)), None);
    assert_eq!(log.handle_dropped(t0 + every), Some(3));
    assert_eq!(log.handle_dropped(t0 + every * 3), Some(1));
}

/// A client's own inbox prefix (`--inbox-prefix`): a user's private prefix under
/// `_INBOX.` is answered by default; what would reach the server's, the bucket's,
/// the API's or the import replies' subjects, or is no literal subject, is refused.
#[test]
fn a_clients_inbox_prefix_is_literal_tokens_and_reaches_no_protected_subject() {
    use crate::reply_scope::client_inbox_prefix;
    for (given, want) in [
        ("_INBOX.a1", "_INBOX.a1"),
        ("_INBOX.a1.", "_INBOX.a1"),
        ("_INBOX_billing", "_INBOX_billing"),
    ] {
        assert_eq!(client_inbox_prefix(given).as_deref(), Ok(want), "{given}");
    }
    let scope = ReplyScope::default();
    assert_eq!(scope.check(Some("_INBOX.a1.Xy12.1")), Ok(()));
    for bad in [
        "",
        ".",
        "_INBOX..a1",
        "_INBOX.*",
        "_INBOX.>",
        "_INBOX. a1",
        "$JS.API",
        "api.leases",
        "dagnats.lease.inbox",
        "_R_",
        "_R_.x",
    ] {
        assert!(client_inbox_prefix(bad).is_err(), "{bad:?}");
    }
}
