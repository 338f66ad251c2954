//! The Go example of the spec (`leases.md`, section "Example", a `package main`
//! program that uses only nats.go) runs as written against the service on
//! nats-server 2.15.1: one copy holds the lease through its three renewals and
//! releases it, printing nothing; a second copy with another holder ID, started
//! while the first holds the lease, prints `held by notify-7f3a`.
//!
//! The program is extracted from the spec text, never copied into the repo. Only
//! three narrow substitutions are made, each of which must match exactly once:
//! `for range 3 {` (Go 1.22) becomes a three-clause loop for Debian's Go 1.19,
//! `nats.DefaultURL` becomes the test server's URL, and the second copy gets its own
//! holder ID. It builds in GOPATH mode against Debian's nats.go
//! (`scripts/install-go-example-deps`), so nothing is downloaded.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::Fx;
use serde_json::json;
use tokio::process::Command;

/// The spec as the docs repository has it, relative to the repo root, when present.
const SHARED_SPEC: &str = "../shared/spec/leases.md";
/// The project's copy: the design document's page with the project's corrections
/// (the tenure rule, the error kinds, links that resolve); its Example is the same.
const REPO_SPEC: &str = "spec/leases.md";
/// Where Debian's golang-github-nats-io-go-nats-dev puts the nats.go sources.
const DEBIAN_GOPATH: &str = "/usr/share/gocode";
const INSTALL_HINT: &str = "run scripts/install-go-example-deps (as root)";

/// What the example uses, as the spec writes it.
const KEY: &str = "notify-leader";
const HOLDER: &str = "notify-7f3a";
/// The second copy's holder ID.
const OTHER_HOLDER: &str = "notify-8b2c";

/// How long the first copy may take: it holds the lease ~15 s (3 renewals of ttl/3).
const FIRST_COPY_LIMIT: Duration = Duration::from_secs(60);
/// How long the lease may take to show up as held by the first copy.
const ACQUIRE_LIMIT: Duration = Duration::from_secs(20);
const SECOND_COPY_LIMIT: Duration = Duration::from_secs(20);

fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The spec text: the project's copy. When the docs repository's page is there, its
/// Example must be the same program (the copy corrects the prose, never the code).
fn spec_text() -> String {
    let root = repo_root();
    let read = |p: &Path| {
        let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
        String::from_utf8(bytes).expect("the spec is UTF-8")
    };
    let text = read(&root.join(REPO_SPEC));
    let shared = root.join(SHARED_SPEC);
    if shared.exists() {
        assert!(
            extract_program(&read(&shared)) == extract_program(&text),
            "the Example of {REPO_SPEC} differs from {SHARED_SPEC}'s: copy it again"
        );
    }
    text
}

/// The Go program of the spec's Example: from the line `package main` through the
/// closing `}` of `func main()`, which must be followed by nothing but blank lines up
/// to the line `Holder rules`.
fn extract_program(spec: &str) -> String {
    let lines: Vec<&str> = spec.lines().collect();
    let find = |from: usize, pred: &dyn Fn(&str) -> bool, what: &str| -> usize {
        lines[from..]
            .iter()
            .position(|l| pred(l))
            .map(|i| from + i)
            .unwrap_or_else(|| panic!("the spec has no {what} (after line {})", from + 1))
    };
    let start = find(
        0,
        &|l| l.trim_end() == "package main",
        "line `package main`",
    );
    let main = find(
        start,
        &|l| l.trim_end() == "func main() {",
        "line `func main() {`",
    );
    let end = find(main, &|l| l.trim_end() == "}", "closing `}` of func main");
    let next = find(
        end,
        &|l| l.starts_with("Holder rules"),
        "line `Holder rules`",
    );
    assert!(
        lines[end + 1..next].iter().all(|l| l.trim().is_empty()),
        "the Example does not end at func main's closing brace: text between it (line {}) \
         and `Holder rules` (line {})",
        end + 1,
        next + 1
    );
    let mut program = lines[start..=end].join("\n");
    program.push('\n');
    program
}

/// Replaces `from` by `to`, which must occur exactly once.
fn replace_once(text: &str, from: &str, to: &str, why: &str) -> String {
    let n = text.matches(from).count();
    assert_eq!(
        n, 1,
        "expected `{from}` exactly once in the spec's Go example ({why}), found it {n} times"
    );
    text.replacen(from, to, 1)
}

/// The example as it runs here: Go 1.19's loop, and the test server's URL.
fn adapt(program: &str, url: &str) -> String {
    assert!(
        !url.contains(['"', '\\']),
        "{url} is not a plain Go string literal"
    );
    let program = replace_once(
        program,
        "for range 3 {",
        "for i := 0; i < 3; i++ {",
        "range over an int needs Go 1.22; Debian's Go is 1.19",
    );
    replace_once(
        &program,
        "nats.DefaultURL",
        &format!("\"{url}\""),
        "the test server runs on a random port",
    )
}

/// Runs `go` with the GOPATH-mode environment of `dir`: `<dir>/gopath` and Debian's
/// gocode, no modules, no downloads, a cache in `dir`.
fn go(dir: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.env("GO111MODULE", "off")
        .env(
            "GOPATH",
            format!("{}:{DEBIAN_GOPATH}", dir.join("gopath").display()),
        )
        .env("GOCACHE", dir.join("gocache"))
        .env("GOFLAGS", "")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn run_go(dir: &Path, args: &[&str]) -> Output {
    go(dir).args(args).output().await.unwrap_or_else(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            panic!("`go` is not installed (needed for the spec's Go example): {INSTALL_HINT}")
        }
        panic!("cannot run go {args:?}: {e}")
    })
}

/// Builds `source` as package `name` of the temporary GOPATH; returns the binary.
async fn build(dir: &Path, name: &str, source: &str) -> PathBuf {
    let pkg = dir.join("gopath/src").join(name);
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("main.go"), source).unwrap();
    let bin = dir.join(name);
    let out = run_go(dir, &["build", "-o", bin.to_str().unwrap(), name]).await;
    assert!(
        out.status.success(),
        "go build {name} failed ({}):\n{}{}\n--- the program:\n{source}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    bin
}

fn show(out: &Output) -> String {
    format!(
        "{}, stdout {:?}, stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn spawn(bin: &Path) -> tokio::process::Child {
    Command::new(bin)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

#[test]
fn the_in_repo_specs_example_is_the_design_documents() {
    let spec = spec_text();
    assert!(
        spec.contains("\npackage main\n"),
        "no Go example in the spec"
    );
}

#[tokio::test]
async fn the_specs_go_example_holds_renews_and_releases_and_a_second_copy_sees_it_held() {
    let program = extract_program(&spec_text());
    assert!(
        program.contains(&format!("Key: \"{KEY}\"")),
        "the example no longer uses the key {KEY}:\n{program}"
    );

    let dir = tempfile::tempdir().unwrap();
    let version = run_go(dir.path(), &["version"]).await;
    assert!(version.status.success(), "go version: {}", show(&version));
    println!(
        "go example: {}",
        String::from_utf8_lossy(&version.stdout).trim()
    );
    let nats_go = Path::new(DEBIAN_GOPATH).join("src/github.com/nats-io/nats.go/nats.go");
    assert!(
        nats_go.exists(),
        "{} is missing (Debian's golang-github-nats-io-go-nats-dev): {INSTALL_HINT}",
        nats_go.display()
    );

    let fx = Fx::start().await;
    let first_source = adapt(&program, &fx.server.url());
    let second_source = replace_once(
        &first_source,
        &format!("Holder: \"{HOLDER}\""),
        &format!("Holder: \"{OTHER_HOLDER}\""),
        "the second copy needs its own holder ID",
    );
    let started = Instant::now();
    let first_bin = build(dir.path(), "example", &first_source).await;
    let second_bin = build(dir.path(), "example_second", &second_source).await;
    println!("go example: built both copies in {:?}", started.elapsed());

    // The first copy acquires, then holds the lease ~15 s.
    let started = Instant::now();
    let mut first = spawn(&first_bin);
    let deadline = started + ACQUIRE_LIMIT;
    loop {
        let owner = fx.owner(KEY).await;
        if owner["holder"] == json!(HOLDER) {
            println!(
                "go example: {HOLDER} holds {KEY} after {:?} (revision {})",
                started.elapsed(),
                owner["revision"]
            );
            break;
        }
        if let Some(status) = first.try_wait().unwrap() {
            let out = first.wait_with_output().await.unwrap();
            panic!(
                "the first copy exited ({status}) before {KEY} was seen held by {HOLDER} \
                 (owner: {owner}): {}",
                show(&out)
            );
        }
        assert!(
            Instant::now() < deadline,
            "{KEY} not held by {HOLDER} within {ACQUIRE_LIMIT:?}: owner {owner}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A second copy, with another holder ID, finds it held.
    let second = tokio::time::timeout(SECOND_COPY_LIMIT, spawn(&second_bin).wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the second copy did not exit within {SECOND_COPY_LIMIT:?}"))
        .unwrap();
    println!(
        "go example: second copy ({OTHER_HOLDER}): {}",
        show(&second)
    );
    assert!(
        second.status.success()
            && second.stdout == format!("held by {HOLDER}\n").as_bytes()
            && second.stderr.is_empty(),
        "the second copy ({OTHER_HOLDER}) must print exactly \"held by {HOLDER}\" and exit 0; \
         it ended with {}",
        show(&second)
    );

    // The first copy renews three times, releases, and prints nothing.
    let first = tokio::time::timeout(FIRST_COPY_LIMIT, first.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the first copy did not exit within {FIRST_COPY_LIMIT:?}"))
        .unwrap();
    println!(
        "go example: first copy ({HOLDER}) after {:?}: {}",
        started.elapsed(),
        show(&first)
    );
    assert!(
        first.status.success() && first.stdout.is_empty() && first.stderr.is_empty(),
        "the first copy ({HOLDER}) must exit 0 and print nothing (renew 3 times, release); \
         it ended with {}",
        show(&first)
    );
    let owner = fx.owner(KEY).await;
    assert_eq!(
        owner["held"],
        json!(false),
        "{KEY} is still held after the example released it: {owner}"
    );
}
