//! The probe's fsync count (step 2): the servers' fsync calls per acked write,
//! strace attached to every process while the writes run (not timed).

use std::process::{Command, Stdio};

use super::*;

/// Counts the fsync/fdatasync calls of every server of `place` while `writes`
/// fresh keys are written in `mode` (strace -f -c attached to each process, not
/// timed). Per node: syscalls per committed message; `None` if strace failed.
pub(super) async fn sync_count(
    place: &Place,
    mode: Mode,
    writes: usize,
    tag: &str,
    bif: usize,
) -> Option<(Slice, Vec<u64>)> {
    place.purge().await;
    let dir = tempfile::tempdir().ok()?;
    let mut tracers = Vec::new();
    for (i, node) in place.nodes().iter().enumerate() {
        let out = dir.path().join(format!("strace-{i}"));
        let child = Command::new("strace")
            .args([
                "-f",
                "-c",
                "-e",
                "trace=fsync,fdatasync,sync_file_range",
                "-o",
            ])
            .arg(&out)
            .arg("-p")
            .arg(node.pid().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        tracers.push((child, out));
    }
    // Attaching to every thread of a Go process takes a moment.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let s = run_writes(place, mode, writes, tag, bif).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut counts = Vec::new();
    for (mut child, out) in tracers {
        // SIGINT: strace detaches and writes its summary.
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let _ = child.wait();
        let text = std::fs::read_to_string(&out).ok()?;
        // Summary rows: "% time seconds usecs/call calls [errors] syscall".
        let calls: u64 = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let name = *f.last()?;
                if ["fsync", "fdatasync", "sync_file_range"].contains(&name) {
                    f.get(3)?.parse::<u64>().ok()
                } else {
                    None
                }
            })
            .sum();
        counts.push(calls);
    }
    Some((s, counts))
}
