//! What a member's driver relays of its campaign ([`crate::holder::relay`]): each
//! holder event as its listener hears it, and when the driver ends. A row fails
//! when an application hears a renewal or a refusal, a supervisor misses one, or
//! the driver ends with something left to carry.

use std::time::{Duration, Instant};

use crate::holder::campaign::Campaign;
use crate::holder::relay::{Heard, Listener, Ownership};
use crate::holder::supervise::NotGranted;
use crate::holder::{HolderConfig, HolderEvent, OutcomeClass, StepDownReason};
use crate::wire::ErrorKind;

#[test]
fn an_application_hears_only_ownership_changes_and_a_supervisor_renewals_and_refusals_too() {
    let at = Instant::now() + Duration::from_secs(10);
    // (event, heard by an application, heard by a supervisor, its ownership change)
    let cases = [
        (
            HolderEvent::Elected {
                fence: 7,
                deadline: at,
            },
            true,
            true,
            Some(Ownership::Elected { fence: 7 }),
        ),
        (
            HolderEvent::SteppedDown {
                reason: StepDownReason::Lost,
            },
            true,
            true,
            Some(Ownership::SteppedDown {
                reason: StepDownReason::Lost,
            }),
        ),
        (
            HolderEvent::Renewed {
                tenure: 7,
                fence: 8,
                deadline: at,
            },
            false,
            true,
            None,
        ),
        (
            HolderEvent::NotGranted {
                holder: Some("other".into()),
                answer: OutcomeClass::Clear,
            },
            false,
            true,
            None,
        ),
        (
            HolderEvent::Failed {
                kind: ErrorKind::Forbidden,
                message: "no".into(),
            },
            false,
            false,
            None,
        ),
    ];
    for (event, application, supervisor, ownership) in cases {
        let heard = Heard::of(event.clone());
        assert_eq!(
            heard.clone().for_listener(Listener::Application).is_some(),
            application,
            "{event:?}"
        );
        assert_eq!(
            heard.clone().for_listener(Listener::Supervisor).is_some(),
            supervisor,
            "{event:?}"
        );
        assert_eq!(heard.into_ownership(), ownership, "{event:?}");
    }
}

#[test]
fn a_refusal_is_heard_with_why_in_locks_terms_and_the_holder_named() {
    let cases = [
        (Some("other"), OutcomeClass::Clear, NotGranted::Held),
        (None, OutcomeClass::NoResponders, NotGranted::NoService),
        (None, OutcomeClass::TimedOut, NotGranted::NoAnswer),
    ];
    for (holder, answer, why) in cases {
        let heard = Heard::of(HolderEvent::NotGranted {
            holder: holder.map(String::from),
            answer,
        });
        assert_eq!(
            heard,
            Heard::NotGranted {
                why,
                holder: holder.map(String::from)
            }
        );
    }
}

#[test]
fn a_members_driver_ends_only_with_no_handle_no_campaign_no_request_and_no_inbox_left() {
    let t0 = Instant::now();
    let idle = Campaign::new("h1", t0).unwrap();
    let mut busy = Campaign::new("h1", t0).unwrap();
    busy.add_group(
        t0,
        vec![HolderConfig::new("k", "h1", Duration::from_secs(15))],
        1,
    )
    .unwrap();
    // (campaign, member alive, requests out, inbox open, ends)
    let cases = [
        (&idle, false, false, false, true),
        (&idle, true, false, false, false),
        (&idle, false, true, false, false),
        (&idle, false, false, true, false),
        (&busy, false, false, false, false),
    ];
    for (campaign, alive, out, inbox, ends) in cases {
        assert_eq!(
            campaign.driver_may_end(alive, out, inbox),
            ends,
            "alive {alive}, requests out {out}, inbox open {inbox}, done {}",
            campaign.is_done()
        );
    }
}
