//! The hot path under callgrind: each implementation runs under valgrind with
//! instrumentation off, the load generator turns it on (`callgrind_control -i on`)
//! for `calls` sequential calls of one operation, then off again, so the profile
//! holds those calls only. From each profile come instructions per call and
//! allocations per call (calls to malloc, calloc and realloc), and for the service
//! the functions that cost most, inclusive (`callgrind_annotate`).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use crate::load::{self, Op};
use crate::procs::{self, Impl};
use crate::servers::Nats;

/// Per-call cost of one implementation for one operation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cost {
    /// The operation.
    pub op: String,
    /// The implementation.
    pub implementation: String,
    /// Instructions executed per call, all threads.
    pub instructions: f64,
    /// Heap allocations (malloc, calloc, realloc) per call.
    pub allocations: f64,
}

/// Profiles baseline and tokio service for every operation; writes the profiles,
/// `profile.json` and the annotations to `out`.
pub async fn run(out: &Path, calls: usize, ops: &[Op]) {
    let dir = out.join("profile");
    std::fs::create_dir_all(&dir).expect("profile dir");
    let server = Nats::start();
    let url = server.url();
    let mut clients = Vec::new();
    for imp in [Impl::Baseline, Impl::Tokio] {
        let client = server.connect(imp.name()).await;
        load::echo_owner(client.clone()).await;
        clients.push((imp, client));
    }
    // The service creates the bucket; the baseline needs it there.
    for (imp, client) in &clients {
        procs::create_bucket(*imp, &url, None, &dir, client).await;
    }
    let mut costs = Vec::new();
    for &op in ops {
        for (imp, client) in &clients {
            let (imp, client) = (*imp, client.clone());
            let file = dir.join(format!("callgrind.{}.{}.out", imp.name(), op.name()));
            let options = procs::Options {
                wrapper: vec![
                    "valgrind".to_string(),
                    "--tool=callgrind".to_string(),
                    "--instr-atstart=no".to_string(),
                    format!("--callgrind-out-file={}", file.display()),
                ],
                ..procs::Options::default()
            };
            let running =
                procs::start_with(imp, imp.name(), imp.name(), &url, &dir, &client, &options).await;
            let tag = format!("p{}", imp.name());
            load::measure(&client, op, &format!("w{tag}"), 1, 50).await;
            control(running.pid(), "on");
            load::measure(&client, op, &tag, 1, calls).await;
            control(running.pid(), "off");
            running.stop();
            let (instructions, allocations) = read_profile(&file);
            let cost = Cost {
                op: op.name().to_string(),
                implementation: imp.name().to_string(),
                instructions: instructions as f64 / calls as f64,
                allocations: allocations as f64 / calls as f64,
            };
            println!(
                "{:<8} {:<9} {:>10.0} instructions/call {:>7.1} allocations/call",
                cost.op, cost.implementation, cost.instructions, cost.allocations
            );
            costs.push(cost);
            if imp == Impl::Tokio {
                let annotated = Command::new("callgrind_annotate")
                    .args(["--inclusive=yes", "--threshold=99"])
                    .arg(&file)
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                std::fs::write(
                    dir.join(format!("annotate.{}.{}.txt", imp.name(), op.name())),
                    annotated,
                )
                .expect("write annotation");
            }
        }
    }
    std::fs::write(
        dir.join("profile.json"),
        serde_json::to_string_pretty(&costs).expect("json"),
    )
    .expect("write profile.json");
    println!("profiles and annotations in {}", dir.display());
}

/// Turns callgrind's instrumentation of `pid` on or off.
fn control(pid: u32, state: &str) {
    let ok = Command::new("callgrind_control")
        .arg(format!("--instr={state}"))
        .arg(pid.to_string())
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "callgrind_control --instr={state} {pid} failed");
}

/// Total instructions and calls to the allocator in a callgrind profile.
fn read_profile(file: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(file).expect("callgrind profile");
    let mut names: HashMap<String, String> = HashMap::new();
    let mut callee = String::new();
    let mut total = 0;
    let mut allocs = 0;
    for line in text.lines() {
        if let Some(v) = line
            .strip_prefix("totals:")
            .or(line.strip_prefix("summary:"))
        {
            total = v
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        } else if let Some(rest) = line.strip_prefix("cfn=") {
            callee = name_of(&mut names, rest);
        } else if let Some(rest) = line.strip_prefix("fn=") {
            name_of(&mut names, rest);
        } else if let Some(rest) = line.strip_prefix("calls=")
            && matches!(callee.as_str(), "malloc" | "calloc" | "realloc")
        {
            allocs += rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    (total, allocs)
}

/// Resolves callgrind's name compression: `(12) name` defines, `(12)` refers.
fn name_of(names: &mut HashMap<String, String>, rest: &str) -> String {
    match rest.split_once(") ") {
        Some((id, name)) => {
            names.insert(id.to_string(), name.to_string());
            name.to_string()
        }
        None => names
            .get(rest.trim_end_matches(')'))
            .cloned()
            .unwrap_or_default(),
    }
}
