//! The stop matrix: every kind of process this project ships stops within its stated
//! bound whatever NATS is doing, on real servers.
//!
//! Each cell runs its own nats-server; the process under test reaches it through a
//! relay the test controls ([`Link`]). The NATS states: up (the reference), the
//! server killed (SIGKILL), frozen (SIGSTOP), the route cut (the relay closes its
//! connections and refuses new ones), and slow (the relay holds every chunk of
//! bytes back by [`SLOW`]). The
//! kinds: `serve` (the binary, SIGTERM, a call in flight), a library
//! [`Elector::stop`], a library [`Shards`] stop, the background release of
//! [`Elector::hand_over`] and of a dropped member, `lock` (the binary, SIGTERM, its
//! command running) and an operator command (`owner`, started once NATS is in that
//! state). The time from the stop to the end is measured and checked against the
//! bound with [`MARGIN`] on top: the bound is the rule, the test fails only when a
//! stop hangs past it. A process that ends must leave nothing running (its stderr
//! pipe, shared with everything it started, reaches its end). The cells run
//! concurrently; the figures are printed (docs/operations.md quotes them).

use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dagnats_leases_core::holder::HolderConfig;
use dagnats_leases_core::io::FLUSH_BOUND;
use dagnats_leases_core::service::shutdown::Shutdown;
use dagnats_leases_core::subjects::inbox_subject;
use dagnats_leases_core::wire::Endpoint;
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tests::proxy::Link;
use dagnats_leases_tokio::client::{DEFAULT_CALL_TIMEOUT, LeaseClient};
use dagnats_leases_tokio::member::{
    CampaignObserver, Elector, Member, ObservedRequest, Ownership, Shards,
};
use dagnats_leases_tokio::service::{self, ServiceHandle, ServiceOptions};
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");
/// The lease TTL of the library and `lock` cells: requests bounded by ttl/4 = 1 s.
const TTL: Duration = Duration::from_secs(4);
/// `serve --shutdown-timeout-ms` in the serve cells.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the slow relay holds each chunk back.
const SLOW: Duration = Duration::from_millis(300);
/// Room on top of every bound for a loaded machine: past bound + margin, a stop hangs.
const MARGIN: Duration = Duration::from_secs(5);
/// Bound on getting a cell ready (servers, services, elections).
const READY: Duration = Duration::from_secs(30);
/// async-nats' default connection timeout, which the operator commands keep.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nats {
    Up,
    Killed,
    Frozen,
    Cut,
    Slow,
}

const STATES: [Nats; 5] = [Nats::Up, Nats::Killed, Nats::Frozen, Nats::Cut, Nats::Slow];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Serve,
    ElectorStop,
    ShardsStop,
    HandOver,
    MemberDrop,
    Lock,
    OwnerCommand,
}

const KINDS: [Kind; 7] = [
    Kind::Serve,
    Kind::ElectorStop,
    Kind::ShardsStop,
    Kind::HandOver,
    Kind::MemberDrop,
    Kind::Lock,
    Kind::OwnerCommand,
];

/// One cell's result.
#[derive(Debug)]
struct Row {
    kind: Kind,
    nats: Nats,
    took: Duration,
    bound: Duration,
    /// The exit code, for a process.
    code: Option<i32>,
    /// What went wrong, if anything.
    failure: Option<String>,
}

/// A cell's world: its server, the relay to it, and (for the cells that need one)
/// a lease service connected straight to the server.
struct World {
    server: NatsServer,
    link: Link,
    _service: Option<ServiceHandle>,
    /// A client straight to the server (not through the relay).
    direct: async_nats::Client,
}

impl World {
    async fn new(with_service: bool) -> Self {
        let server = NatsServer::start();
        let link = Link::bind().expect("a relay");
        link.set_target(server.addr());
        let direct = async_nats::connect(server.url()).await.expect("connects");
        let service = if with_service {
            Some(
                service::start((server.url(), direct.clone()), ServiceOptions::default())
                    .await
                    .expect("the service starts"),
            )
        } else {
            None
        };
        Self {
            server,
            link,
            _service: service,
            direct,
        }
    }

    /// The URL through the relay.
    fn url(&self) -> String {
        format!("nats://{}", self.link.addr())
    }

    fn enter(&mut self, nats: Nats) {
        match nats {
            Nats::Up => {}
            Nats::Killed => self.server.kill(),
            Nats::Frozen => self.server.pause(),
            Nats::Cut => self.link.cut(),
            Nats::Slow => self.link.set_delay(SLOW),
        }
    }

    /// Waits (bounded) until a service answers `owner` other than `unavailable`.
    async fn wait_serving(&self) {
        let leases = LeaseClient::new(self.direct.clone()).with_timeout(Duration::from_secs(2));
        let deadline = Instant::now() + READY;
        loop {
            if leases.owner("probe").await.is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "no service came up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Waits for `child` to exit, at most `limit` (then kills it); the time it took
/// and its code (`None`: it hung and was killed). Then checks that its stderr,
/// shared with every process it started, reaches its end: nothing is left running.
async fn wait_exit(
    mut child: Child,
    from: Instant,
    limit: Duration,
) -> (Duration, Option<i32>, Option<String>) {
    let mut stderr = child.stderr.take().expect("stderr piped");
    let drain = tokio::spawn(async move {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text).await;
        text
    });
    let waited = tokio::time::timeout(limit.saturating_sub(from.elapsed()), child.wait()).await;
    let took = from.elapsed();
    let code = match waited {
        Ok(Ok(status)) => status.code().or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            status.signal().map(|s| 128 + s)
        }),
        _ => {
            let _ = child.kill().await;
            // Bounded: what it started may still hold the pipe.
            let text = tokio::time::timeout(Duration::from_secs(2), drain)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            return (
                took,
                None,
                Some(format!(
                    "still running {took:?} after the stop; it said: {}",
                    String::from_utf8_lossy(&text)
                )),
            );
        }
    };
    match tokio::time::timeout(Duration::from_secs(5), drain).await {
        Ok(_) => (took, code, None),
        Err(_) => (
            took,
            code,
            Some("exited, but a process it started still holds its stderr".into()),
        ),
    }
}

fn row(kind: Kind, nats: Nats, took: Duration, bound: Duration) -> Row {
    Row {
        kind,
        nats,
        took,
        bound,
        code: None,
        failure: None,
    }
}

/// `serve` through the relay, a forward in flight (its owner never answers), one
/// lease held; NATS enters `nats`; SIGTERM. Bound: the stop machine's.
async fn serve_cell(nats: Nats) -> Row {
    let mut world = World::new(false).await;
    let child = Command::new(BIN)
        .args(["serve", "--nats-url", &world.url()])
        .args([
            "--shutdown-timeout-ms",
            &SHUTDOWN_TIMEOUT.as_millis().to_string(),
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    world.wait_serving().await;
    let leases = LeaseClient::new(world.direct.clone());
    let granted = leases
        .acquire("k", "owner", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(granted.granted);
    let mut inbox = world
        .direct
        .subscribe(inbox_subject("owner", "k"))
        .await
        .unwrap();
    world.direct.flush().await.unwrap();
    let forward = tokio::spawn(async move {
        leases
            .forward("k", b"never answered", Duration::from_secs(20))
            .await
    });
    tokio::time::timeout(READY, inbox.next())
        .await
        .expect("the forward reaches the owner");
    world.enter(nats);
    let bound = Shutdown::bound(SHUTDOWN_TIMEOUT);
    let pid = child.id().expect("running").to_string();
    let from = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(killed.unwrap().success());
    let (took, code, mut failure) = wait_exit(child, from, bound + MARGIN).await;
    if failure.is_none() && code != Some(0) {
        failure = Some(format!("exit {code:?}, not 0"));
    }
    forward.abort();
    Row {
        code,
        failure,
        ..row(Kind::Serve, nats, took, bound)
    }
}

/// Waits (bounded) for the election.
async fn elected(elector: &mut Elector) {
    let change = tokio::time::timeout(READY, elector.next())
        .await
        .expect("elected in time");
    assert!(
        matches!(change.map(|c| c.ownership), Some(Ownership::Elected { .. })),
        "elected first"
    );
}

/// A member through the relay elected for `k`; NATS enters `nats`;
/// [`Elector::stop`]. Bound: the holder's stop bound.
async fn elector_cell(nats: Nats) -> Row {
    let mut world = World::new(true).await;
    let client = async_nats::connect(world.url()).await.unwrap();
    let member = Member::new(client, "elector").unwrap();
    let mut elector = member.elect("k", TTL).unwrap();
    elected(&mut elector).await;
    world.enter(nats);
    let bound = HolderConfig::new("k", "elector", TTL).stop_bound();
    let from = Instant::now();
    let stopped = tokio::time::timeout(bound + MARGIN, elector.stop()).await;
    let took = from.elapsed();
    Row {
        failure: stopped
            .is_err()
            .then(|| format!("Elector::stop still waiting {took:?} after it was called")),
        ..row(Kind::ElectorStop, nats, took, bound)
    }
}

/// A member through the relay holding three shards; NATS enters `nats`;
/// [`Shards::stop`]. Bound: the holder's stop bound (the releases go out at once).
async fn shards_cell(nats: Nats) -> Row {
    let mut world = World::new(true).await;
    let client = async_nats::connect(world.url()).await.unwrap();
    let member = Member::new(client, "sharder").unwrap();
    let keys = ["s0", "s1", "s2"];
    let mut shards: Shards = member.shards(&keys, keys.len(), TTL).unwrap();
    let deadline = Instant::now() + READY;
    while shards.held().len() < keys.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(left, shards.next())
            .await
            .expect("every shard held in time");
    }
    world.enter(nats);
    let bound = HolderConfig::new("s0", "sharder", TTL).stop_bound();
    let from = Instant::now();
    let stopped = tokio::time::timeout(bound + MARGIN, shards.stop()).await;
    let took = from.elapsed();
    Row {
        failure: stopped
            .is_err()
            .then(|| format!("Shards::stop still waiting {took:?} after it was called")),
        ..row(Kind::ShardsStop, nats, took, bound)
    }
}

/// Passes on when a release request of the campaign is over (answered or given up).
struct ReleaseSeen(tokio::sync::mpsc::UnboundedSender<Instant>);

impl CampaignObserver for ReleaseSeen {
    fn request(&self, request: &ObservedRequest<'_>) {
        if request.endpoint == Endpoint::Release {
            let _ = self.0.send(Instant::now());
        }
    }
}

/// A member through the relay elected for `k`; NATS enters `nats`; then
/// [`Elector::hand_over`], or the elector and the member dropped: the release runs
/// in the background, and is over (seen by an observer) within the holder's stop
/// bound.
async fn background_release_cell(kind: Kind, nats: Nats) -> Row {
    let mut world = World::new(true).await;
    let client = async_nats::connect(world.url()).await.unwrap();
    let (seen, mut released) = tokio::sync::mpsc::unbounded_channel();
    let member = Member::new(client, "background")
        .unwrap()
        .with_observer(Arc::new(ReleaseSeen(seen)));
    let mut elector = member.elect("k", TTL).unwrap();
    elected(&mut elector).await;
    world.enter(nats);
    let bound = HolderConfig::new("k", "background", TTL).stop_bound();
    let from = Instant::now();
    let kept = match kind {
        Kind::HandOver => {
            elector.hand_over();
            Some((elector, member))
        }
        _ => {
            drop((elector, member));
            None
        }
    };
    let over = tokio::time::timeout(bound + MARGIN, released.recv()).await;
    let took = from.elapsed();
    drop(kept);
    Row {
        failure: over
            .is_err()
            .then(|| format!("the release still running {took:?} after {kind:?}")),
        ..row(kind, nats, took, bound)
    }
}

/// `lock` through the relay, its command running; NATS enters `nats`; SIGTERM to
/// `lock`, which passes it on: the command ends at once, and `lock` releases
/// within the holder's stop bound, flushes within [`FLUSH_BOUND`] and exits with
/// the command's code (143).
async fn lock_cell(nats: Nats) -> Row {
    let mut world = World::new(true).await;
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let script = format!("echo $$ > {}; exec sleep 600", started.display());
    let ttl_ms = TTL.as_millis().to_string();
    let child = Command::new(BIN)
        .args(["lock", "k", "--ttl-ms", &ttl_ms, "--nats-url", &world.url()])
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let deadline = Instant::now() + READY;
    while std::fs::read_to_string(&started).map_or(true, |t| !t.ends_with('\n')) {
        assert!(Instant::now() < deadline, "lock never ran its command");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    world.enter(nats);
    // The command ends at once on the SIGTERM passed on; then the release and the
    // exit's flush.
    let bound = HolderConfig::new("k", "lock", TTL).stop_bound() + FLUSH_BOUND;
    let pid = child.id().expect("running").to_string();
    let from = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(killed.unwrap().success());
    let (took, code, mut failure) = wait_exit(child, from, bound + MARGIN).await;
    if failure.is_none() && code != Some(143) {
        failure = Some(format!("exit {code:?}, not the command's 143"));
    }
    if failure.is_some() {
        // Leave nothing behind a failed cell: the command (its watchdog then ends).
        let pid = std::fs::read_to_string(&started).unwrap_or_default();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status();
    }
    Row {
        code,
        failure,
        ..row(Kind::Lock, nats, took, bound)
    }
}

/// `owner k` through the relay, started once NATS is in `nats`: it ends within
/// the connection timeout, the call timeout and the flush bound, exit 2 (no NATS
/// server) when NATS is gone, 0 when it is up or only slow.
async fn owner_cell(nats: Nats) -> Row {
    let mut world = World::new(true).await;
    world.wait_serving().await;
    let leases = LeaseClient::new(world.direct.clone());
    assert!(
        leases
            .acquire("k", "someone", Duration::from_secs(60))
            .await
            .unwrap()
            .granted
    );
    world.enter(nats);
    let bound = CONNECT_TIMEOUT + DEFAULT_CALL_TIMEOUT + FLUSH_BOUND;
    let from = Instant::now();
    let child = Command::new(BIN)
        .args(["owner", "k", "--nats-url", &world.url()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let (took, code, mut failure) = wait_exit(child, from, bound + MARGIN).await;
    let expected = if matches!(nats, Nats::Up | Nats::Slow) {
        0
    } else {
        2
    };
    if failure.is_none() && code != Some(expected) {
        failure = Some(format!("exit {code:?}, not {expected}"));
    }
    Row {
        code,
        failure,
        ..row(Kind::OwnerCommand, nats, took, bound)
    }
}

fn cell(kind: Kind, nats: Nats) -> Pin<Box<dyn Future<Output = Row> + Send>> {
    match kind {
        Kind::Serve => Box::pin(serve_cell(nats)),
        Kind::ElectorStop => Box::pin(elector_cell(nats)),
        Kind::ShardsStop => Box::pin(shards_cell(nats)),
        Kind::HandOver | Kind::MemberDrop => Box::pin(background_release_cell(kind, nats)),
        Kind::Lock => Box::pin(lock_cell(nats)),
        Kind::OwnerCommand => Box::pin(owner_cell(nats)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_process_stops_within_its_bound_whatever_nats_does() {
    let started = Instant::now();
    let cells: Vec<_> = KINDS
        .iter()
        .flat_map(|&kind| STATES.iter().map(move |&nats| (kind, nats)))
        .map(|(kind, nats)| tokio::spawn(cell(kind, nats)))
        .collect();
    let mut rows = Vec::new();
    for joined in futures::future::join_all(cells).await {
        rows.push(joined.expect("a cell panicked"));
    }
    eprintln!("| process | NATS | stopped in | bound | exit |");
    eprintln!("| --- | --- | --- | --- | --- |");
    for r in &rows {
        eprintln!(
            "| {:?} | {:?} | {:.2} s | {:.1} s | {} |",
            r.kind,
            r.nats,
            r.took.as_secs_f64(),
            r.bound.as_secs_f64(),
            r.code.map_or("-".to_string(), |c| c.to_string())
        );
    }
    eprintln!("the matrix took {:.1} s", started.elapsed().as_secs_f64());
    let failures: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let over = (r.took > r.bound + MARGIN)
                .then(|| format!("took {:?}, bound {:?}", r.took, r.bound));
            r.failure
                .clone()
                .or(over)
                .map(|f| format!("{:?} with NATS {:?}: {f}", r.kind, r.nats))
        })
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `serve` with its server killed and a long `--shutdown-timeout-ms`: SIGTERM starts
/// the stop; a second SIGTERM during it stops the process at once, with 143 (128 +
/// SIGTERM), which only that path gives (a stop that runs its course exits 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_serve_at_once() {
    use tokio::io::AsyncBufReadExt;
    let mut world = World::new(false).await;
    let mut child = Command::new(BIN)
        .args(["serve", "--nats-url", &world.url()])
        .args(["--shutdown-timeout-ms", "600000"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    world.wait_serving().await;
    world.enter(Nats::Killed);
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let pid = child.id().expect("running").to_string();
    let term = || {
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(sent.unwrap().success());
    };
    term();
    // The first signal is taken: the stop has begun (and would take ten minutes).
    tokio::time::timeout(READY, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("a second signal stops at once") {
                return;
            }
        }
        panic!("serve ended its log without taking the signal");
    })
    .await
    .expect("the stop begins");
    term();
    let status = tokio::time::timeout(READY, child.wait())
        .await
        .expect("the second signal stops serve")
        .unwrap();
    assert_eq!(status.code(), Some(143));
}

/// `serve` against a server without JetStream waits in its start (every call
/// answered `unavailable`) for ever; SIGTERM then ends it at once, handled (exit
/// code 143, not a death by the signal), as the stop signals are taken from the
/// start on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_starting_stops_serve_at_once() {
    let server = NatsServer::builder().jetstream(false).start();
    let mut child = Command::new(BIN)
        .args(["serve", "--nats-url", &server.url()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let client = async_nats::connect(server.url()).await.unwrap();
    let leases = LeaseClient::new(client).with_timeout(Duration::from_secs(2));
    // Starting: the endpoints answer, `unavailable`.
    let deadline = Instant::now() + READY;
    loop {
        match leases.owner("k").await {
            Err(e) if e.reply().is_some_and(|r| r.kind.as_str() == "unavailable") => break,
            other => assert!(
                Instant::now() < deadline,
                "serve never answered while starting: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(sent.unwrap().success());
    let status = tokio::time::timeout(READY, child.wait())
        .await
        .expect("SIGTERM ends the start")
        .unwrap();
    assert_eq!(status.code(), Some(143), "{status:?}");
}
