//! `scripts/serve`, as the README tells a newcomer to run it: it starts the pinned
//! nats-server and the service, prints the URL, serves the CLI from another process,
//! and stops both on Ctrl-C (SIGINT).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");

/// The script's stdout, kept open while it runs (closed, its next line would end
/// it with SIGPIPE).
type Output = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// `scripts/serve` with `args`, the URL its first line names (reading it blocks
/// until the service is ready), and the rest of its output.
fn start(args: &[&str]) -> (Child, String, Output) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/serve");
    let mut serve = Command::new(script)
        .args(args)
        .env("DAGNATS_LEASES_BIN", BIN)
        .env("DAGNATS_PORT", "-1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("scripts/serve starts");
    let mut out = BufReader::new(serve.stdout.take().unwrap()).lines();
    let first = out.next().expect("a line").unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("nats://"))
        .unwrap_or_else(|| panic!("no URL in {first:?}"))
        .to_string();
    (serve, url, out)
}

/// Ctrl-C (SIGINT) to the script, and how it exited (within 30 s).
fn ctrl_c(serve: &mut Child) -> ExitStatus {
    let ok = Command::new("kill")
        .args(["-INT", &serve.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = serve.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "scripts/serve did not stop on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn scripts_serve_serves_the_cli_until_ctrl_c() {
    let (mut serve, url, _out) = start(&[]);
    let cli = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .args(["--nats-url", &url])
            .output()
            .unwrap()
    };
    let acquired = cli(&["acquire", "my-key", "--holder", "me", "--ttl-ms", "15000"]);
    assert_eq!(acquired.status.code(), Some(0), "{acquired:?}");
    let owner = cli(&["owner", "my-key", "--json"]);
    assert!(
        String::from_utf8_lossy(&owner.stdout).contains(r#""holder":"me""#),
        "{owner:?}"
    );

    // Ctrl-C: the script stops the service and the server, and exits 0.
    assert_eq!(ctrl_c(&mut serve).code(), Some(0));
    let gone = cli(&["owner", "my-key"]);
    assert_eq!(gone.status.code(), Some(2), "no server left: {gone:?}");
}

/// `scripts/serve --tenants`: the accounts example of docs/security.md on the
/// pinned server, as a newcomer runs it: each tenant has its own keys, the
/// service's own account is not served, the CLI and `lock` work as tenant clients
/// (each user with its own inbox prefix), the options after `--` reach `serve`
/// (a cap of 2), and Ctrl-C stops it all.
#[test]
fn scripts_serve_tenants_serves_each_tenant_its_own_keys_until_ctrl_c() {
    let (mut serve, url, _out) = start(&["--tenants", "--", "--max-leases-per-tenant", "2"]);
    // The connection's flags right after the command, before a `--`.
    let as_user = |user: &str, args: &[&str]| {
        let mut command = Command::new(BIN);
        command
            .arg(args[0])
            .args(["--nats-url", &url, "--user", user, "--password", user]);
        if user != "leases" {
            command.args(["--inbox-prefix", &format!("_INBOX.{user}")]);
        }
        command.args(&args[1..]).output().unwrap()
    };
    let a = as_user(
        "a1",
        &["acquire", "job", "--holder", "me", "--ttl-ms", "15000"],
    );
    assert_eq!(a.status.code(), Some(0), "{a:?}");
    let b = as_user("b1", &["owner", "job"]);
    assert_eq!(b.status.code(), Some(3), "TB's job is free: {b:?}");
    let b = as_user(
        "b1",
        &["acquire", "job", "--holder", "me", "--ttl-ms", "15000"],
    );
    assert_eq!(b.status.code(), Some(0), "TB holds its own job: {b:?}");
    let taken = as_user(
        "a2",
        &["acquire", "job", "--holder", "me", "--ttl-ms", "15000"],
    );
    assert!(
        String::from_utf8_lossy(&taken.stderr).contains("forbidden"),
        "a2 takes a1's lease: {taken:?}"
    );
    // The service's own account reaches no tenant's endpoints.
    let own = as_user("leases", &["owner", "job", "--json"]);
    assert!(!own.status.success(), "the service's own account: {own:?}");
    assert!(
        !String::from_utf8_lossy(&own.stdout).contains("holder"),
        "the service's own account: {own:?}"
    );
    let lock = as_user(
        "a2",
        &[
            "lock",
            "nightly",
            "--",
            "sh",
            "-c",
            "test -n \"$DAGNATS_LEASE_FENCE\"",
        ],
    );
    assert_eq!(lock.status.code(), Some(0), "lock as a tenant: {lock:?}");
    // `-- --max-leases-per-tenant 2` reached the service: TA holds job and k2.
    let k2 = as_user(
        "a1",
        &["acquire", "k2", "--holder", "me", "--ttl-ms", "15000"],
    );
    assert_eq!(k2.status.code(), Some(0), "{k2:?}");
    let k3 = as_user(
        "a1",
        &["acquire", "k3", "--holder", "me", "--ttl-ms", "15000"],
    );
    assert!(
        String::from_utf8_lossy(&k3.stderr).contains("cap of 2"),
        "past the cap: {k3:?}"
    );

    assert_eq!(ctrl_c(&mut serve).code(), Some(0));
}
