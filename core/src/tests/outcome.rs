//! An outcome is classified once: the client's answer ([`Answer`]), the holder's
//! class ([`OutcomeClass`]) and a JetStream request's metric label all come from
//! the one reading in `outcome.rs`. A row fails when any reader sorts an outcome
//! differently from the others.

use super::holder::{error, not_granted, renewed};
use crate::io::RequestOutcome;
use crate::js::JsFailure;
use crate::outcome::{Answer, OutcomeClass};
use crate::wire::{Endpoint, ErrorKind};

/// Which [`Answer`] a row expects, by name.
fn answer_name(answer: &Answer) -> &'static str {
    match answer {
        Answer::Reply(_) => "reply",
        Answer::Error(_) => "refused",
        Answer::Unreadable(_) => "unreadable",
        Answer::NoResponders => "no_responders",
        Answer::TimedOut => "timed_out",
        Answer::Failed(_) => "failed",
    }
}

#[test]
fn an_outcome_is_read_once_the_same_by_a_call_and_a_holder() {
    let cases = [
        (Endpoint::Renew, renewed(5), "reply", OutcomeClass::Clear),
        (
            Endpoint::Acquire,
            not_granted(4),
            "reply",
            OutcomeClass::Clear,
        ),
        (
            Endpoint::Renew,
            error("lost"),
            "refused",
            OutcomeClass::Clear,
        ),
        (
            Endpoint::Renew,
            error("fence_mismatch"),
            "refused",
            OutcomeClass::Clear,
        ),
        (
            Endpoint::Acquire,
            error("unavailable"),
            "refused",
            OutcomeClass::Unavailable,
        ),
        (
            Endpoint::Release,
            error("internal"),
            "refused",
            OutcomeClass::Internal,
        ),
        (
            Endpoint::Owner,
            RequestOutcome::reply("not json"),
            "unreadable",
            OutcomeClass::Internal,
        ),
        (
            Endpoint::Acquire,
            RequestOutcome::NoResponders,
            "no_responders",
            OutcomeClass::NoResponders,
        ),
        (
            Endpoint::Renew,
            RequestOutcome::TimedOut,
            "timed_out",
            OutcomeClass::TimedOut,
        ),
        (
            Endpoint::Renew,
            RequestOutcome::Failed("closed".into()),
            "failed",
            OutcomeClass::RequestFailed,
        ),
    ];
    for (endpoint, outcome, name, class) in cases {
        let answer = Answer::of(endpoint, outcome.clone());
        assert_eq!(answer_name(&answer), name, "{outcome:?}");
        assert_eq!(answer.class(), class, "{outcome:?}");
        assert_eq!(OutcomeClass::of(endpoint, &outcome), class, "{outcome:?}");
    }
}

#[test]
fn a_jetstream_failure_is_labelled_by_the_network_first_then_by_its_kind() {
    let unavailable = JsFailure {
        kind: ErrorKind::Unavailable,
        detail: "no leader".into(),
    };
    let internal = JsFailure {
        kind: ErrorKind::Internal,
        detail: "odd reply".into(),
    };
    let cases = [
        (RequestOutcome::TimedOut, &internal, "timed_out"),
        (RequestOutcome::NoResponders, &unavailable, "no_responders"),
        (
            RequestOutcome::Failed("closed".into()),
            &internal,
            "request_failed",
        ),
        (RequestOutcome::reply("{}"), &unavailable, "unavailable"),
        (RequestOutcome::reply("{}"), &internal, "internal"),
    ];
    for (outcome, failure, label) in cases {
        let class = OutcomeClass::of_failure(&outcome, failure.kind);
        assert_eq!(class.label(), Some(label), "{outcome:?}");
        assert_eq!(
            crate::call::KvFact::failed(crate::call::KvOp::Write, &outcome, failure),
            crate::call::KvFact::Error {
                op: crate::call::KvOp::Write,
                kind: label
            },
        );
    }
}
