//! `scripts/serve`, as the README tells a newcomer to run it: it starts the pinned
//! nats-server and the service, prints the URL, serves the CLI from another process,
//! and stops both on Ctrl-C (SIGINT).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");

#[test]
fn scripts_serve_serves_the_cli_until_ctrl_c() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/serve");
    let mut serve = Command::new(script)
        .env("DAGNATS_LEASES_BIN", BIN)
        .env("DAGNATS_PORT", "-1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("scripts/serve starts");
    // Its first line names the URL; reading blocks until the service is ready.
    let mut out = BufReader::new(serve.stdout.take().unwrap()).lines();
    let first = out.next().expect("a line").unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("nats://"))
        .unwrap_or_else(|| panic!("no URL in {first:?}"))
        .to_string();
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
    let ok = Command::new("kill")
        .args(["-INT", &serve.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = serve.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "scripts/serve did not stop on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let gone = cli(&["owner", "my-key"]);
    assert_eq!(gone.status.code(), Some(2), "no server left: {gone:?}");
}
