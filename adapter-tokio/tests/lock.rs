//! `dagnats-leases lock KEY -- CMD` against a real server and the service: mutual
//! exclusion read from the commands' own stamps, a frozen tool's command stopped by
//! its watchdog before anyone else's starts, a lost lease, `--wait`, signals and exit
//! codes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::client::LeaseClient;
use dagnats_leases_tokio::service::{self, ServiceHandle, ServiceOptions};

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");
const WAIT: Duration = Duration::from_secs(30);

struct Setup {
    server: NatsServer,
    _service: ServiceHandle,
    dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let service = service::start((server.url(), client), ServiceOptions::default())
        .await
        .unwrap();
    Setup {
        server,
        _service: service,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl Setup {
    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `dagnats-leases lock <args> -- sh -c <script>`, started.
    fn lock(&self, args: &[&str], script: &str) -> Child {
        Command::new(BIN)
            .arg("lock")
            .args(args)
            .args(["--nats-url", &self.server.url()])
            .args(["--", "sh", "-c", script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts")
    }
}

/// Waits for `child` to exit (bounded: killed and failed after 30 s), with what it
/// said on stderr.
async fn finish(mut child: Child) -> Output {
    let mut stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut text);
        let _ = tx.send(text);
    });
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lock (pid {}) did not exit within {WAIT:?}", child.id());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The watchdog and the command share the pipe: it ends when the last of them has.
    let pid = child.id();
    let stderr = tokio::task::spawn_blocking(move || rx.recv_timeout(WAIT))
        .await
        .unwrap()
        .unwrap_or_else(|_| {
            panic!(
                "lock (pid {pid}) exited, but a process it started still runs (it holds its stderr)"
            )
        });
    eprintln!("lock said: {}", String::from_utf8_lossy(&stderr));
    Output {
        status,
        stdout: Vec::new(),
        stderr,
    }
}

fn code(status: ExitStatus) -> Option<i32> {
    status.code()
}

/// Waits until `path` holds a line starting with `prefix`; returns the file's lines.
async fn wait_line(path: &Path, prefix: &str) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.iter().any(|l| l.starts_with(prefix)) {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "no line {prefix:?} in {}: {lines:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn signal(child: &Child, sig: &str) {
    signal_pid(child.id(), sig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_locks_on_one_key_never_run_their_commands_at_once() {
    let s = setup().await;
    let stamps = s.file("stamps");
    let script = format!(
        "echo \"start $DAGNATS_LEASE_HOLDER $DAGNATS_LEASE_KEY $DAGNATS_LEASE_FENCE\" >> {0}; \
         sleep 0.2; echo \"end $DAGNATS_LEASE_HOLDER\" >> {0}",
        stamps.display()
    );
    for _round in 0..3 {
        let a = s.lock(&["job", "--holder", "lock-a", "--ttl-ms", "3000"], &script);
        let b = s.lock(&["job", "--holder", "lock-b", "--ttl-ms", "3000"], &script);
        let (a, b) = (finish(a).await, finish(b).await);
        assert_eq!((code(a.status), code(b.status)), (Some(0), Some(0)));
    }
    // Stamps in the order they were written: start X, end X, start Y, end Y, ...
    let text = std::fs::read_to_string(&stamps).unwrap();
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 12, "{text}");
    let mut fences = Vec::new();
    for pair in lines.chunks(2) {
        let (start, end) = (&pair[0], &pair[1]);
        assert_eq!((start[0], end[0]), ("start", "end"), "overlap:\n{text}");
        assert_eq!(start[1], end[1], "overlap:\n{text}");
        assert_eq!(start[2], "job");
        fences.push(start[3].parse::<u64>().unwrap());
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "every tenure has a higher fence: {fences:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_locks_command_is_stopped_before_another_starts() {
    let s = setup().await;
    let stamps = s.file("stamps");
    let f = stamps.display();
    // A's command would run for ever; on SIGTERM it stamps and exits.
    let a = s.lock(
        &[
            "job", "--holder", "lock-a", "--ttl-ms", "3000", "--grace", "1s",
        ],
        &format!(
            "trap 'echo term-a >> {f}; exit 0' TERM; echo start-a >> {f}; \
             while true; do sleep 0.1; done"
        ),
    );
    wait_line(&stamps, "start-a").await;
    // Freeze the tool: it can neither renew nor signal. Its watchdog still can.
    signal(&a, "STOP");
    let frozen = Instant::now();
    let b = s.lock(
        &["job", "--holder", "lock-b", "--ttl-ms", "3000"],
        &format!("echo start-b >> {f}"),
    );
    let b = finish(b).await;
    assert_eq!(code(b.status), Some(0));
    let lines = wait_line(&stamps, "start-b").await;
    assert_eq!(
        lines,
        ["start-a", "term-a", "start-b"],
        "A's command outlived its lease"
    );
    eprintln!("B ran {:?} after A froze", frozen.elapsed());
    // A wakes to a lost lease: exit 5.
    signal(&a, "CONT");
    let a = finish(a).await;
    assert_eq!(code(a.status), Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_terms_then_kills_the_command_and_exits_5() {
    let s = setup().await;
    let stamps = s.file("stamps");
    let f = stamps.display();
    // This command ignores SIGTERM: only the SIGKILL after --grace ends it.
    let a = s.lock(
        &[
            "job", "--holder", "lock-a", "--ttl-ms", "6000", "--grace", "1s",
        ],
        &format!(
            "trap 'echo term >> {f}' TERM; echo \"start $$\" >> {f}; \
             while true; do sleep 0.1; done"
        ),
    );
    let lines = wait_line(&stamps, "start").await;
    let pid = lines[0].split(' ').nth(1).unwrap().to_owned();
    // An operator releases the lease under lock-a's name: its next renew is `lost`.
    let leases = LeaseClient::new(async_nats::connect(s.server.url()).await.unwrap());
    let mut released = false;
    for _ in 0..5 {
        let lease = leases.owner("job").await.unwrap().expect("held by lock-a");
        if leases
            .release("job", "lock-a", lease.revision)
            .await
            .is_ok()
        {
            released = true;
            break;
        }
    }
    assert!(released);
    let a = finish(a).await;
    assert_eq!(code(a.status), Some(5), "lease lost");
    let lines = wait_line(&stamps, "term").await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    let alive = Command::new("kill")
        .args(["-0", &pid])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!alive.success(), "the command (pid {pid}) survived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_wait_and_signals() {
    let s = setup().await;
    let stamps = s.file("stamps");
    let f = stamps.display();

    // The command's code comes back; a missing command is 127.
    let out = finish(s.lock(&["k1"], "exit 7")).await;
    assert_eq!(code(out.status), Some(7));
    let out = finish(
        Command::new(BIN)
            .args(["lock", "k1", "--nats-url", &s.server.url(), "--"])
            .arg(s.file("no-such-command"))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
    .await;
    assert_eq!(code(out.status), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot run"));

    // Held by another: --wait 0 gives up after one try, --wait 500ms after 500 ms.
    let holder = s.lock(
        &["k2", "--holder", "lock-a"],
        &format!(
            "trap 'echo int >> {f}; exit 0' INT; echo start >> {f}; \
             while true; do sleep 0.1; done"
        ),
    );
    wait_line(&stamps, "start").await;
    let out = finish(s.lock(&["k2", "--wait", "0"], "echo never")).await;
    assert_eq!(code(out.status), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("k2 is held by lock-a"));
    let started = Instant::now();
    let out = finish(s.lock(&["k2", "--wait", "500ms"], "echo never")).await;
    assert_eq!(code(out.status), Some(3));
    assert!(started.elapsed() >= Duration::from_millis(500));

    // SIGINT to the tool goes to the command; its exit 0 is the tool's, and the
    // lease is released.
    signal(&holder, "INT");
    let out = finish(holder).await;
    assert_eq!(code(out.status), Some(0));
    wait_line(&stamps, "int").await;
    let leases = LeaseClient::new(async_nats::connect(s.server.url()).await.unwrap());
    assert!(leases.owner("k2").await.unwrap().is_none());

    // SIGTERM likewise: the command gets it, exits 9 from its trap, and that code
    // is the tool's; the lease is released.
    let holder = s.lock(
        &["k2", "--holder", "lock-b"],
        &format!(
            "trap 'echo term >> {f}; exit 9' TERM; echo again >> {f}; \
             while true; do sleep 0.1; done"
        ),
    );
    wait_line(&stamps, "again").await;
    signal(&holder, "TERM");
    let out = finish(holder).await;
    assert_eq!(code(out.status), Some(9));
    wait_line(&stamps, "term").await;
    assert!(leases.owner("k2").await.unwrap().is_none());

    // --grace above half the TTL is refused, with a code of its own.
    let out = finish(s.lock(&["k3", "--ttl-ms", "4000", "--grace", "3s"], "true")).await;
    assert_eq!(
        code(out.status),
        Some(i32::from(dagnats_leases_tokio::lock::EXIT_BAD_GRACE))
    );
}

/// `lock --permits 2` by three processes: at most two commands run at once, each
/// under its own slot (`KEY-<i>`) and fence. A command waits (bounded) until two
/// have started, so the two permits are seen in use together; the third starts
/// only after one of them ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_with_permits_runs_at_most_that_many_commands_at_once() {
    let s = setup().await;
    let stamps = s.file("stamps");
    let f = stamps.display();
    let script = format!(
        "echo \"start $DAGNATS_LEASE_HOLDER $DAGNATS_LEASE_KEY $DAGNATS_LEASE_FENCE\" >> {f}; \
         i=0; while [ $(grep -c start {f}) -lt 2 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; \
         echo \"end $DAGNATS_LEASE_HOLDER\" >> {f}"
    );
    let runs: Vec<Child> = (0..3)
        .map(|i| {
            let holder = format!("perm-{i}");
            let args = [
                "pool",
                "--permits",
                "2",
                "--holder",
                &holder,
                "--ttl-ms",
                "3000",
            ];
            s.lock(&args, &script)
        })
        .collect();
    for run in runs {
        assert_eq!(code(finish(run).await.status), Some(0));
    }
    let text = std::fs::read_to_string(&stamps).unwrap();
    let (mut running, mut most) = (BTreeSet::new(), 0);
    let mut slots = BTreeSet::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        match words[0] {
            "start" => {
                assert!(running.insert(words[1].to_string()), "{text}");
                assert!(["pool-0", "pool-1"].contains(&words[2]), "{text}");
                words[3].parse::<u64>().expect("a fence");
                slots.insert(words[2].to_string());
            }
            _ => assert!(running.remove(words[1]), "{text}"),
        }
        most = most.max(running.len());
    }
    assert_eq!((text.lines().count(), most), (6, 2), "{text}");
    assert_eq!(slots.len(), 2, "both slots used: {text}");
    // Released: no slot is held after the tools exit.
    let leases = LeaseClient::new(async_nats::connect(s.server.url()).await.unwrap());
    for slot in ["pool-0", "pool-1"] {
        assert_eq!(leases.owner(slot).await.unwrap(), None);
    }
}

/// The PIDs of `pid`'s children, from `/proc`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The watchdog process of the `lock` tool `tool` (its one child), once it runs.
async fn watchdog_of(tool: &Child) -> u32 {
    let deadline = Instant::now() + WAIT;
    loop {
        if let [watchdog] = children_of(tool.id())[..] {
            return watchdog;
        }
        assert!(
            Instant::now() < deadline,
            "no watchdog under lock {}",
            tool.id()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first lock on `job` runs `script`, whose processes each append their PID to
/// the file `pids` (the script says where, with `{pids}`). Once `expected` PIDs are
/// there, `act` does something to the first lock; a second lock on the same key then
/// runs a command that lists which of those PIDs still run (zombies left out). It
/// must list none: no process of the first command runs once the second command has
/// started. Returns the first lock's output.
async fn second_lock_finds_none_of_the_first(
    s: &Setup,
    first_args: &[&str],
    script: &str,
    expected: usize,
    act: impl AsyncFnOnce(&Child),
) -> Output {
    let pids = s.file("pids");
    let check = s.file("check");
    let script = script.replace("{pids}", &pids.display().to_string());
    let mut args = vec!["job", "--holder", "lock-a"];
    args.extend_from_slice(first_args);
    let first = s.lock(&args, &script);
    let deadline = Instant::now() + WAIT;
    let started: Vec<String> = loop {
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= expected {
            break lines;
        }
        assert!(
            Instant::now() < deadline,
            "the first command started {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let second = s.lock(
        &["job", "--holder", "lock-b", "--ttl-ms", "3000"],
        &format!(
            "for p in {}; do st=$(awk '/^State:/ {{print $2}}' /proc/$p/status 2>/dev/null); \
             if [ -n \"$st\" ] && [ \"$st\" != Z ]; then echo \"$p $st\"; fi; done > {c}.tmp; \
             mv {c}.tmp {c}",
            started.join(" "),
            c = check.display()
        ),
    );
    act(&first).await;
    let first = finish(first).await;
    let second = finish(second).await;
    assert_eq!(code(second.status), Some(0));
    let survivors = std::fs::read_to_string(&check).expect("the second command ran");
    assert_eq!(
        survivors, "",
        "processes of the first command ({started:?}) still ran when the second started"
    );
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_watchdog_is_passed_on_and_the_lease_waits_for_the_command() {
    let s = setup().await;
    // Before: the watchdog died of SIGTERM, lock released, and `sleep` ran on.
    let first = second_lock_finds_none_of_the_first(
        &s,
        &["--ttl-ms", "6000"],
        "echo $$ >> {pids}; exec sleep 30",
        1,
        async |tool| signal_pid(watchdog_of(tool).await, "TERM"),
    )
    .await;
    assert_eq!(code(first.status), Some(143), "the command's code: SIGTERM");
}

/// A wrapper shell waiting on a worker that ignores SIGTERM; both record their PIDs.
const WRAPPER_OF_A_STUBBORN_WORKER: &str = "sh -c 'trap \"\" TERM; echo $$ >> {pids}; while :; do sleep 0.1; done' & \
     echo $$ >> {pids}; wait";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_to_the_watchdog_makes_lock_stop_the_command_itself_before_releasing() {
    let s = setup().await;
    // The worker ignores SIGTERM: only lock's own SIGKILL after the grace ends it.
    let first = second_lock_finds_none_of_the_first(
        &s,
        &["--ttl-ms", "6000", "--grace", "1s"],
        WRAPPER_OF_A_STUBBORN_WORKER,
        2,
        async |tool| signal_pid(watchdog_of(tool).await, "KILL"),
    )
    .await;
    assert_eq!(code(first.status), Some(1), "the watchdog died");
    assert!(
        String::from_utf8_lossy(&first.stderr).contains("watchdog process died"),
        "says why"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_shell_dying_of_sigterm_leaves_no_worker_that_ignores_it() {
    let s = setup().await;
    // systemd's stop: SIGTERM to the tool. The wrapper shell dies of it; its worker
    // ignores it and is killed after the grace, before the lease goes.
    let first = second_lock_finds_none_of_the_first(
        &s,
        &["--ttl-ms", "6000", "--grace", "1s"],
        WRAPPER_OF_A_STUBBORN_WORKER,
        2,
        async |tool| signal(tool, "TERM"),
    )
    .await;
    assert_eq!(code(first.status), Some(143), "the wrapper's code");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backgrounded_child_is_stopped_before_the_lease_is_released() {
    let s = setup().await;
    // The command exits 0 as soon as its worker, which ignores SIGTERM, has started.
    let first = second_lock_finds_none_of_the_first(
        &s,
        &["--ttl-ms", "6000", "--grace", "1s"],
        "sh -c 'trap \"\" TERM; echo $$ >> {pids}; while :; do sleep 0.1; done' & \
         while ! [ -s {pids} ]; do sleep 0.01; done; echo $$ >> {pids}; exit 0",
        2,
        async |_| {},
    )
    .await;
    assert_eq!(code(first.status), Some(0), "the command's code");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_lock_leaves_no_process_of_its_command_to_the_next_holder() {
    let s = setup().await;
    // SIGSTOP to the tool: it can neither renew nor signal. Its watchdog kills the
    // command (which ignores SIGTERM, and has a child) by the deadline, before the
    // lease expires on the server and the second lock is granted it.
    let first = second_lock_finds_none_of_the_first(
        &s,
        &["--ttl-ms", "3000", "--grace", "1s"],
        "trap '' TERM; sh -c 'echo $$ >> {pids}; while :; do sleep 0.1; done' & \
         echo $$ >> {pids}; while :; do sleep 0.1; done",
        2,
        async |tool| {
            signal(tool, "STOP");
            // Thawed once the second lock has run: it waits for the lease to expire.
            let tool_pid = tool.id();
            let check = s.file("check");
            tokio::spawn(async move {
                wait_file(&check).await;
                signal_pid(tool_pid, "CONT");
            });
        },
    )
    .await;
    assert_eq!(code(first.status), Some(5), "woke to a lost lease");
}

/// Waits until `path` exists (bounded).
async fn wait_file(path: &Path) {
    let deadline = Instant::now() + WAIT;
    while !path.exists() {
        assert!(Instant::now() < deadline, "no {}", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn signal_pid(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}
