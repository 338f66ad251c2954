//! Fault scenarios on a real three-node cluster, each under load: six holders of
//! three kinds campaigning for four keys (TTL 2 s) and writing through a fenced
//! store, readers on every node, and a watcher of expiry markers. The holders start
//! in steps so that every kind holds a key and writes before the fault
//! ([`Load::start_holders`]). Each scenario ends with the history checker's verdict
//! (printed) and asserts no violation, and that every kind held and wrote.
//!
//! The scenarios run one at a time (a lock), so that two clusters do not compete for
//! the machine's two cores. `DAGNATS_FAULTS_SCALE=N` makes every load phase N times
//! longer (a long run). `DAGNATS_FAULTS_BATCHES=1` narrows the services' write
//! coalescer (one single write out, batches from two), so that under this light
//! load writes go in atomic batches through the faults too, as they do at capacity.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dagnats_leases_tests::NatsCluster;
use dagnats_leases_tests::cluster::NODES;
use dagnats_leases_tests::history::{self, Nanos, Op, Outcome, Record, Verdict, now};
use dagnats_leases_tests::load::{self, HolderKind, Load};
use dagnats_leases_tokio::service::{
    self, BucketOptions, ServiceConfig, ServiceHandle, ServiceOptions,
};
use serde_json::{Value, json};

const TTL_MS: u64 = 2_000;
const HOLDERS: usize = 6;
const WAIT: Duration = Duration::from_secs(30);

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The stream whose leader the faults aim at: the bucket's, or with several
/// shards (`DAGNATS_TEST_SHARDS`) shard 0's (the keys spread over every shard, so
/// calls to the other shards run on beside the fault).
fn stream() -> String {
    dagnats_leases_tests::test_shards().stream(0)
}

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().await
}

fn keys() -> Vec<String> {
    (0..4).map(|i| format!("k{i}")).collect()
}

/// A load phase of `secs`, scaled by `DAGNATS_FAULTS_SCALE`.
fn phase(secs: f64) -> Duration {
    let scale: f64 = std::env::var("DAGNATS_FAULTS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(secs * scale)
}

/// The cluster and its in-process service instances, instance `i` on node `i` only.
struct Fx {
    cluster: NatsCluster,
    services: Vec<ServiceHandle>,
}

/// Whether `DAGNATS_FAULTS_BATCHES=1` narrows the coalescer's windows.
fn narrowed_batches() -> bool {
    std::env::var("DAGNATS_FAULTS_BATCHES").is_ok_and(|v| v == "1")
}

async fn start_service(url: String) -> ServiceHandle {
    let defaults = ServiceConfig::default();
    let narrowed = narrowed_batches();
    let options = ServiceOptions::from(ServiceConfig {
        bucket: BucketOptions {
            shards: dagnats_leases_tests::test_shards(),
            ..BucketOptions::default()
        },
        batch_after: if narrowed { Some(1) } else { None },
        min_batch: if narrowed { 2 } else { defaults.min_batch },
        ..defaults
    });
    dagnats_leases_tests::cluster::start_r3_service(url, options).await
}

impl Fx {
    /// A cluster; with `services`, one service instance per node.
    async fn start(services: bool) -> Fx {
        let cluster = tokio::task::spawn_blocking(NatsCluster::start)
            .await
            .unwrap();
        let mut fx = Fx {
            cluster,
            services: Vec::new(),
        };
        if services {
            for i in 0..NODES {
                let handle = start_service(fx.cluster.url(i)).await;
                fx.services.push(handle);
            }
        }
        fx
    }

    fn leader(&mut self) -> usize {
        self.cluster.wait_stream_leader(&stream(), WAIT)
    }

    /// The load: holders (holder `h` on a client given every node, node `h % 3`
    /// first; async-nats picks among them at random), readers likewise, and an
    /// expiry watcher.
    async fn load(&self) -> Load {
        let mut load = Load::new();
        self.fill(&mut load, &keys(), &keys()).await;
        load
    }

    /// The same load with every holder and reader pinned to one node
    /// ([`load::connect_only`]): holder `h` on node `h % 3`, `reader-n{i}` on node
    /// `i`. So each caller's calls are answered by one known service instance.
    async fn pinned_load(&self) -> Load {
        let mut load = Load::new();
        let keys = keys();
        load::watch_events(
            load::connect(&self.cluster.urls()).await,
            Some(load.history.clone()),
        )
        .await;
        for i in 0..NODES {
            load.pinned_reader(&pinned_reader(i), &keys, &self.cluster.url(i))
                .await;
        }
        load.pinned_holders(HOLDERS, &keys, TTL_MS, |h| self.cluster.url(h % NODES))
            .await;
        load
    }

    /// Starts the load's tasks in `load`: readers of `keys`, holders of `held` (the
    /// first three free: [`Load::start_holders`]).
    async fn fill(&self, load: &mut Load, keys: &[String], held: &[String]) {
        load::watch_events(
            load::connect(&self.cluster.urls()).await,
            Some(load.history.clone()),
        )
        .await;
        for i in 0..NODES {
            load.reader(
                &format!("reader-n{}", i + 1),
                keys,
                &self.cluster.urls_from(i),
            )
            .await;
        }
        let urls: Vec<Vec<String>> = (0..NODES).map(|i| self.cluster.urls_from(i)).collect();
        load.holders(HOLDERS, held, TTL_MS, |h| urls[h % NODES].clone())
            .await;
    }

    async fn shutdown(self) {
        for s in self.services {
            s.shutdown().await;
        }
    }
}

/// The name of the pinned load's reader on node `i`.
fn pinned_reader(i: usize) -> String {
    format!("reader-n{}", i + 1)
}

/// The callers of [`Fx::pinned_load`] connected to node `node` only.
fn pinned_callers(node: usize) -> Vec<String> {
    (0..HOLDERS)
        .filter(|h| h % NODES == node)
        .map(|h| format!("holder-{h}"))
        .chain([pinned_reader(node)])
        .collect()
}

/// Checks the history, prints the verdict line, and asserts no violation, some
/// progress after `after` (grants or renewals answered later than it), and that
/// every kind of load holder ([`HolderKind`]) held a key and wrote through the
/// fenced store.
fn verdict(name: &str, records: &[Record], after: Nanos) -> Verdict {
    let v = history::check(records, dagnats_leases_tests::test_shards());
    println!("faults: {name}: {v}");
    if !v.violations.is_empty() {
        // Keep the history for a post-mortem: one JSON record a line.
        let file = std::env::temp_dir().join(format!(
            "faults-{}-{}.jsonl",
            name.split(' ').next().unwrap_or("x"),
            std::process::id()
        ));
        let lines: Vec<String> = records
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        std::fs::write(&file, lines.join("\n")).unwrap();
        println!("faults: {name}: history written to {}", file.display());
    }
    assert!(v.violations.is_empty(), "{name}: {v}");
    let progress = records.iter().any(|r| {
        matches!(r, Record::Call(c) if c.replied > after
            && matches!(c.outcome, Outcome::Granted { .. } | Outcome::Renewed { .. }))
    });
    assert!(
        progress,
        "{name}: no grant or renewal after the fault healed"
    );
    assert!(v.grants > 0 && v.store_writes > 0, "{name}: {v}");
    // What each kind of load holder owned and wrote. Each must have held a key and
    // written through the fenced store in the run: a kind with neither went through
    // the fault untested, and the verdict would pass empty for it.
    let mut by_kind: std::collections::BTreeMap<&str, (usize, usize)> = (0..HOLDERS)
        .map(|h| (HolderKind::of(h).name(), (0, 0)))
        .collect();
    for r in records {
        let (holder, tenure) = match r {
            Record::Belief(b) => (&b.holder, true),
            Record::Store(w) if w.accepted => (&w.holder, false),
            _ => continue,
        };
        let Some(kind) = HolderKind::of_holder(holder) else {
            continue;
        };
        let counts = by_kind.get_mut(kind.name()).expect("a load holder's kind");
        if tenure {
            counts.0 += 1;
        } else {
            counts.1 += 1;
        }
    }
    let shown: Vec<String> = by_kind
        .iter()
        .map(|(kind, (tenures, writes))| format!("{kind} {tenures} tenures, {writes} writes"))
        .collect();
    println!("faults: {name}: by holder kind: {}", shown.join("; "));
    for (kind, (tenures, writes)) in &by_kind {
        assert!(
            *tenures > 0,
            "{name}: the {kind} holders held nothing in this run"
        );
        assert!(
            *writes > 0,
            "{name}: the {kind} holders wrote nothing through the fenced store in this run \
             ({tenures} tenures)"
        );
    }
    v
}

/// Polls `f` (async) until true, failing after `WAIT` with `what`.
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !f().await {
        assert!(Instant::now() < deadline, "not within {WAIT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_then_restart() {
    let _serial = serial().await;
    let mut fx = Fx::start(true).await;
    let batched = count_batched_writes(&fx.cluster.urls()).await;
    let mut load = fx.load().await;
    tokio::time::sleep(phase(3.0)).await;
    let leader = fx.leader();
    fx.cluster.kill(leader);
    let new = tokio::task::block_in_place(|| fx.leader());
    assert_ne!(new, leader);
    tokio::time::sleep(phase(1.0)).await;
    tokio::task::block_in_place(|| fx.cluster.restart(leader));
    let healed = now();
    tokio::time::sleep(phase(4.0)).await;
    load.stop().await;
    verdict(
        &format!(
            "leader_kill (n{} killed, n{} took over)",
            leader + 1,
            new + 1
        ),
        &load.history.records(),
        healed,
    );
    let batched = batched.load(std::sync::atomic::Ordering::Relaxed);
    println!("faults: leader_kill: {batched} writes were published in atomic batches");
    if narrowed_batches() {
        assert!(batched > 0, "no write went in a batch");
    }
    fx.shutdown().await;
}

/// Counts the writes the services publish in atomic batches (each message of a
/// batch carries its id), as a plain subscriber to the bucket's subjects sees them.
async fn count_batched_writes(urls: &[String]) -> Arc<std::sync::atomic::AtomicUsize> {
    use futures::StreamExt;
    let client = load::connect(urls).await;
    let mut sub = client.subscribe("$KV.>").await.expect("subscribe");
    client.flush().await.expect("flush");
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        let _client = client;
        while let Some(m) = sub.next().await {
            let batched = m.headers.as_ref().is_some_and(|h| {
                h.get(dagnats_leases_core::service::coalesce::HDR_BATCH_ID)
                    .is_some()
            });
            if batched {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    count
}

/// A service instance in its own process (`fault-proc serve`), so it can be killed.
struct ServiceProc(Child);

impl ServiceProc {
    fn spawn(url: &str) -> ServiceProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fault-proc"))
            .args(["serve", url, "3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fault-proc serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(WAIT)
            .expect("the service process says ready");
        assert_eq!(line, "\"ready\"");
        ServiceProc(child)
    }
}

impl Drop for ServiceProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_instance_kill_mid_load() {
    let _serial = serial().await;
    let fx = Fx::start(false).await;
    let mut procs: Vec<ServiceProc> = Vec::new();
    for i in 0..NODES {
        let url = fx.cluster.url(i);
        procs.push(
            tokio::task::spawn_blocking(move || ServiceProc::spawn(&url))
                .await
                .unwrap(),
        );
    }
    let mut load = fx.load().await;
    tokio::time::sleep(phase(3.0)).await;
    // SIGKILL: calls in flight on that instance are lost; clients time out and retry.
    let victim = &mut procs[1].0;
    victim.kill().expect("kill -9 the service");
    victim.wait().unwrap();
    tokio::time::sleep(phase(3.0)).await;
    let url = fx.cluster.url(1);
    procs[1] = tokio::task::spawn_blocking(move || ServiceProc::spawn(&url))
        .await
        .unwrap();
    let healed = now();
    tokio::time::sleep(phase(3.0)).await;
    load.stop().await;
    let records = load.history.records();
    let v = verdict(
        "service_kill (instance on n2 killed, restarted)",
        &records,
        healed,
    );
    println!(
        "faults: service_kill: {} calls without a definite answer (retried)",
        v.unknown
    );
    drop(procs);
    fx.shutdown().await;
}

/// The holder process's output: its history records, and a signal each time it has
/// checked its deadline and started the work before a write.
struct HolderProc {
    child: Child,
    records: Arc<Mutex<Vec<Record>>>,
    working: mpsc::Receiver<u64>,
}

impl HolderProc {
    fn spawn(
        kind: HolderKind,
        urls: &[String],
        holder: &str,
        key: &str,
        store_subject: &str,
    ) -> HolderProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fault-proc"))
            .args([
                "holder",
                &urls.join(","),
                holder,
                key,
                &TTL_MS.to_string(),
                store_subject,
                "500",
                kind.name(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn fault-proc holder");
        let stdout = child.stdout.take().unwrap();
        let records: Arc<Mutex<Vec<Record>>> = Arc::default();
        let (tx, working) = mpsc::channel();
        let out = Arc::clone(&records);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).expect("a JSON line");
                if let Some(fence) = v["working"].as_u64() {
                    let _ = tx.send(fence);
                } else {
                    let r: Record = serde_json::from_value(v["record"].clone()).expect("a record");
                    out.lock().unwrap().push(r);
                }
            }
        });
        HolderProc {
            child,
            records,
            working,
        }
    }

    fn pid(&self) -> rustix::process::Pid {
        rustix::process::Pid::from_raw(self.child.id() as i32).unwrap()
    }

    fn signal(&self, sig: rustix::process::Signal) {
        rustix::process::kill_process(self.pid(), sig).expect("signal the holder");
    }

    /// The fence of its first grant, once it has one.
    fn granted(&self) -> Option<u64> {
        self.records.lock().unwrap().iter().find_map(|r| match r {
            Record::Call(c) => match c.outcome {
                Outcome::Granted { revision, .. } => Some(revision),
                _ => None,
            },
            _ => None,
        })
    }

    /// For a failure message: its last `n` records other than acquires (its
    /// renewals, releases and tenures: how it lost its key), and the outcomes of
    /// its acquires with their counts (campaigns would crowd out the rest).
    fn last_records(&self, n: usize) -> (Vec<Record>, Vec<(String, usize)>) {
        let records = self.records.lock().unwrap();
        let mut acquires: Vec<(String, usize)> = Vec::new();
        for r in records.iter() {
            if let Record::Call(c) = r
                && c.op == Op::Acquire
            {
                let what = match &c.outcome {
                    Outcome::Granted { .. } => "granted".to_owned(),
                    Outcome::Held { .. } => "held by another".to_owned(),
                    Outcome::Unknown { why } => why.clone(),
                    other => format!("{other:?}"),
                };
                match acquires.iter_mut().find(|(w, _)| *w == what) {
                    Some((_, count)) => *count += 1,
                    None => acquires.push((what, 1)),
                }
            }
        }
        let mut rest: Vec<Record> = records
            .iter()
            .rev()
            .filter(|r| !matches!(r, Record::Call(c) if c.op == Op::Acquire))
            .take(n)
            .cloned()
            .collect();
        rest.reverse();
        (rest, acquires)
    }

    /// SIGTERM, wait for the exit, and return everything it recorded.
    fn finish(mut self) -> Vec<Record> {
        self.signal(rustix::process::Signal::TERM);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "holder process: {status}");
        std::mem::take(&mut *self.records.lock().unwrap())
    }
}

/// A test that fails while the process is frozen must not leave it behind: a
/// stopped process never exits, and its inherited stderr would hold the test run's
/// output open for ever. SIGKILL ends a stopped process too.
impl Drop for HolderProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Two holder processes, one of each kind ([`HolderKind`]: the holder library, and
/// a client written from leases.md), each owning a key, are frozen with SIGSTOP
/// right after a deadline check, in the 500 ms of work before a store write, for 3
/// TTLs; the load (over three other keys until then) campaigns for their keys too,
/// others take them over and write through the fence; after SIGCONT each finishes
/// its work and writes with its old fence, which the store rejects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_holder_past_its_ttl_then_sigcont() {
    let _serial = serial().await;
    let fx = Fx::start(true).await;
    let keys = keys();
    let subject = "faults.store";
    // One store: the holder processes write to it over NATS, in-process holders directly.
    let mut load = Load::new();
    let store_client = load::connect(&fx.cluster.urls()).await;
    let _store = tokio::spawn(load::serve_store(
        store_client.clone(),
        subject.into(),
        load.store.clone(),
    ));
    store_client.flush().await.unwrap();
    let kinds = [HolderKind::Library, HolderKind::LeasesMd];
    let paused: Vec<(String, String, HolderProc)> = kinds
        .iter()
        .zip(&keys)
        .map(|(kind, key)| {
            let name = format!("paused-{}", kind.name());
            let proc = HolderProc::spawn(*kind, &fx.cluster.urls_from(2), &name, key, subject);
            (name, key.clone(), proc)
        })
        .collect();
    for (name, key, proc) in &paused {
        eventually(&format!("{name} owns {key}"), || {
            let got = proc.granted().is_some();
            async move { got }
        })
        .await;
    }
    // The load's holders campaign for k2, k3 and k4 (a free key for each kind to
    // start on), and for the paused processes' k0 and k1 only once those are frozen:
    // contested before, a process that lost its key to a slow renewal on a busy
    // machine seldom won it back from the load, and the test waited in vain for it
    // to work (2 of 4 runs at a load average of 5 to 7, 1 of 4 before the fifth key).
    let all: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    fx.fill(&mut load, &all, &all[2..]).await;
    let history = load.history.clone();
    let store_write = |pred: &dyn Fn(&history::StoreWrite) -> bool| {
        history
            .records()
            .iter()
            .any(|r| matches!(r, Record::Store(w) if pred(w)))
    };
    tokio::time::sleep(phase(2.0)).await;
    // Freeze each right after a deadline check, in the 500 ms of work before a write
    // (long enough that a busy machine still delivers the signal inside it).
    let mut frozen = Vec::new();
    for (name, key, proc) in &paused {
        while proc.working.try_recv().is_ok() {}
        // It works only while it holds its key: if it lost the key before this
        // point (and the load holders keep it), say so with what it last did.
        let working = tokio::task::block_in_place(|| proc.working.recv_timeout(WAIT))
            .unwrap_or_else(|_| {
                let (last, acquires) = proc.last_records(12);
                panic!(
                    "{name} works: no deadline check in {WAIT:?}; now {} ns; its acquires \
                     (outcome, count): {acquires:?}; its last other records: {last:#?}",
                    now(),
                )
            });
        proc.signal(rustix::process::Signal::STOP);
        println!("faults: sigstop: {name} stopped holding {key} at fence {working}");
        frozen.push((working, now()));
    }
    load.contest(&keys[..paused.len()], TTL_MS);
    // Frozen well past its TTL (3 x 2 s).
    tokio::time::sleep(Duration::from_millis(3 * TTL_MS)).await;
    for ((name, key, _), (working, _)) in paused.iter().zip(&frozen) {
        eventually(
            &format!("a new owner of {key} wrote through the fence"),
            || {
                let seen = store_write(&|w| {
                    w.key == *key && w.holder != *name && w.accepted && w.revision > *working
                });
                async move { seen }
            },
        )
        .await;
    }
    // The time is taken before the signal: a woken process may write to the store
    // before this thread runs again.
    let resumed: Vec<Nanos> = paused
        .iter()
        .map(|(_, _, proc)| {
            let at = now();
            proc.signal(rustix::process::Signal::CONT);
            at
        })
        .collect();
    // Each finishes its work and writes with its old fence, then learns it lost.
    let is_late = |name: &str, working: u64, resumed: Nanos, w: &history::StoreWrite| {
        w.holder == name && w.at > resumed && w.revision <= working
    };
    for ((name, _, _), ((working, _), resumed)) in paused.iter().zip(frozen.iter().zip(&resumed)) {
        eventually(&format!("{name} woke and wrote with its old fence"), || {
            let late = store_write(&|w| is_late(name, *working, *resumed, w));
            async move { late }
        })
        .await;
    }
    tokio::time::sleep(phase(2.0)).await;
    load.stop().await;
    let mut records = load.history.records();
    for (((name, _, proc), (working, stopped)), resumed) in
        paused.into_iter().zip(frozen).zip(resumed.iter().copied())
    {
        let fence = proc.granted().unwrap();
        records.extend(proc.finish());
        let late: Vec<_> = records
            .iter()
            .filter_map(|r| match r {
                Record::Store(w) if is_late(&name, working, resumed, w) => Some(w),
                _ => None,
            })
            .collect();
        assert!(!late.is_empty(), "{name}: no late write");
        assert!(
            late.iter().all(|w| !w.accepted),
            "a late write of the woken {name} was accepted: {late:?}"
        );
        println!(
            "faults: sigstop: {name}: first fence {fence}, frozen {:.1} s at fence {working}; \
             {} late writes after SIGCONT (the first {:.1} ms after it), all rejected",
            (resumed - stopped) as f64 / 1e9,
            late.len(),
            (late.iter().map(|w| w.at).min().unwrap_or(resumed) - resumed) as f64 / 1e6,
        );
    }
    verdict(
        "sigstop (a library and a leases.md holder process frozen 6 s)",
        &records,
        resumed.iter().copied().min().unwrap_or_default(),
    );
    fx.shutdown().await;
}

/// The revision an acquire, renew or owner reply shows.
fn rev(v: &Value) -> u64 {
    v["revision"]
        .as_u64()
        .unwrap_or_else(|| panic!("no revision in {v}"))
}

async fn call_ok(client: &async_nats::Client, endpoint: &str, body: Value) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        match load::call(client, endpoint, &body, load::REQUEST_TIMEOUT).await {
            load::Reply::Ok(v) => return v,
            other => {
                assert!(Instant::now() < deadline, "{endpoint} {body}: {other:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The highest revision any answer in the history showed for a key of `key`'s
/// stream (with one shard: of any key).
fn max_revision(records: &[Record], key: &str) -> u64 {
    let shards = dagnats_leases_tests::test_shards();
    let stream = shards.stream_of(key);
    records
        .iter()
        .filter(|r| match r {
            Record::Call(c) => shards.stream_of(&c.key) == stream,
            Record::Expiry(e) => shards.stream_of(&e.key) == stream,
            _ => false,
        })
        .filter_map(|r| match r {
            Record::Call(c) => match &c.outcome {
                Outcome::Granted { revision, .. }
                | Outcome::Renewed { revision, .. }
                | Outcome::Released { revision }
                | Outcome::Held { revision, .. } => Some(*revision),
                _ => None,
            },
            Record::Expiry(e) => Some(e.seq),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restart_keeps_leases_and_revisions() {
    let _serial = serial().await;
    let mut fx = Fx::start(true).await;
    // Leases that must survive: ten keys held by one keeper with a long TTL.
    let keeper = load::connect(&fx.cluster.urls()).await;
    let held: Vec<String> = (0..10).map(|i| format!("held-{i}")).collect();
    let mut before = Vec::new();
    for key in &held {
        let v = call_ok(
            &keeper,
            "acquire",
            json!({"key": key, "holder": "keeper", "ttl_ms": 120_000}),
        )
        .await;
        assert_eq!(v["granted"], true, "{v}");
        before.push(rev(&v));
    }
    let mut load = fx.load().await;
    tokio::time::sleep(phase(3.0)).await;
    // Power loss: every node killed at once, then all started again.
    tokio::task::block_in_place(|| {
        fx.cluster.kill_all();
        fx.cluster.restart_all();
        fx.leader();
    });
    let records_before = load.history.records();
    // Held leases kept their holder and revision.
    for (key, r) in held.iter().zip(&before) {
        let v = call_ok(&keeper, "owner", json!({"key": key})).await;
        assert_eq!(
            (v["holder"].as_str(), rev(&v)),
            (Some("keeper"), *r),
            "{key}: {v}"
        );
    }
    let healed = now();
    tokio::time::sleep(phase(4.0)).await;
    // Renewing them now gives revisions above everything handed out before the crash.
    let mut after = Vec::new();
    for (key, r) in held.iter().zip(&before) {
        let v = call_ok(
            &keeper,
            "renew",
            json!({"key": key, "holder": "keeper", "revision": r}),
        )
        .await;
        after.push(rev(&v));
    }
    load.stop().await;
    let records = load.history.records();
    for (key, r) in held.iter().zip(&after) {
        let seen_before = max_revision(&records_before, key);
        assert!(
            *r > seen_before,
            "{key}'s renewal after the restart ({r}) must exceed {seen_before}, the \
             highest revision of its stream handed out before the crash"
        );
    }
    // A revision is its stream's: with several shards, two streams may each hand
    // out the same number.
    let shards = dagnats_leases_tests::test_shards();
    let mut all: Vec<(String, u64)> = held
        .iter()
        .zip(&after)
        .chain(held.iter().zip(&before))
        .map(|(key, r)| (shards.stream_of(key), *r))
        .collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 2 * held.len(), "a revision handed out twice");
    let seen_before = held
        .iter()
        .map(|key| max_revision(&records_before, key))
        .max()
        .unwrap_or(0);
    println!(
        "faults: cluster_restart: {} held leases kept holder and revision; renewals after it got {}..={} (highest before: {seen_before})",
        held.len(),
        after.iter().min().unwrap(),
        after.iter().max().unwrap()
    );
    verdict(
        "cluster_restart (all 3 nodes kill -9, restarted)",
        &records,
        healed,
    );
    fx.shutdown().await;
}

/// The `KV_leases` stream leader's node is cut off from its peers (it keeps serving
/// its own clients), the majority elects a new leader, then the cut is healed.
///
/// The cut-off leader goes on answering `STREAM.MSG.GET` from its old state until
/// it learns of the new term (up to ~16 s), first to its own node's service, and in
/// the moment after the heal to every node's. The services confirm every read they
/// answer from with a conditional write that only a leader with quorum commits, so
/// none of those stale answers may reach a caller: the history is checked with no
/// allowance at all, and the verdict line says `stale reports: 0`. The load is
/// pinned ([`Fx::pinned_load`]): every holder and reader talks to one node only, so
/// the cut node's own callers certainly ask the deposed leader; their reads end
/// `unavailable` instead, and are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_of_the_leaders_node_then_heal() {
    let _serial = serial().await;
    let fx = Fx::start(true).await;
    let v = partition_run(fx).await;
    assert_eq!(v.stale_reports(), 0, "{v}");
}

/// The same partition with the services' read confirmation switched off (the
/// test-only `ServiceConfig::unconfirmed_reads_for_tests`): the checker must see
/// the deposed leader's stale answers. Whether the majority commits a write while
/// the old leader still answers is a race (it did in 10 of 16 runs before reads
/// were confirmed), so this runs on demand, not in CI:
/// `cargo test -p dagnats-leases-tests --test faults -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a race of the server's timers: shows the old behaviour in most runs, not all"]
async fn without_read_confirmation_the_partition_shows_stale_reads() {
    let _serial = serial().await;
    let mut fx = Fx::start(false).await;
    for i in 0..NODES {
        let client = async_nats::ConnectOptions::new()
            .connect(fx.cluster.url(i))
            .await
            .expect("connect the service");
        let options = ServiceOptions::from(ServiceConfig {
            bucket: BucketOptions {
                replicas: Some(3),
                shards: dagnats_leases_tests::test_shards(),
                ..BucketOptions::default()
            },
            unconfirmed_reads_for_tests: true,
            ..ServiceConfig::default()
        });
        fx.services.push(
            service::start((fx.cluster.url(i), client), options)
                .await
                .expect("service starts"),
        );
    }
    let records = partition_history(fx).await.0;
    let v = history::check(&records, dagnats_leases_tests::test_shards());
    println!(
        "faults: partition without read confirmation: {}",
        v.summary()
    );
    assert!(v.stale_reports() > 0, "no stale read was seen: {v}");
}

/// Runs the partition on `fx`, prints the verdict and the reads that ended
/// `unavailable` on the cut node, and asserts no violation.
async fn partition_run(fx: Fx) -> Verdict {
    let (records, cut, healed, leader) = partition_history(fx).await;
    let mut on_cut_node = pinned_callers(leader);
    on_cut_node.push("reader-isolated".into());
    // The cut node's clients' calls during the cut that got no answer from a read:
    // `unavailable` from the service, or no reply within the caller's own timeout.
    let mut unanswered: std::collections::BTreeMap<&str, usize> = Default::default();
    for r in &records {
        if let Record::Call(c) = r
            && on_cut_node.contains(&c.caller)
            && c.sent > cut
            && c.replied < healed
            && let Outcome::Unknown { why } = &c.outcome
        {
            *unanswered.entry(why.as_str()).or_default() += 1;
        }
    }
    println!(
        "faults: partition: calls of the cut node's clients during the cut that ended \
         without an answer (reads that could not be confirmed, writes that could not \
         commit): {unanswered:?}; cut at {cut}, healed at {healed} (CLOCK_MONOTONIC ns)"
    );
    verdict(
        &format!("partition (n{} cut off, healed)", leader + 1),
        &records,
        healed,
    )
}

/// Cuts the stream leader's node off under a pinned load, heals it, and returns
/// the history, the cut and heal times, and which node was cut.
async fn partition_history(mut fx: Fx) -> (Vec<Record>, Nanos, Nanos, usize) {
    let mut load = fx.pinned_load().await;
    // A reader that only ever talks to the node that will be cut off.
    let leader = fx.leader();
    load.pinned_reader("reader-isolated", &keys(), &fx.cluster.url(leader))
        .await;
    tokio::time::sleep(phase(3.0)).await;
    fx.cluster.isolate(leader);
    let cut = now();
    // The majority elects another leader; the cut node's clients see unavailable.
    let others: Vec<usize> = (0..NODES).filter(|&i| i != leader).collect();
    eventually("the majority elects a new leader", || {
        let got = others.iter().any(|&i| {
            fx.cluster
                .stream_leader_via(i, &stream())
                .is_some_and(|l| l != leader)
        });
        async move { got }
    })
    .await;
    tokio::time::sleep(phase(4.0)).await;
    fx.cluster.heal();
    let healed = now();
    tokio::time::sleep(phase(4.0)).await;
    load.stop().await;
    let records = load.history.records();
    fx.shutdown().await;
    (records, cut, healed, leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_events_arrive_once_per_write_on_every_node() {
    let _serial = serial().await;
    let mut fx = Fx::start(true).await;
    let mut watchers = Vec::new();
    for i in 0..NODES {
        let client = load::connect(&[fx.cluster.url(i)]).await;
        watchers.push(load::watch_events(client, None).await);
    }
    let mut load = fx.load().await;
    tokio::time::sleep(phase(3.0)).await;
    // A leader change in the middle (a graceful stepdown: no outage, no lost events).
    let leader = fx.leader();
    let step = fx
        .cluster
        .js_api(
            leader,
            &format!("$JS.API.STREAM.LEADER.STEPDOWN.{}", stream()),
            &json!({}),
        )
        .expect("stepdown");
    assert_eq!(step["success"], true, "{step}");
    tokio::time::sleep(phase(3.0)).await;
    load.stop().await;
    let healed = now();
    let records = load.history.records();
    // Every acknowledged write, and every expiry marker.
    let mut writes: Vec<(String, u64)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Call(c) => match c.outcome {
                Outcome::Renewed { revision, .. } | Outcome::Released { revision } => {
                    Some((c.key.clone(), revision))
                }
                Outcome::Granted {
                    revision, write_lb, ..
                } if write_lb >= c.sent => Some((c.key.clone(), revision)),
                _ => None,
            },
            Record::Expiry(e) => Some((e.key.clone(), e.seq)),
            _ => None,
        })
        .collect();
    writes.sort_unstable();
    writes.dedup();
    for (i, seen) in watchers.iter().enumerate() {
        eventually(
            "every write's event reached every node's subscriber",
            || {
                let seen = seen.lock().unwrap();
                let all = writes
                    .iter()
                    .all(|(k, r)| seen.get(k).is_some_and(|s| s.contains(r)));
                async move { all }
            },
        )
        .await;
        let seen = seen.lock().unwrap();
        let mut total = 0;
        for (key, seqs) in seen.iter() {
            let mut sorted = seqs.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(
                sorted.len(),
                seqs.len(),
                "n{}: a duplicate event on {key}: {seqs:?}",
                i + 1
            );
            total += seqs.len();
        }
        println!(
            "faults: events: subscriber on n{} saw {total} events, each once",
            i + 1
        );
    }
    verdict(
        &format!("events (leader n{} stepped down mid-load)", leader + 1),
        &records,
        healed.saturating_sub(history::ms(3_000)),
    );
    fx.shutdown().await;
}
