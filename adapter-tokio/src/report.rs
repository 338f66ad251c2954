//! How a command says it failed: one place for `commands` and `elect`.

use std::io::Write;

use serde_json::json;

/// Prints a failure of the command itself (not a call's): a sentence on stderr,
/// or with `--json` `{"error", "kind"}` on `out`; returns `code`.
pub fn fail(out: &mut (dyn Write + Send), json: bool, kind: &str, message: &str, code: u8) -> u8 {
    if json {
        let _ = writeln!(out, "{}", json!({"error": message, "kind": kind}));
    } else {
        eprintln!("dagnats-leases: {message}");
    }
    code
}
