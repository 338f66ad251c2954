//! How long a key goes without a leader, on a real server and service (loopback):
//! when the leader stops (its release wakes the waiting member through the key's
//! change event), and when the leader's process is SIGKILLed (the server's TTL frees
//! the key; its expiry marker wakes the waiting member). Figures are printed (with
//! `--show-output`), not asserted: the benchmark's habit, in a test that runs the
//! library as shipped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dagnats_leases_core::RequestOutcome;
use dagnats_leases_core::holder::StepDownReason;
use dagnats_leases_core::wire::{Endpoint, Response};
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::client::LeaseClient;
use dagnats_leases_tokio::member::{CampaignObserver, Elector, Member, ObservedRequest, Ownership};
use dagnats_leases_tokio::service::{self, ServiceHandle, ServiceOptions};

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");
const KEY: &str = "leader";
const WAIT: Duration = Duration::from_secs(30);

async fn setup() -> (NatsServer, ServiceHandle) {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let service = service::start((server.url(), client), ServiceOptions::default())
        .await
        .unwrap();
    (server, service)
}

async fn member(server: &NatsServer, name: &str) -> Member {
    let client = async_nats::connect(server.url()).await.unwrap();
    Member::new(client, name).unwrap()
}

/// Tells when a member's acquire was refused: it then waits, subscribed to the key's
/// change events (its subscription goes out before its first request).
struct Refusals(tokio::sync::mpsc::UnboundedSender<()>);

impl CampaignObserver for Refusals {
    fn request(&self, request: &ObservedRequest<'_>) {
        let refused = match request.outcome {
            RequestOutcome::Reply { payload, .. } => matches!(
                Response::decode(request.endpoint, payload),
                Ok(Response::Acquired(r)) if !r.granted
            ),
            _ => false,
        };
        if request.endpoint == Endpoint::Acquire && refused {
            let _ = self.0.send(());
        }
    }
}

/// A member whose refused acquires come out of the receiver.
async fn watched_member(
    server: &NatsServer,
    name: &str,
) -> (Member, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let member = member(server, name)
        .await
        .with_observer(std::sync::Arc::new(Refusals(tx)));
    (member, rx)
}

/// Waits (bounded) until the member was refused: it is waiting for the key.
async fn refused(rx: &mut tokio::sync::mpsc::UnboundedReceiver<()>) {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("refused within 30 s")
        .expect("the member runs");
}

/// Waits (bounded) for `elector`'s election; returns when it came.
async fn elected(elector: &mut Elector) -> Instant {
    let change = tokio::time::timeout(WAIT, elector.next())
        .await
        .expect("elected within 30 s");
    match change.map(|c| c.ownership) {
        Some(Ownership::Elected { .. }) => Instant::now(),
        other => panic!("expected an election, got {other:?}"),
    }
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn summary(mut gaps: Vec<Duration>) -> String {
    gaps.sort();
    format!(
        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {}",
        percentile(&gaps, 50).as_secs_f64() * 1e3,
        percentile(&gaps, 99).as_secs_f64() * 1e3,
        gaps[gaps.len() - 1].as_secs_f64() * 1e3,
        gaps.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_to_a_waiting_member() {
    let (server, _service) = setup().await;
    let ttl = Duration::from_secs(3);
    let (a, mut a_refused) = watched_member(&server, "m-a").await;
    let (b, mut b_refused) = watched_member(&server, "m-b").await;
    let members = [(a, &mut a_refused), (b, &mut b_refused)];
    let mut leader = members[0].0.elect(KEY, ttl).unwrap();
    elected(&mut leader).await;
    let mut waiting = members[1].0.elect(KEY, ttl).unwrap();
    refused(members[1].1).await;
    let (mut from_release, mut from_stop) = (Vec::new(), Vec::new());
    let mut next = 0;
    for _round in 0..20 {
        let stop_called = Instant::now();
        leader.stop().await;
        let released = Instant::now();
        let at = elected(&mut waiting).await;
        from_release.push(at.saturating_duration_since(released));
        from_stop.push(at.saturating_duration_since(stop_called));
        // The one that stopped campaigns again, and is measured once it waits.
        let again = members[next].0.elect(KEY, ttl).unwrap();
        refused(members[next].1).await;
        leader = std::mem::replace(&mut waiting, again);
        next = 1 - next;
    }
    println!(
        "handover, release acknowledged -> next Elected: {}",
        summary(from_release)
    );
    println!(
        "handover, stop() called -> next Elected: {}",
        summary(from_stop)
    );
    leader.stop().await;
    waiting.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_over_passes_the_key_to_the_waiting_member_and_stays_a_candidate() {
    let (server, _service) = setup().await;
    let ttl = Duration::from_secs(3);
    let (a, mut a_refused) = watched_member(&server, "h-a").await;
    let (b, mut b_refused) = watched_member(&server, "h-b").await;
    // a first, b once a leads: started together, either could win the key.
    let mut first = a.elect(KEY, ttl).unwrap();
    elected(&mut first).await;
    let mut electors = [first, b.elect(KEY, ttl).unwrap()];
    let refusals = [&mut a_refused, &mut b_refused];
    refused(refusals[1]).await;
    let mut gaps = Vec::new();
    let mut leader = 0;
    for round in 0..10 {
        let called = Instant::now();
        electors[leader].hand_over();
        let next = 1 - leader;
        let at = elected(&mut electors[next]).await;
        gaps.push(at.saturating_duration_since(called));
        match electors[leader].next().await.map(|c| c.ownership) {
            Some(Ownership::SteppedDown { reason }) => {
                assert_eq!(reason, StepDownReason::HandedOver, "round {round}")
            }
            other => panic!("round {round}: {other:?}"),
        }
        // Still a candidate: it asks again (a campaign interval later) and waits.
        refused(refusals[leader]).await;
        leader = next;
    }
    println!(
        "hand_over() called -> the waiting member Elected: {}",
        summary(gaps)
    );
    for elector in electors {
        elector.stop().await;
    }
}

/// `dagnats-leases lock KEY -- sleep 60` as a leader in a process of its own.
fn lock_process(server: &NatsServer, holder: &str, ttl_ms: u64) -> Child {
    Command::new(BIN)
        .args([
            "lock",
            KEY,
            "--holder",
            holder,
            "--ttl-ms",
            &ttl_ms.to_string(),
        ])
        .args(["--nats-url", &server.url(), "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_takes_over_from_a_sigkilled_leader_after_its_ttl() {
    let (server, _service) = setup().await;
    let ttl = Duration::from_secs(2);
    let leases = LeaseClient::new(async_nats::connect(server.url()).await.unwrap());
    let follower = member(&server, "follower").await;
    let mut takeovers = Vec::new();
    for round in 0..5 {
        let holder = format!("doomed-{round}");
        let mut leader = lock_process(&server, &holder, ttl.as_millis() as u64);
        let deadline = Instant::now() + WAIT;
        while leases
            .owner(KEY)
            .await
            .unwrap()
            .is_none_or(|l| l.holder != holder)
        {
            assert!(Instant::now() < deadline, "{holder} never held {KEY}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut elector = follower.elect(KEY, ttl).unwrap();
        // The tool dies at once, mid-tenure: nothing releases the key. (Its watchdog
        // stops the command; the lease runs out by its TTL.)
        leader.kill().unwrap();
        let killed = Instant::now();
        leader.wait().unwrap();
        let at = elected(&mut elector).await;
        takeovers.push(at.saturating_duration_since(killed));
        elector.stop().await;
    }
    println!(
        "takeover after SIGKILL of the leader (TTL {ttl:?}; goal: TTL + 0.35 s): {}",
        summary(takeovers)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preferred_member_wins_a_released_key_and_a_lower_one_takes_it_when_it_is_gone() {
    let (server, _service) = setup().await;
    let ttl = Duration::from_secs(3);
    let (preferred, mut preferred_refused) = watched_member(&server, "preferred").await;
    let preferred = preferred.with_priority(10);
    let lower = member(&server, "lower").await.with_priority(3);
    let holder_now = async || {
        let leases = LeaseClient::new(async_nats::connect(server.url()).await.unwrap());
        leases.owner(KEY).await.unwrap().map(|l| l.holder)
    };
    for round in 0..3 {
        // The lower member holds the key; the preferred one waits for it.
        let mut low = lower.elect(KEY, ttl).unwrap();
        elected(&mut low).await;
        let mut high = preferred.elect(KEY, ttl).unwrap();
        refused(&mut preferred_refused).await;
        // The lower one releases and campaigns again at once: the preferred one wins.
        low.stop().await;
        let mut low = lower.elect(KEY, ttl).unwrap();
        elected(&mut high).await;
        assert_eq!(
            holder_now().await.as_deref(),
            Some("preferred"),
            "round {round}"
        );
        // The preferred one goes away: the lower one takes over.
        let gone = Instant::now();
        high.stop().await;
        elected(&mut low).await;
        println!(
            "round {round}: the lower member took over {:?} after the preferred one stopped",
            gone.elapsed()
        );
        assert_eq!(holder_now().await.as_deref(), Some("lower"));
        low.stop().await;
    }
}
