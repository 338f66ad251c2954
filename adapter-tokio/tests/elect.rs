//! `dagnats-leases elect --http` read by a program of another language: a Python
//! script (standard library only, `elect_follower.py`) polls the endpoints of the
//! `elect` processes of one key while the leader is killed (SIGKILL), frozen
//! (SIGSTOP, then resumed) and stopped (SIGTERM). It never sees two tenures claim
//! leadership over overlapping times (by the `now` and `deadline` they report),
//! it sees each failover, and the fences go up. Against a real nats-server, the
//! service and the real binary.

use std::process::Stdio;
use std::time::Duration;

use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::service::{self, ServiceOptions};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/elect_follower.py");
/// The bound on every wait for an event (a failover takes about a TTL).
const WAIT: Duration = Duration::from_secs(30);
const KEY: &str = "elect-http";

/// One `elect --http` process, and the URL it serves.
struct Elect {
    child: Child,
    url: String,
}

impl Elect {
    async fn start(nats_url: &str, holder: &str) -> Self {
        let mut child = Command::new(BIN)
            .args(["elect", KEY, "--holder", holder, "--ttl-ms", "2000"])
            .args(["--http", "127.0.0.1:0", "--json", "--nats-url", nats_url])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the binary starts");
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = tokio::time::timeout(WAIT, async {
            while let Some(line) = stderr.next_line().await.unwrap() {
                eprintln!("{holder}: {line}");
                if let Some(at) = line.find("http://") {
                    return line[at..].to_string();
                }
            }
            panic!("{holder} exited before it served");
        })
        .await
        .expect("elect names its address");
        let holder = holder.to_string();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                eprintln!("{holder}: {line}");
            }
        });
        Self { child, url }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} {}", self.pid());
    }
}

/// The Python program and what it prints.
struct Follower {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Follower {
    fn start() -> Self {
        let mut child = Command::new("python3")
            .arg(SCRIPT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            lines,
        }
    }

    async fn say(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn add(&mut self, name: &str, elect: &Elect) {
        self.say(&format!("add {name} {}", elect.url)).await;
    }

    /// Waits for a line about `name` in `state`; returns it.
    async fn wait_for(&mut self, name: &str, state: &str) -> Value {
        let lines = &mut self.lines;
        tokio::time::timeout(WAIT, async {
            loop {
                let line = lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("the follower exited early");
                eprintln!("follower: {line}");
                let v: Value = serde_json::from_str(&line).unwrap();
                if v["name"] == name && v["state"] == state {
                    return v;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the follower never saw {name} {state}"))
    }

    /// Waits for any process to lead; returns its name and fence.
    async fn wait_for_leader(&mut self) -> (String, u64) {
        let lines = &mut self.lines;
        tokio::time::timeout(WAIT, async {
            loop {
                let line = lines.next_line().await.unwrap().expect("follower exited");
                eprintln!("follower: {line}");
                let v: Value = serde_json::from_str(&line).unwrap();
                if v["state"] == "leader" {
                    let name = v["name"].as_str().unwrap().to_string();
                    return (name, v["fence"].as_u64().unwrap());
                }
            }
        })
        .await
        .expect("the follower saw a leader")
    }

    /// Ends the follower; returns its summary and exit code.
    async fn end(mut self) -> (Value, i32) {
        self.say("end").await;
        let summary = tokio::time::timeout(WAIT, async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                eprintln!("follower: {line}");
                let v: Value = serde_json::from_str(&line).unwrap();
                if v["summary"] == true {
                    return v;
                }
            }
            panic!("the follower exited without a summary");
        })
        .await
        .expect("the follower sums up");
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap()
            .unwrap();
        (summary, status.code().unwrap_or(-1))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_reader_of_elect_http_never_sees_two_leaders_through_kill_freeze_and_stop() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let _service = service::start((server.url(), client), ServiceOptions::default())
        .await
        .unwrap();
    let url = server.url();
    let mut elects = vec![
        Elect::start(&url, "elect-a").await,
        Elect::start(&url, "elect-b").await,
    ];
    let names = ["a", "b", "c"];
    let mut follower = Follower::start();
    follower.add("a", &elects[0]).await;
    follower.add("b", &elects[1]).await;

    // SIGKILL of the leader: the other takes over once the lease has expired.
    let (first, f1) = follower.wait_for_leader().await;
    let (killed, survivor) = if first == "a" { (0, 1) } else { (1, 0) };
    elects[killed].child.kill().await.unwrap();
    let took_over = follower.wait_for(names[survivor], "leader").await;
    let f2 = took_over["fence"].as_u64().unwrap();
    assert!(f2 > f1, "fence {f2} after {f1}");

    // SIGSTOP of the new leader: a third process takes over; woken, the frozen one
    // answers that it does not lead (its local deadline has passed).
    elects.push(Elect::start(&url, "elect-c").await);
    follower.add("c", &elects[2]).await;
    follower.wait_for("c", "follower").await;
    elects[survivor].signal("STOP");
    let c_leads = follower.wait_for("c", "leader").await;
    let f3 = c_leads["fence"].as_u64().unwrap();
    assert!(f3 > f2, "fence {f3} after {f2}");
    elects[survivor].signal("CONT");
    follower.wait_for(names[survivor], "follower").await;

    // SIGTERM of the leader: it releases, and the woken one takes over at once.
    elects[2].signal("TERM");
    let back = follower.wait_for(names[survivor], "leader").await;
    let f4 = back["fence"].as_u64().unwrap();
    assert!(f4 > f3, "fence {f4} after {f3}");
    let status = tokio::time::timeout(WAIT, elects[2].child.wait())
        .await
        .expect("elect exits on SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0), "elect's exit on SIGTERM");

    let (summary, code) = follower.end().await;
    assert_eq!(summary["violations"], serde_json::json!([]), "{summary}");
    assert_eq!(code, 0);
    let tenures = summary["tenures"].as_array().unwrap();
    assert!(tenures.len() >= 3, "three tenures or more: {summary}");
    assert!(summary["claims"].as_u64().unwrap() > 0);
    for (name, at) in [(names[survivor], f2), ("c", f3), (names[survivor], f4)] {
        assert!(
            tenures.iter().any(|t| t["fence"] == at),
            "{name}'s tenure at fence {at} among {summary}"
        );
    }
}

/// `GET /` of an `elect --http` endpoint: the status and the JSON body; `None`
/// when the process does not answer.
async fn get(url: &str) -> Option<(u16, Value)> {
    use tokio::io::AsyncReadExt;
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: elect\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut text))
        .await
        .ok()?
        .ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = serde_json::from_str(text.split("\r\n\r\n").nth(1)?).ok()?;
    Some((status, body))
}

/// The shards an answer names: key to (fence, now, deadline) in nanoseconds.
fn shards_of(body: &Value) -> Vec<(String, u64, i128, i128)> {
    let at = |v: &Value| {
        time::OffsetDateTime::parse(
            v.as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
        .unix_timestamp_nanos()
    };
    let now = at(&body["now"]);
    body["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let key = s["key"].as_str().unwrap().to_string();
            (key, s["fence"].as_u64().unwrap(), now, at(&s["deadline"]))
        })
        .collect()
}

/// A claim of a shard: (shard, process, fence, now, deadline).
type Claim = (String, &'static str, u64, i128, i128);

/// Reads every endpoint once, adding each shard claimed to `claims`; returns who
/// holds what.
async fn poll(
    claims: &mut Vec<Claim>,
    names: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    let mut held = Vec::new();
    for &(name, url) in names {
        let shards = match get(url).await {
            Some((status, body)) => {
                let shards = shards_of(&body);
                assert_eq!(status, if shards.is_empty() { 503 } else { 200 }, "{body}");
                shards
            }
            None => Vec::new(),
        };
        for (key, fence, now, deadline) in shards {
            claims.push((key.clone(), name, fence, now, deadline));
            held.push((name, key));
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_elect_shard_sets_split_four_shards_and_the_survivor_takes_them_all() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let _service = service::start((server.url(), client), ServiceOptions::default())
        .await
        .unwrap();
    let url = server.url();
    let start = |holder: &'static str| {
        let url = url.clone();
        async move {
            let mut child = Command::new(BIN)
                .args(["elect", "orders", "--shards", "4", "--holder", holder])
                .args([
                    "--ttl-ms",
                    "2000",
                    "--http",
                    "127.0.0.1:0",
                    "--nats-url",
                    &url,
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
            let line = tokio::time::timeout(WAIT, stderr.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            let at = line.find("http://").expect("the address first");
            tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
            (child, line[at..].to_string())
        }
    };
    let (mut a, a_url) = start("shards-a").await;
    let (_b, b_url) = start("shards-b").await;

    // Every claim seen, per shard: (holder, fence, now, deadline).
    let mut claims: Vec<Claim> = Vec::new();
    let both = [("a", a_url.as_str()), ("b", b_url.as_str())];
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let held = poll(&mut claims, &both).await;
        let count = |n| held.iter().filter(|(name, _)| *name == n).count();
        if count("a") == 2 && count("b") == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never split: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SIGKILL of a: b takes all four once a's leases run out.
    a.kill().await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let held = poll(&mut claims, &both).await;
        if held.iter().filter(|(name, _)| *name == "b").count() == 4 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b never took all: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // No shard was claimed by two holders over overlapping times, and a later
    // holder of a shard has a higher fence.
    for (i, (key, x, fx, nx, dx)) in claims.iter().enumerate() {
        for (k2, y, fy, ny, dy) in &claims[i + 1..] {
            if key != k2 || x == y {
                continue;
            }
            assert!(
                !(nx < dy && ny < dx),
                "{key}: {x}@{fx} [{nx}, {dx}] and {y}@{fy} [{ny}, {dy}] overlap"
            );
            assert_eq!(
                fx < fy,
                nx < ny,
                "{key}: {x}@{fx} and {y}@{fy} out of order"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_prints_the_leader_then_no_leader_after_its_release() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let _service = service::start((server.url(), client), ServiceOptions::default())
        .await
        .unwrap();
    let url = server.url();
    let mut observer = Command::new(BIN)
        .args([
            "elect",
            "--observe",
            "watched",
            "--json",
            "--nats-url",
            &url,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(observer.stdout.take().unwrap()).lines();
    let mut next = async || -> Value {
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("observe prints a change")
            .unwrap()
            .expect("observe runs");
        eprintln!("observe: {line}");
        serde_json::from_str(&line).unwrap()
    };
    // The first read: nobody leads.
    let first = next().await;
    assert_eq!(first["leader"], Value::Null, "{first}");
    let mut elect = Command::new(BIN)
        .args(["elect", "watched", "--holder", "obs-a", "--ttl-ms", "2000"])
        .args(["--nats-url", &url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let led = next().await;
    assert_eq!(led["leader"], "obs-a", "{led}");
    assert!(led["revision"].as_u64().unwrap() > 0);
    // SIGTERM: released (at once, or after the deadline its stdout line named).
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &elect.id().unwrap().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let freed = next().await;
    assert_eq!(freed["leader"], Value::Null, "{freed}");
    assert!(freed["revision"].as_u64().unwrap() > led["revision"].as_u64().unwrap());
    let status = tokio::time::timeout(WAIT, elect.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
