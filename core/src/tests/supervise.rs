//! Table tests of `lock`'s supervision: one per rule of [`crate::holder::supervise`].

use std::time::{Duration, Instant};

use crate::holder::supervise::{
    DEFAULT_GRACE_MAX, EXIT_BAD_GRACE, EXIT_CANNOT_RUN, EXIT_ERROR, EXIT_LEASE_LOST, GraceTooLong,
    GroupSignal, Lock, LockEvent, LockExit, NotGranted, StopCause, Supervisor, SupervisorEvent,
    WatchdogMessage, WatchdogReport, lock_grace, may_start,
};

const GRACE: Duration = Duration::from_secs(2);

fn ms(base: Instant, ms: u64) -> Instant {
    base + Duration::from_millis(ms)
}

fn drain(s: &mut Supervisor) -> Vec<SupervisorEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn drain_lock(l: &mut Lock) -> Vec<LockEvent> {
    std::iter::from_fn(|| l.poll_event()).collect()
}

use GroupSignal::{Kill, Term};
use SupervisorEvent::{Report, Signal};

/// The watchdog's command's first process.
const PID: u32 = 4242;

/// A supervisor whose command started at `t` under `deadline`.
fn started(t: Instant, deadline: Instant) -> Supervisor {
    let mut s = Supervisor::new(deadline, GRACE, t);
    assert_eq!(drain(&mut s), [SupervisorEvent::Start]);
    s.handle_started(t, PID);
    assert_eq!(
        drain(&mut s),
        [Report(WatchdogReport::Started { pgid: PID })]
    );
    s
}

#[allow(non_snake_case)]
fn Finished(code: u8, stopped: Option<StopCause>) -> SupervisorEvent {
    Report(WatchdogReport::Finished { code, stopped })
}

#[test]
fn a_command_starts_only_with_more_than_the_grace_left() {
    let t = Instant::now();
    let deadline = ms(t, 10_000);
    assert!(may_start(t, deadline, GRACE));
    assert!(
        !may_start(ms(t, 8_000), deadline, GRACE),
        "exactly the grace left"
    );
    assert!(!may_start(ms(t, 9_000), deadline, GRACE));
    assert!(
        !may_start(ms(t, 11_000), deadline, GRACE),
        "past the deadline"
    );
}

#[test]
fn a_watchdog_with_no_more_than_the_grace_left_starts_nothing_and_reports_the_lease_lost() {
    let t = Instant::now();
    let deadline = ms(t, 10_000);
    let mut s = Supervisor::new(deadline, GRACE, ms(t, 8_500));
    assert_eq!(
        drain(&mut s),
        [Finished(EXIT_LEASE_LOST, Some(StopCause::DeadlineNear))]
    );
    assert!(s.is_done());
    let mut s = Supervisor::new(deadline, GRACE, t);
    assert_eq!(drain(&mut s), [SupervisorEvent::Start]);
}

#[test]
fn a_command_that_cannot_start_is_reported_with_its_own_code() {
    let t = Instant::now();
    let mut s = Supervisor::new(ms(t, 10_000), GRACE, t);
    drain(&mut s);
    s.handle_start_failed(ms(t, 1));
    assert_eq!(drain(&mut s), [Finished(EXIT_CANNOT_RUN, None)]);
    assert!(s.is_done());
}

#[test]
fn the_first_process_is_the_one_whose_pid_is_the_group_id() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    // A child it left behind, reaped by the watchdog: nothing changes.
    s.handle_exited(ms(t, 100), PID + 1, 0);
    assert_eq!(drain(&mut s), []);
    assert_eq!(s.stop_cause(), None);
    s.handle_exited(ms(t, 200), PID, 3);
    assert_eq!(drain(&mut s), [Signal(Term)]);
    s.handle_group_empty(ms(t, 300));
    assert_eq!(drain(&mut s), [Finished(3, Some(StopCause::LeaderExited))]);
}

#[test]
fn a_group_gone_without_its_first_process_seen_reports_the_error_code() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    s.handle_group_empty(ms(t, 300));
    assert_eq!(drain(&mut s), [Finished(EXIT_ERROR, None)]);
}

#[test]
fn a_failed_timer_kills_the_command_at_once() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    s.handle_timer_failed(ms(t, 100));
    assert_eq!(drain(&mut s), [Signal(Kill)]);
    assert_eq!(s.poll_timeout(), None, "nothing more to wait for");
    s.handle_timer_failed(ms(t, 200));
    assert_eq!(drain(&mut s), [], "one SIGKILL");
    s.handle_timeout(ms(t, 9_000));
    assert_eq!(drain(&mut s), [], "killed already");
    s.handle_group_empty(ms(t, 9_001));
    assert!(matches!(
        drain(&mut s)[..],
        [Report(WatchdogReport::Finished { .. })]
    ));
}

#[test]
fn grace_defaults_to_a_third_of_the_ttl_at_most_five_seconds_and_never_over_half() {
    let s = Duration::from_secs;
    for (ttl, requested, grace) in [
        (s(15), None, Ok(s(5))),
        (s(6), None, Ok(s(2))),
        (s(60), None, Ok(DEFAULT_GRACE_MAX)),
        (s(4), Some(s(2)), Ok(s(2))),
        (s(4), Some(Duration::ZERO), Ok(Duration::ZERO)),
        (
            s(4),
            Some(s(3)),
            Err(GraceTooLong {
                grace: s(3),
                ttl: s(4),
            }),
        ),
    ] {
        assert_eq!(lock_grace(ttl, requested), grace, "{ttl:?} {requested:?}");
    }
    assert_eq!(EXIT_BAD_GRACE, 6, "a code of its own");
    assert!(![EXIT_ERROR, EXIT_LEASE_LOST, EXIT_CANNOT_RUN].contains(&EXIT_BAD_GRACE));
}

#[test]
fn term_at_grace_before_the_deadline_and_kill_at_the_deadline() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    assert_eq!(s.poll_timeout(), Some(ms(t, 8_000)));
    s.handle_timeout(ms(t, 7_999));
    assert_eq!(drain(&mut s), []);
    s.handle_timeout(ms(t, 8_000));
    assert_eq!(drain(&mut s), [Signal(Term)]);
    assert_eq!(s.stop_cause(), Some(StopCause::DeadlineNear));
    assert_eq!(s.poll_timeout(), Some(ms(t, 10_000)));
    s.handle_timeout(ms(t, 9_999));
    assert_eq!(drain(&mut s), []);
    s.handle_timeout(ms(t, 10_000));
    assert_eq!(drain(&mut s), [Signal(Kill)]);
    assert_eq!(s.poll_timeout(), None, "no second SIGKILL");
}

#[test]
fn a_late_wake_past_the_deadline_terms_and_kills_at_once() {
    // A timer that fired late (a suspend): nothing may run past the deadline.
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    s.handle_timeout(ms(t, 30_000));
    assert_eq!(drain(&mut s), [Signal(Term), Signal(Kill)]);
}

#[test]
fn a_renewal_moves_the_deadline_on_but_never_takes_a_stop_back() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    s.handle_deadline(ms(t, 3_000), ms(t, 13_000));
    assert_eq!(s.poll_timeout(), Some(ms(t, 11_000)));
    s.handle_timeout(ms(t, 11_000));
    assert_eq!(drain(&mut s), [Signal(Term)]);
    // A renewal that comes now does not put SIGKILL off.
    s.handle_deadline(ms(t, 11_100), ms(t, 20_000));
    assert_eq!(s.poll_timeout(), Some(ms(t, 13_000)));
    assert_eq!(s.deadline(), ms(t, 13_000));
}

#[test]
fn a_lost_lease_terms_now_and_kills_at_the_earlier_of_grace_and_deadline() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    s.handle_lost(ms(t, 1_000));
    assert_eq!(drain(&mut s), [Signal(Term)]);
    assert_eq!(s.poll_timeout(), Some(ms(t, 3_000)), "now + grace");
    let mut s = started(t, ms(t, 10_000));
    s.handle_deadline(ms(t, 1_000), ms(t, 10_000));
    s.handle_lost(ms(t, 7_500));
    assert_eq!(drain(&mut s), [Signal(Term)]);
    assert_eq!(s.poll_timeout(), Some(ms(t, 9_500)));
    // Lost after the TERM time already passed unnoticed: the deadline bounds SIGKILL.
    let mut s = started(t, ms(t, 10_000));
    s.handle_lost(ms(t, 9_000));
    assert_eq!(drain(&mut s), [Signal(Term)]);
    assert_eq!(s.poll_timeout(), Some(ms(t, 10_000)), "the deadline");
}

#[test]
fn the_tool_gone_stops_the_command() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    s.handle_tool_gone(ms(t, 500));
    assert_eq!(drain(&mut s), [Signal(Term)]);
    assert_eq!(s.stop_cause(), Some(StopCause::ToolGone));
    s.handle_timeout(ms(t, 2_500));
    assert_eq!(drain(&mut s), [Signal(Kill)]);
}

#[test]
fn signals_are_passed_on_and_stop_nothing_by_themselves() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    for sig in [GroupSignal::Term, GroupSignal::Int, GroupSignal::Hup] {
        s.handle_signal(ms(t, 100), sig);
        assert_eq!(drain(&mut s), [Signal(sig)]);
    }
    assert_eq!(s.stop_cause(), None);
    assert_eq!(s.poll_timeout(), Some(ms(t, 8_000)));
}

#[test]
fn when_the_leader_exits_the_rest_of_its_group_is_stopped_before_finishing() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    s.handle_leader_exited(ms(t, 1_000), 0);
    assert_eq!(drain(&mut s), [Signal(Term)], "the rest of the group");
    assert!(!s.is_done(), "not finished while the group has processes");
    s.handle_timeout(ms(t, 3_000));
    assert_eq!(drain(&mut s), [Signal(Kill)]);
    s.handle_group_empty(ms(t, 3_001));
    assert_eq!(drain(&mut s), [Finished(0, Some(StopCause::LeaderExited))]);
    assert!(s.is_done());
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn the_leaders_code_is_the_one_reported_even_after_a_stop() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 10_000));
    s.handle_lost(ms(t, 100));
    s.handle_leader_exited(ms(t, 200), 143);
    s.handle_group_empty(ms(t, 200));
    assert_eq!(
        drain(&mut s),
        [Signal(Term), Finished(143, Some(StopCause::Lost))]
    );
    s.handle_signal(ms(t, 300), GroupSignal::Term);
    assert_eq!(drain(&mut s), [], "nothing to signal once finished");
}

#[test]
fn taking_over_a_group_terms_at_once_and_kills_by_the_deadline() {
    let t = Instant::now();
    let mut s =
        Supervisor::stopping_now(ms(t, 10_000), GRACE, StopCause::WatchdogGone, ms(t, 9_000));
    assert_eq!(drain(&mut s), [Signal(Term)]);
    assert_eq!(s.poll_timeout(), Some(ms(t, 10_000)));
    // Already past the deadline: SIGKILL right after SIGTERM.
    let mut s =
        Supervisor::stopping_now(ms(t, 10_000), GRACE, StopCause::WatchdogGone, ms(t, 11_000));
    assert_eq!(drain(&mut s), [Signal(Term), Signal(Kill)]);
}

#[test]
fn the_channel_lines_read_back_and_refuse_anything_else() {
    let base = Instant::now();
    let to_clock = |at: Instant| Duration::from_secs(100) + at.duration_since(base);
    let from_clock = |d: Duration| base.checked_add(d.checked_sub(Duration::from_secs(100))?);
    for message in [
        WatchdogMessage::Deadline(ms(base, 1_234)),
        WatchdogMessage::Lost,
        WatchdogMessage::Signal(GroupSignal::Hup),
    ] {
        let line = message.to_line(to_clock);
        assert_eq!(
            WatchdogMessage::parse(&line, from_clock),
            Some(message),
            "{line}"
        );
    }
    assert_eq!(
        WatchdogMessage::Deadline(ms(base, 1_234)).to_line(to_clock),
        "deadline 101.234000000"
    );
    for report in [
        WatchdogReport::Started { pgid: 4242 },
        WatchdogReport::Finished {
            code: 7,
            stopped: None,
        },
        WatchdogReport::Finished {
            code: 137,
            stopped: Some(StopCause::DeadlineNear),
        },
    ] {
        assert_eq!(WatchdogReport::parse(&report.to_line()), Some(report));
    }
    for bad in [
        "",
        "deadline",
        "deadline 1.5",
        "deadline x.000000000",
        "lost now",
        "signal STOP",
        "started 0",
        "finished 300",
        "finished 1 maybe",
        "started 1 2",
        // Found by the fuzzer: a time past any instant is refused, not a panic.
        "deadline 11244444444444444234.000000001",
    ] {
        assert_eq!(WatchdogMessage::parse(bad, from_clock), None, "{bad:?}");
        assert_eq!(WatchdogReport::parse(bad), None, "{bad:?}");
    }
}

fn elected_and_started(t: Instant) -> Lock {
    let mut lock = Lock::new(GRACE, None, t);
    lock.handle_elected(t, Some(ms(t, 10_000)));
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::StartWatchdog {
            deadline: ms(t, 10_000)
        }]
    );
    lock
}

#[test]
fn lock_waits_out_wait_only_after_a_refusal() {
    let t = Instant::now();
    let mut lock = Lock::new(GRACE, Some(Duration::from_millis(500)), t);
    assert_eq!(lock.poll_timeout(), Some(ms(t, 500)));
    lock.handle_not_granted(ms(t, 10), NotGranted::Held);
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::Waiting(NotGranted::Held)]
    );
    lock.handle_timeout(ms(t, 500));
    let exit = LockEvent::Exit {
        exit: LockExit::NotHeld,
        release: true,
    };
    assert_eq!(drain_lock(&mut lock), [exit]);
    // The wait passes with no answer yet: the next refusal ends it; an election
    // does not.
    let mut lock = Lock::new(GRACE, Some(Duration::ZERO), t);
    lock.handle_timeout(t);
    assert_eq!(drain_lock(&mut lock), []);
    lock.handle_not_granted(ms(t, 10), NotGranted::Held);
    assert_eq!(drain_lock(&mut lock), [exit]);
    assert!(lock.is_done());
    let mut lock = Lock::new(GRACE, Some(Duration::ZERO), t);
    lock.handle_timeout(t);
    lock.handle_elected(ms(t, 10), Some(ms(t, 15_000)));
    assert!(matches!(
        drain_lock(&mut lock)[..],
        [LockEvent::StartWatchdog { .. }]
    ));
}

/// What a refused acquire was decides how the wait ends and what is told while it
/// lasts: no lease service is never "held by another holder".
#[test]
fn lock_tells_no_service_apart_from_a_held_key() {
    use crate::holder::OutcomeClass;
    // How the holder's report reads.
    for (named, answer, want) in [
        (true, OutcomeClass::Clear, NotGranted::Held),
        (false, OutcomeClass::Clear, NotGranted::Held),
        (false, OutcomeClass::NoResponders, NotGranted::NoService),
        (false, OutcomeClass::TimedOut, NotGranted::NoAnswer),
        (false, OutcomeClass::RequestFailed, NotGranted::NoAnswer),
        (false, OutcomeClass::Unavailable, NotGranted::NoAnswer),
        (false, OutcomeClass::Internal, NotGranted::NoAnswer),
    ] {
        assert_eq!(NotGranted::of(named, answer), want, "{named} {answer:?}");
    }
    // How the wait ends: by the last refusal.
    let t = Instant::now();
    for (refusals, want) in [
        (&[NotGranted::NoService][..], LockExit::NoService),
        (&[NotGranted::NoAnswer], LockExit::NoAnswer),
        (&[NotGranted::Held], LockExit::NotHeld),
        (
            &[NotGranted::Held, NotGranted::NoService],
            LockExit::NoService,
        ),
        (
            &[NotGranted::NoService, NotGranted::Held],
            LockExit::NotHeld,
        ),
    ] {
        let mut lock = Lock::new(GRACE, Some(Duration::from_millis(500)), t);
        for (i, why) in refusals.iter().enumerate() {
            lock.handle_not_granted(ms(t, 10 + i as u64), *why);
        }
        lock.handle_timeout(ms(t, 500));
        let events = drain_lock(&mut lock);
        let exit = LockEvent::Exit {
            exit: want,
            release: true,
        };
        assert_eq!(events.last(), Some(&exit), "{refusals:?}");
    }
    // Without --wait it campaigns on, telling each change of reason once.
    let mut lock = Lock::new(GRACE, None, t);
    for (at, why) in [
        (10, NotGranted::NoService),
        (20, NotGranted::NoService),
        (30, NotGranted::Held),
        (40, NotGranted::Held),
        (50, NotGranted::NoService),
    ] {
        lock.handle_not_granted(ms(t, at), why);
    }
    assert_eq!(
        drain_lock(&mut lock),
        [
            LockEvent::Waiting(NotGranted::NoService),
            LockEvent::Waiting(NotGranted::Held),
            LockEvent::Waiting(NotGranted::NoService),
        ]
    );
    assert!(!lock.is_done());
}

#[test]
fn lock_elected_with_too_little_time_left_waits_for_a_renewal() {
    let t = Instant::now();
    let mut lock = Lock::new(GRACE, None, t);
    lock.handle_elected(ms(t, 8_500), Some(ms(t, 10_000)));
    assert_eq!(
        drain_lock(&mut lock),
        [],
        "1.5 s left, grace 2 s: not started"
    );
    lock.handle_deadline(ms(t, 9_000), ms(t, 19_000));
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::StartWatchdog {
            deadline: ms(t, 19_000)
        }]
    );
    // Or loses the lease first: nothing ran, so release and exit as lost.
    let mut lock = Lock::new(GRACE, None, t);
    lock.handle_elected(ms(t, 8_500), Some(ms(t, 10_000)));
    lock.handle_lost(ms(t, 10_000));
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::Exit {
            exit: LockExit::LeaseLost,
            release: true
        }]
    );
}

#[test]
fn lock_passes_deadlines_loss_and_signals_to_the_watchdog() {
    let t = Instant::now();
    let mut lock = elected_and_started(t);
    lock.handle_deadline(ms(t, 3_000), ms(t, 13_000));
    lock.handle_signal(ms(t, 3_100), GroupSignal::Hup);
    lock.handle_lost(ms(t, 4_000));
    lock.handle_deadline(ms(t, 4_100), ms(t, 14_000));
    assert_eq!(
        drain_lock(&mut lock),
        [
            LockEvent::ToWatchdog(WatchdogMessage::Deadline(ms(t, 13_000))),
            LockEvent::ToWatchdog(WatchdogMessage::Signal(GroupSignal::Hup)),
            LockEvent::ToWatchdog(WatchdogMessage::Lost),
        ],
        "no deadline after the loss"
    );
}

#[test]
fn lock_releases_only_once_the_watchdog_saw_the_group_empty() {
    let t = Instant::now();
    let mut lock = elected_and_started(t);
    lock.handle_report(ms(t, 10), WatchdogReport::Started { pgid: 77 });
    lock.handle_report(
        ms(t, 1_000),
        WatchdogReport::Finished {
            code: 3,
            stopped: Some(StopCause::LeaderExited),
        },
    );
    assert_eq!(
        drain_lock(&mut lock),
        [],
        "nothing before the watchdog is gone"
    );
    lock.handle_watchdog_gone(ms(t, 1_001));
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::Exit {
            exit: LockExit::Command(3),
            release: true
        }]
    );
}

#[test]
fn lock_exits_as_lost_when_the_watchdog_stopped_the_command_for_the_lease() {
    let t = Instant::now();
    for (stopped, lost, at) in [
        (Some(StopCause::DeadlineNear), false, 8_100),
        (Some(StopCause::Lost), true, 5_000),
        (None, false, 10_000), // the tool woke past its deadline
    ] {
        let mut lock = elected_and_started(t);
        lock.handle_report(t, WatchdogReport::Started { pgid: 77 });
        if lost {
            lock.handle_lost(ms(t, 4_000));
            drain_lock(&mut lock);
        }
        lock.handle_report(ms(t, at), WatchdogReport::Finished { code: 0, stopped });
        lock.handle_watchdog_gone(ms(t, at));
        assert_eq!(
            drain_lock(&mut lock),
            [LockEvent::Exit {
                exit: LockExit::LeaseLost,
                release: true
            }],
            "{stopped:?}"
        );
    }
}

#[test]
fn lock_whose_watchdog_died_stops_the_group_itself_before_releasing() {
    let t = Instant::now();
    let mut lock = elected_and_started(t);
    lock.handle_report(ms(t, 10), WatchdogReport::Started { pgid: 77 });
    lock.handle_watchdog_gone(ms(t, 5_000));
    assert_eq!(
        drain_lock(&mut lock),
        [
            LockEvent::WatchGroup { pgid: 77 },
            LockEvent::Signal {
                pgid: 77,
                signal: Term
            }
        ]
    );
    assert_eq!(lock.poll_timeout(), Some(ms(t, 7_000)), "now + grace");
    lock.handle_signal(ms(t, 5_500), GroupSignal::Int);
    lock.handle_timeout(ms(t, 7_000));
    assert_eq!(
        drain_lock(&mut lock),
        [
            LockEvent::Signal {
                pgid: 77,
                signal: GroupSignal::Int
            },
            LockEvent::Signal {
                pgid: 77,
                signal: Kill
            }
        ]
    );
    assert!(!lock.is_done(), "no release while a process may run");
    lock.handle_group_empty(ms(t, 7_010));
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::Exit {
            exit: LockExit::WatchdogGone,
            release: true
        }]
    );
}

#[test]
fn lock_whose_watchdog_died_near_the_deadline_kills_by_the_deadline() {
    let t = Instant::now();
    let mut lock = elected_and_started(t);
    lock.handle_report(ms(t, 10), WatchdogReport::Started { pgid: 77 });
    lock.handle_watchdog_gone(ms(t, 9_500));
    drain_lock(&mut lock);
    assert_eq!(lock.poll_timeout(), Some(ms(t, 10_000)));
}

#[test]
fn lock_whose_watchdog_died_before_naming_the_group_releases_nothing() {
    let t = Instant::now();
    let mut lock = elected_and_started(t);
    lock.handle_watchdog_gone(ms(t, 100));
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::Exit {
            exit: LockExit::WatchdogGone,
            release: false
        }]
    );
}

#[test]
fn lock_signalled_before_the_command_started_releases_and_exits() {
    let t = Instant::now();
    let mut lock = Lock::new(GRACE, None, t);
    lock.handle_signal(ms(t, 10), GroupSignal::Term);
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::Exit {
            exit: LockExit::Interrupted(GroupSignal::Term),
            release: true
        }]
    );
    assert_eq!(GroupSignal::Term.exit_code(), 143);
    assert_eq!(GroupSignal::Int.exit_code(), 130);
}

#[test]
fn lock_elected_with_the_tenure_over_already_is_a_lost_lease() {
    let t = Instant::now();
    let mut lock = Lock::new(GRACE, None, t);
    // The campaign elected, but its tenure had ended by the time it was read.
    lock.handle_elected(ms(t, 100), None);
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::Exit {
            exit: LockExit::LeaseLost,
            release: true
        }]
    );
}

#[test]
fn lock_holds_the_key_and_fence_it_was_elected_for_and_counts_only_that_keys_renewals() {
    use crate::holder::relay::Heard;
    let t = Instant::now();
    let mut lock = Lock::new(GRACE, None, t);
    lock.handle_heard(
        t,
        "sem-1",
        &Heard::Elected {
            fence: 9,
            deadline: ms(t, 15_000),
        },
    );
    assert_eq!(lock.held(), Some(("sem-1", 9)));
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::StartWatchdog {
            deadline: ms(t, 15_000)
        }]
    );
    lock.handle_report(t, WatchdogReport::Started { pgid: PID });
    // Another slot's renewal moves nothing; the held one's does.
    let cases = [("sem-0", false), ("sem-1", true)];
    for (key, passed) in cases {
        let deadline = ms(t, 20_000);
        lock.handle_heard(t, key, &Heard::Renewed { deadline });
        let told = drain_lock(&mut lock);
        let expected = if passed {
            vec![LockEvent::ToWatchdog(WatchdogMessage::Deadline(deadline))]
        } else {
            vec![]
        };
        assert_eq!(told, expected, "{key}");
    }
}

#[test]
fn lock_hears_an_election_whose_deadline_passed_as_a_loss() {
    use crate::holder::relay::Heard;
    let t = Instant::now();
    let mut lock = Lock::new(GRACE, None, t);
    lock.handle_heard(
        ms(t, 15_000),
        "k",
        &Heard::Elected {
            fence: 3,
            deadline: ms(t, 15_000),
        },
    );
    assert_eq!(
        drain_lock(&mut lock),
        [LockEvent::Exit {
            exit: LockExit::LeaseLost,
            release: true
        }]
    );
}

#[test]
fn lock_names_the_holder_the_service_last_named() {
    use crate::holder::relay::Heard;
    let t = Instant::now();
    let mut lock = Lock::new(GRACE, None, t);
    // (holder named in the refusal, holder lock names after it)
    let cases = [
        (Some("a"), Some("a")),
        (None, Some("a")),
        (Some("b"), Some("b")),
    ];
    for (named, names) in cases {
        lock.handle_heard(
            t,
            "k",
            &Heard::NotGranted {
                why: NotGranted::Held,
                holder: named.map(String::from),
            },
        );
        assert_eq!(lock.named_holder(), names, "{named:?}");
    }
    assert_eq!(lock.held(), None);
}

#[test]
fn the_watchdogs_timer_is_armed_once_per_wake_up() {
    let t = Instant::now();
    let mut s = started(t, ms(t, 15_000));
    // The first wake-up is handed out once; asked again, nothing to arm.
    assert_eq!(s.poll_timer(), Some(Some(ms(t, 13_000))));
    assert_eq!(s.poll_timer(), None);
    // A failed arm is not retried for the same wake-up: the kill it leads to
    // has no timer left to arm.
    s.handle_timer_failed(t);
    assert_eq!(s.poll_timer(), Some(None));
    assert_eq!(s.poll_timer(), None);
    // A renewal's new wake-up is armed.
    let mut s = started(t, ms(t, 15_000));
    assert_eq!(s.poll_timer(), Some(Some(ms(t, 13_000))));
    s.handle_deadline(t, ms(t, 20_000));
    assert_eq!(s.poll_timer(), Some(Some(ms(t, 18_000))));
}
